"""drafter triton_v3: triton_v2's step with every projection on the dense linear op's engine
dispatch (kernels/dense linear_triton_v5) instead of triton_v2's per-name table (_gemm.SKINNY).

Why: triton_v2's skinny tiles were picked at the whole drafter's widths (session 9: o [7168 x
8192], gate_up [36864 x 7168], ...). The EP8 emulation runs the tensor-parallel drafter, whose
rank holds an eighth of each projection: qkv [1280 x 7168], o [7168 x 1024] (the target's own
o shard), gate_up [4608 x 7168], down [7168 x 2304]. There, at C 1 DDTree-16 (8 rows a draft),
triton_v2's 18 skinny GEMMs took 283 µs (2.4 TB/s on 682 MB) and its 6 cuBLAS qkv GEMMs 53 µs
(2.1 TB/s) on an H100 (session 57 call 5's kernel table), where linear_triton_v5 was tuned on
exactly such EP8-rank shapes (v4's swap-AB split-K for N >= 2048, v3's rule below).
Measured (H200, session 58 call 1): a negative. The EP8 emulation's draft (C 1 / 8 DDTree-16)
took 0.657 / 0.780 ms against triton_v2's 0.640 / 0.765: v5 sends the narrow qkv shard (N 1280)
to v3's rule, 11.88 µs at 8 rows against cuBLAS's 9.34 (`scripts/sweep_linear.py --set
drafter-tp8`), more than v5 gains on o and gate_up. triton_v4 takes the sweep's winners.

Numerics: fp32 accumulation, one bf16 rounding per projection as triton_v2; v4's split-K sums
its K slices in another order than v2's skinny kernel (the drafter's tolerance, not bitwise).
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

from torch import Tensor

from ..dense import linear_triton_v5
from .triton_v2 import on_proj


def proj(x: Tensor, w: Tensor, name: str) -> Tensor:
    """x [M, K] bf16 @ w [N, K]^T -> [M, N] bf16 on linear_triton_v5 (cuBLAS past 64 rows, as
    triton_v2); `name` is unused: the rule goes by shape."""
    return linear_triton_v5.linear(x, w)


# the registry's entry points: triton_v2's step on `proj`
draft_topk_triton, block_hidden = on_proj(proj)
