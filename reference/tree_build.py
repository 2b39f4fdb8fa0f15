"""DDTree best-first draft tree: per-depth top-k, heap build, ancestor bitmasks, greedy walk.

The reference for the `tree_build` kernels (ddtree.md §2, §3.4). `build_ddtree` reproduces the
published `build_ddtree_tree` (liranringel/ddtree) bit for bit: a Python `heapq` keyed on
`(-score, rank_tuple)`, so equal scores go to the lexicographically smaller rank tuple, and scores
kept as Python float64 with the incremental sibling update `s - lp[d][r] + lp[d][r+1]`.

Dimension legend:
    B batch (requests)      L draft depth (block_size - 1)      K candidates per depth
    V vocab                 N = budget + 1 tree rows per request, row 0 = the root
    W = ceil(N / 64) int64 words of ancestor bitmask per row

Rows are in heap pop order (best first), which is NOT depth-major: depths interleave (§2.5).
Rows >= node_count[b] are padding: token 0, depth 0, parent -1, score -inf, and an ancestor mask
holding only their own bit, so an attention row built from it is never empty (no NaN softmax).

Run `python -m workbench.reference.tree_build` to print the worked example of ddtree.md §2.6.
"""

from __future__ import annotations

import heapq
import math
import operator

import torch
from torch import Tensor

from workbench.tree import WORD_BITS, DDTree  # the output record (shared with the kernels)

MAX_BUDGET = 1024  # N = 1025 rows = 17 mask words; the design targets budgets 1..128


def _require(ok: bool, name: str, expected: str, actual) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {actual}")


def _as_int(value, name: str, expected: str) -> int:
    """operator.index accepts Python and numpy ints and rejects floats; bool is not a count."""
    try:
        _require(not isinstance(value, bool), name, expected, repr(value))
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected {expected}, got {value!r}") from None


def _first_index(mask: Tensor) -> list[int]:
    return mask.nonzero()[0].tolist()


