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

Dimension legend: B requests, L draft depth, K candidates per depth, N = budget + 1 rows,
W = ceil(N / 64) mask words; SP slots, NP node rows and WP words rounded up to powers of two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from workbench.reference.tree_build import DDTree

MAX_BUDGET = 128  # 7-bit rank digits: ranks < min(K, budget) <= 128
MAX_DEPTH = 16  # two 63-bit key words of 9 + 7 digits
ONE_WORD_DEPTH = 9  # 9 digits x 7 bits = 63 bits: one non-negative int64 key word

# In the kernel, meta = slot | rank << 8 | depth << 16 | previous sibling << 21 (int32; slots,
# ranks and rows < 256, depths < 32): literal shifts, as the interpreter rejects int << constexpr.
_NEG_INF = tl.constexpr(float("-inf"))
_KEY_MAX = tl.constexpr(2**63 - 1)
_META_MAX = tl.constexpr(2**31 - 1)
_max_combine = tl.standard._elementwise_max  # what tl.max reduces with
_min_combine = tl.standard._elementwise_min


# ------------------------------------------------------------------------------------- kernels


@triton.jit
def _better1(s1, k1, m1, s2, k2, m2):
    # Python heapq on (-score, ranks): higher score first, equal scores -> smaller rank key.
    # Live entries never tie on (score, key), so the combine is a total order on them.
    take1 = (s1 > s2) | ((s1 == s2) & (k1 < k2))
    return tl.where(take1, s1, s2), tl.where(take1, k1, k2), tl.where(take1, m1, m2)


