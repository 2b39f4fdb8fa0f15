"""What the tree_build versions share: host checks, output allocation, launch arguments, the
kernels' constants, and the @triton.jit helpers whose code is the same in several versions.

Each triton_vN.py keeps its own `_tree_build_kernel` (llm.c style: a version's pop loop reads on
its own, next to what makes it different) and a thin launcher. The helpers here are the parts
before and after the pop loop (root / prefix loads, the L1 prefetch, initial slots and rows, the
end-of-kernel row stores, the ancestor-bit pointer chase) and the tuple reduction's combine
functions. Code inside the pop loops stays written out in each version: under the interpreter
a @jit helper call costs about 0.4 ms (measured on a CPU box, where one program's pop takes 3-4
ms), and in the loop that would be paid on every pop. On the GPU the helpers are inlined: each kernel's sm_90 PTX is
the same as with their code written out in it (v5 at L > 9: `_better2`'s compares come in v1's
order, which was v5's own copy's order reversed; same instructions and registers).

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

from workbench.tree import DDTree

MAX_BUDGET = 128  # 7-bit rank digits: ranks < min(K, budget) <= 128
MAX_DEPTH = 16  # two 63-bit key words of 9 + 7 digits
ONE_WORD_DEPTH = 9  # 9 digits x 7 bits = 63 bits: one non-negative int64 key word

# In the kernels, meta = slot | rank << 8 | depth << 16 | previous sibling << 21 (int32; slots,
# ranks and rows < 256, depths < 32; v2 and v5 add -0.0 << 29): literal shifts, as the
# interpreter rejects int << constexpr.
assert MAX_BUDGET <= 255  # slots, ranks and rows fit the 8-bit fields of meta
_NEG_INF = tl.constexpr(float("-inf"))
_KEY_MAX = tl.constexpr(2**63 - 1)  # v1/v3/v4 built-in pop: no rank key (int64)
_META_MAX = tl.constexpr(2**31 - 1)  # ... and no meta (int32)
_I32_MIN = tl.constexpr(-(2**31))
_I32_MAX = tl.constexpr(2**31 - 1)
_I64_MIN = tl.constexpr(-(2**63))  # also the bits of -0.0
_I64_MAX = tl.constexpr(2**63 - 1)
_NEG_ZERO_BIT = tl.constexpr(1 << 29)  # v2/v5: meta bit of an entry whose score is -0.0
# what tl.max / tl.min reduce with, passed to tl.reduce directly (see triton_v1's pop: in the
# interpreter tl.max is a @jit helper call)
_max_combine = tl.standard._elementwise_max
_min_combine = tl.standard._elementwise_min


# ------------------------------------------------------------------------- shared device code


@triton.jit
def _better1(s1, k1, m1, s2, k2, m2):
    # Python heapq on (-score, ranks): higher score first, equal scores -> smaller rank key.
    # Live entries never tie on (score, key), so the combine is a total order on them.
    # (Scores are float64 in v1/v3/v4 and order-preserving int64 keys in v5.)
    take1 = (s1 > s2) | ((s1 == s2) & (k1 < k2))
    return tl.where(take1, s1, s2), tl.where(take1, k1, k2), tl.where(take1, m1, m2)


@triton.jit
def _better2(s1, k1, j1, m1, s2, k2, j2, m2):
    key_lt = (k1 < k2) | ((k1 == k2) & (j1 < j2))  # (k, j): two-word lexicographic compare
    take1 = (s1 > s2) | ((s1 == s2) & key_lt)
    return (tl.where(take1, s1, s2), tl.where(take1, k1, k2), tl.where(take1, j1, j2),
            tl.where(take1, m1, m2))


@triton.jit
def _load_prefix_root(prefix_ptr, root_ptr, b, s_prefix, s_root,
                      HAS_PREFIX: tl.constexpr, HAS_ROOT: tl.constexpr):
    """Request b's prefix length and root token as int64 scalars (0 when not given)."""
    prefix = tl.zeros([], tl.int64)
    if HAS_PREFIX:
        prefix = tl.load(prefix_ptr + b * s_prefix).to(tl.int64)
    root = tl.zeros([], tl.int64)
    if HAS_ROOT:
        root = tl.load(root_ptr + b * s_root).to(tl.int64)
    return prefix, root


