"""triton_v2's projections: cuBLAS, or the skinny Triton GEMM of kernels/dense (linear_triton_v1:
each program owns BN output columns of every row and walks all of K, no split-K) where it
measured faster on the H200 at kimi-k2.6 drafter widths.

Session 9, call 2 (`scripts/profile_drafter.py`, traces/gpu/session9), µs of one projection
alone, cuBLAS in brackets (its split-K kernels add a splitKreduce launch on o and down):

    rows    o [7168 x 8192]     gate_up [36864 x 7168]    down [7168 x 18432]    qkv [10240 x 7168]
    8       31.2 [33.8] BN 64   124.8 [136.3] BN 32       63.9 [72.6] BN 64      40.7 [38.8]: cuBLAS
    64      33.5 [32.5]: cuBLAS 138.7 [134.8]: cuBLAS     67.5 [75.8] BN 64      50.5 [38.6]: cuBLAS

Rows past 64 are compute-shaped (the skinny kernel re-reads the weight per row tile): cuBLAS.
Numerics: fp32 accumulation in a fixed K order, one rounding to bf16 (cuBLAS's split-K sums in
another order): the drafter's tolerance, not bitwise cuBLAS.
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from ..dense.linear_triton_v1 import _skinny_kernel
from ._common import INTERPRET, next_pow2

# (projection, row bucket) -> (BN, BK, warps, stages); a missing entry runs cuBLAS
SKINNY = {
    ("o", 16): (64, 256, 4, 4),
    ("gate_up", 16): (32, 256, 4, 4),
    ("down", 16): (64, 256, 4, 4),
    ("down", 64): (64, 128, 4, 6),
}


def _bucket(M: int) -> int | None:
    return 16 if M <= 16 else (64 if M <= 64 else None)


def proj(x: Tensor, w: Tensor, name: str) -> Tensor:
    """x [M, K] bf16 @ w [N, K]^T -> [M, N] bf16; `name` picks the kernel (SKINNY)."""
    M, K = x.shape
    N = w.shape[0]
    tiles = SKINNY.get((name, _bucket(M)))
    if tiles is None or M == 0 or K == 0:
        return F.linear(x, w)
    BN, BK, warps, stages = tiles
    BN, BK = min(BN, max(16, next_pow2(N))), min(BK, max(16, next_pow2(K)))
    BM = max(16, next_pow2(M))
    # under the interpreter fp32 -> bf16 stores truncate (_common): write fp32, torch rounds
    y = torch.empty(M, N, dtype=torch.float32 if INTERPRET else x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(N, BN), triton.cdiv(M, BM))](
        x, w, y, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0),
        BM=BM, BN=BN, BK=BK, INTERPRET=INTERPRET, num_warps=warps, num_stages=stages)
    return y.to(x.dtype)
