"""Compile the tree_mla kernels for sm_90 on a machine without a GPU; report registers, spills
and whether the dots became wgmma and the loads TMA (DESIGN.md §10).

    python -m workbench.kernels.tree_mla.sm90 [--versions 1,2,3,4] [--heads 64] [--rows 9]
    python -m workbench.kernels.tree_mla.sm90 --versions 4,8 --heads 8 --rows 17   # v8 combine

Each launcher runs once on CPU tensors with its kernels swapped for recorders, so signatures
and constexprs are exactly what a CUDA launch passes; then `triton.compile` targets
GPUTarget("cuda", 90, 32) and the wheel's `ptxas -v` reads registers and spills. Must run
without TRITON_INTERPRET (the kernels must be JIT functions).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from workbench.kernels._sm90 import ptxas_stats

_DTYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
           torch.int64: "*i64", torch.int32: "*i32"}


class _Recorder:
    def __init__(self, name):
        self.name, self.calls = name, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, grid, args, kwargs))


def capture(module, *args) -> list[tuple]:
    """[(kernel, grid, signature, constexprs, num_warps)] the launcher would launch."""
    names = [n for n in dir(module) if n.startswith("_") and n.endswith("_kernel")]
    kernels = {n: getattr(module, n) for n in names}
    recs = {n: _Recorder(n) for n in names}
    # a kernel imported from another version (v8 launches v4's _attn_kernel through v4's
    # _launch) is swapped in the module that defines it as well
    homes = {n: {module, sys.modules[kernels[n].module]} for n in names}
    os.environ["TRITON_INTERPRET"] = "1"  # pass the launcher's CPU-tensor check
    try:
        for n in names:
            for home in homes[n]:
                setattr(home, n, recs[n])
        module.tree_mla_triton(*args)
    finally:
        os.environ.pop("TRITON_INTERPRET")
        for n in names:
            for home in homes[n]:
                setattr(home, n, kernels[n])
    out = []
    for n in names:
        for _, grid, pos, kw in recs[n].calls:
            kw = dict(kw)
            warps, stages = kw.pop("num_warps"), kw.pop("num_stages", 3)
            kw.pop("launch_pdl", None)  # a launch option, not a kernel argument
            fusion = kw.pop("enable_fp_fusion", True)  # a compile option (v6 turns it off)
            if "UPCAST" in kw:
                kw["UPCAST"] = False  # the CUDA value
            if "USE_PDL" in kw:  # v4: griddepcontrol on CUDA whenever a combine is launched
                kw["USE_PDL"] = "_combine_kernel" in {c[0] for r in recs.values()
                                                      for c in r.calls}
            fn = kernels[n]
            # the JIT's specialisation: ints equal to 1 become constexprs, pointers and ints
            # divisible by 16 get the divisibility hint (what lets loads vectorise)
            sig, attrs = {}, {}
            for i, (name, value) in enumerate(zip(fn.arg_names, pos)):
                if isinstance(value, TensorDescriptor):  # v3's TMA descriptors
                    block = ",".join(map(str, value.block_shape))
                    sig[name] = f"tensordesc<{_DTYPES[value.base.dtype][1:]}[{block}]>"
                elif isinstance(value, torch.Tensor):
                    sig[name] = _DTYPES[value.dtype]
                    attrs[(i,)] = [["tt.divisibility", 16]]
                elif isinstance(value, float):
                    sig[name] = "fp32"
                elif int(value) == 1:
                    kw[name] = 1
                else:
                    sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
                    if int(value) % 16 == 0:
                        attrs[(i,)] = [["tt.divisibility", 16]]
            for param in fn.params[len(pos):]:  # constexprs left at their defaults
                if param.name not in kw and param.has_default:
                    kw[param.name] = param.default
            for name in kw:
                sig[name] = "constexpr"
            out.append((fn, grid, {a: sig[a] for a in fn.arg_names}, kw, attrs, warps, stages,
                        fusion))
    return out


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="1,2,3,4")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--rows", type=int, default=9)
    args = p.parse_args(argv)
    B, N, H, C, R, T = 1, args.rows, args.heads, 512, 64, 4096
    q = torch.zeros(B, N, H, C + R, dtype=torch.bfloat16)
    kv = torch.zeros(B, T, C + R, dtype=torch.bfloat16)
    P = torch.zeros(B, dtype=torch.int64)
    anc = torch.zeros(B, N, -(-N // 64), dtype=torch.int64)
    print("version kernel               warps stages regs spill(B) wgmma mma.sync smem(B) cp.async"
          " tma gdc")
    for v in args.versions.split(","):
        module = importlib.import_module(f"workbench.kernels.tree_mla.triton_v{v}")
        for fn, _grid, sig, const, attrs, warps, stages, fusion in capture(module, q, kv, P,
                                                                            anc, 0.1447, C):
            ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                                target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": warps, "num_stages": stages,
                                         "enable_fp_fusion": fusion})
            ptx = ck.asm["ptx"]
            regs, spill = ptxas_stats(ptx)
            print(f"v{v:<6} {fn.__name__:<20} {warps:>5} {stages:>6} {regs:>4} {spill:>8} "
                  f"{ptx.count('wgmma.mma_async'):>5} {ptx.count('mma.sync'):>8} "
                  f"{ck.metadata.shared:>7} {ptx.count('cp.async.cg'):>8} "
                  f"{ptx.count('cp.async.bulk.tensor'):>3} {ptx.count('griddepcontrol'):>3}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