def topk_logprobs(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per-depth top-k of the draft log-probs: the tree builder's input (ddtree.md §2.1).

    logits [B, L, V], any float dtype -> (logprobs float32 [B, L, k], ids int64 [B, L, k]),
    sorted descending along k; k is clamped to V.

    Normalised in fp32 over the FULL vocabulary, because scores are compared across depths.
    Equal log-probs come out lower token id first: a stable descending sort keeps equal values
    in index order, whereas torch.topk promises no order among ties (and ties are common with
    bf16 logits, while the tree's tie-break depends on rank). Sorting all V is O(V log V) per
    row; fine for a reference.
    """
    _require(isinstance(logits, Tensor), "logits", "a Tensor", type(logits).__name__)
    _require(logits.dim() == 3, "logits", "shape [B, L, V] (rank 3)", tuple(logits.shape))
    _require(logits.is_floating_point(), "logits", "a floating dtype", logits.dtype)
    _require(logits.shape[-1] >= 1, "logits", "V >= 1", tuple(logits.shape))
    k = min(_as_int(k, "k", "an int >= 1"), logits.shape[-1])
    _require(k >= 1, "k", "an int >= 1", k)
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, L, V]
    values, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    return values[..., :k].contiguous(), ids[..., :k].contiguous()


def _check_build_inputs(top_logprobs, top_ids, budget, root_tokens, prefix_lens) -> int:
    budget = _as_int(budget, "budget", f"an int in [1, {MAX_BUDGET}]")
    _require(1 <= budget <= MAX_BUDGET, "budget", f"an int in [1, {MAX_BUDGET}]", budget)
    for name, t in (("top_logprobs", top_logprobs), ("top_ids", top_ids)):
        _require(isinstance(t, Tensor), name, "a Tensor", type(t).__name__)
        _require(t.dim() == 3, name, "shape [B, L, K] (rank 3)", tuple(t.shape))
    shape = tuple(top_logprobs.shape)
    _require(shape[1] >= 1 and shape[2] >= 1, "top_logprobs", "L >= 1 and K >= 1", shape)
    _require(tuple(top_ids.shape) == shape, "top_ids", f"shape {shape} (as top_logprobs)",
             tuple(top_ids.shape))
    _require(top_logprobs.is_floating_point(), "top_logprobs", "a floating dtype",
             top_logprobs.dtype)
    _require(not top_ids.is_floating_point() and not top_ids.is_complex()
             and top_ids.dtype != torch.bool, "top_ids", "an integer dtype", top_ids.dtype)
    for bad, what in ((torch.isnan(top_logprobs), "NaN"), (top_logprobs == math.inf, "+inf")):
        if bad.any():
            _require(False, "top_logprobs", "no NaN and no +inf (-inf is allowed)",
                     f"{what} at [b, d, r] = {_first_index(bad)}")
    rising = top_logprobs[..., 1:] > top_logprobs[..., :-1]  # [B, L, K-1]
    if rising.any():
        b, d, r = _first_index(rising)
        _require(False, "top_logprobs", "sorted descending along K",
                 f"[{b}, {d}, {r}] = {top_logprobs[b, d, r].item()} < "
                 f"[{b}, {d}, {r + 1}] = {top_logprobs[b, d, r + 1].item()}")
    for name, t in (("root_tokens", root_tokens), ("prefix_lens", prefix_lens)):
        if t is None:
            continue
        _require(isinstance(t, Tensor), name, "a Tensor or None", type(t).__name__)
        _require(tuple(t.shape) == shape[:1], name, f"shape ({shape[0]},) = [B]", tuple(t.shape))
        _require(not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool,
                 name, "an integer dtype", t.dtype)
    if prefix_lens is not None:
        _require(bool((prefix_lens >= 0).all()), "prefix_lens", "values >= 0",
                 prefix_lens.tolist())
    return budget


def _best_first(lp: list[list[float]], ids: list[list[int]], budget: int) -> list[tuple]:
    """The published heap (ddtree.md §2.3) for one request; lp, ids are [L][K] Python lists.

    Returns (token, depth, parent, score) per drafted node in pop order (node i = entry
    i - 1). Entries of score -inf are never pushed, so they never become nodes.
    """
    depth_count, k = len(lp), len(lp[0])
    heap: list[tuple] = []  # (-score, rank_tuple, parent, depth 1..L, rank 0..K-1)
    if lp[0][0] > -math.inf:
        heap.append((-lp[0][0], (0,), 0, 1, 0))
    nodes: list[tuple] = []
    while heap and len(nodes) < budget:
        neg_score, ranks, parent, d, r = heapq.heappop(heap)
        s = -neg_score
        nodes.append((ids[d - 1][r], d, parent, s))
        i = len(nodes)  # this node's row
        if r + 1 < k:  # next sibling: same parent, next rank at the same depth
            sib = s - lp[d - 1][r] + lp[d - 1][r + 1]  # incremental, in this order (bit-exact)
            if sib > -math.inf:
                heapq.heappush(heap, (-sib, ranks[:-1] + (r + 1,), parent, d, r + 1))
        if d < depth_count:  # first child: rank 0 at the next depth
            child = s + lp[d][0]
            if child > -math.inf:
                heapq.heappush(heap, (-child, ranks + (0,), i, d + 1, 0))
    return nodes


def _to_words(bits: int, n_words: int) -> list[int]:
    """A Python-int bitmask -> n_words int64 values (bit 63 of a word makes it negative)."""
    out = []
    for w in range(n_words):
        word = (bits >> (WORD_BITS * w)) & ((1 << WORD_BITS) - 1)
        out.append(word - (1 << WORD_BITS) if word >= 1 << (WORD_BITS - 1) else word)
    return out


def build_ddtree(
    top_logprobs: Tensor,
    top_ids: Tensor,
    budget: int,
    root_tokens: Tensor | None = None,
    prefix_lens: Tensor | None = None,
) -> DDTree:
    """Best-first DDTree of `budget` drafted nodes per request (ddtree.md §2.3).

    top_logprobs [B, L, K] float (sorted descending along K; -inf allowed, NaN/+inf not),
    top_ids [B, L, K] int, root_tokens [B] int (default 0), prefix_lens [B] int (default 0).
    Returns a DDTree of N = budget + 1 rows on top_logprobs' device. Each request is built
    independently on the host; only ranks < min(K, budget) are read, because a node of rank r
    needs its r earlier siblings in the tree first (Lemma 1). Token ids of one depth must be
    distinct among the ranks that can become nodes (a top-k always is; shard-local ids under
    vocab-parallel TP are not, see §2.1), since the walk finds a child by its token.
    """
    budget = _check_build_inputs(top_logprobs, top_ids, budget, root_tokens, prefix_lens)
    device = top_logprobs.device
    batch, _, k_in = top_logprobs.shape
    n_rows, k_used = budget + 1, min(k_in, budget)
    n_words = -(-n_rows // WORD_BITS)
    # Exact: float32/bf16/fp16 -> float64 is lossless, as the reference's `float()` per entry.
    lp_all = top_logprobs[..., :k_used].to(torch.float64).cpu().tolist()  # [B][L][K]
    id_all = top_ids[..., :k_used].to(torch.int64).cpu().tolist()
    roots = [0] * batch if root_tokens is None else root_tokens.tolist()
    prefix = torch.zeros(batch, dtype=torch.int64) if prefix_lens is None else prefix_lens

    cols: dict[str, list] = {n: [] for n in ("tok", "dep", "par", "sco", "anc", "fc", "ns")}
    counts = []
    for b in range(batch):
        for d, row in enumerate(id_all[b]):
            used = [t for t, v in zip(row, lp_all[b][d], strict=True) if v > -math.inf]
            _require(len(set(used)) == len(used), "top_ids",
                     "distinct ids among the finite candidates of a depth",
                     f"repeats in [{b}, {d}, :{k_used}] = {used}")
        nodes = _best_first(lp_all[b], id_all[b], budget)
        count, pad = len(nodes) + 1, budget - len(nodes)
        counts.append(count)
        parents = [-1] + [n[2] for n in nodes] + [-1] * pad
        cols["tok"].append([int(roots[b])] + [n[0] for n in nodes] + [0] * pad)
        cols["dep"].append([0] + [n[1] for n in nodes] + [0] * pad)
        cols["par"].append(parents)
        cols["sco"].append([0.0] + [n[3] for n in nodes] + [-math.inf] * pad)
        anc = [1]  # the root sees itself
        for i in range(1, count):  # parents[i] < i, so the parent's mask is ready
            anc.append(anc[parents[i]] | (1 << i))
        anc += [1 << i for i in range(count, n_rows)]  # padding sees only itself
        cols["anc"].append([_to_words(a, n_words) for a in anc])
        first, nxt, last = [-1] * n_rows, [-1] * n_rows, [-1] * n_rows
        for i in range(1, count):  # ascending index = ascending rank among siblings
            p = parents[i]
            if first[p] < 0:
                first[p] = i
            else:
                nxt[last[p]] = i
            last[p] = i
        cols["fc"].append(first)
        cols["ns"].append(nxt)

    def rows(key: str, dtype: torch.dtype, *shape: int) -> Tensor:
        return torch.tensor(cols[key], dtype=dtype).reshape(batch, *shape).to(device)

    depths = rows("dep", torch.int64, n_rows)
    return DDTree(
        tokens=rows("tok", torch.int64, n_rows),
        depths=depths,
        parents=rows("par", torch.int64, n_rows),
        scores=rows("sco", torch.float64, n_rows),
        anc_bits=rows("anc", torch.int64, n_rows, n_words),
        positions=prefix.to(device=device, dtype=torch.int64)[:, None] + depths,
        node_count=torch.tensor(counts, dtype=torch.int64).reshape(batch).to(device),
        first_child=rows("fc", torch.int64, n_rows),
        next_sibling=rows("ns", torch.int64, n_rows),
    )


def walk_tree(tree: DDTree, target_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy (or sample-and-walk) acceptance, ddtree.md §3.4, batched like the GPU kernel.

    target_tokens [B, N] int: the target's choice after node i (argmax, or a sample at T > 0).
    From the root, move to the child whose token is the current node's choice while one exists.
    Returns accepted_indices [B, N] int64 (the path incl. the root, padded with -1),
    accept_lens [B] int64 (= tokens emitted this round: accepted drafted nodes + the bonus),
    bonus [B] int64 (the choice at the last path node).
    """
    _require(isinstance(target_tokens, Tensor), "target_tokens", "a Tensor",
             type(target_tokens).__name__)
    _require(tuple(target_tokens.shape) == tuple(tree.tokens.shape), "target_tokens",
             f"shape {tuple(tree.tokens.shape)} = [B, N]", tuple(target_tokens.shape))
    _require(not target_tokens.is_floating_point() and not target_tokens.is_complex()
             and target_tokens.dtype != torch.bool, "target_tokens", "an integer dtype",
             target_tokens.dtype)
    batch, n_rows = tree.tokens.shape
    device = tree.tokens.device
    target = target_tokens.to(device=device, dtype=torch.int64)  # [B, N]
    idx = torch.arange(n_rows, device=device)  # [N]
    drafted = (idx > 0) & (idx < tree.node_count[:, None])  # [B, N], padding never matches
    accepted = torch.full((batch, n_rows), -1, dtype=torch.int64, device=device)
    accepted[:, 0] = 0
    cur = torch.zeros(batch, dtype=torch.int64, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    # One step per depth: a path has at most max_depth + 1 rows (this read is a host sync).
    max_depth = int(tree.depths.max()) if tree.depths.numel() else 0
    for step in range(1, max_depth + 1):
        choice = target.gather(1, cur[:, None])  # [B, 1]
        match = drafted & (tree.parents == cur[:, None]) & (tree.tokens == choice)
        # Siblings carry distinct tokens, so at most one child matches; take the lowest index.
        nxt = torch.where(match, idx, n_rows).min(dim=1).values  # [B], n_rows = no match
        alive = alive & (nxt < n_rows)
        cur = torch.where(alive, nxt, cur)
        accepted[:, step] = torch.where(alive, nxt, -1)
    accept_lens = (accepted >= 0).sum(dim=1)
    bonus = target.gather(1, cur[:, None]).squeeze(1)
    return accepted, accept_lens, bonus


def format_tree(tree: DDTree, b: int = 0, decode=None) -> str:
    """Request b's tree as indented text, one node a line: index, token, depth, score."""
    batch = tree.tokens.shape[0]
    b = _as_int(b, "b", f"a request index in [0, {batch})")
    _require(0 <= b < batch, "b", f"a request index in [0, {batch})", b)
    tokens, depths = tree.tokens[b].tolist(), tree.depths[b].tolist()
    scores = tree.scores[b].tolist()
    first, nxt = tree.first_child[b].tolist(), tree.next_sibling[b].tolist()
    count = int(tree.node_count[b])
    lines = [f"request {b}: {count - 1} drafted nodes of budget {tree.budget}, "
             f"position {int(tree.positions[b, 0])} at the root"]
    stack = [0]  # depth-first, children in ascending index (= descending probability)
    while stack:
        i = stack.pop()
        token = repr(decode(tokens[i])) if decode is not None else str(tokens[i])
        lines.append(f"{'  ' * depths[i]}[{i}] {token}  depth {depths[i]}  score {scores[i]:.4f}")
        children, c = [], first[i]
        while c >= 0:
            children.append(c)
            c = nxt[c]
        stack.extend(reversed(children))
    return "\n".join(lines)


if __name__ == "__main__":
    # ddtree.md §2.6: L=3, K=2, budget 5; then its greedy walk example (t* = 999).
    lp = torch.tensor([[[-0.1, -2.5], [-0.3, -1.5], [-0.2, -1.8]]])
    ids = torch.tensor([[[101, 102], [201, 202], [301, 302]]])
    tree = build_ddtree(lp, ids, budget=5, root_tokens=torch.tensor([7]))
    print(format_tree(tree))
    print("parents", tree.parents[0].tolist(), " E[accepted] =",
          round(float(tree.scores[0, 1:].exp().sum()), 4))
    target = torch.tensor([[101, 202, 0, 0, 301, 999]])
    path, lens, bonus = walk_tree(tree, target)
    print("path", path[0].tolist(), " accept_len", int(lens[0]), " bonus", int(bonus[0]))
