"""Probe (H200): the EP8 rank's mla_v_up (8 heads, C 512 -> dv 128) by GEMM orientation.

Session 27's op table put torch_bf16's mla_v_up at 4.6 µs a layer at one row (cuBLAS
nvjet_sm90_tst_8x64_64x16_2x1_v_bz_TNN) against 3.2 at 17 rows: this times, per row count, the
op as registered, the transposed batched GEMM (out^T [H, dv, BN] = W_UV [H, dv, C] @ x^T [H, C,
BN]: the weight's rows on the GEMM's M) and the Triton variant, each as REPS back-to-back calls
in one CUDA graph (µs a call: graph time / REPS), and checks the transposed form against the
registered one.

    PYTHONPATH=. python scripts/probe_mla_v_up.py [--rows 1,2,4,8,17,136] [--heads 8]

Caveat (session 27 call 8): back to back, each call's launch and 1 MB weight read overlap the
previous call's, so the probe favours the cheaper launch; in the EP8 step triton_v1's 2.9 µs
here was 4.4, cuBLAS's time. Read it as an upper bound on a gain, and measure in the step.
"""

from __future__ import annotations

import argparse

import torch

REPS = 50


def transposed(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """torch_bf16.mla_v_up's contract with the weight's rows on the GEMM's M dimension."""
    B, N, H, C = o_lat.shape
    dv = w_uv.shape[1]
    out = torch.empty(B, N, H, dv, dtype=o_lat.dtype, device=o_lat.device)
    x = o_lat.reshape(B * N, H, C).permute(1, 2, 0)  # [H, C, BN]
    torch.bmm(w_uv, x, out=out.view(B * N, H, dv).permute(1, 2, 0))  # [H, dv, BN]
    return out


def _graph_us(fn, *args) -> float:
    fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn(*args)
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(20):
        t0.record()
        g.replay()
        t1.record()
        torch.cuda.synchronize()
        best = min(best, t0.elapsed_time(t1) * 1e3 / REPS)
    return best


def main(argv=None) -> int:
    from workbench.kernels.dense import mla_proj_triton_v1, torch_bf16

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,17,136")
    p.add_argument("--heads", type=int, default=8)
    a = p.parse_args(argv)
    H, C, dv = a.heads, 512, 128
    w = torch.randn(H, dv, C, device="cuda", dtype=torch.bfloat16) * 0.05
    print(f"{'rows':>5} {'torch_bf16':>11} {'transposed':>11} {'triton_v1':>10}  max |diff|")
    for rows in map(int, a.rows.split(",")):
        x = torch.randn(1, rows, H, C, device="cuda", dtype=torch.bfloat16)
        ref = torch_bf16.mla_v_up(x, w)
        got = transposed(x, w)
        diff = (got.float() - ref.float()).abs().max().item()
        us = [_graph_us(f, x, w) for f in (torch_bf16.mla_v_up, transposed,
                                           mla_proj_triton_v1.mla_v_up)]
        print(f"{rows:>5} {us[0]:>11.2f} {us[1]:>11.2f} {us[2]:>10.2f}  {diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
