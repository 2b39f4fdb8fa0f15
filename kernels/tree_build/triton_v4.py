"""tree_build triton_v4: v3 with the next pop chosen while the reduction runs (lookahead).

The entry to pop next is held in scalars and the slot vectors hold every other live entry. Each
iteration reduces the vectors to the best of the others (A) while it pops the held entry and
computes that pop's sibling and child (B); the next pop is the best of those three, found with
two scalar compares, and its slot is taken out of the vectors. The chain per pop becomes
max(reduction, pop work) + a compare instead of their sum. Same rows, order and outputs as v3."""

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

    # the entry to pop next, held in scalars; the slot vectors hold every other live entry
    bs = tl.load(lp_b).to(tl.float64)  # slot 0: the root's first child, rank 0 at depth 1
    bk0 = tl.full([], 0, tl.int64)
    bk1 = tl.full([], 0, tl.int64)
    bm = tl.full([], 1 << 16, tl.int32)
    sc = tl.where(slot == 0, neg_inf, sc)

    for n in range(budget):
        # (A) the best of the others: runs while (B) works on the entry being popped
        if TUPLE_REDUCE:
            if TWO_WORDS:
                s2, c0, c1, m2 = tl.reduce((sc, key0, key1, meta), 0, _better2)
            else:
                s2, c0, m2 = tl.reduce((sc, key0, meta), 0, _better1)
                c1 = tl.full([], 0, tl.int64)
        else:  # built-in reductions (interpreter), same order
            s2 = tl.reduce(sc, 0, _max_combine)
            tie = sc == s2
            c0 = tl.reduce(tl.where(tie, key0, _KEY_MAX), 0, _min_combine)
            tie &= key0 == c0
            if TWO_WORDS:
                c1 = tl.reduce(tl.where(tie, key1, _KEY_MAX), 0, _min_combine)
                tie &= key1 == c1
            else:
                c1 = tl.full([], 0, tl.int64)
            m2 = tl.reduce(tl.where(tie, meta, _META_MAX), 0, _min_combine)
            s2 = tl.reduce(tl.where(slot == (m2 & 255), sc, neg_inf), 0, _max_combine)

        # (B) pop (bs, bk, bm): node i, its next sibling and its first child
        valid = bs > neg_inf  # the heap is empty from here on otherwise
        sel = bm & 255  # slot = parent node of the popped entry
        r = (bm >> 8) & 255
        d = (bm >> 16) & 31  # 1..L
        prev = (bm >> 21) & 255  # the previous sibling (rank r - 1), if r > 0
        i = tl.full([], 1, tl.int32) + n  # the new node's row
        lp_d = lp_b + (d - 1) * s_ll
        a = tl.load(lp_d + r * s_lk, mask=valid, other=0.0).to(tl.float64)
        nxt = tl.load(lp_d + (r + 1) * s_lk, mask=valid & (r + 1 < k_used),
                      other=neg_inf).to(tl.float64)
        c = tl.load(lp_d + s_ll, mask=valid & (d < depth_count), other=neg_inf).to(tl.float64)
        sib = (bs - a) + nxt  # the reference's order; -inf when there is no next rank
        child = bs + c  # -inf at depth L
        dd = tl.minimum(tl.maximum(d, 1), 16).to(tl.int64)
        if TWO_WORDS:
            unit0 = tl.where(dd <= 9, 1 << (7 * (9 - tl.minimum(dd, 9))), 0)
            unit1 = tl.where(dd > 9, 1 << (7 * (18 - tl.maximum(dd, 10))), 0)
        else:
            unit0 = 1 << (7 * (9 - tl.minimum(dd, 9)))
            unit1 = tl.full([], 0, tl.int64)
        sk0 = bk0 + unit0  # the sibling's key adds 1 to digit d
        sk1 = bk1 + unit1
        smeta = sel | ((r + 1) << 8) | (d << 16) | (i << 21)
        cmeta = i | ((d + 1) << 16)  # the child's key is the popped node's

        # the next pop: the best of (A), the sibling and the child; sibling vs child first
        sib_first = (sib > child) | ((sib == child) & (
            (sk0 < bk0) | ((sk0 == bk0) & (sk1 < bk1))))
        ws = tl.where(sib_first, sib, child)
        wk0 = tl.where(sib_first, sk0, bk0)
        wk1 = tl.where(sib_first, sk1, bk1)
        wm = tl.where(sib_first, smeta, cmeta)
        new_first = (ws > s2) | ((ws == s2) & ((wk0 < c0) | ((wk0 == c0) & (wk1 < c1))))

        # the vectors: insert both new entries, then take out the next pop's slot
        is_sel = slot == sel
        is_new = slot == i  # no slot when i == SP: a child of the last pop is never popped
        sc = tl.where(is_sel, sib, tl.where(is_new, child, sc))
        key0 = tl.where(is_sel, sk0, tl.where(is_new, bk0, key0))
        if TWO_WORDS:
            key1 = tl.where(is_sel, sk1, tl.where(is_new, bk1, key1))
        meta = tl.where(is_sel, smeta, tl.where(is_new, cmeta, meta))
        # row i: the popped node (rows of an empty heap keep their padding values)
        is_row = rows == tl.where(valid, i, -1)  # (the interpreter rejects vector & scalar)
        parents = tl.where(is_row, sel, parents)
        dep_rank = tl.where(is_row, d | (r << 8), dep_rank)
        scores = tl.where(is_row, bs, scores)
        first = tl.where(rows == tl.where(valid & (r == 0), sel, -1), i, first)
        nexts = tl.where(rows == tl.where(valid & (r > 0), prev, -1), i, nexts)
        count += valid.to(tl.int32)

        bs = tl.where(new_first, ws, s2)
        bk0 = tl.where(new_first, wk0, c0)
        bk1 = tl.where(new_first, wk1, c1)
        bm = tl.where(new_first, wm, m2)
        sc = tl.where(slot == (bm & 255), neg_inf, sc)

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
