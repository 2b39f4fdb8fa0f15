"""tree_mla v4: v3's kernel (TMA prefix tiles, shifted last tile, masked loop for the tree) under
a split policy that gives short contexts short splits and long contexts more of them, the tree
block in its own program where splits are long, and the combine launched as a programmatic
dependent (PDL) of the attention kernel (README.md, "Design (v4)": where v3's ~45 µs went).

    launch 1  _attn_kernel     grid (G, ceil(M / BLOCK_M), B)
              request b has n_pre = splits(P_b) prefix splits (0 when P_b < 64) and
              n_parts = n_pre + sep(P_b) parts (>= 1); part t < n_pre is prefix split t (v3's
              TMA loop), the last part (t = n_parts - 1) also runs the masked loop over the
              tree slots (and over the whole prefix when P_b < 64). sep(P_b) = P_b > 2048: the
              tree is a part of its own, run beside the splits instead of after the last
              one's 8+ tiles; below, it rides on the last split (<= 4 tiles). G =
              parts_grid(T) >= n_parts(P) for every P <= T (programs t >= n_parts exit).
              n_parts == 1: o_lat / lse written directly; else partial slot t.
    launch 2  _combine_kernel  grid (ceil(M / 16), C / 128, B)   (only if G > 1)
              launched with PDL: once every launch-1 program has started, its programs may
              start and wait in griddepcontrol.wait (launch 1 finished, its writes
              visible); requests with
              n_parts > 1 merge parts 0, 1, ..., n_parts - 1 in that order.

Policy (depends on P only, like v1-v3: batch invariant; host twin split_len() below):
    split_len(P) = 256                                    P <= 2048 (<= 8 splits of <= 4 tiles)
                 = max(512, ceil(ceil(P / 32) / 64) * 64)  P >  2048 (5..32 splits)
`triton_v4_split512` (tree_mla_triton_split512) is the same kernel with 512-key splits up to
P = 2048 (v3's partition there): the control for the short splits' extra partials at large M.
Q comes in by TMA as well where q is contiguous and K takes the TMA path (two bulk copies of
[64, C] and [64, R] from q viewed [B * M, D], instead of 18 pointer loads a thread and a
register -> shared-memory pass); otherwise v1's masked pointer loads (same values, bitwise).
TREE_MLA_V4_ABLATE=pdl,qtma (either or both) turns those two off: a timing ablation, and a way
around a driver that will not capture PDL edges; results are the same bits (CPU test).
Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from ..dense.linear_triton_v2 import counters
from . import _common
from ._common import BLOCK_N
from .triton_v1 import _load_k, _load_q
from .triton_v3 import _tma_ok

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # log2 units -> natural log
BLOCK_M = 64  # query rows (heads x nodes) per program: one wgmma M tile
MASKED_BLOCK_N = 32  # keys per masked (tree) tile: shared memory, as v1-v3
COMBINE_ROWS = 16
MERGE_COLS = tl.constexpr(128)  # columns a chunk of triton_v26's in-kernel merge (v4's combine's)
# the policy (README.md, "Design (v4)"): P <= SHORT_UPTO: splits of SHORT_LEN keys; above:
# at least LONG_MIN keys, at most MAX_SPLITS splits; the tree has its own part above SHORT_UPTO
SHORT_UPTO = 2048
SHORT_LEN = 256
LONG_MIN = 512
MAX_SPLITS = 32


class Policy(NamedTuple):
    """The split policy's constants (constexprs of both kernels; host twins below). Other
    versions reuse v4's kernels with other values (triton_v7: by the head count)."""

    short_upto: int = SHORT_UPTO  # P <= short_upto: splits of short_len keys, tree on the last
    short_len: int = SHORT_LEN
    long_min: int = LONG_MIN  # P > short_upto: >= long_min keys, <= max_splits splits, the
    max_splits: int = MAX_SPLITS  # tree in a part of its own


V4 = Policy()
SPLIT512 = V4._replace(short_len=512)  # triton_v4_split512: v3's partition up to 2048


def _with(policy: Policy, short_len: int | None) -> Policy:
    return policy if short_len is None else policy._replace(short_len=short_len)


