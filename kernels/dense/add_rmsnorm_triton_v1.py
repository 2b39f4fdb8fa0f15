"""The residual add fused with the next RMSNorm (op add_rmsnorm, reference/layers.py).

Each layer of the model adds the attention output to the residual stream and normalises it
(post_attention_layernorm), then adds the MLP output and normalises again (the next layer's
input_layernorm): two bf16 add kernels and two norm kernels a layer, each a round trip of
[rows, 7168] through HBM. One program per row here: h = x + r in fp32 rounded once to x.dtype
(bitwise torch's bf16 add: both round the exact fp32 sum of two bf16 values), stored, then
RMSNorm of the rounded h in fp32, rounded once, as kernels/dense triton_v1 computes it.

Numerics: h is bitwise the reference's; y is the engine's fp32 RMSNorm (not the float64
reference): engine-only, within the dtype-derived tolerance.
Legend: M rows, D hidden.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from ..int4_moe._common import _to_bf16

DTYPES = (torch.bfloat16, torch.float32)
MAX_D = 32768  # the row lives in registers (as kernels/dense triton_v1)


@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, D, sx, sr, sh, sy, eps,
                        BF16: tl.constexpr, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    s = (tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
         + tl.load(r_ptr + row * sr + cols, mask=ok, other=0.0).to(tl.float32))
    if BF16:  # the residual stream is bf16: round once, norm the rounded value
        hb = _to_bf16(s, INTERPRET)
        tl.store(h_ptr + row * sh + cols, hb, mask=ok)
        h = hb.to(tl.float32)
    else:
        tl.store(h_ptr + row * sh + cols, s, mask=ok)
        h = s
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(h * h, 0) / D + eps)
    y = h * inv * w
    if BF16:
        tl.store(y_ptr + row * sy + cols, _to_bf16(y, INTERPRET), mask=ok)
    else:
        tl.store(y_ptr + row * sy + cols, y, mask=ok)


def add_rmsnorm(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + r, rmsnorm(x + r)) in x.dtype; x, r [..., D] of one shape and dtype, weight [D]."""
    _require(isinstance(x, Tensor) and x.dtype in DTYPES, "x",
             f"a tensor of one of {[str(d) for d in DTYPES]}", getattr(x, "dtype", type(x)))
    _require(isinstance(r, Tensor) and r.shape == x.shape and r.dtype == x.dtype, "r",
             f"{tuple(x.shape)} {x.dtype} (x's shape and dtype)",
             (tuple(getattr(r, "shape", ())), getattr(r, "dtype", type(r))))
    D = x.shape[-1]
    _require(tuple(weight.shape) == (D,) and weight.is_floating_point(), "weight",
             f"a float tensor of shape ({D},)", tuple(weight.shape))
    for name, t in (("r", r), ("weight", weight)):
        _require(t.device == x.device, name, f"on {x.device} (x's device)", t.device)
    _require(x.is_cuda or INTERPRET, "x", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             x.device)
    _require(D <= MAX_D, "x", f"D <= {MAX_D} (one row per program, in registers)", D)
    x2, r2 = x.reshape(-1, D), r.reshape(-1, D)
    if D > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    if D > 1 and r2.stride(1) != 1:
        r2 = r2.contiguous()
    M = x2.shape[0]
    h = torch.empty(M, D, dtype=x.dtype, device=x.device)
    y = torch.empty(M, D, dtype=x.dtype, device=x.device)
    if M and D:
        _add_rmsnorm_kernel[(M,)](x2, r2, weight.contiguous(), h, y, D, x2.stride(0),
                                  r2.stride(0), h.stride(0), y.stride(0), eps,
                                  BF16=x.dtype == torch.bfloat16, BLOCK_D=next_pow2(D),
                                  INTERPRET=INTERPRET, num_warps=8 if D >= 2048 else 1)
    return h.view(x.shape), y.view(x.shape)
