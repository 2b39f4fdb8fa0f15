"""tree_build triton_v5: v4's lookahead loop with integer score keys and lean row output.

Against v4, two changes aimed at the instruction count of one pop (one warp issues them all):
* Slot scores are order-preserving int64 keys (v2's mapping: -0.0 folded onto +0.0, its sign
  kept in meta bit 29), so every reduction stage compares integers only (no DSETP).
* ROW_STORES: a pop writes its row with three scalar stores (parent | depth << 8 | rank << 13
  packed, score, and the first-child or next-sibling link), decoded by an epilogue after a
  barrier, instead of selecting into five [NP] register vectors (v3/v4). Off: v4's vectors.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from workbench.tree import DDTree

from ._common import (
    _I32_MAX,
    _I64_MAX,
    _I64_MIN,
    _NEG_INF,
    _NEG_ZERO_BIT,
    _better1,
    _better2,
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
    LP: tl.constexpr, KP: tl.constexpr, PREFETCH: tl.constexpr, ROW_STORES: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])
    neg_inf = _NEG_INF
    rows = tl.arange(0, NP)  # [NP] node rows
    in_rows = rows < n_rows
    out = row0 + rows

    if PREFETCH:  # touch the whole [L, K] table once: the pops' scalar loads then hit L1
        _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk, LP, KP)

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    if ROW_STORES:  # padding everywhere (row 0: the root); pops overwrite rows 1..count
        tl.store(sco_ptr + out, tl.where(rows == 0, 0.0, neg_inf).to(tl.float64), mask=in_rows)
        tl.store(par_ptr + out, tl.full([NP], -1, tl.int64), mask=in_rows)
        tl.store(fc_ptr + out, tl.full([NP], -1, tl.int64), mask=in_rows)
        tl.store(ns_ptr + out, tl.full([NP], -1, tl.int64), mask=in_rows)
        tl.debug_barrier()  # the pops' scalar stores may come from another thread
    # [NP] rows in registers (ROW_STORES off): parents, depth | rank << 8, scores, the links
    parents, dep_rank, scores, first, nexts = _padding_rows(rows, NP)

    # score keys: int64 whose signed order is the float64 order (-0.0 keyed as +0.0)
    inf_bits = tl.full([], _NEG_INF, tl.float64).to(tl.int64, bitcast=True)
    inf_key = inf_bits ^ ((inf_bits >> 63) & _I64_MAX)
    slot = tl.arange(0, SP)  # [SP]
    skey = tl.full([SP], 0, tl.int64) + inf_key  # every slot empty but the popped one
    key0 = tl.zeros([SP], tl.int64)  # rank digits of depths 1..9 (7 bits each)
    key1 = tl.zeros([SP], tl.int64)  # rank digits of depths 10..16 (TWO_WORDS only)
    meta = slot  # slot | rank << 8 | depth << 16 | prev sibling << 21 | -0.0 << 29
    count = tl.full([], 0, tl.int32)

    # the entry to pop next, in scalars: slot 0's rank-0 child at depth 1
    bs = tl.load(lp_b).to(tl.float64)
    bk0 = tl.full([], 0, tl.int64)
    bk1 = tl.full([], 0, tl.int64)
    bm = tl.full([], 1 << 16, tl.int32)

    for n in range(budget):
        # (A) the best of the others: runs while (B) works on the entry being popped
        if TUPLE_REDUCE:
            if TWO_WORDS:
                t2, c0, c1, m2 = tl.reduce((skey, key0, key1, meta), 0, _better2)
            else:
                t2, c0, m2 = tl.reduce((skey, key0, meta), 0, _better1)
                c1 = tl.full([], 0, tl.int64)
        else:  # built-in reductions (interpreter), same order
            t2 = tl.reduce(skey, 0, _max_combine)
            tie = skey == t2
            c0 = tl.reduce(tl.where(tie, key0, _I64_MAX), 0, _min_combine)
            tie = tie & (key0 == c0)
            if TWO_WORDS:
                c1 = tl.reduce(tl.where(tie, key1, _I64_MAX), 0, _min_combine)
                tie = tie & (key1 == c1)
            else:
                c1 = tl.full([], 0, tl.int64)
            m2 = tl.reduce(tl.where(tie, meta, _I32_MAX), 0, _min_combine)

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
        sk0 = bk0 + unit0  # the sibling's key adds 1 to digit d; the child's is the node's
        sk1 = bk1 + unit1
        sbits = sib.to(tl.int64, bitcast=True)
        sz = sbits == _I64_MIN  # -0.0
        sbits = tl.where(sz, 0, sbits)
        st = sbits ^ ((sbits >> 63) & _I64_MAX)
        cbits = child.to(tl.int64, bitcast=True)
        cz = cbits == _I64_MIN
        cbits = tl.where(cz, 0, cbits)
        ct = cbits ^ ((cbits >> 63) & _I64_MAX)
        smeta = sel | ((r + 1) << 8) | (d << 16) | (i << 21) | tl.where(sz, _NEG_ZERO_BIT, 0)
        cmeta = i | ((d + 1) << 16) | tl.where(cz, _NEG_ZERO_BIT, 0)

        # the next pop: the best of (A), the sibling and the child; sibling vs child first
        sib_first = (st > ct) | ((st == ct) & ((sk0 < bk0) | ((sk0 == bk0) & (sk1 < bk1))))
        wt = tl.where(sib_first, st, ct)
        wk0 = tl.where(sib_first, sk0, bk0)
        wk1 = tl.where(sib_first, sk1, bk1)
        wm = tl.where(sib_first, smeta, cmeta)
        new_first = (wt > t2) | ((wt == t2) & ((wk0 < c0) | ((wk0 == c0) & (wk1 < c1))))

        # row i: the popped node (rows of an empty heap keep their padding)
        if ROW_STORES:
            row = row0 + i
            tl.store(par_ptr + row, (sel | (d << 8) | (r << 13)).to(tl.int64), mask=valid)
            tl.store(sco_ptr + row, bs, mask=valid)
            link = tl.where(r == 0, fc_ptr + row0 + sel, ns_ptr + row0 + prev)
            tl.store(link, i.to(tl.int64), mask=valid)
        else:
            is_row = rows == tl.where(valid, i, -1)  # (the interpreter rejects vector & scalar)
            parents = tl.where(is_row, sel, parents)
            dep_rank = tl.where(is_row, d | (r << 8), dep_rank)
            scores = tl.where(is_row, bs, scores)
            first = tl.where(rows == tl.where(valid & (r == 0), sel, -1), i, first)
            nexts = tl.where(rows == tl.where(valid & (r > 0), prev, -1), i, nexts)
        count += valid.to(tl.int32)

        # the vectors: insert both new entries, then take out the next pop's slot
        is_sel = slot == sel
        is_new = slot == i  # no slot when i == SP: a child of the last pop is never popped
        skey = tl.where(is_sel, st, tl.where(is_new, ct, skey))
        key0 = tl.where(is_sel, sk0, tl.where(is_new, bk0, key0))
        if TWO_WORDS:
            key1 = tl.where(is_sel, sk1, tl.where(is_new, bk1, key1))
        meta = tl.where(is_sel, smeta, tl.where(is_new, cmeta, meta))
        bt = tl.where(new_first, wt, t2)
        bk0 = tl.where(new_first, wk0, c0)
        bk1 = tl.where(new_first, wk1, c1)
        bm = tl.where(new_first, wm, m2)
        skey = tl.where(slot == (bm & 255), inf_key, skey)
        # the next pop's float64 score back from its key
        bbits = bt ^ ((bt >> 63) & _I64_MAX)
        bs = tl.where((bm & _NEG_ZERO_BIT) != 0, _I64_MIN, bbits).to(tl.float64, bitcast=True)

    # ---- every row at once
    tl.store(cnt_ptr + b, (count + 1).to(tl.int64))
    if ROW_STORES:
        tl.debug_barrier()  # the pops' stores, read back by every lane
        info = tl.load(par_ptr + out, mask=in_rows, other=-1).to(tl.int32)
        real = (rows > 0) & (info >= 0)
        parents = tl.where(real, info & 255, -1)
        dep_rank = tl.where(real, ((info >> 8) & 31) | ((info >> 13) << 8), 0)
        # (each lane rewrites the rows it read: same layout, no second barrier needed)
    else:
        tl.store(sco_ptr + out, scores, mask=in_rows)
        tl.store(fc_ptr + out, first.to(tl.int64), mask=in_rows)
        tl.store(ns_ptr + out, nexts.to(tl.int64), mask=in_rows)
    _store_node_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, ids_b, out, rows,
                     in_rows, count, root, prefix, parents, dep_rank, scores, first, nexts,
                     s_il, s_ik, LINKS=False)

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
    row_stores: bool = True,
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    Same contract as `triton_v1.build_ddtree_triton` (shapes, dtypes, budget 1..128, L <= 16,
    one launch, no host sync; content checks only with validate=True). tuple_reduce and
    prefetch default to on for CUDA tensors and off in the interpreter; row_stores picks the
    row output (module docstring).
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        _tree_build_kernel[job.grid](
            *job.args, SP=job.SP, NP=job.NP, WP=job.WP, TWO_WORDS=job.TWO_WORDS,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX,
            TUPLE_REDUCE=job.on_cuda(tuple_reduce), LP=job.LP, KP=job.KP,
            PREFETCH=job.on_cuda(prefetch), ROW_STORES=row_stores, num_warps=num_warps,
        )
    return tree