def split_len(P: int, short_len: int | None = None, policy: Policy = V4) -> int:
    """Host twin of _parts: keys per prefix split of a request with prefix length P under
    `policy` (short_len overrides its short_len: 512 for triton_v4_split512)."""
    policy = _with(policy, short_len)
    if P <= policy.short_upto:
        return policy.short_len
    per = -(-P // policy.max_splits)
    return max(policy.long_min, -(-per // BLOCK_N) * BLOCK_N)


def num_parts(P: int, short_len: int | None = None, policy: Policy = V4) -> tuple[int, int]:
    """(prefix splits, parts) of a request: what _parts computes on the device."""
    n_pre = -(-P // split_len(P, short_len, policy)) if P >= BLOCK_N else 0
    return n_pre, max(1, n_pre + int(P > policy.short_upto))


def parts_grid(T: int, short_len: int | None = None, policy: Policy = V4) -> int:
    """Part programs per request in the grid, from T only: max of num_parts(P) over P <= T
    (P is clamped to T in the kernels)."""
    policy = _with(policy, short_len)
    if T < BLOCK_N:
        return 1
    short = -(-min(T, policy.short_upto) // policy.short_len)
    if T <= policy.short_upto:
        return short
    return max(short, min(policy.max_splits, -(-T // policy.long_min)) + 1)


@triton.jit
def _parts(P, SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr,
           MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(split length, prefix splits, parts) of a request with prefix length P (host twins
    split_len / num_parts): P only, so a row's partition never depends on the launch."""
    long = tl.maximum(tl.cdiv(tl.cdiv(P, MAX_SPLITS), BLOCK_N) * BLOCK_N, LONG_MIN)
    length = tl.where(P <= SHORT_UPTO, SHORT_LEN, long)
    n_pre = tl.where(P >= BLOCK_N, tl.cdiv(P, length), 0)  # P < 64: prefix in the masked loop
    n_parts = tl.maximum(n_pre + (P > SHORT_UPTO).to(tl.int32), 1)
    return length, n_pre, n_parts


@triton.jit
def _attn_kernel(q_ptr, kv_ptr, qc_desc, qr_desc, kc_desc, kr_desc, plen_ptr, anc_ptr, o_ptr,
                 lse_ptr, opart_ptr, lpart_ptr, cnt_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED_BLOCK_N: tl.constexpr,
                 SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr,
                 MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                 USE_TMA: tl.constexpr, USE_PDL: tl.constexpr, Q_TMA: tl.constexpr,
                 MERGE: tl.constexpr = False):
    # the combine may launch once every program of this grid has started (it then waits in
    # griddepcontrol.wait for this grid to finish): its launch overlaps this grid's tail
    if USE_PDL:
        gdc_launch_dependents()
    t = tl.program_id(0)
    mb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    length, n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if t < n_parts:  # the grid covers parts_grid(T); the rest exit before any load
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows of request b
        row_ok = rows < M
        if Q_TMA:  # one bulk copy into shared memory, in flight with the first K tiles
            row0 = (b * M + mb * BLOCK_M).to(tl.int32)
            qc = qc_desc.load([row0, 0])
            qr = qr_desc.load([row0, C])
            if UPCAST:
                qc = qc.to(tl.float32)
                qr = qr.to(tl.float32)
        else:
            qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
        kv_b = kv_ptr + b * skb
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_M, CP], tl.float32)  # sum of p * V
        # prefix split t (t < n_pre, so P >= BLOCK_N): full-width tiles, the last one shifted
        # back to end at the split's end (v3); the tree's own part runs none
        start = t * length
        end = tl.where(t < n_pre, tl.minimum(start + length, P), start)
        for k0 in range(start, end, BLOCK_N):
            k_ld = tl.minimum(k0, end - BLOCK_N)  # >= 0: end >= BLOCK_N when t < n_pre
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
        if t == n_parts - 1:
            # masked tiles over j = x - P in [j_lo, N): slot x visible to node i iff j < 0
            # (prefix) or bit j of anc_bits[b, i]. j_lo = 0 (tree only), or, when the prefix
            # was too short for the TMA loop, the multiple of MASKED_BLOCK_N at or below -P
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
                # a tile may hide every key from a row (and the tree's own part starts at
                # m_i = -inf): keep the subtracted max finite, so exp2 never sees -inf - -inf
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None],
                             input_precision=DOT_PREC)
                m_i = m_new
        # a real row sees >= 1 key of every part (its own slot in the tree's, prefix keys in
        # the others), so l_i > 0; l_i = 0 only for rows past M or an empty ancestor word
        # (malformed input): out = 0 and lse = -inf there, weight 0 in the merge, no 0/0
        l_i = tl.where(row_ok & (l_i > 0), l_i, 1.0)
        out = acc / l_i[:, None]
        lse2 = m_i + tl.log2(l_i)
        cc = tl.arange(0, CP)
        if n_parts == 1:  # the whole answer: no partial round trip, no combine
            o_rows = b * M + rows  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
            tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & (cc < C)[None, :])
            tl.store(lse_ptr + o_rows, lse2 * LN2, mask=row_ok)
        else:
            part = (b * S_GRID + t) * M + rows  # [BLOCK_M] rows of partial slot t
            tl.store(opart_ptr + part[:, None] * CP + cc[None, :], out, mask=row_ok[:, None])
            tl.store(lpart_ptr + part, lse2, mask=row_ok)
            if MERGE:  # triton_v26: the row block's last part to finish merges them all
                _merge_last(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, cnt_ptr, b, mb,
                            rows, row_ok, M, S_GRID, n_parts, C, CP, BLOCK_M)


@triton.jit
def _merge_last(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, cnt_ptr, b, mb, rows, row_ok,
                M, S_GRID, n_parts, C: tl.constexpr, CP: tl.constexpr, BLOCK_M: tl.constexpr):
    """triton_v26 (MERGE): after its partial is stored, a part takes a ticket on its row
    block's counter; the part that draws the last one (n_parts - 1) merges the row block's
    n_parts partials exactly as _combine_kernel does (parts 0, 1, ..., n_parts - 1 whatever
    order they finished in: the same fp32 operations a value, so v4's bits), in 128-column
    chunks, writes o_lat and lse and resets the counter to 0 (the next launch, or CUDA-graph
    replay, finds it zero). The partials it reads were written moments before: from L2
    (.cg: never a stale L1 line), not HBM, and no combine launch."""
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    cnt = cnt_ptr + b * tl.num_programs(1) + mb
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
    if ticket == n_parts - 1:
        tl.debug_barrier()
        first = b * S_GRID * M + rows  # part 0's rows; part t adds t * M
        m = tl.load(lpart_ptr + first, mask=row_ok, other=0.0, cache_modifier=".cg")
        for t in range(1, n_parts):
            m = tl.maximum(m, tl.load(lpart_ptr + first + t * M, mask=row_ok, other=0.0,
                                      cache_modifier=".cg"))
        o_rows = b * M + rows
        for c0 in tl.static_range(0, CP, MERGE_COLS):
            cc = c0 + tl.arange(0, MERGE_COLS)
            l_sum = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, MERGE_COLS], tl.float32)
            for t in range(0, n_parts):
                w = tl.exp2(tl.load(lpart_ptr + first + t * M, mask=row_ok, other=0.0,
                                    cache_modifier=".cg") - m)
                l_sum += w
                acc += tl.load(opart_ptr + (first + t * M)[:, None] * CP + cc[None, :],
                               mask=row_ok[:, None], other=0.0, cache_modifier=".cg") * w[:, None]
            out = acc / l_sum[:, None]
            tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & (cc < C)[None, :])
            if c0 == 0:
                tl.store(lse_ptr + o_rows, (m + tl.log2(l_sum)) * LN2, mask=row_ok)
        tl.atomic_xchg(cnt, 0)  # ready for the next launch / graph replay


@triton.jit
def _combine_kernel(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, T, M, S_GRID,
                    C: tl.constexpr, CP: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr, SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr,
                    LONG_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                    USE_PDL: tl.constexpr):
    """LSE merge of request b's n_parts > 1 partials in a fixed order (0, 1, ..., n_parts - 1:
    the prefix splits, then the tree's part), BLOCK_R rows x BLOCK_C columns."""
    if USE_PDL:  # launched early (PDL): wait until _attn_kernel's writes are visible
        gdc_wait()
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    _len, _n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if n_parts > 1:
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < M
        cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        first = b * S_GRID * M + rows  # part 0's rows; part t adds t * M
        # part 0 is a prefix split (finite lse); the tree's part may be -inf for a row whose
        # ancestor word is empty (weight 0, its o is 0: no NaN)
        m = tl.load(lpart_ptr + first, mask=row_ok, other=0.0)
        for t in range(1, n_parts):
            m = tl.maximum(m, tl.load(lpart_ptr + first + t * M, mask=row_ok, other=0.0))
        l_sum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        for t in range(0, n_parts):
            w = tl.exp2(tl.load(lpart_ptr + first + t * M, mask=row_ok, other=0.0) - m)
            l_sum += w
            acc += tl.load(opart_ptr + (first + t * M)[:, None] * CP + cc[None, :],
                           mask=row_ok[:, None], other=0.0) * w[:, None]
        out = acc / l_sum[:, None]
        o_rows = b * M + rows
        tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cc < C)[None, :])
        tl.store(lse_ptr + o_rows, (m + tl.log2(l_sum)) * LN2, mask=row_ok & (cb == 0))


