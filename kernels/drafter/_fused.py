"""Row-wise fused kernels of the drafter layer: RMSNorm, q/k-norm + RoPE, SwiGLU's silu * up.

Each replaces a chain of torch elementwise ops (and their HBM round trips) with one pass.
Legend: M rows, D hidden, Hq/Hkv heads, d head_dim, F SwiGLU width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, act_dtype, next_pow2


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, D, sx, sy, eps, BLOCK_D: tl.constexpr):
    # one program per row: the row (D = 7168 -> 8192 lanes) stays in registers
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x = tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    tl.store(y_ptr + row * sy + cols, x * r * w, mask=ok)


def rmsnorm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x [M, D] (unit stride along D) -> [M, D] in act_dtype()."""
    M, D = x.shape
    y = torch.empty(M, D, dtype=act_dtype(), device=x.device)
    if M:
        _rmsnorm_kernel[(M,)](x, w, y, D, x.stride(0), y.stride(0), eps,
                              BLOCK_D=next_pow2(D), num_warps=8 if D >= 2048 else 1)
    return y


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, out_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, s_row, so_row, HQ,
                         eps, HALF: tl.constexpr, ROUND: tl.constexpr):
    # grid (M, Hq + Hkv): head h < Hq is a q head, else k head h - Hq. The GEMM output row is
    # [q heads | k heads | v heads], each d wide, so head h starts at column h * d for both.
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    c = tl.arange(0, HALF)
    src = qkv_ptr + row * s_row + h * (2 * HALF)
    x1 = tl.load(src + c).to(tl.float32)  # rotate-half pairs (i, i + d/2)
    x2 = tl.load(src + HALF + c).to(tl.float32)
    if h < HQ:
        w1 = tl.load(qw_ptr + c).to(tl.float32)
        w2 = tl.load(qw_ptr + HALF + c).to(tl.float32)
    else:
        w1 = tl.load(kw_ptr + c).to(tl.float32)
        w2 = tl.load(kw_ptr + HALF + c).to(tl.float32)
    r = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
    n1 = x1 * r * w1
    n2 = x2 * r * w2
    if ROUND:  # the reference rounds the normed head to bf16 before RoPE
        n1 = n1.to(tl.bfloat16).to(tl.float32)
        n2 = n2.to(tl.bfloat16).to(tl.float32)
    cs = tl.load(cos_ptr + row * HALF + c)
    sn = tl.load(sin_ptr + row * HALF + c)
    dst = out_ptr + row * so_row + h * (2 * HALF)
    tl.store(dst + c, n1 * cs - n2 * sn)
    tl.store(dst + HALF + c, n2 * cs + n1 * sn)


def qk_norm_rope(qkv: Tensor, q_w: Tensor, k_w: Tensor, cos: Tensor, sin: Tensor, Hq: int,
                 Hkv: int, eps: float) -> Tensor:
    """qkv [M, (Hq + 2 Hkv) d] -> q and k heads normed and rotated: [M, Hq + Hkv, d]
    (act_dtype()); cos/sin [M, d/2] fp32. v stays in qkv (read in place by the attention)."""
    M = qkv.shape[0]
    d = q_w.shape[0]
    out = torch.empty(M, Hq + Hkv, d, dtype=act_dtype(), device=qkv.device)
    if M:
        _qk_norm_rope_kernel[(M, Hq + Hkv)](qkv, out, q_w, k_w, cos, sin, qkv.stride(0),
                                            out.stride(0), Hq, eps, HALF=d // 2,
                                            ROUND=not INTERPRET, num_warps=1)
    return out


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, h_ptr, F, s_g, s_u, s_h, BLOCK: tl.constexpr):
    # h = silu(gate) * up, silu in fp32; gate and up rows F wide (the drafter passes the two
    # halves of its one-GEMM [gate | up] output, kernels/dense swiglu_mlp two GEMM outputs)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < F
    g = tl.load(g_ptr + row * s_g + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * s_u + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * s_h + c, g / (1.0 + tl.exp(-g)) * u, mask=ok)


def silu_mul(gu: Tensor) -> Tensor:
    """gu [M, 2F] -> silu(gate) * up [M, F] in act_dtype()."""
    M, F2 = gu.shape
    F = F2 // 2
    h = torch.empty(M, F, dtype=act_dtype(), device=gu.device)
    BLOCK = min(2048, next_pow2(F))
    if M:
        _silu_mul_kernel[(M, triton.cdiv(F, BLOCK))](gu, gu[:, F:], h, F, gu.stride(0),
                                                     gu.stride(0), h.stride(0), BLOCK=BLOCK,
                                                     num_warps=4)
    return h
