"""tree_build triton_v6: v2's redux.sync pop with nothing else in the loop but the pop.

The H200 experiments on v2 (README.md, version log) put about a third of its time in the
per-pop global stores and as much again behind the exact-tie branch, whose results (the winner's
meta and key words) every later instruction of the pop waited for. v6 keeps v2's slots, keys
and cascade of 32-bit reductions (one `redux.sync` each) and changes what surrounds them:

* No store in the loop. A pop selects its row into two [NP] register vectors: an int32
  `info` (parent | depth << 8 | rank << 13 | previous sibling << 20, -1 = padding) and the
  float64 score. After the loop every field is stored at once; first_child / next_sibling are
  two scatter stores (a rank-0 row is its parent's first child, a rank-r row the next sibling
  of the row in its prev field) after a -1 fill and a barrier.
* One dependent reduction less: the winner is decided on the score key's high int32 word
  alone (sign, exponent and 20 mantissa bits), and the low word, the tie count, the meta and
  the key words are all reduced in parallel right after it. Only when several slots share
  the high word (an exact float64 tie, or scores within about 2^-20 relative) does a uniform
  branch narrow by the low word, then by the rank key (Python's order on equal scores), and
  redo the loads.
* The three log-prob loads of a pop are issued before that branch, from the no-tie winner.
  The popped score's sign bit (-0.0) comes from the final winner's meta, after the branch.
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

    # slot 0 = the root's first child: rank 0 at depth 1 (score -inf = empty)
    slot = tl.arange(0, SP)  # [SP]
    s0 = tl.load(lp_b).to(tl.float64)
    h0, l0, z0 = _score_key(s0)
    inf_hi, inf_lo, _z = _score_key(tl.full([], _NEG_INF, tl.float64))
    hi = tl.where(slot == 0, h0, inf_hi)  # [SP] score keys
    lo = tl.where(slot == 0, l0, inf_lo)
    kw0 = tl.zeros([SP], tl.int32)  # rank digits of depths 1..4, 5..8, 9..12, 13..16
    kw1 = tl.zeros([SP], tl.int32)
    kw2 = tl.zeros([SP], tl.int32)
    kw3 = tl.zeros([SP], tl.int32)
    meta = tl.where(slot == 0, (1 << 16) | tl.where(z0, _NEG_ZERO_BIT, 0), slot)
    info = tl.full([NP], -1, tl.int32)  # [NP] parent | depth << 8 | rank << 13 | prev << 20
    scores = tl.where(rows == 0, 0.0, _NEG_INF).to(tl.float64)  # [NP]
    count = tl.full([], 0, tl.int32)

    for n in range(budget):
        # ---- pop: max of the score key's high word; everything else in parallel after it
        hmax = tl.reduce(hi, 0, _max_combine)
        cand = hi == hmax
        ties = tl.reduce(cand.to(tl.int32), 0, _sum_combine)
        lmax = tl.reduce(tl.where(cand, lo, _I32_MIN), 0, _max_combine)
        m = tl.reduce(tl.where(cand, meta, -1), 0, _max_combine)
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
        # the three loads, issued before the tie branch (masked as in v2)
        r = (m >> 8) & 255
        d = (m >> 16) & 31  # 1..L
        lp_d = lp_b + (d - 1) * s_ll
        a = tl.load(lp_d + r * s_lk, mask=valid, other=0.0).to(tl.float64)
        nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                      other=_NEG_INF).to(tl.float64)
        c = tl.load(lp_d + s_ll, mask=valid & (d < depth_count),
                    other=_NEG_INF).to(tl.float64)
        if ties > 1:  # several slots share the high word: low word, then (Python's order on
            # equal float64 scores) the rank tuples decide; then reload
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
            m = tl.reduce(tl.where(cand, meta, -1), 0, _max_combine)
            r = (m >> 8) & 255
            d = (m >> 16) & 31
            lp_d = lp_b + (d - 1) * s_ll
            a = tl.load(lp_d + r * s_lk, mask=valid, other=0.0).to(tl.float64)
            nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                          other=_NEG_INF).to(tl.float64)
            c = tl.load(lp_d + s_ll, mask=valid & (d < depth_count),
                        other=_NEG_INF).to(tl.float64)
        # the winner's float64 score from its key; the -0.0 sign bit comes with its meta
        o = (hmax.to(tl.int64) << 32) | ((lmax ^ _I32_MIN).to(tl.int64) & _LOW32)
        bits = o ^ ((o >> 63) & _MAG)
        s = tl.where((m & _NEG_ZERO_BIT) != 0, _I64_MIN, bits).to(tl.float64, bitcast=True)
        sel = m & 255  # slot = the parent node of the popped entry
        prev = (m >> 21) & 255  # the previous sibling (rank r - 1), if r > 0
        i = tl.full([], 1, tl.int32) + n  # the new node's row

        # ---- the next sibling and the first child, float64 in the reference's order
        sib = (s - a) + nxt  # -inf when there is no next rank (or the heap is empty)
        child = s + c  # -inf at depth L
        # their keys (inlined _score_key)
        sbits = sib.to(tl.int64, bitcast=True)
        sz = sbits == _I64_MIN
        sbits = tl.where(sz, 0, sbits)
        sbits = sbits ^ ((sbits >> 63) & _MAG)
        sh = (sbits >> 32).to(tl.int32)
        sl = (sbits & _LOW32).to(tl.int32) ^ _I32_MIN
        cbits = child.to(tl.int64, bitcast=True)
        cz = cbits == _I64_MIN
        cbits = tl.where(cz, 0, cbits)
        cbits = cbits ^ ((cbits >> 63) & _MAG)
        ch = (cbits >> 32).to(tl.int32)
        cl = (cbits & _LOW32).to(tl.int32) ^ _I32_MIN
        # the sibling's key adds 1 to digit d; the child's key equals the popped node's
        dd = tl.minimum(tl.maximum(d, 1), 16) - 1
        unit = 1 << (7 * (3 - dd % 4))
        word = dd // 4
        is_sel = slot == sel
        is_new = slot == i  # no slot when i == SP: a child of the last pop is never popped
        hi = tl.where(is_sel, sh, tl.where(is_new, ch, hi))
        lo = tl.where(is_sel, sl, tl.where(is_new, cl, lo))
        kw0 = tl.where(is_sel, w0 + tl.where(word == 0, unit, 0), tl.where(is_new, w0, kw0))
        if KW > 1:
            kw1 = tl.where(is_sel, w1 + tl.where(word == 1, unit, 0), tl.where(is_new, w1, kw1))
        if KW > 2:
            kw2 = tl.where(is_sel, w2 + tl.where(word == 2, unit, 0), tl.where(is_new, w2, kw2))
        if KW > 3:
            kw3 = tl.where(is_sel, w3 + tl.where(word == 3, unit, 0), tl.where(is_new, w3, kw3))
        meta = tl.where(is_sel, sel | ((r + 1) << 8) | (d << 16) | (i << 21)
                        | tl.where(sz, _NEG_ZERO_BIT, 0),
                        tl.where(is_new, i | ((d + 1) << 16) | tl.where(cz, _NEG_ZERO_BIT, 0),
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
