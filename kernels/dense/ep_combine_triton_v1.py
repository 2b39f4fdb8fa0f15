"""The owner's side of the EP combine (op ep_combine, reference/ep_plan.py) as one Triton kernel.

After the results come back the engine path gathered them into (token, slot, member) order,
cast them to fp32, ran an einsum (a cuBLAS batched GEMM) for the weighted slot sum, padded
the slice for the all-gather and cast it back: ~6 launches a MoE layer. Here one program per
(owned row, column block) gathers its K x tp rows through `order`, sums the tp partials and
the weighted slots in fp32 (slot order, no atomics: deterministic), rounds once, and writes
zeros for the padding rows.

Numerics: fp32 sums, not the float64 reference: engine-only, within the dtype-derived
tolerance. `order` entries outside [0, S) are a caller bug (EPRoutes makes a permutation);
`validate=True` checks on the host.
Legend: S = Tm K tp rows back, Tm owned tokens, K slots, D width, chunk padded rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from ..int4_moe._common import _to_bf16

BLOCK_D = 1024
DTYPES = (torch.bfloat16, torch.float32)


@triton.jit
def _ep_combine_kernel(back_ptr, order_ptr, w_ptr, out_ptr, Tm, D, s_b, s_wt, s_wk, s_o,
                       K: tl.constexpr, TP: tl.constexpr, BLOCK_D: tl.constexpr,
                       OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr):
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    acc = tl.zeros([BLOCK_D], tl.float32)
    if t < Tm:
        for j in tl.static_range(K):
            y = tl.zeros([BLOCK_D], tl.float32)
            for i in tl.static_range(TP):  # width-slice partials in rank order
                src = tl.load(order_ptr + (t * K + j) * TP + i)
                y += tl.load(back_ptr + src * s_b + d, mask=d_ok, other=0.0).to(tl.float32)
            acc += tl.load(w_ptr + t * s_wt + j * s_wk).to(tl.float32) * y
    dst = out_ptr + t.to(tl.int64) * s_o + d
    if OUT_BF16:
        tl.store(dst, _to_bf16(acc, INTERPRET), mask=d_ok)
    else:
        tl.store(dst, acc, mask=d_ok)


def ep_combine(back: Tensor, order: Tensor, weights: Tensor, chunk: int, tp: int,
               out_dtype: torch.dtype, validate: bool = False) -> Tensor:
    """reference/ep_plan.py ep_combine's contract in one launch: [S, D] -> [chunk, D]."""
    _require(isinstance(back, Tensor) and back.dim() == 2 and back.dtype in DTYPES, "back",
             f"a [S, D] tensor of one of {[str(d) for d in DTYPES]}",
             (getattr(back, "dtype", type(back)), tuple(getattr(back, "shape", ()))))
    _require(out_dtype in DTYPES, "out_dtype", f"one of {[str(d) for d in DTYPES]}", out_dtype)
    _require(weights.dim() == 2 and weights.is_floating_point(), "weights", "float [Tm, K]",
             (weights.dtype, tuple(weights.shape)))
    Tm, K = weights.shape
    _require(isinstance(tp, int) and tp >= 1, "tp", "an int >= 1", tp)
    S = Tm * K * tp
    _require(back.shape[0] == S, "back", f"{S} rows (Tm {Tm} x K {K} x tp {tp})",
             back.shape[0])
    _require(order.dtype in (torch.int32, torch.int64) and tuple(order.shape) == (S,), "order",
             f"int [{S}]", (order.dtype, tuple(order.shape)))
    _require(isinstance(chunk, int) and chunk >= Tm, "chunk", f"an int >= Tm ({Tm})", chunk)
    for name, t in (("order", order), ("weights", weights)):
        _require(t.device == back.device, name, f"on {back.device} (back's device)", t.device)
    _require(back.is_cuda or INTERPRET, "back", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             back.device)
    if validate and S:
        lo, hi = int(order.min()), int(order.max())  # host sync
        _require(lo >= 0 and hi < S, "order", f"send positions in [0, {S})", f"[{lo}, {hi}]")
    D = back.shape[1]
    if D and back.stride(1) != 1:
        back = back.contiguous()
    out = torch.empty(chunk, D, dtype=out_dtype, device=back.device)
    if chunk and D:
        bd = min(BLOCK_D, next_pow2(D))
        _ep_combine_kernel[(chunk, triton.cdiv(D, bd))](
            back, order, weights, out, Tm, D, back.stride(0), weights.stride(0),
            weights.stride(1), out.stride(0), K=K, TP=tp, BLOCK_D=bd,
            OUT_BF16=out_dtype == torch.bfloat16, INTERPRET=INTERPRET, num_warps=4)
    return out
