"""Launch shapes of the engine step's small Triton kernels, timed at the EP8 rank's decode and
verify row counts: GPU kernel µs (profiler) for each kernel at each launch option.

    PYTHONPATH=. python3 scripts/probe_small_launches.py [--rows 1,17,136]

Why (session 18): RoPE's 32 rows a program made a launch 5.3 µs where 4 rows take 1.3
(`scripts/probe_rope_programs.py`); the other small kernels of the EP8 step take 2-4 µs a
launch (session 18 call 2's table: moe_route 3.8, int4 combine 2.8, rmsnorm 2.2, add_rmsnorm
2.2) with launch shapes chosen without a measurement (moe_route's one warp is "a latency
guess" in its source). Each kernel is launched here exactly as its op launches it, with only
the option under test changed:
  rmsnorm      (q_a's layernorm, D 1536)         num_warps 1 (the op's) / 2 / 4 / 8
  add_rmsnorm  (the residual, D 7168)            num_warps 4 / 8 (the op's) / 16
  moe_route    (E 384, K 8, after the GEMM)      num_warps 1 (the op's) / 2 / 4 / 8
  int4 combine (K 8, D 7168, one K split)        BD 256 / 512 / 1024 (v7's) / 2048 / 4096
`--device cpu` runs every launch once under TRITON_INTERPRET=1 (a smoke test, no timing).
"""

from __future__ import annotations

import argparse

import torch
import triton

from workbench.bench import kernel_us
from workbench.kernels.dense.add_rmsnorm_triton_v1 import _add_rmsnorm_kernel
from workbench.kernels.dense.moe_route_triton_v1 import _moe_route_kernel
from workbench.kernels.drafter._common import INTERPRET, next_pow2
from workbench.kernels.drafter._fused import _rmsnorm_kernel
from workbench.kernels.int4_moe.triton_v3 import _combine_kernel


def _time(kernel, grid: tuple, args: tuple, kw: dict, dev: str, seconds: float) -> float:
    """Kernel µs of kernel[grid](*args, **kw) (graph-replayed timing; NaN on CPU, where the
    launch only runs)."""
    return kernel_us(lambda: kernel[grid](*args, **kw), dev, seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,17,136")
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    dev = a.device
    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, device=dev).to(dtype)

    print("kernel        rows  option        kernel_us")
    for M in map(int, a.rows.split(",")):
        D = 1536
        x, w = randn(M, D, dtype=bf), randn(D)
        y = torch.empty(M, D, dtype=bf, device=dev)
        for nw in (1, 2, 4, 8):
            us = _time(_rmsnorm_kernel, (M,), (x, w, y, D, x.stride(0), y.stride(0), 1e-6),
                       dict(BLOCK_D=next_pow2(D), num_warps=nw), dev, a.seconds)
            print(f"rmsnorm       {M:<5} warps={nw:<7} {us:9.2f}", flush=True)
        D = 7168
        x, r, w = randn(M, D, dtype=bf), randn(M, D, dtype=bf), randn(D)
        h, y = torch.empty_like(x), torch.empty_like(x)
        for nw in (4, 8, 16):
            us = _time(_add_rmsnorm_kernel, (M,), (x, r, w, h, y, D, x.stride(0), r.stride(0),
                                                    h.stride(0), y.stride(0), 1e-6),
                       dict(BF16=True, BLOCK_D=next_pow2(D), INTERPRET=INTERPRET, num_warps=nw),
                       dev, a.seconds)
            print(f"add_rmsnorm   {M:<5} warps={nw:<7} {us:9.2f}", flush=True)
        E, K = 384, 8
        logits, bias = randn(M, E), randn(E) * 0.01
        ids = torch.empty(M, K, dtype=torch.int64, device=dev)
        wts = torch.empty(M, K, dtype=torch.float32, device=dev)
        for nw in (1, 2, 4, 8):
            us = _time(_moe_route_kernel, (M,),
                       (logits, bias, ids, wts, ids, E, K, logits.stride(0), 2.827, 0, 0),
                       dict(BLOCK_E=next_pow2(E), BLOCK_K=next_pow2(K), LOCAL=False,
                            num_warps=nw), dev, a.seconds)
            print(f"moe_route     {M:<5} warps={nw:<7} {us:9.2f}", flush=True)
        D = 7168
        yk = randn(1, M * K, D)  # [KS, S, D] slot-order partials
        cw = torch.rand(M, K, generator=g, device=dev)
        cid = torch.randint(0, 384, (M, K), generator=g, device=dev)
        bad = torch.zeros(M, dtype=torch.int8, device=dev)
        out = torch.empty(M, D, dtype=bf, device=dev)
        for BD in (256, 512, 1024, 2048, 4096):
            nw = 4 if BD <= 1024 else 8
            us = _time(_combine_kernel, (M, triton.cdiv(D, BD)),
                       (yk, yk.stride(0), cw, cw.stride(0), cw.stride(1), cid, cid.stride(0),
                        cid.stride(1), bad, out, D),
                       dict(K=K, KS=1, BD=BD, INTERPRET=INTERPRET, num_warps=nw), dev,
                       a.seconds)
            print(f"int4 combine  {M:<5} BD={BD:<10} {us:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