@triton.jit
def _prefetch_table(lp_b, sco_ptr, row0, depth_count, k_used, s_ll, s_lk,
                    LP: tl.constexpr, KP: tl.constexpr):
    """Touch the request's whole [L, K] log-prob table once: the pops' scalar loads then hit L1
    (v2..v5, on CUDA)."""
    dl = tl.arange(0, LP)
    kr = tl.arange(0, KP)
    table = tl.load(lp_b + dl[:, None] * s_ll + kr[None, :] * s_lk,
                    mask=(dl < depth_count)[:, None] & (kr < k_used)[None, :], other=0.0)
    # a store that never happens (k_used >= 1) keeps the loads alive
    tl.store(sco_ptr + row0, tl.max(tl.max(table.to(tl.float32), 1), 0).to(tl.float64),
             mask=k_used < 0)


@triton.jit
def _store_root_row(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, row0, root,
                    prefix, n_rows, NP: tl.constexpr):
    """Row 0 = the root; first_child / next_sibling start at -1 everywhere (v1, v2: their pops
    store rows and links as they go, so the caller puts a barrier after this)."""
    tl.store(tok_ptr + row0, root)
    tl.store(dep_ptr + row0, tl.zeros([], tl.int64))
    tl.store(par_ptr + row0, tl.full([], -1, tl.int64))
    tl.store(sco_ptr + row0, tl.zeros([], tl.float64))
    tl.store(pos_ptr + row0, prefix)
    rows = tl.arange(0, NP)  # [NP] node rows
    in_rows = rows < n_rows
    tl.store(fc_ptr + row0 + rows, tl.full([NP], -1, tl.int64), mask=in_rows)
    tl.store(ns_ptr + row0 + rows, tl.full([NP], -1, tl.int64), mask=in_rows)


@triton.jit
def _initial_slots(lp_b, SP: tl.constexpr):
    """The float64 slot vectors (v1/v3/v4): slot 0 = the root's first child, rank 0 at depth 1;
    every other slot empty (-inf, never popped). Returns slot indices, scores, the rank key's
    two words (digits of depths 1..9 and 10..16) and meta, all [SP]."""
    slot = tl.arange(0, SP)  # [SP]
    s0 = tl.load(lp_b).to(tl.float64)
    sc = tl.where(slot == 0, s0, _NEG_INF)  # [SP] float64 scores
    key0 = tl.zeros([SP], tl.int64)  # rank digits of depths 1..9
    key1 = tl.zeros([SP], tl.int64)  # rank digits of depths 10..16 (TWO_WORDS only)
    meta = tl.where(slot == 0, 1 << 16, slot)  # slot | rank | depth | prev sibling
    return slot, sc, key0, key1, meta


@triton.jit
def _padding_rows(rows, NP: tl.constexpr):
    """[NP] rows kept in registers (v3/v4/v5), at their padding values (row 0: the root):
    parents, depth | rank << 8 (tokens are gathered at the end), scores, first child and next
    sibling."""
    parents = tl.full([NP], -1, tl.int32)
    dep_rank = tl.zeros([NP], tl.int32)
    scores = tl.where(rows == 0, 0.0, _NEG_INF).to(tl.float64)
    first = tl.full([NP], -1, tl.int32)
    nexts = tl.full([NP], -1, tl.int32)
    return parents, dep_rank, scores, first, nexts


