"""tree_mla v2: v1's cascade with the tree block folded into the last prefix split, so a request
with one split is finished in a single launch (README.md: why v1 costs ~50 µs at any size).

    launch 1  _attn_kernel     grid (S, ceil(M / BLOCK_M), B)
              program (s, mb, b): n = max(1, splits(P_b)); programs with s >= n exit before
              touching memory. Split s streams its prefix keys (no mask but the split's end);
              the last split (s = n - 1) then continues the same online softmax over the N tree
              slots under the ancestor bits. n == 1: o_lat (q.dtype) and lse (natural log) are
              written directly; n > 1: normalised o and lse (log2) go to partial slot s.
    launch 2  _combine_kernel  grid (ceil(M / COMBINE_ROWS), C / 128, B)   (only if S > 1)
              requests with n > 1 merge their n partials in a fixed order (0, 1, ..., n - 1);
              requests with n == 1 exit at once.

Two policies are registered from this file (both depend on the request's own P only, so both
keep v1's batch invariance): `triton_v2` (v1's, splits of >= 512 keys) and `triton_v2_split128`
(splits of >= 128 keys: 8 programs of 2 tiles instead of 2 of 8 at P = 1024, more partial
traffic where M is large). Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common
from ._common import BLOCK_N, MAX_SPLITS, MIN_SPLIT
from .triton_v1 import _load_k, _load_q, _split_len

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # log2 units -> natural log
BLOCK_M = 64  # query rows (heads x nodes) per program: one wgmma M tile
TREE_BLOCK_N = 32  # tree keys per tile (v1's width: shared memory, README); divides 64
assert 64 % TREE_BLOCK_N == 0
COMBINE_ROWS = 16  # rows per combine program (x 128 columns)


@triton.jit
def _attn_kernel(q_ptr, kv_ptr, plen_ptr, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TREE_BLOCK_N: tl.constexpr,
                 MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PREC: tl.constexpr):
    sp = tl.program_id(0)
    mb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    length = _split_len(P, MIN_SPLIT, MAX_SPLITS, BLOCK_N)
    # P = 0: one split with no prefix keys that still carries the tree block
    n_splits = tl.maximum(tl.cdiv(P, length), 1)
    if sp < n_splits:  # the grid covers splits_grid(T); the rest exit before any load
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows of request b
        row_ok = rows < M
        qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
        kv_b = kv_ptr + b * skb
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_M, CP], tl.float32)  # sum of p * V
        start = sp * length
        end = tl.minimum(start + length, P)
        # prefix tiles: every one holds >= 1 live key, so m_new is finite
        for k0 in range(start, end, BLOCK_N):
            slots = k0 + tl.arange(0, BLOCK_N)
            ok = slots < end
            kc, kr = _load_k(kv_b, slots, ok, skt, skd, C, R, CP, RP, UPCAST)
            s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
            s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
            s = tl.where(ok[None, :], s, float("-inf"))  # [BLOCK_M, BLOCK_N]
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None], input_precision=DOT_PREC)
            m_i = m_new
        if sp == n_splits - 1:
            # the tree slots P + j, j < N, visible to node i iff bit j of anc_bits[b, i];
            # tile width fixed whatever N is (batch invariance)
            anc_rows = anc_ptr + b * sab + (rows // H) * san  # [BLOCK_M]
            for j0 in range(0, N, TREE_BLOCK_N):
                j = j0 + tl.arange(0, TREE_BLOCK_N)
                ok = (j < N) & (P + j < T)  # P + j < T: memory safety for bad prefix_lens
                kc, kr = _load_k(kv_b, P + j, ok, skt, skd, C, R, CP, RP, UPCAST)
                s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
                s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
                # TREE_BLOCK_N divides 64: the tile's keys share one mask word per row
                word = tl.load(anc_rows + (j0 // 64) * saw, mask=row_ok, other=0)  # [BLOCK_M]
                vis = ((word[:, None] >> (j % 64).to(tl.int64)[None, :]) & 1) != 0
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
        # every real row sees >= 1 key (its own slot in the last split, the prefix in the
        # others), so l_i > 0 there; rows past M are masked and kept away from 0/0
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


@triton.jit
def _combine_kernel(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, T, M, S_GRID,
                    C: tl.constexpr, CP: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr, MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """LSE merge of request b's n > 1 partials in a fixed order (0, 1, ..., n - 1), BLOCK_R
    rows x BLOCK_C columns; requests with one split were finished by _attn_kernel."""
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    n_splits = tl.cdiv(P, _split_len(P, MIN_SPLIT, MAX_SPLITS, BLOCK_N))
    if n_splits > 1:
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < M
        cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        first = b * S_GRID * M + rows  # split 0's rows; split s adds s * M
        m = tl.load(lpart_ptr + first, mask=row_ok, other=0.0)  # finite (log2 units)
        for sp in range(1, n_splits):
            m = tl.maximum(m, tl.load(lpart_ptr + first + sp * M, mask=row_ok, other=0.0))
        l_sum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        for sp in range(0, n_splits):
            w = tl.exp2(tl.load(lpart_ptr + first + sp * M, mask=row_ok, other=0.0) - m)
            l_sum += w
            acc += tl.load(opart_ptr + (first + sp * M)[:, None] * CP + cc[None, :],
                           mask=row_ok[:, None], other=0.0) * w[:, None]
        out = acc / l_sum[:, None]
        o_rows = b * M + rows
        tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cc < C)[None, :])
        tl.store(lse_ptr + o_rows, (m + tl.log2(l_sum)) * LN2, mask=row_ok & (cb == 0))


def _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
            min_split):
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
    # split programs per request, from the shape only (>= 1: the tree block needs a program)
    S = max(1, _common.splits_grid(T, min_split))
    m_blocks = triton.cdiv(M, BLOCK_M)
    # partials only where some request can have 2+ splits (S > 1, known from T alone)
    o_part = torch.empty(B, S, M, CP, dtype=torch.float32, device=q.device) if S > 1 else lse
    l_part = torch.empty(B, S, M, dtype=torch.float32, device=q.device) if S > 1 else lse
    policy = dict(MIN_SPLIT=min_split, MAX_SPLITS=MAX_SPLITS, BLOCK_N=BLOCK_N)
    _attn_kernel[(S, m_blocks, B)](
        q, kv_cache, prefix_lens, anc_bits, o_lat, lse, o_part, l_part,
        *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, S, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, BLOCK_M=BLOCK_M, TREE_BLOCK_N=TREE_BLOCK_N,
        UPCAST=_common.interpreting(), DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        **policy, num_warps=8 if CP >= 256 else 4, num_stages=2)
    if S > 1:
        block_c = min(CP, 128)
        _combine_kernel[(triton.cdiv(M, COMBINE_ROWS), CP // block_c, B)](
            prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, S, C=C,
            CP=CP, BLOCK_R=COMBINE_ROWS, BLOCK_C=block_c, **policy, num_warps=4)
    return o_lat, lse


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v1's split
    policy (splits of >= 512 keys). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   MIN_SPLIT)


def tree_mla_triton_split128(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                             anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int,
                             *, validate: bool = False):
    """As tree_mla_triton with splits of >= 128 keys (more programs, fewer serial tiles each,
    at small P; the same partition as v1 from P = 8192 up)."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   128)
