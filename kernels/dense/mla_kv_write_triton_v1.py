"""The MLA latent-cache write (op mla_kv_write, reference/layers.py) as one Triton kernel.

Per layer the model normalised the latent c (one kernel), rotated k_pe (one), built the slots
(an arange and an add), concatenated [c | k_pe] and scattered it into the cache (an arange,
a cat, an index_put): ~7 launches for N rows of 576 values, 61 times a step. Here one program
per (request, row) reads the kv_a output row once, normalises its C latent values (fp32 sum
of squares, one rounding), rotates its R rope values with the table row of its position
(fp32, one rounding) and writes both into slot prefix_lens[b] + i of the cache.

Numerics: the engine's fp32 RMSNorm and RoPE (kernels/dense triton_v1, rope_triton_v1), not
the float64 reference: engine-only, within the dtype-derived tolerance. Slots at or past the
cache length and positions outside the table are caller bugs: such a row writes nothing
(no write outside the cache, no wrapped angle); `validate=True` checks both on the host.
Legend: B requests, N rows, T cache slots, C latent, R rope, P prefix lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from ..int4_moe._common import _to_bf16


@triton.jit
def _kv_write_kernel(kv_ptr, w_ptr, pos_ptr, tab_ptr, cache_ptr, pre_ptr, N, T, n_tab, eps,
                     s_kb, s_kn, s_kd, s_pb, s_pn, s_tab, s_cb, s_ct, s_pre,
                     C: tl.constexpr, HALF: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr,
                     INTERPRET: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    slot = tl.load(pre_ptr + b * s_pre).to(tl.int64) + i
    pos = tl.load(pos_ptr + b * s_pb + i * s_pn).to(tl.int64)
    row_ok = (slot >= 0) & (slot < T) & (pos >= 0) & (pos < n_tab)
    src = kv_ptr + b * s_kb + i * s_kn
    dst = cache_ptr + b * s_cb + tl.where(row_ok, slot, 0) * s_ct  # never out of the cache
    # latent: RMSNorm in fp32, one rounding
    c = tl.arange(0, BLOCK_C)
    c_ok = c < C
    x = tl.load(src + c * s_kd, mask=c_ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / C + eps)
    w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(dst + c, _to_bf16(x * inv * w, INTERPRET), mask=c_ok & row_ok)
    # rope: pairs (2p, 2p+1) interleaved, else (p, p + R/2)
    p = tl.arange(0, BLOCK_P)
    p_ok = p < HALF
    if INTERLEAVED:
        d1, d2 = 2 * p, 2 * p + 1
    else:
        d1, d2 = p, p + HALF
    x1 = tl.load(src + (C + d1) * s_kd, mask=p_ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + (C + d2) * s_kd, mask=p_ok, other=0.0).to(tl.float32)
    trow = tab_ptr + tl.where(row_ok, pos, 0) * s_tab
    cos = tl.load(trow + p, mask=p_ok, other=0.0)
    sin = tl.load(trow + HALF + p, mask=p_ok, other=0.0)
    tl.store(dst + C + d1, _to_bf16(x1 * cos - x2 * sin, INTERPRET), mask=p_ok & row_ok)
    tl.store(dst + C + d2, _to_bf16(x1 * sin + x2 * cos, INTERPRET), mask=p_ok & row_ok)


def mla_kv_write(kv: Tensor, norm_weight: Tensor, eps: float, positions: Tensor, table: Tensor,
                 interleaved: bool, kv_cache: Tensor, prefix_lens: Tensor,
                 validate: bool = False) -> None:
    """reference/layers.py mla_kv_write's contract, one launch; kv_cache bf16, written in place.
    No host sync unless validate=True (slots and positions in range)."""
    _require(isinstance(kv, Tensor) and kv.dim() == 3 and kv.is_floating_point(), "kv",
             "a float tensor [B, N, C+R]", getattr(kv, "shape", type(kv)))
    B, N, CR = kv.shape
    _require(norm_weight.dim() == 1 and 0 < norm_weight.shape[0] < CR, "norm_weight",
             f"[C] with C < {CR} (kv's last dim)", tuple(norm_weight.shape))
    C = norm_weight.shape[0]
    R = CR - C
    _require(R % 2 == 0, "kv", f"an even rope width C+R - C (C = {C})", R)
    _require(isinstance(kv_cache, Tensor) and kv_cache.dtype == torch.bfloat16, "kv_cache",
             "a bf16 tensor", getattr(kv_cache, "dtype", type(kv_cache)))
    _require(kv_cache.dim() == 3 and kv_cache.shape[0] == B and kv_cache.shape[2] == CR,
             "kv_cache", f"[{B}, T, {CR}]", tuple(kv_cache.shape))
    _require(kv_cache.stride(2) == 1, "kv_cache", "unit stride along C+R", kv_cache.stride())
    _require(positions.dtype in (torch.int32, torch.int64) and tuple(positions.shape) == (B, N),
             "positions", f"int [{B}, {N}]", (positions.dtype, tuple(positions.shape)))
    _require(prefix_lens.dtype in (torch.int32, torch.int64) and tuple(prefix_lens.shape) ==
             (B,), "prefix_lens", f"int [{B}]", (prefix_lens.dtype, tuple(prefix_lens.shape)))
    _require(table.dtype == torch.float32 and table.dim() == 2 and table.shape[1] == R and
             table.stride(1) == 1, "table", f"a unit-stride fp32 [n, {R}] cos|sin table",
             (table.dtype, tuple(table.shape)))
    for name, t in (("norm_weight", norm_weight), ("positions", positions), ("table", table),
                    ("kv_cache", kv_cache), ("prefix_lens", prefix_lens)):
        _require(t.device == kv.device, name, f"on {kv.device} (kv's device)", t.device)
    _require(kv.is_cuda or INTERPRET, "kv", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             kv.device)
    T = kv_cache.shape[1]
    if validate and B * N:
        lo, hi = int(prefix_lens.min()), int(prefix_lens.max()) + N  # host sync
        _require(lo >= 0 and hi <= T, "prefix_lens", f"slots P_b + i within [0, {T})",
                 f"[{lo}, {hi})")
        lo, hi = int(positions.min()), int(positions.max())
        _require(lo >= 0 and hi < table.shape[0], "positions",
                 f"values in [0, {table.shape[0]}) (the table's rows)", f"[{lo}, {hi}]")
    if B * N == 0:
        return
    w = norm_weight.contiguous()
    _kv_write_kernel[(B, N)](
        kv, w, positions, table, kv_cache, prefix_lens, N, T, table.shape[0], eps,
        kv.stride(0), kv.stride(1), kv.stride(2), positions.stride(0), positions.stride(1),
        table.stride(0), kv_cache.stride(0), kv_cache.stride(1), prefix_lens.stride(0),
        C=C, HALF=R // 2, BLOCK_C=next_pow2(C), BLOCK_P=next_pow2(R // 2),
        INTERLEAVED=bool(interleaved), INTERPRET=INTERPRET, num_warps=4)