def _launch_combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts,
                    use_pdl, pdl):
    """v4's combine launch: grid (ceil(M / 16), CP / 128, B), parts merged one after another
    (triton_v8 passes its own launcher to _launch)."""
    block_c = min(CP, 128)
    _combine_kernel[(triton.cdiv(M, COMBINE_ROWS), CP // block_c, o_part.shape[0])](
        prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, G, C=C,
        CP=CP, BLOCK_R=COMBINE_ROWS, BLOCK_C=block_c, **consts, USE_PDL=use_pdl,
        num_warps=4, **pdl)


def _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
            policy: Policy, combine=None, merge: bool = False):
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
    G = parts_grid(T, policy=policy)  # part programs per request (>= 1: the tree needs one)
    m_blocks = triton.cdiv(M, BLOCK_M)
    o_part = torch.empty(B, G, M, CP, dtype=torch.float32, device=q.device) if G > 1 else lse
    l_part = torch.empty(B, G, M, dtype=torch.float32, device=q.device) if G > 1 else lse
    use_tma = _tma_ok(kv_cache, C)
    if use_tma:  # host-built (pointer, shape, strides only: no sync, graph-capturable)
        shape, strides = list(kv_cache.shape), list(kv_cache.stride())
        kc_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, C])
        # RP >= R columns: those past C+R are outside the tensor, TMA fills them with 0
        kr_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, RP])
    else:
        kc_desc = kr_desc = kv_cache  # unused (USE_TMA=False)
    # Q by TMA too where q is contiguous: request b's rows m = node * H + head are rows
    # b * M + m of q viewed [B * M, D]; a block's rows past M read the next request's q (or
    # TMA's zero fill past B * M): row-local garbage, never stored
    ablate = os.environ.get("TREE_MLA_V4_ABLATE", "").split(",")  # timing ablations only
    q_tma = (use_tma and q.is_contiguous() and q.data_ptr() % 16 == 0
             and D * q.element_size() % 16 == 0 and "qtma" not in ablate)
    if q_tma:
        q2 = q.view(B * M, D)
        qc_desc = TensorDescriptor(q2, [B * M, D], [D, 1], [BLOCK_M, C])
        qr_desc = TensorDescriptor(q2, [B * M, D], [D, 1], [BLOCK_M, RP])
    else:
        qc_desc = qr_desc = q
    interp = _common.interpreting()
    # PDL (griddepcontrol) is sm_90+ inline PTX: not in the interpreter
    use_pdl = not interp and G > 1 and "pdl" not in ablate
    pdl = {} if interp else {"launch_pdl": use_pdl}
    consts = dict(SHORT_UPTO=policy.short_upto, SHORT_LEN=policy.short_len,
                  LONG_MIN=policy.long_min, MAX_SPLITS=policy.max_splits, BLOCK_N=BLOCK_N)
    merge = merge and G > 1  # triton_v26: the last part merges in-kernel (tickets)
    cnt = counters(q.device, B * m_blocks, pool="tree_mla") if merge else lse
    _attn_kernel[(G, m_blocks, B)](
        q, kv_cache, qc_desc, qr_desc, kc_desc, kr_desc, prefix_lens, anc_bits, o_lat, lse, o_part,
        l_part, cnt, *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, G, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, BLOCK_M=BLOCK_M, MASKED_BLOCK_N=MASKED_BLOCK_N,
        UPCAST=interp, DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        USE_TMA=use_tma, USE_PDL=use_pdl and not merge, Q_TMA=q_tma, **consts, MERGE=merge,
        num_warps=8 if CP >= 256 else 4, num_stages=2)
    if G > 1 and not merge:  # combine: the LSE-merge launcher (None: v4's, looked up at call time)
        (combine or _launch_combine)(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP,
                                     consts, use_pdl, pdl)
    return o_lat, lse


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v4's split
    policy (module docstring). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate, V4)


def tree_mla_triton_split512(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                             anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int,
                             *, validate: bool = False):
    """As tree_mla_triton with v3's 512-key splits up to P = 2048 (2 at P = 1024, not 4): the
    control for the short splits' partial traffic where M is large; the same above 2048."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   SPLIT512)
