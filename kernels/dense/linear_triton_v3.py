"""Decode linear (op linear, variant triton_v3, ENGINE-style): linear_triton_v2's split-K kernel
on tiles read off session 10's sweep for up to DECODE_ROWS rows, cuBLAS (torch_bf16) above.

Why (H200, session 10 call 2, `scripts/sweep_linear.py`, traces/gpu/session10/sweep_linear.csv,
kernel µs): at 1-9 rows the sweep's best v2 tiles beat cuBLAS (split-K GEMM + splitKreduce) on
every EP8-rank projection (1 row: q_a | kv_a 8.1 vs 10.3, q_b 4.6 vs 6.3, o 4.5 vs 5.3, the
shared expert's gate | up 5.4 vs 5.9 and down 2.7 vs 3.1) and lose from 17 rows (the verify),
where v2's default tiles also lost to cuBLAS at 1 row on o and q_b: so v2 never entered the
engine preset. This version takes exactly those best tiles, as a rule of the shape:
  BN     64 where N >= 2048, else 32 where K >= 4096, else 16
  SPLIT  the most of 1 / 2 / 4 / 8 K slices keeping N / BN x SPLIT <= 132 programs (one wave)
         and >= 2 BK steps of 128 a slice
  BK     256 where a slice holds >= 1536 inputs, else 128
(q_a | kv_a [2112, 7168]: 64 / 4 / 256; o [7168, 1024]: 64 / 1 / 128; q_b [1536, 1536]:
16 / 1 / 256; gate | up [512, 7168]: 32 / 8 / 128; down [7168, 256]: 64 / 1 / 128: the sweep's
best at 1 and 9 rows.) More than DECODE_ROWS rows run cuBLAS: a dispatch by shape, as cuBLAS's
own kernel choice (engine-only, batch-variant; not bitwise cuBLAS or the reference).
Measured (session 19 call 5, REAL bench, kernel µs at 1 row, v3 / cuBLAS): q_a | kv_a 11.1 /
12.2, q_b 4.8 / 5.8, o 5.8 / 6.0, gate | up 6.2 / 6.4, down 3.7 / 4.0; the EP8 step's kernels
with swiglu_mlp triton_v4 on it 6.11 / 10.15 ms at C 1 / C 8 AR against 6.24 / 10.42: the
engine preset's linear from session 19.
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

import triton
from torch import Tensor

from . import linear_triton_v2, torch_bf16
from .linear_triton_v1 import SMS, fit_smem

DECODE_ROWS = 16  # one 16-row tile: decode and small batches; the verify's 17+ run cuBLAS


def tiles(M: int, N: int, K: int) -> linear_triton_v2.Tiles:
    """The rule above (BM 16: M <= DECODE_ROWS)."""
    BN = 64 if N >= 2048 else 32 if K >= 4096 else 16
    n_tiles, split = triton.cdiv(N, BN), 1
    while split < 8 and n_tiles * split * 2 <= SMS and triton.cdiv(K, split * 2) >= 2 * 128:
        split *= 2
    BK = 256 if triton.cdiv(K, split) >= 1536 else 128
    BK, stages = fit_smem(16, BN, BK, 4)
    return linear_triton_v2.Tiles(16, BN, BK, split, 4, stages)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x.dtype (the "linear" op's contract): v2's
    kernel on `tiles` up to DECODE_ROWS rows, torch_bf16's cuBLAS GEMM above (and v2's checks
    and dispatch for everything else)."""
    if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] and (
            x.numel() // x.shape[-1] > DECODE_ROWS):
        return torch_bf16.linear(x, weight)
    return linear_triton_v2.linear(x, weight, tiles_for=tiles)
