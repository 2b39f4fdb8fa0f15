"""Engine-style RMSNorm (op rmsnorm), triton_v2: kernels/dense triton_v1's one-program-a-row
kernel with 4 warps below D 2048 instead of 1.

Why (H200, session 18 call 8, `scripts/probe_small_launches.py`, traces/gpu/session18): at
q_a's width (D 1536, 2048 lanes) one warp walks 64 lanes a thread and reduces them alone:
1.72 / 1.73 / 1.96 µs of kernel time at 1 / 17 / 136 rows, against 1.08 / 1.10 / 1.39 at 4
warps (8: within 0.03 µs of 4). The EP8 step runs it 61 times (q_a's layernorm). From D 2048
it is triton_v1 (8 warps). Numerics: the same fp32 math with the sum reduced over 4 warps'
partials: not v1's bits below D 2048 (another reduction tree), a row's value still independent
of the batch; within the reference's tolerance.
Legend: D hidden width, M rows.
"""

from __future__ import annotations

from torch import Tensor

from . import triton_v1


def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """triton_v1.rmsnorm's contract (x [..., D] -> [..., D] in x.dtype, fp32 math, one
    rounding) with 4 warps a row below D 2048."""
    D = x.shape[-1] if isinstance(x, Tensor) and x.dim() else 0
    return triton_v1.rmsnorm(x, weight, eps, num_warps=4 if D < 2048 else 8)