@triton.jit
def _store_node_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, ids_b, out,
                     rows, in_rows, count, root, prefix, parents, dep_rank, scores, first, nexts,
                     s_il, s_ik, LINKS: tl.constexpr):
    """Every row at once (v3/v4/v5) from the [NP] register rows: token, depth, parent and
    position, and with LINKS also score, first child and next sibling (v5 stores those itself,
    or already did per pop). Tokens are gathered from the id table here: ids[d - 1, r] for rows
    1..count, the root's for row 0, 0 for padding."""
    depth = (dep_rank & 255).to(tl.int64)
    real = (rows > 0) & (rows <= count)
    tok = tl.load(ids_b + tl.maximum(depth - 1, 0) * s_il + (dep_rank >> 8) * s_ik, mask=real,
                  other=0).to(tl.int64)
    tl.store(tok_ptr + out, tl.where(rows == 0, root, tok), mask=in_rows)
    tl.store(dep_ptr + out, depth, mask=in_rows)
    tl.store(par_ptr + out, parents.to(tl.int64), mask=in_rows)
    if LINKS:
        tl.store(sco_ptr + out, scores, mask=in_rows)
    tl.store(pos_ptr + out, prefix + depth, mask=in_rows)
    if LINKS:
        tl.store(fc_ptr + out, first.to(tl.int64), mask=in_rows)
        tl.store(ns_ptr + out, nexts.to(tl.int64), mask=in_rows)


