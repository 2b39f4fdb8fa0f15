"""tree_mla v1: the cascade of notes/kimi_mla.md §4.6 in two launches, clear before fast.

    launch 1  _prefix_kernel      grid (S, ceil(M / BLOCK_M), B)
              split s of request b's committed prefix [0, P_b), no mask but the split's end;
              M = N * H rows (all heads x all tree rows of the request) in the M dimension of
              tl.dot, so each latent K tile is read once for all of them.
              -> o_part [B, S, M, C] fp32 (normalised), lse_part [B, S, M] fp32 (log2 units)
    launch 2  _tree_merge_kernel  grid (ceil(M / BLOCK_M), B)
              the N tree slots P_b .. P_b + N - 1 under the ancestor bitmask, then the LSE
              merge of the request's prefix partials (fixed order: tree, split 0, 1, ...)
              -> o_lat [B, N, H, C] in q.dtype, lse [B, N, H] fp32 (natural log)

Each K tile [BLOCK_N, C + R] is loaded once as its C part (the V tile too: V = the latent's
first C columns) and its R part; S = Qc Kc^T + Qr Kr^T. The [BLOCK_M, C] fp32 accumulator is
held whole by a program (8 warps at C = 512: 128 registers a thread; sm90.py reports).

Legend: _common.py. Softmax in base 2: scores scaled by softmax_scale * log2(e).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _common
from ._common import BLOCK_N, MAX_SPLITS, MIN_SPLIT

LOG2E = 1.4426950408889634
BLOCK_M = 64  # query rows (heads x nodes) per program: one wgmma M tile
# tree tiles: 32 keys so two pipeline stages fit shared memory (64 needs 248 KB > 227 KB)
TREE_BLOCK_N = 32
COMBINE_ROWS = 16  # rows per combine program (x 128 columns: 8 KB of fp32 per partial)


@triton.jit
def _split_len(P, MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per prefix split for a request of prefix length P (_common.split_len)."""
    per = tl.cdiv(P, MAX_SPLITS)
    return tl.maximum(tl.cdiv(per, BLOCK_N) * BLOCK_N, MIN_SPLIT)


