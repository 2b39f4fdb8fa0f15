"""Compile every tree_build version for sm_90 on a machine without a GPU; report registers.

    python -m workbench.kernels.tree_build.sm90 [--versions 1,2,3,4,5,6,7,8,9]

Each launcher is run once on CPU tensors with its kernel swapped for a recorder, so the
signature and constexprs are exactly what a CUDA launch would pass; then `triton.compile`
targets GPUTarget("cuda", 90, 32) and the wheel's own `ptxas -v` reads registers and spills
(ecosystem.md §1.4). Must run without TRITON_INTERPRET (the kernels must be JIT functions).
The pop loops' SASS, with ptxas's control bits, and their issue model: `sass_model.py`.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

from workbench.kernels._sm90 import ptxas_report

_DTYPES = {torch.float32: "*fp32", torch.float64: "*fp64", torch.bfloat16: "*bf16",
           torch.float16: "*fp16", torch.int64: "*i64", torch.int32: "*i32"}


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def capture(module, *args, **kwargs) -> tuple[dict, dict, int]:
    """(signature, constexprs, num_warps) the launcher of `module` would pass for these args."""
    from workbench.kernels.tree_build import _common

    kernel, rec = module._tree_build_kernel, _Recorder()
    check = _common._check_runnable  # the launchers' CPU-needs-the-interpreter check
    module._tree_build_kernel, _common._check_runnable = rec, lambda device: None
    try:
        module.build_ddtree_triton(*args, **kwargs)
    finally:
        module._tree_build_kernel, _common._check_runnable = kernel, check
    (pos, kw), = rec.calls
    num_warps = kw.pop("num_warps")
    names = kernel.arg_names
    sig = {}
    for name, value in zip(names, pos):
        if isinstance(value, torch.Tensor):
            sig[name] = _DTYPES[value.dtype]
        else:
            sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
    for name in kw:
        sig[name] = "constexpr"
    return {n: sig[n] for n in names}, kw, num_warps


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from workbench.reference.tree_build import topk_logprobs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="1,2,3,4,5,6,7,8,9")
    args = p.parse_args(argv)
    print("version  L  budget  registers / spills (sm_90a, ptxas -v)  PTX: shfl redux")
    for v in args.versions.split(","):
        module = importlib.import_module(f"workbench.kernels.tree_build.triton_v{v}")
        for depth, budget in [(7, 8), (7, 16), (7, 32), (7, 64), (7, 128), (16, 64), (16, 128)]:
            lp, ids = topk_logprobs(torch.randn(2, depth, 200), budget)
            zeros = torch.zeros(2, dtype=torch.int64)
            sig, const, warps = capture(module, lp, ids, budget, zeros, zeros)
            for key in ("TUPLE_REDUCE", "PREFETCH"):  # the CUDA defaults
                if key in const:
                    const[key] = True
            ck = triton.compile(ASTSource(fn=module._tree_build_kernel, signature=sig,
                                          constexprs=const),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            ptx = ck.asm["ptx"]
            print(f"v{v:<7} {depth:<2} {budget:<7} {ptxas_report(ptx):<38} "
                  f"{ptx.count('shfl.sync'):>4} {ptx.count('redux.sync'):>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
