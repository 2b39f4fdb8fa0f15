"""tree_build triton_v3: v1's heap and pop, with nothing but the pop in the loop.

Experiments on v2 (README.md, version log) showed the per-pop global stores and a
data-dependent branch each costing about as much as the reduction. v3 keeps v1's single tuple
reduction (no branch: ties are resolved inside the combine) and moves every output row to
registers: parent, depth|rank, score, first child and next sibling are [NP] vectors updated by
selects, stored once after the loop; tokens are gathered from the id table then. As in v2, the
request's log-prob table is touched once first, so the pop's three scalar loads hit L1.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from workbench.tree import DDTree

from ._common import (
    _KEY_MAX,
    _META_MAX,
    _NEG_INF,
    _better1,
    _better2,
    _initial_slots,
    _load_prefix_root,
    _max_combine,
    _min_combine,
    _padding_rows,
    _prefetch_table,
    _store_ancestor_bits,
    _store_node_rows,
    prepare_build,
)


@triton.jit
def _tree_build_kernel(
    lp_ptr, ids_ptr, root_ptr, prefix_ptr,  # inputs
    tok_ptr, dep_ptr, par_ptr, sco_ptr, anc_ptr, pos_ptr, cnt_ptr, fc_ptr, ns_ptr,  # outputs
    budget, depth_count, k_used, n_rows, n_words,
    s_lb, s_ll, s_lk, s_ib, s_il, s_ik, s_root, s_prefix,
    SP: tl.constexpr, NP: tl.constexpr, WP: tl.constexpr, TWO_WORDS: tl.constexpr,
    HAS_ROOT: tl.constexpr, HAS_PREFIX: tl.constexpr, TUPLE_REDUCE: tl.constexpr,
    LP: tl.constexpr, KP: tl.constexpr, PREFETCH: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])
    neg_inf = _NEG_INF

    if PREFETCH:  # touch the whole [L, K] table once: the pops' scalar loads then hit L1
        _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk, LP, KP)

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    rows = tl.arange(0, NP)  # [NP] node rows: row 0 the root, padding until written
    in_rows = rows < n_rows

    # slot 0 = the root's first child: rank 0 at depth 1 (-inf = empty, never popped)
    slot, sc, key0, key1, meta = _initial_slots(lp_b, SP)  # [SP] each; key1: TWO_WORDS only
    # [NP] the rows, kept in registers and stored once after the loop (no global store in it):
    # parents, depth | rank << 8 (tokens are gathered at the end), scores, the two links
    parents, dep_rank, scores, first, nexts = _padding_rows(rows, NP)
    count = tl.zeros([], tl.int32)

    for n in range(budget):
        if TUPLE_REDUCE:  # one reduction tree carrying (score, key, meta): the GPU path
            if TWO_WORDS:
                s, k0, k1, m = tl.reduce((sc, key0, key1, meta), 0, _better2)
            else:
                s, k0, m = tl.reduce((sc, key0, meta), 0, _better1)
                k1 = tl.full([], 0, tl.int64)
        else:  # the same order from built-in reductions (the interpreter calls a custom
            # combine once per element pair in Python, ~100x slower than numpy's max/min)
            # (tl.max / tl.min are @jit helpers: ~3 ms of interpreter overhead per call, so
            # the combine functions they use are passed to tl.reduce directly)
            s = tl.reduce(sc, 0, _max_combine)
            tie = sc == s
            k0 = tl.reduce(tl.where(tie, key0, _KEY_MAX), 0, _min_combine)
            tie &= key0 == k0
            if TWO_WORDS:
                k1 = tl.reduce(tl.where(tie, key1, _KEY_MAX), 0, _min_combine)
                tie &= key1 == k1
            else:
                k1 = tl.full([], 0, tl.int64)
            # one live slot is left; meta holds its slot index in the low bits
            m = tl.reduce(tl.where(tie, meta, _META_MAX), 0, _min_combine)
            # the winner's own score: max() may have returned +0.0 for a -0.0 entry
            s = tl.reduce(tl.where(slot == (m & 255), sc, neg_inf), 0, _max_combine)
        valid = s > neg_inf  # the heap is empty from here on otherwise
        sel = m & 255  # slot = parent node of the popped entry
        r = (m >> 8) & 255
        d = (m >> 16) & 31  # 1..L
        prev = (m >> 21) & 255  # the previous sibling (rank r - 1), if r > 0
        i = tl.full([], 1, tl.int32) + n  # the new node's row

        # the three log-probs and the token this pop needs (masked: garbage meta when empty)
        lp_d = lp_b + (d - 1) * s_ll
        a = tl.load(lp_d + r * s_lk, mask=valid, other=0.0).to(tl.float64)
        nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                      other=neg_inf).to(tl.float64)
        c = tl.load(lp_d + s_ll, mask=valid & (d < depth_count), other=neg_inf).to(tl.float64)
        sib = (s - a) + nxt  # the reference's order; -inf when there is no next rank
        child = s + c  # -inf at depth L

        # the next sibling's key adds 1 to digit d; the first child's key equals the node's
        dd = tl.minimum(tl.maximum(d, 1), 16).to(tl.int64)
        if TWO_WORDS:
            unit0 = tl.where(dd <= 9, 1 << (7 * (9 - tl.minimum(dd, 9))), 0)
            unit1 = tl.where(dd > 9, 1 << (7 * (18 - tl.maximum(dd, 10))), 0)
        else:
            unit0 = 1 << (7 * (9 - tl.minimum(dd, 9)))
            unit1 = tl.full([], 0, tl.int64)
        is_sel = slot == sel
        is_new = slot == i  # no slot when i == SP: a child of the last pop is never popped
        sc = tl.where(is_sel, sib, tl.where(is_new, child, sc))
        key0 = tl.where(is_sel, k0 + unit0, tl.where(is_new, k0, key0))
        if TWO_WORDS:
            key1 = tl.where(is_sel, k1 + unit1, tl.where(is_new, k1, key1))
        meta = tl.where(is_sel, sel | ((r + 1) << 8) | (d << 16)
                        | (i << 21),
                        tl.where(is_new, i | ((d + 1) << 16), meta))

        # row i: the popped node (rows of an empty heap keep their padding values)
        is_row = rows == tl.where(valid, i, -1)  # (the interpreter rejects vector & scalar)
        parents = tl.where(is_row, sel, parents)
        dep_rank = tl.where(is_row, d | (r << 8), dep_rank)
        scores = tl.where(is_row, s, scores)
        first = tl.where(rows == tl.where(valid & (r == 0), sel, -1), i, first)
        nexts = tl.where(rows == tl.where(valid & (r > 0), prev, -1), i, nexts)
        count += valid.to(tl.int32)

    # ---- every row at once
    tl.store(cnt_ptr + b, (count + 1).to(tl.int64))
    out = row0 + rows
    _store_node_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, ids_b, out, rows,
                     in_rows, count, root, prefix, parents, dep_rank, scores, first, nexts,
                     s_il, s_ik, LINKS=True)

    _store_ancestor_bits(anc_ptr, parents, row0, rows, in_rows, depth_count, n_words, NP, WP)


def build_ddtree_triton(
    top_logprobs: Tensor,
    top_ids: Tensor,
    budget: int,
    root_tokens: Tensor | None = None,
    prefix_lens: Tensor | None = None,
    *,
    validate: bool = False,
    num_warps: int = 1,
    tuple_reduce: bool | None = None,
    prefetch: bool | None = None,
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    Same contract as `triton_v1.build_ddtree_triton` (shapes, dtypes, budget 1..128, L <= 16,
    one launch, no host sync; content checks only with validate=True). tuple_reduce and
    prefetch default to on for CUDA tensors and off in the interpreter.
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        _tree_build_kernel[job.grid](
            *job.args, SP=job.SP, NP=job.NP, WP=job.WP, TWO_WORDS=job.TWO_WORDS,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX,
            TUPLE_REDUCE=job.on_cuda(tuple_reduce), LP=job.LP, KP=job.KP,
            PREFETCH=job.on_cuda(prefetch), num_warps=num_warps,
        )
    return tree