@triton.jit
def _store_ancestor_bits(anc_ptr, parents, row0, rows, in_rows, depth_count, n_words,
                         NP: tl.constexpr, WP: tl.constexpr):
    """Ancestor-or-self bits of every row from the [NP] int32 parent vector (-1: none), by
    pointer chasing in registers: own bit, then one ancestor per step (a path has <= L edges).
    W int64 words per row."""
    words = tl.arange(0, WP)  # [WP]
    one = tl.full([NP, WP], 1, tl.int64)
    anc = tl.where(words[None, :] == (rows // 64)[:, None],
                   one << (rows % 64).to(tl.int64)[:, None], 0)  # [NP, WP]
    p = parents
    for _ in range(depth_count):
        pc = tl.maximum(p, 0)
        hit = (p >= 0)[:, None] & (words[None, :] == (pc // 64)[:, None])
        anc = anc | tl.where(hit, one << (pc % 64).to(tl.int64)[:, None], 0)
        p = tl.where(p > 0, tl.gather(parents, pc, 0), -1)
    anc_off = (row0 + rows)[:, None] * n_words + words[None, :]
    tl.store(anc_ptr + anc_off, anc, mask=in_rows[:, None] & (words[None, :] < n_words))


@triton.jit
def _store_info_rows(tok_ptr, dep_ptr, par_ptr, sco_ptr, pos_ptr, fc_ptr, ns_ptr, anc_ptr, ids_b,
                     row0, rows, in_rows, info, scores, root, prefix, depth_count, n_words,
                     s_il, s_ik, NP: tl.constexpr, WP: tl.constexpr):
    """Every row at once (v6-v9) from the [NP] packed row words (info: parent bits 0-7, depth
    8-12, rank 13-19, previous sibling 20-27; < 0 for row 0 and padding) and the [NP] scores:
    token, depth, parent, score, position; first-child / next-sibling links scattered from the
    parents' and previous siblings' side; ancestor bits."""
    out = row0 + rows
    real = info >= 0  # rows 1..count
    parents = tl.where(real, info & 255, -1)
    depth = tl.where(real, (info >> 8) & 31, 0)
    rank = (info >> 13) & 127
    prev = (info >> 20) & 255
    tok = tl.load(ids_b + tl.maximum(depth - 1, 0) * s_il + rank * s_ik, mask=real,
                  other=0).to(tl.int64)
    tl.store(tok_ptr + out, tl.where(rows == 0, root, tok), mask=in_rows)
    tl.store(dep_ptr + out, depth.to(tl.int64), mask=in_rows)
    tl.store(par_ptr + out, parents.to(tl.int64), mask=in_rows)
    tl.store(sco_ptr + out, scores, mask=in_rows)
    tl.store(pos_ptr + out, prefix + depth, mask=in_rows)
    minus_one = tl.full([NP], -1, tl.int64)
    tl.store(fc_ptr + out, minus_one, mask=in_rows)
    tl.store(ns_ptr + out, minus_one, mask=in_rows)
    tl.debug_barrier()  # the scatters below write rows other threads filled with -1
    row_ids = rows.to(tl.int64)
    tl.store(fc_ptr + row0 + parents, row_ids, mask=real & (rank == 0))
    tl.store(ns_ptr + row0 + prev, row_ids, mask=real & (rank > 0))
    _store_ancestor_bits(anc_ptr, parents, row0, rows, in_rows, depth_count, n_words, NP, WP)


# ------------------------------------------------------------------------------ host: checks


def _require(ok: bool, name: str, expected: str, actual) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {actual}")


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _check_device(t: Tensor, name: str, device: torch.device) -> None:
    _require(t.device == device, name, f"a tensor on {device} (as top_logprobs)", t.device)


def _check_runnable(device: torch.device, arg: str = "top_logprobs") -> None:
    if device.type == "cuda":
        return
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    _require(device.type == "cpu" and interpreting, arg,
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


# ------------------------------------------------------------------------------ host: launch


@dataclass(frozen=True)
class Launch:
    """A checked build, ready to launch: `_tree_build_kernel[launch.grid](*launch.args, ...)`.

    args are the arguments every version's kernel takes first, in its signature's order (inputs,
    outputs, budget..n_words, strides); the launcher adds its kernel's constexprs, picking from
    the values below (the same in every version unless a launcher says otherwise)."""

    grid: tuple[int]
    args: tuple
    depth_count: int  # L
    k_used: int  # min(K, budget): the ranks a build can pop
    cuda: bool  # top_logprobs is a CUDA tensor (else: the interpreter)
    SP: int  # slots: budget, next power of two
    NP: int  # rows: N = budget + 1, next power of two
    WP: int  # mask words: ceil(N / 64), next power of two
    LP: int  # L, next power of two (the prefetched table)
    KP: int  # k_used, next power of two
    TWO_WORDS: bool  # L > 9: the int64 rank key needs its second word
    HAS_ROOT: bool
    HAS_PREFIX: bool

    def on_cuda(self, flag: bool | None) -> bool:
        """A path switch left at None: on for CUDA tensors, off in the interpreter."""
        return self.cuda if flag is None else flag


def prepare_build(top_logprobs, top_ids, budget, root_tokens, prefix_lens,
                  validate: bool) -> tuple[DDTree, Launch | None]:
    """check_and_allocate, then the launch (None for an empty batch: nothing to run)."""
    tree = check_and_allocate(top_logprobs, top_ids, budget, root_tokens, prefix_lens, validate)
    batch, n_rows = tree.tokens.shape
    if batch == 0:
        return tree, None
    lp, ids = top_logprobs, top_ids
    depth_count, k_in = lp.shape[1:]
    k_used = min(k_in, budget)
    n_words = tree.anc_bits.shape[2]
    root = root_tokens if root_tokens is not None else tree.tokens  # dummies, never read
    prefix = prefix_lens if prefix_lens is not None else tree.tokens
    args = (
        lp, ids, root, prefix,
        tree.tokens, tree.depths, tree.parents, tree.scores, tree.anc_bits, tree.positions,
        tree.node_count, tree.first_child, tree.next_sibling,
        budget, depth_count, k_used, n_rows, n_words,
        lp.stride(0), lp.stride(1), lp.stride(2), ids.stride(0), ids.stride(1), ids.stride(2),
        root.stride(0), prefix.stride(0),
    )
    return tree, Launch(
        grid=(batch,), args=args, depth_count=depth_count, k_used=k_used, cuda=lp.is_cuda,
        SP=_next_pow2(budget), NP=_next_pow2(n_rows), WP=_next_pow2(n_words),
        LP=_next_pow2(depth_count), KP=_next_pow2(k_used),
        TWO_WORDS=depth_count > ONE_WORD_DEPTH,
        HAS_ROOT=root_tokens is not None, HAS_PREFIX=prefix_lens is not None,
    )
