"""tree_mla v3: v2's schedule (tree block fused into the last split, direct write for one split,
combine only where a request has 2+ splits) with the prefix K tiles brought in by TMA instead of
per-thread cp.async (README.md, "Design (v3)": why not 2 CTAs/SM, a deeper pipeline or a
split output).

    launch 1  _attn_kernel     grid (S, ceil(M / BLOCK_M), B)
              prefix (P_b >= BLOCK_N): split s walks ceil(len / 64) tiles of 64 keys, each one
              TMA copy of [64, C] and one of [64, R] from a host-built descriptor over
              kv_cache [B, T, C+R]. A split's last tile is shifted back to end at the split's
              end (rows [end - 64, end), all prefix rows: finite) and the keys before its
              nominal start are masked out of the scores, so a TMA tile never reads a slot past
              P_b (where NaN may sit) and needs no row mask: one loop, no peeled tail.
              then (last split) the tree slots by masked pointer loads in tiles of 32, as v2;
              requests with P_b < BLOCK_N take their whole prefix here too (tiles aligned in
              j = slot - P_b from below -P_b; j < 0 visible to every row), so every path's
              choice depends on P_b only.
    launch 2  _combine_kernel  triton_v2's, unchanged (only when S > 1)

TMA needs 16-byte aligned strides and base, a 2-byte dtype (a [64, 512] fp32 tile twice over
does not fit shared memory) and C a power of two; otherwise USE_TMA=False loads the same tiles
(same shifted rows, same masks, same results) through v1's masked pointer loads.
Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _common
from ._common import BLOCK_N, MAX_SPLITS, MIN_SPLIT
from .triton_v1 import _load_k, _load_q, _split_len
from .triton_v2 import _combine_kernel

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # log2 units -> natural log
BLOCK_M = 64  # query rows (heads x nodes) per program: one wgmma M tile
MASKED_BLOCK_N = 32  # keys per masked (tree) tile: shared memory, as v1/v2
COMBINE_ROWS = 16


@triton.jit
def _attn_kernel(q_ptr, kv_ptr, kc_desc, kr_desc, plen_ptr, anc_ptr, o_ptr, lse_ptr,
                 opart_ptr, lpart_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED_BLOCK_N: tl.constexpr,
                 MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr):
    sp = tl.program_id(0)
    mb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    length = _split_len(P, MIN_SPLIT, MAX_SPLITS, BLOCK_N)
    n_splits = tl.maximum(tl.cdiv(P, length), 1)  # P = 0: one split carrying the tree
    if sp < n_splits:  # the grid covers splits_grid(T); the rest exit before any load
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows of request b
        row_ok = rows < M
        qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
        kv_b = kv_ptr + b * skb
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_M, CP], tl.float32)  # sum of p * V
        # P >= BLOCK_N: the split's keys in full-width tiles; P < BLOCK_N: none here, the
        # masked loop takes the prefix (a shifted tile would reach past P)
        start = sp * length
        end = tl.where(P >= BLOCK_N, tl.minimum(start + length, P), start)
        for k0 in range(start, end, BLOCK_N):
            k_ld = tl.minimum(k0, end - BLOCK_N)  # the last tile ends at `end` (>= 0: P >= 64)
            slots = k_ld + tl.arange(0, BLOCK_N)
            if USE_TMA:
                kc = kc_desc.load([b.to(tl.int32), k_ld, 0]).reshape(BLOCK_N, CP)
                kr = kr_desc.load([b.to(tl.int32), k_ld, C]).reshape(BLOCK_N, RP)
                if UPCAST:  # interpreter: bf16 tl.dot is wrong there
                    kc = kc.to(tl.float32)
                    kr = kr.to(tl.float32)
            else:
                kc, kr = _load_k(kv_b, slots, slots < end, skt, skd, C, R, CP, RP, UPCAST)
            s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
            s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
            # keys before k0 belong to the previous tile (shifted last tile): p = 0, and their
            # V rows are finite prefix rows, so they add exactly 0; >= 1 key live per tile
            s = tl.where((slots >= k0)[None, :], s, float("-inf"))  # [BLOCK_M, BLOCK_N]
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None], input_precision=DOT_PREC)
            m_i = m_new
        if sp == n_splits - 1:
            # masked tiles over j = x - P in [j_lo, N): slot x visible to node i iff j < 0
            # (prefix) or bit j of anc_bits[b, i]. j_lo = 0 (v2's tree tiles), or, when the
            # prefix was too short for the loop above, the multiple of MASKED_BLOCK_N at or
            # below -P: tiles stay aligned in j, so a tile with j >= 0 reads one mask word
            j_lo = tl.where(P >= BLOCK_N, 0, -tl.cdiv(P, MASKED_BLOCK_N) * MASKED_BLOCK_N)
            anc_rows = anc_ptr + b * sab + (rows // H) * san  # [BLOCK_M]
            for j0 in range(j_lo, N, MASKED_BLOCK_N):
                j = j0 + tl.arange(0, MASKED_BLOCK_N)
                x = P + j
                ok = (x >= 0) & (j < N) & (x < T)  # x < T: memory safety, bad prefix_lens
                kc, kr = _load_k(kv_b, x, ok, skt, skd, C, R, CP, RP, UPCAST)
                s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
                s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
                # MASKED_BLOCK_N divides 64: a tile with j0 >= 0 shares one word per row
                word = tl.load(anc_rows + (tl.maximum(j0, 0) // 64) * saw,
                               mask=row_ok & (j0 >= 0), other=0)  # [BLOCK_M]
                sh = (tl.maximum(j, 0) % 64).to(tl.int64)
                vis = (((word[:, None] >> sh[None, :]) & 1) != 0) | (j < 0)[None, :]
                s = tl.where(vis & ok[None, :], s, float("-inf"))
                # a tile may hide every key from a row (and P = 0 leaves m_i = -inf): keep
                # the subtracted max finite, so exp2 never sees -inf - -inf = NaN
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None],
                             input_precision=DOT_PREC)
                m_i = m_new
        # every real row sees >= 1 key, so l_i > 0 there; rows past M kept away from 0/0
        l_i = tl.where(row_ok, l_i, 1.0)
        out = acc / l_i[:, None]
        lse2 = m_i + tl.log2(l_i)
        cc = tl.arange(0, CP)
        if n_splits == 1:  # the whole answer: no partial round trip, no combine
            o_rows = b * M + rows  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
            tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & (cc < C)[None, :])
            tl.store(lse_ptr + o_rows, lse2 * LN2, mask=row_ok)
        else:
            part = (b * S_GRID + sp) * M + rows  # [BLOCK_M] rows of partial slot sp
            tl.store(opart_ptr + part[:, None] * CP + cc[None, :], out, mask=row_ok[:, None])
            tl.store(lpart_ptr + part, lse2, mask=row_ok)


def _tma_ok(kv_cache: torch.Tensor, C: int) -> bool:
    """TMA's rules (16-byte aligned base and strides, unit inner stride) and this kernel's
    (2-byte elements; C a power of two, so the [64, C] box ends at the latent's end)."""
    e = kv_cache.element_size()
    return (e == 2 and C == _common.next_pow2(C)
            and kv_cache.stride(2) == 1 and kv_cache.data_ptr() % 16 == 0
            and all(s * e % 16 == 0 for s in kv_cache.stride()[:2]))


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v1's split
    policy (splits of >= 512 keys). No host sync unless validate=True."""
    B, N, H, D, T, W = _common.check_inputs(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                            kv_lora_rank)
    if validate:
        _common.validate_contents(kv_cache, prefix_lens, N)
    C, M = kv_lora_rank, N * H
    o_lat = torch.empty(B, N, H, C, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, N, H, dtype=torch.float32, device=q.device)
    if B == 0:
        return o_lat, lse
    CP, RP = _common.next_pow2(C), max(16, _common.next_pow2(D - C))
    S = max(1, _common.splits_grid(T, MIN_SPLIT))
    m_blocks = triton.cdiv(M, BLOCK_M)
    o_part = torch.empty(B, S, M, CP, dtype=torch.float32, device=q.device) if S > 1 else lse
    l_part = torch.empty(B, S, M, dtype=torch.float32, device=q.device) if S > 1 else lse
    use_tma = _tma_ok(kv_cache, C)
    if use_tma:  # host-built (pointer, shape, strides only: no sync, graph-capturable)
        shape, strides = list(kv_cache.shape), list(kv_cache.stride())
        kc_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, C])
        # RP >= R columns: those past C+R are outside the tensor, TMA fills them with 0
        kr_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, RP])
    else:
        kc_desc = kr_desc = kv_cache  # unused (USE_TMA=False)
    policy = dict(MIN_SPLIT=MIN_SPLIT, MAX_SPLITS=MAX_SPLITS, BLOCK_N=BLOCK_N)
    _attn_kernel[(S, m_blocks, B)](
        q, kv_cache, kc_desc, kr_desc, prefix_lens, anc_bits, o_lat, lse, o_part, l_part,
        *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, S, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, BLOCK_M=BLOCK_M, MASKED_BLOCK_N=MASKED_BLOCK_N,
        UPCAST=_common.interpreting(), DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        USE_TMA=use_tma, **policy, num_warps=8 if CP >= 256 else 4, num_stages=2)
    if S > 1:
        block_c = min(CP, 128)
        _combine_kernel[(triton.cdiv(M, COMBINE_ROWS), CP // block_c, B)](
            prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, S, C=C,
            CP=CP, BLOCK_R=COMBINE_ROWS, BLOCK_C=block_c, **policy, num_warps=4)
    return o_lat, lse
