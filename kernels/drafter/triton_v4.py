"""drafter triton_v4: triton_v2's step with its projections at <= 16 rows on linear_triton_v4's
swap-AB kernel with 256-wide K steps; above 16 rows triton_v2's rule (_gemm.proj).

Why (H200, session 58 call 1, `scripts/sweep_linear.py --set drafter-tp8 --kernel triton_v4
--rows 8,64 --cold-mb 400`, µs of one call streaming its weight from HBM): at 8 rows (C 1, the
tensor-parallel drafter's shards) the swap-AB kernel at (BM 16, BN 64, BK 256) and v4's own
SPLIT beat triton_v2's choice on every projection: gate_up [4608 x 7168] 19.18 vs 22.74 (the
skinny kernel at BN 32), qkv [1280 x 7168] 8.92 vs 9.34 (cuBLAS; v4's SPLIT 4), o [7168 x
1024] 5.95 vs 6.20, down [7168 x 2304] 10.30 vs 10.56: ~4.5 µs a layer, ~27 µs a draft of six
layers. v4's default BK 128 walks K in twice the steps (gate_up 21.96). At 64 rows (C 8) none
wins by more than the noise (o 6.72 vs 6.77; gate_up and down lose), so triton_v2's rule stays.
triton_v3 (every projection on linear_triton_v5's dispatch) lost at 8 rows: v5 sends the
narrow qkv shard to v3's rule (11.88 vs 9.34).
The whole-width drafter (one GPU) at <= 16 rows is not measured under this rule.

Numerics: fp32 accumulation, one bf16 rounding per projection; split-K sums in slice order
(the drafter's tolerance, not bitwise triton_v2).
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

from torch import Tensor

from ..dense import linear_triton_v4
from ..dense.linear_triton_v1 import fit_smem
from ._gemm import proj as proj_v2
from .triton_v2 import on_proj

MAX_ROWS = 16  # the rows this version's rule serves (session 58's 8-row winners)
BK = 256


def tiles(M: int, N: int, K: int) -> linear_triton_v4.Tiles:
    """linear_triton_v4's tiles (its BM, BN and SPLIT) with BK 256 where shared memory holds
    it (fit_smem)."""
    t = linear_triton_v4.tiles(M, N, K)
    bk, stages = fit_smem(t.BM, t.BN, BK, t.stages)
    return t._replace(BK=bk, stages=stages)


def proj(x: Tensor, w: Tensor, name: str) -> Tensor:
    """x [M, K] bf16 @ w [N, K]^T -> [M, N] bf16: the swap-AB kernel on `tiles` at <= 16 rows,
    else triton_v2's projection for `name`."""
    if x.shape[0] <= MAX_ROWS:
        return linear_triton_v4.linear(x, w, tiles_for=tiles)
    return proj_v2(x, w, name)


# the registry's entry points: triton_v2's step on `proj`
draft_topk_triton, block_hidden = on_proj(proj)