@triton.jit
def _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd,
            C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
            UPCAST: tl.constexpr):
    """Rows m = node * H + head of request b: (Qc [BLOCK_M, CP], Qr [BLOCK_M, RP])."""
    cc = tl.arange(0, CP)
    rr = tl.arange(0, RP)
    row_ok = rows < M
    base = q_ptr + b * sqb + (rows // H) * sqn + (rows % H) * sqh  # [BLOCK_M] pointers
    qc = tl.load(base[:, None] + cc[None, :] * sqd,
                 mask=row_ok[:, None] & (cc < C)[None, :], other=0.0)
    qr = tl.load(base[:, None] + (C + rr)[None, :] * sqd,
                 mask=row_ok[:, None] & (rr < R)[None, :], other=0.0)
    if UPCAST:  # interpreter: bf16 tl.dot is wrong there
        qc = qc.to(tl.float32)
        qr = qr.to(tl.float32)
    return qc, qr


@triton.jit
def _load_k(kv_b, slots, ok, skt, skd, C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr,
            RP: tl.constexpr, UPCAST: tl.constexpr):
    """Latent rows `slots` [BLOCK_N]: (Kc [BLOCK_N, CP] = V, Kr [BLOCK_N, RP]); rows not `ok`
    read as 0, so NaN past a request's length never reaches p @ V."""
    cc = tl.arange(0, CP)
    rr = tl.arange(0, RP)
    row = kv_b + slots * skt
    kc = tl.load(row[:, None] + cc[None, :] * skd, mask=ok[:, None] & (cc < C)[None, :],
                 other=0.0)
    kr = tl.load(row[:, None] + (C + rr)[None, :] * skd, mask=ok[:, None] & (rr < R)[None, :],
                 other=0.0)
    if UPCAST:
        kc = kc.to(tl.float32)
        kr = kr.to(tl.float32)
    return kc, kr


@triton.jit
def _prefix_kernel(q_ptr, kv_ptr, plen_ptr, opart_ptr, lpart_ptr,
                   sqb, sqn, sqh, sqd, skb, skt, skd, s_plen,
                   T, H, M, S_GRID, qk_scale,
                   C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr,
                   MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr):
    sp = tl.program_id(0)
    mb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    length = _split_len(P, MIN_SPLIT, MAX_SPLITS, BLOCK_N)
    start = sp * length
    # splits past the prefix run zero iterations and store nothing (the merge never reads them)
    end = tl.minimum(start + length, P)
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows of request b
    qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
    kv_b = kv_ptr + b * skb
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, CP], tl.float32)  # sum of p * V
    for k0 in range(start, end, BLOCK_N):
        slots = k0 + tl.arange(0, BLOCK_N)
        ok = slots < end
        kc, kr = _load_k(kv_b, slots, ok, skt, skd, C, R, CP, RP, UPCAST)
        s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
        s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))  # [BLOCK_M, BLOCK_N]
        # every tile holds >= 1 live key, so m_new is finite and exp2 never sees inf - inf
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    cc = tl.arange(0, CP)
    part = (b * (S_GRID + 1) + sp) * M + rows  # [BLOCK_M] rows of partial slot sp
    row_ok = (rows < M) & (start < P)
    l_i = tl.where(row_ok, l_i, 1.0)  # empty splits / rows past M: masked, and no 0/0
    tl.store(opart_ptr + part[:, None] * CP + cc[None, :], acc / l_i[:, None],
             mask=row_ok[:, None])
    tl.store(lpart_ptr + part, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _tree_kernel(q_ptr, kv_ptr, plen_ptr, anc_ptr, opart_ptr, lpart_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PREC: tl.constexpr):
    """The N tree slots P_b .. P_b + N - 1 under the ancestor bitmask -> partial slot S_GRID."""
    mb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    node = rows // H  # [BLOCK_M] tree row of each query row
    qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
    kv_b = kv_ptr + b * skb
    anc_rows = anc_ptr + b * sab + node * san  # [BLOCK_M]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, CP], tl.float32)
    # key j = slot P + j, visible to node i iff bit j of anc_bits[b, i]; the tile width is
    # BLOCK_N whatever N is, so a row's sums never depend on N (README: batch invariance)
    for j0 in range(0, N, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] tree key index
        ok = (j < N) & (P + j < T)  # P + j < T: memory safety for bad prefix_lens only
        kc, kr = _load_k(kv_b, P + j, ok, skt, skd, C, R, CP, RP, UPCAST)
        s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
        s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
        word = tl.load(anc_rows[:, None] + (j // 64)[None, :] * saw,
                       mask=row_ok[:, None] & ok[None, :], other=0)  # [BLOCK_M, BLOCK_N] i64
        vis = ((word >> (j % 64).to(tl.int64)[None, :]) & 1) != 0
        s = tl.where(vis & ok[None, :], s, float("-inf"))
        # a tile may hide every key from a row (its ancestors live in another tile): keep the
        # max finite so exp2 sees -inf - finite = -inf, never -inf - -inf = NaN
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    # every real row sees itself (bit i of row i), so l_i > 0 there; rows past M are masked
    l_i = tl.where(row_ok, l_i, 1.0)
    cc = tl.arange(0, CP)
    part = (b * (S_GRID + 1) + S_GRID) * M + rows
    tl.store(opart_ptr + part[:, None] * CP + cc[None, :], acc / l_i[:, None],
             mask=row_ok[:, None])
    tl.store(lpart_ptr + part, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _combine_kernel(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, T, M, S_GRID,
                    C: tl.constexpr, CP: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr, MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """LSE merge of request b's partials, in a fixed order (tree, split 0, 1, ...), for BLOCK_R
    rows x BLOCK_C output columns."""
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    n_splits = tl.cdiv(P, _split_len(P, MIN_SPLIT, MAX_SPLITS, BLOCK_N))
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < M
    cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    tree = (b * (S_GRID + 1) + S_GRID) * M + rows  # the tree partial's rows
    first = b * (S_GRID + 1) * M + rows  # split 0's rows; split s adds s * M
    # pass 1: the max and the sum of the weights (lse values are finite: log2 units)
    m = tl.load(lpart_ptr + tree, mask=row_ok, other=0.0)
    for sp in range(0, n_splits):
        m = tl.maximum(m, tl.load(lpart_ptr + first + sp * M, mask=row_ok, other=0.0))
    w = tl.exp2(tl.load(lpart_ptr + tree, mask=row_ok, other=0.0) - m)
    l_sum = w
    acc = tl.load(opart_ptr + tree[:, None] * CP + cc[None, :], mask=row_ok[:, None],
                  other=0.0) * w[:, None]
    for sp in range(0, n_splits):
        w = tl.exp2(tl.load(lpart_ptr + first + sp * M, mask=row_ok, other=0.0) - m)
        l_sum += w
        acc += tl.load(opart_ptr + (first + sp * M)[:, None] * CP + cc[None, :],
                       mask=row_ok[:, None], other=0.0) * w[:, None]
    out = acc / l_sum[:, None]
    o_rows = (b * M + rows).to(tl.int64)  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
    tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cc < C)[None, :])
    lse = (m + tl.log2(l_sum)) * 0.6931471805599453  # log2 units -> natural log
    tl.store(lse_ptr + o_rows, lse, mask=row_ok & (cb == 0))


def launch_args(q, kv_lora_rank):
    """Constexprs of the attention launches (prefix and tree)."""
    C, R = kv_lora_rank, q.shape[-1] - kv_lora_rank
    return dict(C=C, R=R, CP=_common.next_pow2(C), RP=max(16, _common.next_pow2(R)),
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, UPCAST=_common.interpreting(),
                DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32")


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla.

    No host sync unless validate=True (then P_b >= 0 and P_b + N <= T are checked)."""
    B, N, H, D, T, W = _common.check_inputs(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                            kv_lora_rank)
    if validate:
        _common.validate_contents(kv_cache, prefix_lens, N)
    C, M = kv_lora_rank, N * H
    o_lat = torch.empty(B, N, H, C, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, N, H, dtype=torch.float32, device=q.device)
    if B == 0:
        return o_lat, lse
    meta = launch_args(q, kv_lora_rank)
    CP = meta["CP"]
    qk_scale = float(softmax_scale) * LOG2E
    S = _common.splits_grid(T)  # prefix splits per request in the grid (from the shape only)
    m_blocks = triton.cdiv(M, BLOCK_M)
    # partials [B, S + 1, M, CP]: slots 0..S-1 the prefix splits, slot S the tree block
    o_part = torch.empty(B, S + 1, M, CP, dtype=torch.float32, device=q.device)
    l_part = torch.empty(B, S + 1, M, dtype=torch.float32, device=q.device)
    warps = 8 if CP >= 256 else 4
    q_strides = (q.stride(0), q.stride(1), q.stride(2), q.stride(3))
    kv_strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2))
    common = (*q_strides, *kv_strides, prefix_lens.stride(0))
    if S > 0:
        _prefix_kernel[(S, m_blocks, B)](
            q, kv_cache, prefix_lens, o_part, l_part, *common, T, H, M, S, qk_scale, **meta,
            MIN_SPLIT=MIN_SPLIT, MAX_SPLITS=MAX_SPLITS, num_warps=warps, num_stages=2)
    _tree_kernel[(m_blocks, B)](
        q, kv_cache, prefix_lens, anc_bits, o_part, l_part, *common, *anc_bits.stride(), T, N,
        H, M, S, qk_scale, **(meta | dict(BLOCK_N=TREE_BLOCK_N)), num_warps=warps, num_stages=2)
    block_c = min(CP, 128)
    _combine_kernel[(triton.cdiv(M, COMBINE_ROWS), CP // block_c, B)](
        prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, S, C=C, CP=CP,
        BLOCK_R=COMBINE_ROWS, BLOCK_C=block_c, MIN_SPLIT=MIN_SPLIT, MAX_SPLITS=MAX_SPLITS,
        BLOCK_N=BLOCK_N, num_warps=4)
    return o_lat, lse


assert math.isclose(LOG2E, 1 / math.log(2))
