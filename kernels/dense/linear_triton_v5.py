"""Decode linear (op linear, variant triton_v5, ENGINE-style): linear_triton_v4's swap-AB split-K
kernel for wide outputs (N >= WIDE_N), linear_triton_v3's dispatch for the narrow ones.

Why (H200, session 20 call 2, `scripts/sweep_linear.py --kernel triton_v4 --cold-mb 400`,
traces/gpu/session20/call2_sweep_linear_v4_cold.csv: each call streams its weight from HBM,
µs of one call at 1 / 9 / 17 rows): v4's default tiles win every wide projection of the EP8
rank: q_a | kv_a [2112, 7168] 10.9 / 10.9 / 11.5 against v3's 11.1 / 11.3 and cuBLAS's 13.1 at
17 rows; o [7168, 1024] 6.0 / 6.0 / 6.2 against v3 6.4 / 6.5, cuBLAS 6.4; the shared expert's
down [7168, 256] 3.2 / 3.3 / 3.4 against v3 3.4 / 3.5, cuBLAS 3.8. On the narrow ones v4's
64-column tiles leave too few programs without splitting K and lose: q_b [1536, 1536] at 17
rows 6.1 against cuBLAS's 5.3, gate | up [512, 7168] 7.8-8.4 against 7.2 (at 1 row 6.6 against
v3's 6.2). So N >= WIDE_N takes v4 at every row count it serves (<= 64), and the rest v3's
rule (v2's kernel on session 10's tiles up to 16 rows, cuBLAS above). A dispatch by shape, as
cuBLAS's own kernel choice: engine-only, batch-variant.
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

from torch import Tensor

from . import linear_triton_v3, linear_triton_v4

WIDE_N = 2048  # q_a | kv_a (2112), o and down (7168) take v4; q_b (1536), gate | up (512) not


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x.dtype (the "linear" op's contract):
    linear_triton_v4 where weight has >= WIDE_N rows (output columns), else linear_triton_v3
    (each with its own checks and cuBLAS dispatch)."""
    if isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[0] >= WIDE_N:
        return linear_triton_v4.linear(x, weight)
    return linear_triton_v3.linear(x, weight)
