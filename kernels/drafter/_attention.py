"""Non-causal block attention over the drafter's cached context + the block, split-KV flash.

One program owns one (request b, kv head h) and a chunk of the context: its G query heads x S
block rows (G*S = 64 rows for the Kimi drafter) are one [BLOCK_Q, d] tile, so each cached K/V
row is read once for the whole query group (GQA). The context is split into NSPLIT chunks so
that bs 1 still fills the GPU (8 kv heads alone would be 8 programs); split 0 also takes the
block's own S keys. With NSPLIT == 1 the kernel normalises and writes the output itself;
otherwise each split writes (acc, m, l) partials that `_combine_kernel` merges (one split
after the other, or all loaded at once: `combine_tiles`).

Mask (reference/drafter.py `_mask`), query position qp = P + s, key position kp:
    context keys  kp in [lo, P), lo = max(0, P - W + 1) on sliding layers (|qp - kp| < W), else 0
    block keys    all S; sliding: |qp - kp| < W, and kp <= qp with causal_sliding_in_block
Cache slots >= P may hold NaN: they are never loaded (masked loads with other=0).
Scores use exp2 with log2(e) folded into the scale; P is rounded to bf16 for the P.V dot on a
GPU (FlashAttention's rounding), fp32 under the interpreter.

Legend: B batch, S block rows, T cache slots, Hkv kv heads, G = Hq / Hkv, d head_dim.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, act_dtype, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _online_update(q, k, v, ok, m_i, l_i, acc, qk_scale, DOT_BF16: tl.constexpr):
    if DOT_BF16:
        s = tl.dot(q, tl.trans(k))
    else:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    s = tl.where(ok, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_BF16:
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
    return m_new, l_i, acc


@triton.jit
def _attn_split_kernel(
        q_ptr, kb_ptr, vb_ptr, kc_ptr, vc_ptr, start_ptr, o_ptr, po_ptr, pm_ptr, pl_ptr,
        sq_b, sq_s, sq_h, skb_b, skb_s, skb_h, svb_b, svb_s, svb_h,
        skc_b, skc_t, skc_h, svc_b, svc_t, svc_h, so_b, so_s, so_h,
        T, W, qk_scale, HKV, NSPLIT, chunk,
        S: tl.constexpr, G: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, SLIDING: tl.constexpr,
        CAUSAL_BLOCK: tl.constexpr, FINAL: tl.constexpr, DOT_BF16: tl.constexpr):
    pid = tl.program_id(0)
    j = tl.program_id(1)
    b = (pid // HKV).to(tl.int64)
    h = pid % HKV
    P = tl.minimum(tl.maximum(tl.load(start_ptr + b).to(tl.int32), 0), T)  # memory safety

    rows = tl.arange(0, BLOCK_Q)  # row r = block row r // G, query head h * G + r % G
    s_of = rows // G
    qh = h * G + rows % G
    row_ok = rows < S * G
    qpos = P + s_of
    dc = tl.arange(0, HEAD_D)
    q = tl.load(q_ptr + b * sq_b + s_of[:, None] * sq_s + qh[:, None] * sq_h + dc[None, :],
                mask=row_ok[:, None], other=0.0)
    if DOT_BF16:
        q = q.to(tl.bfloat16)

    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_D], tl.float32)

    # this split's context chunk [a, e)
    lo = 0
    if SLIDING:
        lo = tl.maximum(P - W + 1, 0)
    a = lo + j * chunk
    e = tl.minimum(a + chunk, P)
    for n0 in range(a, e, BLOCK_N):
        kp = n0 + tl.arange(0, BLOCK_N)
        kok = kp < e
        k = tl.load(kc_ptr + b * skc_b + kp[:, None].to(tl.int64) * skc_t + h * skc_h
                    + dc[None, :], mask=kok[:, None], other=0.0)
        v = tl.load(vc_ptr + b * svc_b + kp[:, None].to(tl.int64) * svc_t + h * svc_h
                    + dc[None, :], mask=kok[:, None], other=0.0)
        ok = kok[None, :] & row_ok[:, None]
        if SLIDING:
            ok = ok & ((qpos[:, None] - kp[None, :]) < W)
        m_i, l_i, acc = _online_update(q, k, v, ok, m_i, l_i, acc, qk_scale, DOT_BF16)

    if j == 0:  # the block's own S keys at positions P .. P + S - 1
        sk = tl.arange(0, BLOCK_S)
        kok = sk < S
        k = tl.load(kb_ptr + b * skb_b + sk[:, None] * skb_s + h * skb_h + dc[None, :],
                    mask=kok[:, None], other=0.0)
        v = tl.load(vb_ptr + b * svb_b + sk[:, None] * svb_s + h * svb_h + dc[None, :],
                    mask=kok[:, None], other=0.0)
        ok = kok[None, :] & row_ok[:, None]
        if SLIDING:
            rel = s_of[:, None] - sk[None, :]  # qp - kp
            ok = ok & (rel < W) & (rel > -W)
            if CAUSAL_BLOCK:
                ok = ok & (rel >= 0)
        m_i, l_i, acc = _online_update(q, k, v, ok, m_i, l_i, acc, qk_scale, DOT_BF16)

    if FINAL:  # one split: every row saw at least its own block key, so l_i > 0
        o = acc / tl.where(row_ok, l_i, 1.0)[:, None]
        tl.store(o_ptr + b * so_b + s_of[:, None] * so_s + qh[:, None] * so_h + dc[None, :], o,
                 mask=row_ok[:, None])
    else:
        base = (pid * NSPLIT + j).to(tl.int64) * BLOCK_Q
        tl.store(pm_ptr + base + rows, m_i)
        tl.store(pl_ptr + base + rows, l_i)
        tl.store(po_ptr + (base + rows[:, None]) * HEAD_D + dc[None, :], acc)


@triton.jit
def _combine_kernel(o_ptr, po_ptr, pm_ptr, pl_ptr, so_b, so_s, so_h, HKV, NSPLIT,
                    S: tl.constexpr, G: tl.constexpr, HEAD_D: tl.constexpr,
                    BLOCK_Q: tl.constexpr, ROWS: tl.constexpr, PARTS: tl.constexpr):
    # grid (B * Hkv, BLOCK_Q / ROWS): ROWS query rows of one (request, kv head) a program.
    # PARTS 0: the splits merged one after the other (a load latency each); PARTS a power of
    # two >= NSPLIT: all of them loaded at once as a [PARTS, ROWS, d] tile and merged by one
    # max and two sums over the parts (one load latency; another summation order)
    pid = tl.program_id(0)
    b = (pid // HKV).to(tl.int64)
    h = pid % HKV
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    dc = tl.arange(0, HEAD_D)
    if PARTS == 0:
        m_g = tl.full([ROWS], float("-inf"), tl.float32)
        l_g = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, HEAD_D], tl.float32)
        for j in range(0, NSPLIT):
            base = (pid * NSPLIT + j).to(tl.int64) * BLOCK_Q
            m_j = tl.load(pm_ptr + base + rows)
            l_j = tl.load(pl_ptr + base + rows)
            a_j = tl.load(po_ptr + (base + rows[:, None]) * HEAD_D + dc[None, :])
            m_new = tl.maximum(m_g, m_j)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            al = tl.exp2(m_g - m_safe)
            be = tl.exp2(m_j - m_safe)
            acc = acc * al[:, None] + a_j * be[:, None]
            l_g = l_g * al + l_j * be
            m_g = m_new
    else:
        j = tl.arange(0, PARTS)
        jok = j < NSPLIT
        base = (pid * NSPLIT + j).to(tl.int64) * BLOCK_Q  # [PARTS]
        at = base[:, None] + rows[None, :]  # [PARTS, ROWS]
        m_j = tl.load(pm_ptr + at, mask=jok[:, None], other=float("-inf"))
        l_j = tl.load(pl_ptr + at, mask=jok[:, None], other=0.0)
        a_j = tl.load(po_ptr + at[:, :, None] * HEAD_D + dc[None, None, :],
                      mask=jok[:, None, None], other=0.0)  # [PARTS, ROWS, d]
        m_g = tl.max(m_j, 0)
        m_safe = tl.where(m_g == float("-inf"), 0.0, m_g)
        be = tl.exp2(m_j - m_safe[None, :])  # 0 for the padding parts and empty splits
        l_g = tl.sum(l_j * be, 0)
        acc = tl.sum(a_j * be[:, :, None], 0)
    s_of = rows // G
    qh = h * G + rows % G
    row_ok = rows < S * G
    o = acc / tl.where(row_ok, l_g, 1.0)[:, None]
    tl.store(o_ptr + b * so_b + s_of[:, None] * so_s + qh[:, None] * so_h + dc[None, :], o,
             mask=row_ok[:, None])


def splits_for(B: int, Hkv: int, span: int, block_n: int, n_sm: int,
               min_tiles: int = 4, max_splits: int | None = None) -> int:
    """Context splits: enough programs for ~2 per SM, never a split shorter than min_tiles
    key tiles (4: triton_v1-v4's rule, tuned where 8 kv heads share the launch), at most
    max_splits (None: no cap; triton_v6's 32 keeps the one-load combine at 2+ rows a program)."""
    want = max(1, -(-2 * n_sm // max(1, B * Hkv)))
    n = max(1, min(want, -(-span // (min_tiles * block_n))))
    return n if max_splits is None else max(1, min(n, max_splits))


ONE_LOAD_ELEMS = 8192  # fp32 a one-load combine program holds: 64 registers a thread at 4 warps


def combine_tiles(nsplit: int, block_q: int, d: int) -> tuple[int, int]:
    """(PARTS, ROWS) of the one-load combine: the splits padded to a power of two, as many
    query rows a program (a power of two) as keep the [PARTS, ROWS, d] tile within
    ONE_LOAD_ELEMS; (0, 1), the serial merge, where one row's parts alone exceed it."""
    parts = next_pow2(nsplit)
    if parts * d > ONE_LOAD_ELEMS:
        return 0, 1
    rows = 1
    while rows * 2 <= block_q and parts * d * rows * 2 <= ONE_LOAD_ELEMS:
        rows *= 2
    return parts, rows


def block_attention(q: Tensor, kb: Tensor, vb: Tensor, kc: Tensor, vc: Tensor, start: Tensor,
                    sliding: bool, window: int, causal_block: bool, n_sm: int,
                    combine_rows: int | None = None, min_tiles: int = 4,
                    one_load: bool = False, max_splits: int | None = None) -> Tensor:
    """q [B, S, Hq, d]; kb, vb [B, S, Hkv, d] (the block's own keys/values; any strides with
    unit stride along d); kc, vc [B, T, Hkv, d] one layer of the cache; start [B] -> o
    [B, S, Hq, d] in act_dtype(). combine_rows: query rows per combine program (default all
    BLOCK_Q of a (request, kv head): triton_v1; triton_v2 splits them, see README).
    min_tiles / max_splits: the shortest split in key tiles and the most splits
    (`splits_for`); one_load: the combine loads every split at once (`combine_tiles`' rows a
    program; combine_rows then unused)."""
    B, S, Hq, d = q.shape
    T, Hkv = kc.shape[1], kc.shape[2]
    G = Hq // Hkv
    o = torch.empty(B, S, Hq, d, dtype=act_dtype(), device=q.device)
    if B == 0:
        return o
    BLOCK_Q = max(16, next_pow2(S * G))
    BLOCK_N = 64 if d <= 128 else 32
    span = min(T, window - 1) if sliding else T  # context keys one request can see
    nsplit = splits_for(B, Hkv, max(span, 1), BLOCK_N, n_sm, min_tiles, max_splits)
    chunk = triton.cdiv(triton.cdiv(max(span, 1), nsplit), BLOCK_N) * BLOCK_N
    final = nsplit == 1
    if final:
        po = pm = pl = o  # unused
    else:
        po = torch.empty(B * Hkv * nsplit * BLOCK_Q * d, dtype=torch.float32, device=q.device)
        pm = torch.empty(B * Hkv * nsplit * BLOCK_Q, dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
    args = [q, kb, vb, kc, vc, start, o, po, pm, pl,
            *q.stride()[:3], *kb.stride()[:3], *vb.stride()[:3], *kc.stride()[:3],
            *vc.stride()[:3], *o.stride()[:3],
            T, max(window, 1), d**-0.5 * LOG2E, Hkv, nsplit, chunk]
    _attn_split_kernel[(B * Hkv, nsplit)](
        *args, S=S, G=G, HEAD_D=d, BLOCK_Q=BLOCK_Q, BLOCK_N=BLOCK_N,
        BLOCK_S=max(16, next_pow2(S)), SLIDING=sliding, CAUSAL_BLOCK=causal_block, FINAL=final,
        DOT_BF16=not INTERPRET, num_warps=8, num_stages=3)
    if not final:
        if one_load:
            parts, rows = combine_tiles(nsplit, BLOCK_Q, d)
        else:
            parts, rows = 0, BLOCK_Q if combine_rows is None else min(BLOCK_Q,
                                                                      max(1, combine_rows))
        _combine_kernel[(B * Hkv, triton.cdiv(BLOCK_Q, rows))](
            o, po, pm, pl, *o.stride()[:3], Hkv, nsplit, S=S, G=G, HEAD_D=d, BLOCK_Q=BLOCK_Q,
            ROWS=rows, PARTS=parts, num_warps=4)
    return o
