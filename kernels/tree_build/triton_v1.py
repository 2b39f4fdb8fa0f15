"""tree_build triton_v1: the DDTree best-first heap, one program (one warp) per request.

Bit-exact twin of `workbench.reference.tree_build.build_ddtree` (kernels/tree_build/README.md
has the design and the proofs). In short:

* Slot array, one slot per tree node: slot j holds the next not-yet-popped child of node j (its
  first child once j is popped, then each next sibling in rank order). A pop of slot `sel`
  creates node i = pops + 1, refills slot `sel` with that node's next sibling and opens slot i
  with its first child. So the heap needs budget slots (next power of two), the parent of the
  entry in slot j is j itself, and a pop touches exactly two slots.
* Pop = one tuple reduction over the slots: max float64 score, then min rank key (the rank tuple
  as fixed-position 7-bit digits, depth 1 most significant; two int64 words when L > 9), carrying
  a packed int32 `meta` (slot, rank, depth, previous sibling).
* Scores in float64 with the reference's operation order: `(s - lp[r]) + lp[r+1]` for a
  sibling, `s + lp[d][0]` for a child; log-probs are loaded in their own dtype and widened.
* Row i of every output is written by pop i - 1 (a real node, or padding once the heap is
  empty), first-child / next-sibling by scalar stores after an initialising barrier, ancestor
  bits at the end by pointer chasing over the parent vector held in registers.

What every version shares (host checks, allocation and launch arguments, the combine functions,
the helpers before and after the pop loop) is in _common.py; this file keeps v1's kernel, its
launcher, and the walk.

Dimension legend: B requests, L draft depth, K candidates per depth, N = budget + 1 rows,
W = ceil(N / 64) mask words; SP slots, NP node rows and WP words rounded up to powers of two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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
    _check_runnable,
    _initial_slots,
    _is_int_dtype,
    _load_prefix_root,
    _max_combine,
    _min_combine,
    _next_pow2,
    _require,
    _store_ancestor_bits,
    _store_root_row,
    prepare_build,
)

# ------------------------------------------------------------------------------------- kernels


@triton.jit
def _tree_build_kernel(
    lp_ptr, ids_ptr, root_ptr, prefix_ptr,  # inputs
    tok_ptr, dep_ptr, par_ptr, sco_ptr, anc_ptr, pos_ptr, cnt_ptr, fc_ptr, ns_ptr,  # outputs
    budget, depth_count, k_used, n_rows, n_words,
    s_lb, s_ll, s_lk, s_ib, s_il, s_ik, s_root, s_prefix,
    SP: tl.constexpr, NP: tl.constexpr, WP: tl.constexpr, TWO_WORDS: tl.constexpr,
    HAS_ROOT: tl.constexpr, HAS_PREFIX: tl.constexpr, TUPLE_REDUCE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lp_b = lp_ptr + b * s_lb
    ids_b = ids_ptr + b * s_ib
    row0 = b * n_rows  # outputs are contiguous [B, N] (anc: [B, N, W])
    neg_inf = _NEG_INF

    prefix, root = _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root, HAS_PREFIX,
                                     HAS_ROOT)

    # row 0 = the root; first_child / next_sibling start at -1 everywhere
    _store_root_row(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, row0, root,
                    prefix, n_rows, NP)
    rows = tl.arange(0, NP)  # [NP] node rows
    in_rows = rows < n_rows
    tl.debug_barrier()  # the scalar stores below may come from another thread

    # slot 0 = the root's first child: rank 0 at depth 1 (-inf = empty, never popped)
    slot, sc, key0, key1, meta = _initial_slots(lp_b, SP)  # [SP] each; key1: TWO_WORDS only
    parents = tl.full([NP], -1, tl.int32)  # [NP] kept for the ancestor pass
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
        tok = tl.load(ids_b + (d - 1) * s_il + r * s_ik, mask=valid, other=0).to(tl.int64)
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

        # row i: the popped node, or padding once the heap is empty
        row = row0 + i
        depth = tl.where(valid, d, 0).to(tl.int64)
        parent = tl.where(valid, sel, -1)
        tl.store(tok_ptr + row, tl.where(valid, tok, 0))
        tl.store(dep_ptr + row, depth)
        tl.store(par_ptr + row, parent.to(tl.int64))
        tl.store(sco_ptr + row, s)  # -inf when empty = the padding score
        tl.store(pos_ptr + row, prefix + depth)
        tl.store(fc_ptr + row0 + sel, i.to(tl.int64), mask=valid & (r == 0))
        tl.store(ns_ptr + row0 + prev, i.to(tl.int64), mask=valid & (r > 0))
        parents = tl.where(rows == i, parent, parents)
        count += valid.to(tl.int32)

    tl.store(cnt_ptr + b, (count + 1).to(tl.int64))

    _store_ancestor_bits(anc_ptr, parents, row0, rows, in_rows, depth_count, n_words, NP, WP)


@triton.jit
def _first_match(k1, v1, k2, v2):
    take1 = k1 < k2  # the lowest matching node index (siblings have distinct tokens: one match)
    return tl.where(take1, k1, k2), tl.where(take1, v1, v2)


@triton.jit
def _walk_kernel(
    tok_ptr, par_ptr, cnt_ptr, tgt_ptr,  # tree (contiguous [B, N]) and target [B, N]
    acc_ptr, len_ptr, bonus_ptr, emit_ptr,  # outputs
    n_rows, s_tb, s_tn, s_tok_b, s_par_b, s_cnt,
    NP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, NP)
    in_rows = rows < n_rows
    tokens = tl.load(tok_ptr + b * s_tok_b + rows, mask=in_rows, other=-1)
    parents = tl.load(par_ptr + b * s_par_b + rows, mask=in_rows, other=-1)
    target = tl.load(tgt_ptr + b * s_tb + rows * s_tn, mask=in_rows, other=0).to(tl.int64)
    count = tl.load(cnt_ptr + b * s_cnt)
    drafted = (rows > 0) & (rows < count)  # padding rows never match

    t = tl.load(tgt_ptr + b * s_tb).to(tl.int64)  # the target's choice after the root
    cur = tl.zeros([], tl.int64)
    accepted = tl.where(rows == 0, 0, -1).to(tl.int64)
    emitted = tl.full([NP], -1, tl.int64)
    step = tl.full([], 1, tl.int32)
    alive = step > 0
    while alive:  # one iteration per accepted node plus the miss: <= depth + 1 reductions
        emitted = tl.where(rows == step - 1, t, emitted)
        match = drafted & (parents == cur) & (tokens == t)
        nxt, t_next = tl.reduce((tl.where(match, rows, NP), target), 0, _first_match)
        alive = (nxt < NP) & (step < n_rows)
        accepted = tl.where((rows == step) & alive, nxt.to(tl.int64), accepted)
        cur = tl.where(alive, nxt.to(tl.int64), cur)
        t = tl.where(alive, t_next, t)
        step += alive.to(tl.int32)

    out = b * n_rows + rows
    tl.store(acc_ptr + out, accepted, mask=in_rows)
    tl.store(emit_ptr + out, emitted, mask=in_rows)
    tl.store(len_ptr + b, step.to(tl.int64))
    tl.store(bonus_ptr + b, t)


# ------------------------------------------------------------------------------- host launchers


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
) -> DDTree:
    """Best-first DDTree on the GPU, bit-identical to `reference.tree_build.build_ddtree`.

    top_logprobs [B, L, K] float (fp32/bf16/fp16/fp64, any strides; sorted descending along K,
    -inf allowed), top_ids [B, L, K] int (int32 or int64), budget 1..128, L <= 16,
    root_tokens [B] int (default 0), prefix_lens [B] int (default 0). Returns a DDTree of
    N = budget + 1 rows on top_logprobs' device. One launch, one program per request, no host
    sync: only shapes, dtypes and devices are checked here. Content checks (NaN, +inf, not
    sorted, negative prefix_lens, repeated ids among the usable ranks) read the values back
    and therefore sync; they run only with validate=True. Unvalidated bad contents give an
    unspecified (but memory-safe) tree. tuple_reduce picks the pop's reduction (default: the
    single tuple reduction on CUDA, built-in max/min reductions in the interpreter).
    """
    tree, job = prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    if job is not None:
        _tree_build_kernel[job.grid](
            *job.args, SP=job.SP, NP=job.NP, WP=job.WP, TWO_WORDS=job.TWO_WORDS,
            HAS_ROOT=job.HAS_ROOT, HAS_PREFIX=job.HAS_PREFIX,
            TUPLE_REDUCE=job.on_cuda(tuple_reduce), num_warps=num_warps,
        )
    return tree


@dataclass
class Walk:
    """The greedy walk's outputs, plus what the commit needs.

    accepted_indices [B, N] int64  path node indices incl. the root, -1 padding
    accept_lens [B] int64          tokens emitted this round (accepted drafted nodes + bonus)
    bonus [B] int64                the target's choice at the last path node
    emitted [B, N] int64           the tokens emitted this round in order (path tokens after the
                                   root, then the bonus at accept_lens - 1), -1 padding
    """

    accepted_indices: Tensor
    accept_lens: Tensor
    bonus: Tensor
    emitted: Tensor


def walk_commit_triton(tree: DDTree, target_tokens: Tensor, *, num_warps: int = 1) -> Walk:
    """Greedy (or sample-and-walk) acceptance on the GPU, one launch, no host sync.

    target_tokens [B, N] int: the target's choice after each node. Equal to
    `reference.tree_build.walk_tree` on the first three fields.
    """
    _require(isinstance(target_tokens, Tensor), "target_tokens", "a Tensor",
             type(target_tokens).__name__)
    _require(tuple(target_tokens.shape) == tuple(tree.tokens.shape), "target_tokens",
             f"shape {tuple(tree.tokens.shape)} = [B, N]", tuple(target_tokens.shape))
    _require(_is_int_dtype(target_tokens.dtype), "target_tokens", "an integer dtype",
             target_tokens.dtype)
    device = tree.tokens.device
    _require(target_tokens.device == device, "target_tokens",
             f"a tensor on {device} (as the tree)", target_tokens.device)
    batch, n_rows = tree.tokens.shape
    for name in ("tokens", "parents"):
        t = getattr(tree, name)
        _require(t.dtype == torch.int64 and t.stride(1) == 1, f"tree.{name}",
                 "int64 with unit stride along N", f"{t.dtype}, strides {t.stride()}")
    _require(tree.node_count.dtype == torch.int64, "tree.node_count", "int64",
             tree.node_count.dtype)
    out = Walk(
        accepted_indices=torch.empty(batch, n_rows, dtype=torch.int64, device=device),
        accept_lens=torch.empty(batch, dtype=torch.int64, device=device),
        bonus=torch.empty(batch, dtype=torch.int64, device=device),
        emitted=torch.empty(batch, n_rows, dtype=torch.int64, device=device),
    )
    if batch == 0:
        return out
    _check_runnable(device, "target_tokens")
    _walk_kernel[(batch,)](
        tree.tokens, tree.parents, tree.node_count, target_tokens,
        out.accepted_indices, out.accept_lens, out.bonus, out.emitted,
        n_rows, target_tokens.stride(0), target_tokens.stride(1),
        tree.tokens.stride(0), tree.parents.stride(0), tree.node_count.stride(0),
        NP=_next_pow2(n_rows), num_warps=num_warps,
    )
    return out


def walk_tree_triton(tree: DDTree, target_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(accepted_indices [B, N], accept_lens [B], bonus [B]) = reference.walk_tree's outputs."""
    w = walk_commit_triton(tree, target_tokens)
    return w.accepted_indices, w.accept_lens, w.bonus
