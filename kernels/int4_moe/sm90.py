"""Compile the int4_moe kernels for sm_90 on a machine without a GPU; report registers, spills,
whether the MMA is wgmma, and whether the weight loads were pipelined (cp.async).

    python -m workbench.kernels.int4_moe.sm90 [--versions 1,2,3,4] [--T 1,9,65,512] [--no-spec]

Each launcher runs once on CPU tensors (experts expanded from one expert: shapes and strides
only) with its kernels swapped for recorders, so the signature and constexprs are what a CUDA
launch at Kimi shapes passes; then `triton.compile` targets GPUTarget("cuda", 90, 32) and the
wheel's `ptxas -v` reads registers and spills. Must run without TRITON_INTERPRET.

Specialization: a CUDA launch marks 16-byte-aligned pointers and integers divisible by 16 as
`tt.divisibility = 16` and turns integers equal to 1 into constants (Triton's own
`native_specialize_impl`); the capture does the same by default, so vector widths (and with
them which loads become cp.async) are the launch's. `--no-spec` compiles without it (the
numbers this tool printed before v4: every load looked unaligned, bf16 loads scalar).
Columns: smem is the CTA's dynamic shared memory (Triton's metadata); cp.async counts the
PTX's cp.async instructions (weights, scales, activations if pipelined).
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

from workbench.kernels._sm90 import ptxas_report

_DTYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.int64: "*i64",
           torch.int32: "*i32", torch.int8: "*i8"}


class _Recorder:
    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def capture(module, *args, spec: bool = True) -> list:
    """[(kernel, signature, constexprs, attrs, options)] of every launch `module.int4_moe_triton`
    makes; spec: specialize like a CUDA launch (alignment / divisibility 16, ints equal to 1)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from workbench.kernels.int4_moe import _common

    calls, saved = [], {}
    mods = (module, _common)
    for mod in mods:
        for name in dir(mod):
            obj = getattr(mod, name)
            if name.endswith("_kernel") and hasattr(obj, "arg_names"):
                saved[mod, name] = obj
                setattr(mod, name, _Recorder(obj, calls))
    check = _common._check_runnable
    _common._check_runnable = lambda device: None
    repack = getattr(module, "repack", None)
    if repack is not None:  # shapes only: Kimi's D and I are multiples of the 256 tile already
        module.repack = lambda experts: tuple(experts)
    try:
        module.int4_moe_triton(*args, validate=False)
    finally:
        for (mod, name), obj in saved.items():
            setattr(mod, name, obj)
        _common._check_runnable = check
        if repack is not None:
            module.repack = repack
    out = []
    for kernel, pos, kw in calls:
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in kw}
        sig, attrs = {}, {}
        for i, (name, value) in enumerate(zip(kernel.arg_names, pos)):
            if isinstance(value, torch.Tensor):
                sig[name] = _DTYPES[value.dtype]
            else:
                sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
            if spec:
                ty, key = native_specialize_impl(BaseBackend, value, False, True, True)
                if ty == "constexpr":
                    sig[name] = "constexpr"
                    kw[name] = key
                elif key == "D":
                    attrs[(i,)] = [["tt.divisibility", 16]]
        sig.update({name: "constexpr" for name in kw})
        out.append((kernel, {n: sig[n] for n in kernel.arg_names}, kw, attrs, opts))
    return out


def kimi_like(T: int, E=384, D=7168, I=2048, K=8):
    """CPU inputs with Kimi shapes; experts are one expert expanded E times (no 9.5 GB)."""
    from workbench.reference.int4_moe import Int4Experts

    def proj(o, i):
        return (torch.zeros(1, o, i // 8, dtype=torch.int32).expand(E, -1, -1),
                torch.zeros(1, o, i // 32, dtype=torch.bfloat16).expand(E, -1, -1))

    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    w = torch.rand(T, K)
    return torch.zeros(T, D, dtype=torch.bfloat16), ids, w, Int4Experts(*proj(I, D), *proj(I, D),
                                                                          *proj(D, I))


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="3,4")
    p.add_argument("--T", default="1,9,65,512")
    p.add_argument("--no-spec", action="store_true", help="no launch specialization")
    args = p.parse_args(argv)
    print("version  T    kernel           registers / spills (sm_90a)   wgmma  mma.sync  cp.async"
          "  smem B")
    for v in args.versions.split(","):
        module = importlib.import_module(f"workbench.kernels.int4_moe.triton_v{v}")
        for T in map(int, args.T.split(",")):
            for kernel, sig, const, attrs, opts in capture(module, *kimi_like(T),
                                                           spec=not args.no_spec):
                ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=const,
                                              attrs=attrs),
                                    target=GPUTarget("cuda", 90, 32), options=opts)
                ptx = ck.asm["ptx"]
                print(f"v{v:<7} {T:<4} {kernel.__name__:<16} {ptxas_report(ptx):<29} "
                      f"{ptx.count('wgmma.mma_async'):>5} {ptx.count('mma.sync'):>9} "
                      f"{ptx.count('cp.async'):>9} {ck.metadata.shared:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
