"""Compile the int4_moe kernels for sm_90 on a machine without a GPU; report registers, spills,
whether the MMA is wgmma, and whether the weight loads were pipelined (cp.async).

    python -m workbench.kernels.int4_moe.sm90 [--versions 1,2,3,4,5,6,7] [--T 1,9,65,512]
                                              [--no-spec] [--sass]

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
`--sass` adds, for each GEMM, the instruction mix of its innermost loop that issues HGMMA (the
pipelined K loop; nvdisasm from the Triton wheel): SASS instructions per iteration, per weight
(one K tile of BN x KT weights per iteration over the CTA's threads; versions with a KT), and
the opcodes that make up most of it. Issue model: README.md. v6's loop also holds its chunk
end (a branch with the running-total FADDs, taken once per CH tiles): the count is static, the
executed mix per tile is the count minus those FADDs (README.md, "v6").
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

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
    # every loaded version module: a launcher may live in an earlier version (v8 runs
    # triton_v7.launch, whose helper kernels are v7's globals)
    pkg = module.__name__.rsplit(".", 1)[0] + ".triton_v"
    mods = (module, _common, *{m for n, m in sys.modules.items()
                               if n.startswith(pkg) and m is not module})
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
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "launch_pdl")
                if k in kw}
        sig, attrs = {}, {}
        for i, (name, value) in enumerate(zip(kernel.arg_names, pos)):
            if isinstance(value, TensorDescriptor):  # v7's TMA descriptors
                block = ",".join(map(str, value.block_shape))
                sig[name] = f"tensordesc<{_DTYPES[value.base.dtype][1:]}[{block}]>"
                continue
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
        for param in kernel.params[len(pos):]:  # constexprs left at their defaults (PDL)
            if param.name not in kw and param.has_default:
                kw[param.name] = param.default
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


def loop_mix(cubin: bytes) -> collections.Counter:
    """Opcode counts of the shortest backward-branch loop that contains an HGMMA (empty when
    there is none: no wgmma, or nvdisasm missing)."""
    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        lines = subprocess.run([exe, "-c", f.name], capture_output=True, text=True).stdout
    except OSError:
        return collections.Counter()
    finally:
        os.unlink(f.name)
    lines = lines.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"^(\.L_x_\d+):", line.strip()))}
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i + 1]
            if any("HGMMA" in b for b in body) and (best is None or len(body) < len(best)):
                best = body
    ops = (re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", b) for b in best or ())
    return collections.Counter(m.group(1) for m in ops if m)


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="5,6")
    p.add_argument("--T", default="1,9,65,512")
    p.add_argument("--no-spec", action="store_true", help="no launch specialization")
    p.add_argument("--sass", action="store_true", help="main-loop SASS instruction mix")
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
                mix = loop_mix(ck.asm["cubin"]) if args.sass and "gemm" in kernel.__name__ else {}
                if mix:
                    total = sum(mix.values())
                    # the K tile of the module that defines the kernel (v8 runs v7's)
                    kt = getattr(importlib.import_module(kernel.fn.__module__), "KT", None)
                    per = (f"{total / (const['BN'] * kt / (32 * opts['num_warps'])):.2f} / weight"
                           if kt and "BN" in const else "")
                    top = ", ".join(f"{op} {n}" for op, n in mix.most_common(8))
                    print(f"{'':13} main loop: {total} SASS / iteration {per}; {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
