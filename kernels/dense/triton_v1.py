"""Engine-style RMSNorm as one Triton kernel: the drafter's row kernel (kernels/drafter/_fused.py)
behind torch_bf16.rmsnorm's contract.

torch_bf16.rmsnorm launches ~6 kernels per call (cast, pow, mean, rsqrt, mul, mul, cast), each a
round trip of the row through HBM; this is one read of x and w and one write of y. One program
per row holds the whole row in registers (D = 7168 -> 8192 lanes), sums x^2 in fp32 in a fixed
order, and rounds x * rsqrt(mean + eps) * w once to x.dtype. A row's result therefore does not
depend on how many rows are in the batch (batch-invariant per row), but it is not bitwise the
float64 reference (fp32 sum, rounding order): it passes the reference's dtype-derived tolerance.

Dtypes: x bf16, fp16, fp32 or float64 (the distributed proof path hands ACC partials), weight
any float dtype. The math is fp32 whatever the input, exactly as torch_bf16 does (`x.float()`),
so float64 in gives float64 out holding fp32-accurate values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from ..drafter._fused import _rmsnorm_kernel

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
MAX_D = 32768  # the row lives in registers: 32K fp32 lanes over 8 warps is 128 per thread


def rmsnorm(x: Tensor, weight: Tensor, eps: float, *, num_warps: int | None = None) -> Tensor:
    """x [..., D] -> [..., D] in x.dtype; weight [D]; fp32 math, one rounding. num_warps: the
    program's warps (default 8 from D 2048, else 1; rmsnorm_triton_v2 passes its own)."""
    _require(x.dim() >= 1, "x", "a tensor [..., D]", tuple(x.shape))
    D = x.shape[-1]
    _require(x.dtype in DTYPES, "x", f"one of {[str(d) for d in DTYPES]}", x.dtype)
    _require(weight.is_floating_point(), "weight", "a floating dtype", weight.dtype)
    _require(tuple(weight.shape) == (D,), "weight", f"shape ({D},)", tuple(weight.shape))
    _require(weight.device == x.device, "weight", f"on {x.device} (x's device)", weight.device)
    _require(x.is_cuda or INTERPRET, "x", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             x.device)
    _require(D <= MAX_D, "x", f"D <= {MAX_D} (one row per program, in registers)", D)
    # the kernel reads a row with unit stride and rows `sx` apart: a view with strided columns
    # (or leading dims that do not flatten) is copied; the model only passes contiguous rows
    x2 = x.reshape(-1, D)  # [M, D], a view whenever the leading dims flatten
    if D > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    w = weight.contiguous()
    M = x2.shape[0]
    # Under the interpreter fp32 -> bf16 stores truncate instead of rounding (drafter/_common):
    # there the kernel writes fp32 and torch rounds (round-to-nearest-even, as cvt.rn does).
    narrow = x.dtype in (torch.bfloat16, torch.float16)
    y = torch.empty(M, D, dtype=torch.float32 if INTERPRET and narrow else x.dtype,
                    device=x.device)
    if M and D:
        warps = num_warps or (8 if D >= 2048 else 1)
        _rmsnorm_kernel[(M,)](x2, w, y, D, x2.stride(0), y.stride(0), eps,
                              BLOCK_D=next_pow2(D), num_warps=warps)
    return y.to(x.dtype).view(x.shape)
