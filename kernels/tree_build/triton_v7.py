"""tree_build triton_v7: v6 with each slot carrying its entry's two successors, precomputed.

v6's pop, after the high-word `redux` decides the winner, waits on a second `redux` level
(meta), then on the address arithmetic, three L1 loads, their float32 -> float64 conversions,
two dependent DADDs and the key transform before the slots can be rewritten and the next pop
can start: roughly two `redux` latencies plus ~130 dependent cycles per pop, one warp per
request, nothing to overlap with.

v7 moves everything after the second `redux` level off that chain. Each slot holds, next to
its entry's score key, the score keys of the entry's next sibling and first child, computed
(float64, in the reference's order) when the entry was created. A pop then fetches those two
keys in the same `redux` level as the meta word and writes them straight into the popped slot
(the sibling) and slot i (the child): the next pop's high-word `redux` depends only on that.
The float64 work moves to the *new* entries' successors (the popped entry's sibling's sibling
and child, its child's sibling and child: four DADD pairs from five L1 loads), which the next
pop needs only after its own first `redux` level, so the loads, conversions and adds overlap
with it. Same slots, same keys, same tie branch, same rows as v6; the sign bits of -0.0
successors ride in meta bits 30 and 31 (entries: bit 29).

Exactness: a successor is computed from the same float64 values as in the reference, in the
same order: the sibling of an entry of score s at (d, r) is `(s - lp[d-1][r]) + lp[d-1][r+1]`,
its child `s + lp[d][0]`; only the moment of the computation changes. An entry of score -inf
(an empty slot) gets -inf successors (guarded with `where`, as `-inf - -inf` is NaN).

Expected speed (not yet timed on a GPU): the chain is shorter, but the common path has 266 SASS
instructions (v6: 169), and an in-order issue replay of that SASS (README.md, "v7 and the
in-order issue model") predicts ~530 cycles per pop against v6's ~420: kept as an exact,
probably negative result until the GPU says otherwise.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from workbench.tree import DDTree

from ._common import (
    _I32_MAX,
    _I32_MIN,
    _I64_MIN,
    _NEG_INF,
    _NEG_ZERO_BIT,
    _load_prefix_root,
    _max_combine,
    _min_combine,
    _prefetch_table,
    _store_info_rows,
    prepare_build,
)
from .triton_v2 import _score_key

_MAG = tl.constexpr(2**63 - 1)  # the non-sign bits of a float64
_LOW32 = tl.constexpr(2**32 - 1)
_SIB_NZ = tl.constexpr(1 << 30)  # meta: the slot's sibling-to-be scores -0.0
_CHILD_NZ = tl.constexpr(-(2**31))  # meta bit 31: the slot's child-to-be scores -0.0
_sum_combine = tl.standard._sum_combine  # (what tl.sum reduces with: see v1's pop)


@triton.jit
def _tree_build_kernel(
    lp_ptr, ids_ptr, root_ptr, prefix_ptr,  # inputs
    tok_ptr, dep_ptr, par_ptr, sco_ptr, anc_ptr, pos_ptr, cnt_ptr, fc_ptr, ns_ptr,  # outputs
    budget, depth_count, k_used, n_rows, n_words,
    s_lb, s_ll, s_lk, s_ib, s_il, s_ik, s_root, s_prefix,
    SP: tl.constexpr, NP: tl.constexpr, WP: tl.constexpr, KW: tl.constexpr,
    LP: tl.constexpr, KP: tl.constexpr,
    HAS_ROOT: tl.constexpr, HAS_PREFIX: tl.constexpr, PREFETCH: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])
    rows = tl.arange(0, NP)  # [NP] node rows
    in_rows = rows < n_rows

    if PREFETCH:  # touch the whole [L, K] table once: the pops' scalar loads then hit L1
        _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk, LP, KP)

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    # slot 0 = the root's first child: rank 0 at depth 1 (score -inf = empty), with its
    # successors: sibling (s0 - lp[0][0]) + lp[0][1], child s0 + lp[1][0]
    slot = tl.arange(0, SP)  # [SP]
    s0 = tl.load(lp_b).to(tl.float64)
    live0 = s0 > _NEG_INF
    sib0 = tl.where(live0, (s0 - s0) + tl.load(lp_b + s_lk, mask=k_used > 1,
                                               other=_NEG_INF).to(tl.float64), _NEG_INF)
    child0 = tl.where(live0, s0 + tl.load(lp_b + s_ll, mask=depth_count > 1,
                                          other=_NEG_INF).to(tl.float64), _NEG_INF)
    h0, l0, z0 = _score_key(s0)
    sh0, sl0, sz0 = _score_key(sib0)
    ch0, cl0, cz0 = _score_key(child0)
    inf_hi, inf_lo, _z = _score_key(tl.full([], _NEG_INF, tl.float64))
    hi = tl.where(slot == 0, h0, inf_hi)  # [SP] score keys of the entries
    lo = tl.where(slot == 0, l0, inf_lo)
    shi = tl.where(slot == 0, sh0, inf_hi)  # [SP] ... of their next siblings
    slo = tl.where(slot == 0, sl0, inf_lo)
    chi = tl.where(slot == 0, ch0, inf_hi)  # [SP] ... of their first children
    clo = tl.where(slot == 0, cl0, inf_lo)
    kw0 = tl.zeros([SP], tl.int32)  # rank digits of depths 1..4, 5..8, 9..12, 13..16
    kw1 = tl.zeros([SP], tl.int32)
    kw2 = tl.zeros([SP], tl.int32)
    kw3 = tl.zeros([SP], tl.int32)
    # meta = slot | rank << 8 | depth << 16 | prev << 21 | -0.0 bits: entry 29, sibling 30,
    # child 31
    meta = tl.where(slot == 0, (1 << 16) | tl.where(z0, _NEG_ZERO_BIT, 0)
                    | tl.where(sz0, _SIB_NZ, 0) | tl.where(cz0, _CHILD_NZ, 0), slot)
    info = tl.full([NP], -1, tl.int32)  # [NP] parent | depth << 8 | rank << 13 | prev << 20
    scores = tl.where(rows == 0, 0.0, _NEG_INF).to(tl.float64)  # [NP]
    count = tl.full([], 0, tl.int32)

    for n in range(budget):
        # ---- pop: max of the score key's high word; everything else in parallel after it,
        # including the winner's precomputed successor keys
        hmax = tl.reduce(hi, 0, _max_combine)
        cand = hi == hmax
        ties = tl.reduce(cand.to(tl.int32), 0, _sum_combine)
        lmax = tl.reduce(tl.where(cand, lo, _I32_MIN), 0, _max_combine)
        m = tl.reduce(tl.where(cand, meta, _I32_MIN), 0, _max_combine)
        sh = tl.reduce(tl.where(cand, shi, _I32_MIN), 0, _max_combine)
        sl = tl.reduce(tl.where(cand, slo, _I32_MIN), 0, _max_combine)
        ch = tl.reduce(tl.where(cand, chi, _I32_MIN), 0, _max_combine)
        cl = tl.reduce(tl.where(cand, clo, _I32_MIN), 0, _max_combine)
        w0 = tl.reduce(tl.where(cand, kw0, -1), 0, _max_combine)
        w1 = tl.full([], 0, tl.int32)
        w2 = tl.full([], 0, tl.int32)
        w3 = tl.full([], 0, tl.int32)
        if KW > 1:
            w1 = tl.reduce(tl.where(cand, kw1, -1), 0, _max_combine)
        if KW > 2:
            w2 = tl.reduce(tl.where(cand, kw2, -1), 0, _max_combine)
        if KW > 3:
            w3 = tl.reduce(tl.where(cand, kw3, -1), 0, _max_combine)
        valid = (hmax != inf_hi) | (lmax != inf_lo)  # else the heap is empty (-inf)
        # the five loads for the new entries' successors, issued before the tie branch:
        # lp[d-1][r+1], lp[d-1][r+2] (the sibling's), lp[d][0], lp[d][1], lp[d+1][0] (the child's)
        r = (m >> 8) & 255
        d = (m >> 16) & 31  # 1..L
        lp_d = lp_b + (d - 1) * s_ll
        nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                      other=_NEG_INF).to(tl.float64)
        nxt2 = tl.load(lp_d + (r + 2) * s_lk, mask=valid & (r + 2 < k_used),
                       other=_NEG_INF).to(tl.float64)
        c0 = tl.load(lp_d + s_ll, mask=valid & (d < depth_count), other=_NEG_INF).to(tl.float64)
        c1 = tl.load(lp_d + s_ll + s_lk, mask=valid & (d < depth_count) & (k_used > 1),
                     other=_NEG_INF).to(tl.float64)
        g0 = tl.load(lp_d + 2 * s_ll, mask=valid & (d + 1 < depth_count),
                     other=_NEG_INF).to(tl.float64)
        if ties > 1:  # several slots share the high word: low word, then (Python's order on
            # equal float64 scores) the rank tuples decide; then refetch and reload
            cand = cand & (lo == lmax)
            w0 = tl.reduce(tl.where(cand, kw0, _I32_MAX), 0, _min_combine)
            cand = cand & (kw0 == w0)
            if KW > 1:
                w1 = tl.reduce(tl.where(cand, kw1, _I32_MAX), 0, _min_combine)
                cand = cand & (kw1 == w1)
            if KW > 2:
                w2 = tl.reduce(tl.where(cand, kw2, _I32_MAX), 0, _min_combine)
                cand = cand & (kw2 == w2)
            if KW > 3:
                w3 = tl.reduce(tl.where(cand, kw3, _I32_MAX), 0, _min_combine)
                cand = cand & (kw3 == w3)
            m = tl.reduce(tl.where(cand, meta, _I32_MIN), 0, _max_combine)
            sh = tl.reduce(tl.where(cand, shi, _I32_MIN), 0, _max_combine)
            sl = tl.reduce(tl.where(cand, slo, _I32_MIN), 0, _max_combine)
            ch = tl.reduce(tl.where(cand, chi, _I32_MIN), 0, _max_combine)
            cl = tl.reduce(tl.where(cand, clo, _I32_MIN), 0, _max_combine)
            r = (m >> 8) & 255
            d = (m >> 16) & 31
            lp_d = lp_b + (d - 1) * s_ll
            nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                          other=_NEG_INF).to(tl.float64)
            nxt2 = tl.load(lp_d + (r + 2) * s_lk, mask=valid & (r + 2 < k_used),
                           other=_NEG_INF).to(tl.float64)
            c0 = tl.load(lp_d + s_ll, mask=valid & (d < depth_count),
                         other=_NEG_INF).to(tl.float64)
            c1 = tl.load(lp_d + s_ll + s_lk, mask=valid & (d < depth_count) & (k_used > 1),
                         other=_NEG_INF).to(tl.float64)
            g0 = tl.load(lp_d + 2 * s_ll, mask=valid & (d + 1 < depth_count),
                         other=_NEG_INF).to(tl.float64)
        sel = m & 255  # slot = the parent node of the popped entry
        prev = (m >> 21) & 255  # the previous sibling (rank r - 1), if r > 0
        i = tl.full([], 1, tl.int32) + n  # the new node's row

        # ---- the critical part: the two new entries' keys are the winner's precomputed ones
        is_sel = slot == sel
        is_new = slot == i  # no slot when i == SP: a child of the last pop is never popped
        hi = tl.where(is_sel, sh, tl.where(is_new, ch, hi))
        lo = tl.where(is_sel, sl, tl.where(is_new, cl, lo))

        # ---- off the next pop's first reduction: float64 scores from the keys (inlined
        # inverse of _score_key; the -0.0 sign bits come with meta)
        o = (hmax.to(tl.int64) << 32) | ((lmax ^ _I32_MIN).to(tl.int64) & _LOW32)
        bits = o ^ ((o >> 63) & _MAG)
        s = tl.where((m & _NEG_ZERO_BIT) != 0, _I64_MIN, bits).to(tl.float64, bitcast=True)
        o = (sh.to(tl.int64) << 32) | ((sl ^ _I32_MIN).to(tl.int64) & _LOW32)
        bits = o ^ ((o >> 63) & _MAG)
        sib = tl.where((m & _SIB_NZ) != 0, _I64_MIN, bits).to(tl.float64, bitcast=True)
        o = (ch.to(tl.int64) << 32) | ((cl ^ _I32_MIN).to(tl.int64) & _LOW32)
        bits = o ^ ((o >> 63) & _MAG)
        child = tl.where(m < 0, _I64_MIN, bits).to(tl.float64, bitcast=True)  # bit 31
        # the new entries' successors, float64 in the reference's order; -inf entries (no
        # sibling / no child) get -inf successors
        sib_live = sib > _NEG_INF
        child_live = child > _NEG_INF
        sib_sib = tl.where(sib_live, (sib - nxt) + nxt2, _NEG_INF)
        sib_child = tl.where(sib_live, sib + c0, _NEG_INF)
        child_sib = tl.where(child_live, (child - c0) + c1, _NEG_INF)
        child_child = tl.where(child_live, child + g0, _NEG_INF)
        # their keys (inlined _score_key)
        xb = sib_sib.to(tl.int64, bitcast=True)
        ss_z = xb == _I64_MIN
        xb = tl.where(ss_z, 0, xb)
        xb = xb ^ ((xb >> 63) & _MAG)
        shi = tl.where(is_sel, (xb >> 32).to(tl.int32), shi)
        slo = tl.where(is_sel, (xb & _LOW32).to(tl.int32) ^ _I32_MIN, slo)
        xb = sib_child.to(tl.int64, bitcast=True)
        sc_z = xb == _I64_MIN
        xb = tl.where(sc_z, 0, xb)
        xb = xb ^ ((xb >> 63) & _MAG)
        chi = tl.where(is_sel, (xb >> 32).to(tl.int32), chi)
        clo = tl.where(is_sel, (xb & _LOW32).to(tl.int32) ^ _I32_MIN, clo)
        xb = child_sib.to(tl.int64, bitcast=True)
        cs_z = xb == _I64_MIN
        xb = tl.where(cs_z, 0, xb)
        xb = xb ^ ((xb >> 63) & _MAG)
        shi = tl.where(is_new, (xb >> 32).to(tl.int32), shi)
        slo = tl.where(is_new, (xb & _LOW32).to(tl.int32) ^ _I32_MIN, slo)
        xb = child_child.to(tl.int64, bitcast=True)
        cc_z = xb == _I64_MIN
        xb = tl.where(cc_z, 0, xb)
        xb = xb ^ ((xb >> 63) & _MAG)
        chi = tl.where(is_new, (xb >> 32).to(tl.int32), chi)
        clo = tl.where(is_new, (xb & _LOW32).to(tl.int32) ^ _I32_MIN, clo)
        # the sibling's key adds 1 to digit d; the child's key equals the popped node's
        dd = tl.minimum(tl.maximum(d, 1), 16) - 1
        unit = 1 << (7 * (3 - dd % 4))
        word = dd // 4
        kw0 = tl.where(is_sel, w0 + tl.where(word == 0, unit, 0), tl.where(is_new, w0, kw0))
        if KW > 1:
            kw1 = tl.where(is_sel, w1 + tl.where(word == 1, unit, 0), tl.where(is_new, w1, kw1))
        if KW > 2:
            kw2 = tl.where(is_sel, w2 + tl.where(word == 2, unit, 0), tl.where(is_new, w2, kw2))
        if KW > 3:
            kw3 = tl.where(is_sel, w3 + tl.where(word == 3, unit, 0), tl.where(is_new, w3, kw3))
        meta = tl.where(is_sel, sel | ((r + 1) << 8) | (d << 16) | (i << 21)
                        | tl.where((m & _SIB_NZ) != 0, _NEG_ZERO_BIT, 0)
                        | tl.where(ss_z, _SIB_NZ, 0) | tl.where(sc_z, _CHILD_NZ, 0),
                        tl.where(is_new, i | ((d + 1) << 16)
                                 | tl.where(m < 0, _NEG_ZERO_BIT, 0)
                                 | tl.where(cs_z, _SIB_NZ, 0) | tl.where(cc_z, _CHILD_NZ, 0),
                                 meta))

        # ---- row i in registers: the popped node, or padding once the heap is empty
        is_row = rows == i
        info = tl.where(is_row, tl.where(valid, sel | (d << 8) | (r << 13) | (prev << 20), -1),
                        info)
        scores = tl.where(is_row, s, scores)  # -inf when empty = the padding score
        count += valid.to(tl.int32)

    # ---- every row at once
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
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    Same contract as `triton_v1.build_ddtree_triton` (shapes, dtypes, budget 1..128, L <= 16,
    one launch, no host sync; content checks only with validate=True). prefetch: load the
    log-prob table into L1 first (default: on CUDA; it only costs time in the interpreter).
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        # SP >= 32: one slot per lane at least, so each reduction is one redux.sync (as v2)
        _tree_build_kernel[job.grid](
            *job.args, SP=max(job.SP, 32), NP=job.NP, WP=job.WP,
            KW=-(-job.depth_count // 4), LP=job.LP, KP=job.KP,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX, PREFETCH=job.on_cuda(prefetch),
            num_warps=num_warps,
        )
    return tree