@triton.jit
def _better2(s1, k1, j1, m1, s2, k2, j2, m2):
    key_lt = (k1 < k2) | ((k1 == k2) & (j1 < j2))  # (k, j): two-word lexicographic compare
    take1 = (s1 > s2) | ((s1 == s2) & key_lt)
    return (tl.where(take1, s1, s2), tl.where(take1, k1, k2), tl.where(take1, j1, j2),
            tl.where(take1, m1, m2))


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

    prefix = tl.zeros([], tl.int64)
    if HAS_PREFIX:
        prefix = tl.load(prefix_ptr + b * s_prefix).to(tl.int64)
    root = tl.zeros([], tl.int64)
    if HAS_ROOT:
        root = tl.load(root_ptr + b * s_root).to(tl.int64)

    # row 0 = the root; first_child / next_sibling start at -1 everywhere
    tl.store(tok_ptr + row0, root)
    tl.store(dep_ptr + row0, tl.zeros([], tl.int64))
    tl.store(par_ptr + row0, tl.full([], -1, tl.int64))
    tl.store(sco_ptr + row0, tl.zeros([], tl.float64))
    tl.store(pos_ptr + row0, prefix)
    rows = tl.arange(0, NP)  # [NP] node rows
    in_rows = rows < n_rows
    tl.store(fc_ptr + row0 + rows, tl.full([NP], -1, tl.int64), mask=in_rows)
    tl.store(ns_ptr + row0 + rows, tl.full([NP], -1, tl.int64), mask=in_rows)
    tl.debug_barrier()  # the scalar stores below may come from another thread

    # slot 0 = the root's first child: rank 0 at depth 1 (-inf = empty, never popped)
    slot = tl.arange(0, SP)  # [SP]
    s0 = tl.load(lp_b).to(tl.float64)
    sc = tl.where(slot == 0, s0, neg_inf)  # [SP] float64 scores
    key0 = tl.zeros([SP], tl.int64)  # rank digits of depths 1..9
    key1 = tl.zeros([SP], tl.int64)  # rank digits of depths 10..16 (TWO_WORDS only)
    meta = tl.where(slot == 0, 1 << 16, slot)  # slot | rank | depth | prev sibling
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

    # ancestor-or-self bits: own bit, then one ancestor per step (a path has <= L edges)
    words = tl.arange(0, WP)  # [WP]
    one = tl.full([NP, WP], 1, tl.int64)
    own = tl.where(words[None, :] == (rows // 64)[:, None], one << (rows % 64).to(tl.int64)[:, None],
                   0)
    anc = own  # [NP, WP]
    p = parents
    for _ in range(depth_count):
        pc = tl.maximum(p, 0)
        hit = (p >= 0)[:, None] & (words[None, :] == (pc // 64)[:, None])
        anc = anc | tl.where(hit, one << (pc % 64).to(tl.int64)[:, None], 0)
        p = tl.where(p > 0, tl.gather(parents, pc, 0), -1)
    anc_off = (row0 + rows)[:, None] * n_words + words[None, :]
    tl.store(anc_ptr + anc_off, anc, mask=in_rows[:, None] & (words[None, :] < n_words))


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


def _require(ok: bool, name: str, expected: str, actual) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {actual}")


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _check_device(t: Tensor, name: str, device: torch.device) -> None:
    _require(t.device == device, name, f"a tensor on {device} (as top_logprobs)", t.device)


def _check_runnable(device: torch.device) -> None:
    if device.type == "cuda":
        return
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    _require(device.type == "cpu" and interpreting, "top_logprobs",
             "a CUDA tensor, or a CPU tensor with TRITON_INTERPRET=1 set before this module "
             "is imported", f"a tensor on {device} (TRITON_INTERPRET="
             f"{os.environ.get('TRITON_INTERPRET')!r})")


def _validate_contents(top_logprobs, top_ids, budget, root_tokens, prefix_lens) -> None:
    """The reference's content checks (NaN, +inf, unsorted, negative prefix, repeated ids).
    These read values back to the host: a device sync, so only behind validate=True."""
    from workbench.reference.tree_build import _check_build_inputs

    _check_build_inputs(top_logprobs, top_ids, budget, root_tokens, prefix_lens)
    k_used = min(top_logprobs.shape[2], budget)
    ids = top_ids[..., :k_used].to(torch.int64)
    finite = top_logprobs[..., :k_used] > -torch.inf  # [B, L, K]
    same = (ids[..., :, None] == ids[..., None, :]) & finite[..., :, None] & finite[..., None, :]
    same &= ~torch.eye(k_used, dtype=torch.bool, device=ids.device)
    if bool(same.any()):
        b, d = same.nonzero()[0, :2].tolist()
        _require(False, "top_ids", "distinct ids among the finite candidates of a depth",
                 f"repeats in [{b}, {d}, :{k_used}] = {ids[b, d].tolist()}")


def check_and_allocate(top_logprobs, top_ids, budget, root_tokens, prefix_lens,
                       validate: bool, max_budget: int = MAX_BUDGET) -> DDTree:
    """The launchers' shared front: shape/dtype/device checks (no sync), the optional content
    validation (syncs), and the output tree, allocated uninitialised (the kernel writes every
    element)."""
    if (isinstance(budget, bool) or not isinstance(budget, int)
            or not 1 <= budget <= max_budget):
        raise ValueError(f"budget: expected an int in [1, {max_budget}], got {budget!r}")
    for name, t in (("top_logprobs", top_logprobs), ("top_ids", top_ids)):
        _require(isinstance(t, Tensor), name, "a Tensor", type(t).__name__)
        _require(t.dim() == 3, name, "shape [B, L, K] (rank 3)", tuple(t.shape))
    shape = tuple(top_logprobs.shape)
    batch, depth_count, k_in = shape
    _require(1 <= depth_count <= MAX_DEPTH and k_in >= 1, "top_logprobs",
             f"1 <= L <= {MAX_DEPTH} and K >= 1", shape)
    _require(tuple(top_ids.shape) == shape, "top_ids", f"shape {shape} (as top_logprobs)",
             tuple(top_ids.shape))
    _require(top_logprobs.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16),
             "top_logprobs", "dtype float32, float64, bfloat16 or float16", top_logprobs.dtype)
    _require(_is_int_dtype(top_ids.dtype), "top_ids", "an integer dtype", top_ids.dtype)
    device = top_logprobs.device
    _check_device(top_ids, "top_ids", device)
    for name, t in (("root_tokens", root_tokens), ("prefix_lens", prefix_lens)):
        if t is None:
            continue
        _require(isinstance(t, Tensor), name, "a Tensor or None", type(t).__name__)
        _require(tuple(t.shape) == (batch,), name, f"shape ({batch},) = [B]", tuple(t.shape))
        _require(_is_int_dtype(t.dtype), name, "an integer dtype", t.dtype)
        _check_device(t, name, device)
    if validate:
        _validate_contents(top_logprobs, top_ids, budget, root_tokens, prefix_lens)
    if batch:
        _check_runnable(device)
    n_rows = budget + 1
    n_words = -(-n_rows // 64)
    i64 = dict(dtype=torch.int64, device=device)
    return DDTree(
        tokens=torch.empty(batch, n_rows, **i64),
        depths=torch.empty(batch, n_rows, **i64),
        parents=torch.empty(batch, n_rows, **i64),
        scores=torch.empty(batch, n_rows, dtype=torch.float64, device=device),
        anc_bits=torch.empty(batch, n_rows, n_words, **i64),
        positions=torch.empty(batch, n_rows, **i64),
        node_count=torch.empty(batch, **i64),
        first_child=torch.empty(batch, n_rows, **i64),
        next_sibling=torch.empty(batch, n_rows, **i64),
    )


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
    tree = check_and_allocate(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    batch, n_rows = tree.tokens.shape
    if batch == 0:
        return tree
    lp, ids = top_logprobs, top_ids
    depth_count, k_in = lp.shape[1:]
    n_words = tree.anc_bits.shape[2]
    root = root_tokens if root_tokens is not None else tree.tokens  # dummies, never read
    prefix = prefix_lens if prefix_lens is not None else tree.tokens
    _tree_build_kernel[(batch,)](
        lp, ids, root, prefix,
        tree.tokens, tree.depths, tree.parents, tree.scores, tree.anc_bits, tree.positions,
        tree.node_count, tree.first_child, tree.next_sibling,
        budget, depth_count, min(k_in, budget), n_rows, n_words,
        lp.stride(0), lp.stride(1), lp.stride(2), ids.stride(0), ids.stride(1), ids.stride(2),
        root.stride(0), prefix.stride(0),
        SP=_next_pow2(budget), NP=_next_pow2(n_rows), WP=_next_pow2(n_words),
        TWO_WORDS=depth_count > ONE_WORD_DEPTH,
        HAS_ROOT=root_tokens is not None, HAS_PREFIX=prefix_lens is not None,
        TUPLE_REDUCE=lp.is_cuda if tuple_reduce is None else tuple_reduce,
        num_warps=num_warps,
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
    _check_runnable(device)
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
