"""Compile the int4_moe kernels for sm_90 on a machine without a GPU; report registers, spills,
whether the MMA is wgmma, and whether the weight loads were pipelined (cp.async).

    python -m workbench.kernels.int4_moe.sm90 [--versions 1,2,3] [--T 1,9,65,512]

Each launcher runs once on CPU tensors (experts expanded from one expert: shapes and strides
only) with its kernels swapped for recorders, so the signature and constexprs are what a CUDA
launch at Kimi shapes passes; then `triton.compile` targets GPUTarget("cuda", 90, 32) and the
wheel's `ptxas -v` reads registers and spills. Must run without TRITON_INTERPRET.
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


def capture(module, *args) -> list:
    """[(kernel, signature, constexprs, options)] of every launch `module.int4_moe_triton` makes."""
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
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
        sig = {}
        for name, value in zip(kernel.arg_names, pos):
            if isinstance(value, torch.Tensor):
                sig[name] = _DTYPES[value.dtype]
            else:
                sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
        sig.update({name: "constexpr" for name in kw})
        out.append((kernel, {n: sig[n] for n in kernel.arg_names}, kw, opts))
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
    p.add_argument("--versions", default="1,3")
    p.add_argument("--T", default="1,9,65,512")
    args = p.parse_args(argv)
    print("version  T    kernel           registers / spills (sm_90a)   wgmma  mma.sync  cp.async")
    for v in args.versions.split(","):
        module = importlib.import_module(f"workbench.kernels.int4_moe.triton_v{v}")
        for T in map(int, args.T.split(",")):
            for kernel, sig, const, opts in capture(module, *kimi_like(T)):
                ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=const),
                                    target=GPUTarget("cuda", 90, 32), options=opts)
                ptx = ck.asm["ptx"]
                print(f"v{v:<7} {T:<4} {kernel.__name__:<16} {ptxas_report(ptx):<29} "
                      f"{ptx.count('wgmma.mma_async'):>5} {ptx.count('mma.sync'):>9} "
                      f"{ptx.count('cp.async'):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
