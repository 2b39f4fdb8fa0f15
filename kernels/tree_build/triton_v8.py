"""tree_build triton_v8: v6 with one `redux` level per pop, and the pop's bookkeeping moved
into the next pop's `redux` shadow.

One warp per request issues in program order, so a pop costs the latency of its dependent chain
plus every instruction that ptxas puts on it. v6's chain: `redux` (the score key's high word)
-> `redux` (the winner's meta, low word, rank key) -> address, three L1 loads, F2F, two DADDs,
the 64-bit key transform -> the slot writes -> the next `redux`, with ~90 slot / row updates
(SEL) issued in between. v8 keeps v6's slots (one per node), tie order, register rows and
end-of-kernel stores, and changes three things:

* Level 1 names the slot. Each slot keeps a 32-bit key: the float64 score's high word mapped to
  a signed int ordered like the score (sign-magnitude -> two's complement: -0.0 keys as +0.0),
  its low log2(slots) bits replaced by the slot index. Two `redux.max` run side by side: on the
  key (-> the highest truncated score and the *largest* slot holding it) and on the key with its
  slot bits flipped (-> the *smallest* such slot). When both name the same slot, it alone holds
  the highest truncated score, hence the strictly highest float64 score: that is the pop, with
  no second reduction. Otherwise (an exact tie, scores within ~2^-14 relative, or an empty heap)
  a uniform branch decides as the reference does: float64 max among the slots sharing the
  truncated key, then the smallest rank key (v6's 7-bit digits), then that slot.
* The winner's fields come by `shfl.idx`: slots are a [SR, 32] tile (slot = plane * 32 + lane,
  SR registers per lane); every lane takes its element of the winner's plane, then shuffles
  from the winner's lane (tl.gather). Slots hold the score's float64 bits (the popped score is
  the fetched bits, -0.0 included: no key -> float transform), the element offsets of the
  entry's log-prob and of its first child's, and two flags (next rank / next depth exists), so
  each of the three loads is one address add away from the fetch.
* Only the slot keys are written before the next pop's `redux`. Every other write of pop n (the
  sibling / child score bits, meta, offsets and rank digits of slots win and i, row i) runs in
  pop n + 1 right after its `redux` is issued, from fields carried in registers ([1, 32] values,
  one per lane, all equal), so it fills the reduction's latency instead of lengthening the
  chain; the tie branch and the fetch see the slots up to date. That bookkeeping sits in an
  `if` block of its own (false only before the first pop): within one block ptxas put it before
  the `redux`; across the block edge it stays behind it. Rows live in an [NR, 32] tile of the
  slots' layout (a fetched value broadcasts into it with no conversion) and are reshaped to
  v6's [NP] vectors after the loop for v6's stores.

Expected speed (compiled for sm_90a on a CPU, not yet timed): the common-path loop has 162 SASS
instructions (v6: 169), 2 `redux` (6) and 7 `shfl`; the in-order issue model (README.md) gives
284 cycles per pop at a `redux` latency of 16..100 (v6: 403 at 64). The block layout is
ptxas's choice: variants with fewer bookkeeping instructions made it hoist the `redux`
consumers above the block (~340 cycles), so check the SASS after any change
(README.md, "v8").
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from workbench.tree import DDTree

from ._common import (
    _I32_MAX,
    _NEG_INF,
    _load_prefix_root,
    _max_combine,
    _min_combine,
    _prefetch_table,
    _store_info_rows,
    prepare_build,
)

_sum_combine = tl.standard._sum_combine  # (what tl.sum reduces with: see v1's pop)
_MAG32 = tl.constexpr(2**31 - 1)
_NEG_INF_BITS = tl.constexpr(-(2**52))  # 0xfff0000000000000 as int64: the bits of -inf
_HAS_NEXT = tl.constexpr(1 << 21)  # meta: rank r + 1 exists (r + 1 < k_used)
_HAS_CHILD = tl.constexpr(1 << 22)  # meta: depth d + 1 exists (d < L)


@triton.jit
def _tree_build_kernel(
    lp_ptr, ids_ptr, root_ptr, prefix_ptr,  # inputs
    tok_ptr, dep_ptr, par_ptr, sco_ptr, anc_ptr, pos_ptr, cnt_ptr, fc_ptr, ns_ptr,  # outputs
    budget, depth_count, k_used, n_rows, n_words,
    s_lb, s_ll, s_lk, s_ib, s_il, s_ik, s_root, s_prefix, pops,
    SR: tl.constexpr, NR: tl.constexpr, WP: tl.constexpr, KW: tl.constexpr,
    LP: tl.constexpr, KP: tl.constexpr,
    HAS_ROOT: tl.constexpr, HAS_PREFIX: tl.constexpr, PREFETCH: tl.constexpr,
):
    SM: tl.constexpr = SR * 32 - 1  # the slot bits of a level-1 key
    HI: tl.constexpr = -SR * 32  # ~SM: its truncated-score bits
    NP: tl.constexpr = NR * 32
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])

    if PREFETCH:  # touch the whole [L, K] table once: the pops' scalar loads then hit L1
        _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk, LP, KP)

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    lane = tl.arange(0, 32)[None, :]
    slot = tl.arange(0, SR)[:, None] * 32 + lane  # [SR, 32] slot index: plane * 32 + lane
    plane = tl.arange(0, SR)[:, None]
    rid = tl.arange(0, NR)[:, None] * 32 + lane  # [NR, 32] node rows

    # slot 0 = the root's first child: rank 0 at depth 1, log-prob offset 0; others empty
    s0 = tl.load(lp_b).to(tl.float64)
    sbits = tl.where(slot == 0, s0.to(tl.int64, bitcast=True), _NEG_INF_BITS)  # [SR, 32]
    h = (sbits >> 32).to(tl.int32)
    key = (((h ^ ((h >> 31) & _MAG32)) - (h >> 31)) & HI) | slot  # [SR, 32] level-1 keys
    meta = tl.where(slot == 0, (1 << 8) | tl.where(k_used > 1, _HAS_NEXT, 0)
                    | tl.where(depth_count > 1, _HAS_CHILD, 0), 0)  # r | d << 8 | prev << 13
    off = tl.zeros([SR, 32], tl.int32)  # [SR, 32] lp offset of the entry: (d-1) s_ll + r s_lk
    offc = tl.zeros([SR, 32], tl.int32) + s_ll  # [SR, 32] ... of its first child: d s_ll
    kw0 = tl.zeros([SR, 32], tl.int32)  # rank digits of depths 1..4, 5..8, 9..12, 13..16
    kw1 = tl.zeros([SR, 32], tl.int32)
    kw2 = tl.zeros([SR, 32], tl.int32)
    kw3 = tl.zeros([SR, 32], tl.int32)
    info = tl.full([NR, 32], -1, tl.int32)  # [NR, 32] parent | d << 8 | r << 13 | prev << 20
    scores = tl.where(rid == 0, 0.0, _NEG_INF).to(tl.float64)  # [NR, 32]
    count = tl.full([], 0, tl.int32)

    # The previous pop, whose bookkeeping (every slot field but the key, its row) runs in the
    # next pop's redux shadow: its slot, row, validity and fetched fields ([1, 32]: one per
    # lane, all equal). p_win = p_i = -1: no previous pop.
    p_win = tl.full([], -1, tl.int32)
    p_i = tl.full([], -1, tl.int32)
    p_valid = tl.full([], 0, tl.int32)
    p_m = tl.zeros([1, 32], tl.int32)
    p_o = tl.zeros([1, 32], tl.int32)
    p_oc = tl.zeros([1, 32], tl.int32)
    p_w0 = tl.zeros([1, 32], tl.int32)
    p_w1 = tl.zeros([1, 32], tl.int32)
    p_w2 = tl.zeros([1, 32], tl.int32)
    p_w3 = tl.zeros([1, 32], tl.int32)
    p_s = tl.zeros([1, 32], tl.float64)
    p_sib = tl.zeros([1, 32], tl.int64)
    p_child = tl.zeros([1, 32], tl.int64)

    for n in range(pops):  # = budget (fewer only in a timing ablation)
        # ---- level 1: the highest truncated score, and the largest / smallest slot holding it
        kmax = tl.reduce(tl.reduce(key, 0, _max_combine), 0, _max_combine)
        kflip = tl.reduce(tl.reduce(key ^ SM, 0, _max_combine), 0, _max_combine)

        # ---- meanwhile, the previous pop's bookkeeping: slot p_win <- its next sibling,
        # slot p_i <- its first child (keys already written), row p_i <- the popped node
        if p_i >= 0:  # (false before the first pop) a block of its own, behind the redux
            r = p_m & 255
            d = (p_m >> 8) & 31  # 1..L
            is_sel = slot == p_win
            is_new = slot == p_i  # no slot when p_i == SR * 32: that child is never popped
            sbits = tl.where(is_sel, p_sib, tl.where(is_new, p_child, sbits))
            m_sib = (((p_m + 1) & 0x1FFF) | (p_i << 13) | tl.where(r + 2 < k_used, _HAS_NEXT, 0)
                     | (p_m & _HAS_CHILD))  # rank r + 1, previous sibling p_i
            m_child = ((d + 1) << 8) | tl.where(k_used > 1, _HAS_NEXT, 0) | tl.where(
                d + 1 < depth_count, _HAS_CHILD, 0)
            meta = tl.where(is_sel, m_sib, tl.where(is_new, m_child, meta))
            off = tl.where(is_sel, p_o + s_lk, tl.where(is_new, p_oc, off))
            offc = tl.where(is_sel, p_oc, tl.where(is_new, p_oc + s_ll, offc))
            # the sibling's key adds 1 to digit d; the child's key equals the popped node's
            dd = tl.minimum(tl.maximum(d, 1), 16) - 1
            unit = 1 << (7 * (3 - dd % 4))
            word = dd // 4
            kw0 = tl.where(is_sel, p_w0 + tl.where(word == 0, unit, 0),
                           tl.where(is_new, p_w0, kw0))
            if KW > 1:
                kw1 = tl.where(is_sel, p_w1 + tl.where(word == 1, unit, 0),
                               tl.where(is_new, p_w1, kw1))
            if KW > 2:
                kw2 = tl.where(is_sel, p_w2 + tl.where(word == 2, unit, 0),
                               tl.where(is_new, p_w2, kw2))
            if KW > 3:
                kw3 = tl.where(is_sel, p_w3 + tl.where(word == 3, unit, 0),
                               tl.where(is_new, p_w3, kw3))
            is_row = rid == p_i  # row p_i <- the popped node (or padding)
            row = tl.where(p_valid != 0,
                           p_win | (d << 8) | (r << 13) | (((p_m >> 13) & 255) << 20), -1)
            info = tl.where(is_row, row, info)
            scores = tl.where(is_row, p_s, scores)  # -inf when empty = the padding score
            count += p_valid

        # ---- this pop's winner
        win = kmax
        valid = tl.full([], 1, tl.int32)
        if kflip != (kmax ^ SM):  # several slots share it: the reference's order decides
            cand = (key & HI) == (kmax & HI)
            f = sbits.to(tl.float64, bitcast=True)
            fmax = tl.reduce(tl.reduce(tl.where(cand, f, _NEG_INF), 0, _max_combine), 0,
                             _max_combine)
            cand = cand & (f == fmax)  # -0.0 == +0.0, as in Python
            w = tl.reduce(tl.reduce(tl.where(cand, kw0, _I32_MAX), 0, _min_combine), 0,
                          _min_combine)
            cand = cand & (kw0 == w)
            if KW > 1:
                w = tl.reduce(tl.reduce(tl.where(cand, kw1, _I32_MAX), 0, _min_combine), 0,
                              _min_combine)
                cand = cand & (kw1 == w)
            if KW > 2:
                w = tl.reduce(tl.reduce(tl.where(cand, kw2, _I32_MAX), 0, _min_combine), 0,
                              _min_combine)
                cand = cand & (kw2 == w)
            if KW > 3:
                w = tl.reduce(tl.reduce(tl.where(cand, kw3, _I32_MAX), 0, _min_combine), 0,
                              _min_combine)
                cand = cand & (kw3 == w)
            win = tl.reduce(tl.reduce(tl.where(cand, slot, -1), 0, _max_combine), 0,
                            _max_combine)
            valid = (fmax != _NEG_INF).to(tl.int32)  # else the heap is empty (-inf)
        win = win & SM

        # ---- its fields: every lane takes the winner's plane, then shfl.idx from its lane
        at = plane == (win >> 5)
        src = tl.zeros([1, 32], tl.int32) + (win & 31)
        s = tl.gather(tl.reduce(tl.where(at, sbits, 0), 0, _sum_combine, keep_dims=True), src,
                      1).to(tl.float64, bitcast=True)  # [1, 32]
        m = tl.gather(tl.reduce(tl.where(at, meta, 0), 0, _sum_combine, keep_dims=True), src, 1)
        o = tl.gather(tl.reduce(tl.where(at, off, 0), 0, _sum_combine, keep_dims=True), src, 1)
        oc = tl.gather(tl.reduce(tl.where(at, offc, 0), 0, _sum_combine, keep_dims=True), src, 1)
        p_w0 = tl.gather(tl.reduce(tl.where(at, kw0, 0), 0, _sum_combine, keep_dims=True), src,
                         1)
        if KW > 1:
            p_w1 = tl.gather(tl.reduce(tl.where(at, kw1, 0), 0, _sum_combine, keep_dims=True),
                             src, 1)
        if KW > 2:
            p_w2 = tl.gather(tl.reduce(tl.where(at, kw2, 0), 0, _sum_combine, keep_dims=True),
                             src, 1)
        if KW > 3:
            p_w3 = tl.gather(tl.reduce(tl.where(at, kw3, 0), 0, _sum_combine, keep_dims=True),
                             src, 1)

        # ---- the next sibling and the first child, float64 in the reference's order
        lp_o = lp_b + o  # [1, 32] pointers, all equal
        a = tl.load(lp_o, mask=valid != 0, other=0.0).to(tl.float64)  # lp[d-1][r]
        nxt = tl.load(lp_o + s_lk, mask=(m & _HAS_NEXT) != 0,
                      other=_NEG_INF).to(tl.float64)  # lp[d-1][r+1]
        c = tl.load(lp_b + oc, mask=(m & _HAS_CHILD) != 0,
                    other=_NEG_INF).to(tl.float64)  # lp[d][0]
        sib = (s - a) + nxt  # -inf when there is no next rank (or the heap is empty)
        child = s + c  # -inf at depth L
        p_sib = sib.to(tl.int64, bitcast=True)
        p_child = child.to(tl.int64, bitcast=True)
        hs = (p_sib >> 32).to(tl.int32)
        hc = (p_child >> 32).to(tl.int32)
        i = tl.full([], 1, tl.int32) + n  # the new node's row (and its child's slot)
        key_sib = (((hs ^ ((hs >> 31) & _MAG32)) - (hs >> 31)) & HI) | win
        key_child = (((hc ^ ((hc >> 31) & _MAG32)) - (hc >> 31)) & HI) | i
        key = tl.where(slot == win, key_sib, tl.where(slot == i, key_child, key))
        p_win = win
        p_i = i
        p_valid = valid
        p_m = m
        p_o = o
        p_oc = oc
        p_s = s

    # ---- the last pop's row
    d = (p_m >> 8) & 31
    row = tl.where(p_valid != 0, p_win | (d << 8) | ((p_m & 255) << 13)
                   | (((p_m >> 13) & 255) << 20), -1)
    info = tl.where(rid == p_i, row, info)
    scores = tl.where(rid == p_i, p_s, scores)
    count += p_valid

    # ---- every row at once (v6's stores, on the rows as [NP] vectors)
    info = tl.reshape(info, [NP])
    scores = tl.reshape(scores, [NP])
    rows = tl.arange(0, NP)
    in_rows = rows < n_rows
    tl.store(cnt_ptr + b, (count + 1).to(tl.int64))
    _store_info_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, anc_ptr, ids_b,
                     row0, rows, in_rows, info, scores, root, prefix, depth_count, n_words,
                     s_il, s_ik, NP, WP)


def build_ddtree_triton(
    top_logprobs: Tensor,
    top_ids: Tensor,
    budget: int,
    root_tokens: Tensor | None = None,
    prefix_lens: Tensor | None = None,
    *,
    validate: bool = False,
    num_warps: int = 1,
    prefetch: bool | None = None,
    max_pops: int | None = None,
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    Same contract as `triton_v1.build_ddtree_triton` (shapes, dtypes, budget 1..128, L <= 16,
    one launch, no host sync; content checks only with validate=True). prefetch: load the
    log-prob table into L1 first (default: on CUDA; it only costs time in the interpreter).
    max_pops: run only that many pops, to time what lies outside the loop (a timing ablation:
    the tree is then not the reference's).
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        # slots and rows as [SR, 32] / [NR, 32] tiles: one plane per register, one lane each
        _tree_build_kernel[job.grid](
            *job.args, budget if max_pops is None else max(0, min(budget, max_pops)),
            SR=max(job.SP, 32) // 32, NR=max(job.NP, 32) // 32, WP=job.WP,
            KW=-(-job.depth_count // 4), LP=job.LP, KP=job.KP,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX, PREFETCH=job.on_cuda(prefetch),
            num_warps=num_warps,
        )
    return tree
