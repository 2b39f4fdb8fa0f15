"""Tests for reference/tree_build.py: the DDTree best-first build, its bitmasks and the walk.

Anchors: the worked vector of ddtree.md §2.6, the ordering invariants of §2.5, and a brute-force
oracle (every prefix, sorted by (-score, rank tuple)) that does not use a heap at all.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.reference.tree_build import (
    MAX_BUDGET,
    DDTree,
    build_ddtree,
    format_tree,
    topk_logprobs,
    walk_tree,
)

INF = math.inf
NO_CHILD = 10**6  # a target choice no drafted token uses

# ddtree.md §2.6: L=3, K=2, budget 5.
WORKED_LP = [[-0.1, -2.5], [-0.3, -1.5], [-0.2, -1.8]]
WORKED_IDS = [[101, 102], [201, 202], [301, 302]]


def worked_tree(**kw) -> DDTree:
    return build_ddtree(torch.tensor([WORKED_LP]), torch.tensor([WORKED_IDS]), budget=5, **kw)


# ---------------------------------------------------------------- helpers: oracles and invariants


def oracle_order(lp: list[list[float]], budget: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every prefix (u_1..u_d) of finite score, sorted by (-score, rank tuple), first `budget`.

    Scores are fresh left-to-right float64 sums, not the heap's incremental sibling update. The
    hypothesis tables draw float32 values of magnitude <= 2.5 (lowest set bit >= 2^-27), so any
    sum of <= 4 of them, and every partial `s - lp[r] + lp[r+1]`, is exact in float64: both ways
    give the same bits, and the comparison can be exact. `oracle_order_incremental` covers
    general values.
    """
    depth, k = len(lp), len(lp[0])
    entries = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            score = 0.0
            for i, r in enumerate(ranks):
                score += lp[i][r]
            if score > -INF:
                entries.append((-score, ranks))
    entries.sort()
    return entries[:budget]


def oracle_order_incremental(lp, budget):
    """As oracle_order, but each score is computed with the reference's exact formula: parent +
    lp[d][0], then `s - lp[d][j-1] + lp[d][j]` per later rank. Needed for arbitrary float32
    values, where the fresh sum can round differently from the incremental one."""
    depth, k = len(lp), len(lp[0])
    score_of = {(): 0.0}
    entries = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            s = score_of[ranks[:-1]] + lp[d - 1][0]
            for j in range(1, ranks[-1] + 1):
                s = s - lp[d - 1][j - 1] + lp[d - 1][j]
            score_of[ranks] = s
            if s > -INF:
                entries.append((-s, ranks))
    entries.sort()
    return entries[:budget]


def tree_order(tree: DDTree, ids: list[list[int]], b: int) -> list[tuple[float, tuple[int, ...]]]:
    """The built nodes of request b as (-score, rank tuple), in node (= pop) order."""
    count = int(tree.node_count[b])
    parents, depths = tree.parents[b].tolist(), tree.depths[b].tolist()
    tokens, scores = tree.tokens[b].tolist(), tree.scores[b].tolist()
    ranks: list[tuple[int, ...]] = [()]
    for i in range(1, count):
        rank = ids[depths[i] - 1].index(tokens[i])  # ids are distinct within a depth
        ranks.append(ranks[parents[i]] + (rank,))
    return [(-scores[i], ranks[i]) for i in range(1, count)]


def finite_prefix_count(lp: list[list[float]]) -> int:
    total, width = 0, 1
    for row in lp:
        width *= sum(v > -INF for v in row)
        total += width
    return total


def visibility_from_parents(parents: list[int], count: int, n_rows: int) -> list[list[bool]]:
    vis = [[i == j for j in range(n_rows)] for i in range(n_rows)]  # padding: itself only
    for i in range(count):
        j = i
        while j >= 0:
            vis[i][j] = True
            j = parents[j]
    return vis


def anc_as_ints(tree: DDTree, b: int) -> list[int]:
    words = tree.anc_bits[b].tolist()  # [N][W], signed int64
    return [sum((w % (1 << 64)) << (64 * k) for k, w in enumerate(row)) for row in words]


def check_invariants(tree: DDTree, lp, ids, budget: int, prefix_lens=None, roots=None) -> None:
    """ddtree.md §2.5 and the DDTree layout, for every request. lp/ids are [B][L][K] lists."""
    batch, n_rows = tree.tokens.shape
    n_words = -(-n_rows // 64)
    assert n_rows == budget + 1 and tree.budget == budget and tree.num_rows == n_rows
    assert tree.anc_bits.shape == (batch, n_rows, n_words)
    for name, dtype in [("tokens", torch.int64), ("depths", torch.int64),
                        ("parents", torch.int64), ("scores", torch.float64),
                        ("anc_bits", torch.int64), ("positions", torch.int64),
                        ("node_count", torch.int64), ("first_child", torch.int64),
                        ("next_sibling", torch.int64)]:
        assert getattr(tree, name).dtype == dtype, name
    vis = tree.visibility()
    for b in range(batch):
        count = int(tree.node_count[b])
        assert count == min(budget, finite_prefix_count(lp[b])) + 1
        tokens, depths = tree.tokens[b].tolist(), tree.depths[b].tolist()
        parents, scores = tree.parents[b].tolist(), tree.scores[b].tolist()
        prefix = 0 if prefix_lens is None else prefix_lens[b]
        assert tokens[0] == (0 if roots is None else roots[b])
        assert (depths[0], parents[0], scores[0]) == (0, -1, 0.0)
        children: dict[int, list[int]] = {i: [] for i in range(count)}
        for i in range(1, count):
            p = parents[i]
            assert 0 <= p < i  # topological order
            assert depths[i] == depths[p] + 1
            assert scores[i] <= scores[i - 1]  # best first
            rank = ids[b][depths[i] - 1].index(tokens[i])
            assert lp[b][depths[i] - 1][rank] > -INF  # -inf never becomes a node
            children[p].append(rank)
        for ranks in children.values():
            assert ranks == list(range(len(ranks)))  # siblings in increasing rank, no gaps
        for i in range(count, n_rows):  # padding
            assert (tokens[i], depths[i], parents[i], scores[i]) == (0, 0, -1, -INF)
        assert tree.positions[b].tolist() == [prefix + d for d in depths]
        anc = anc_as_ints(tree, b)
        for i in range(n_rows):
            own = 1 << i
            expected = anc[parents[i]] | own if 0 < i < count else own
            assert anc[i] == expected, (b, i)
        assert vis[b].tolist() == visibility_from_parents(parents, count, n_rows)
        # left-child/right-sibling: the children of each node in ascending index
        first, nxt = tree.first_child[b].tolist(), tree.next_sibling[b].tolist()
        kids: list[list[int]] = [[] for _ in range(n_rows)]
        for j in range(1, count):
            kids[parents[j]].append(j)
        for i in range(n_rows):
            assert first[i] == (kids[i][0] if kids[i] else -1)
            for a, c in zip(kids[i], kids[i][1:] + [-1], strict=False):
                assert nxt[a] == c
        assert all(nxt[i] == -1 for i in range(count, n_rows)) and nxt[0] == -1


def reference_walk(tree: DDTree, target: list[int], b: int) -> tuple[list[int], int]:
    """follow_verified_tree of ddtree.md §3.4, with child_maps dicts."""
    count = int(tree.node_count[b])
    child_maps: list[dict[int, int]] = [{} for _ in range(count)]
    for i in range(1, count):
        child_maps[int(tree.parents[b, i])][int(tree.tokens[b, i])] = i
    path, cur, t = [0], 0, target[0]
    while t in child_maps[cur]:
        cur = child_maps[cur][t]
        path.append(cur)
        t = target[cur]
    return path, t


def random_ids(gen: torch.Generator, batch: int, depth: int, k: int) -> torch.Tensor:
    """[B, L, K] distinct ids per depth, drawn from a vocab of 3K so depths share some ids."""
    rows = [torch.randperm(3 * k, generator=gen)[:k] for _ in range(batch * depth)]
    return torch.stack(rows).reshape(batch, depth, k)


# ---------------------------------------------------------------- worked vector, ddtree.md §2.6


def test_worked_vector():
    tree = worked_tree(root_tokens=torch.tensor([7]), prefix_lens=torch.tensor([17]))
    assert tree.tokens.tolist() == [[7, 101, 201, 301, 202, 301]]
    assert tree.depths.tolist() == [[0, 1, 2, 3, 2, 3]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 1, 4]]
    # float32 inputs summed in float64: -0.1f + -0.3f is not the double -0.4, hence the tolerance
    expected = torch.tensor([[0.0, -0.1, -0.4, -0.6, -1.6, -1.8]], dtype=torch.float64)
    torch.testing.assert_close(tree.scores, expected, atol=1e-6, rtol=0)
    assert round(float(tree.scores[0, 1:].exp().sum()), 4) == 2.4912  # surrogate E[accepted]
    rows = ["100000", "110000", "111000", "111100", "110010", "110011"]
    assert tree.visibility()[0].tolist() == [[c == "1" for c in r] for r in rows]
    assert tree.anc_bits.tolist() == [[[0b1], [0b11], [0b111], [0b1111], [0b10011], [0b110011]]]
    assert tree.positions.tolist() == [[17 + d for d in [0, 1, 2, 3, 2, 3]]]
    assert tree.node_count.tolist() == [6]
    assert tree.first_child.tolist() == [[1, 2, 3, -1, 5, -1]]
    assert tree.next_sibling.tolist() == [[-1, -1, 4, -1, -1, -1]]
    check_invariants(tree, [WORKED_LP], [WORKED_IDS], 5, prefix_lens=[17], roots=[7])


def test_worked_walk():
    tree = worked_tree()
    t_star = 999
    # argmax at nodes 0, 1, 4, 5 = 101, 202, 301, t*; nodes 2 and 3 are off the path
    target = torch.tensor([[101, 202, 301, 302, 301, t_star]])
    path, lens, bonus = walk_tree(tree, target)
    assert path.tolist() == [[0, 1, 4, 5, -1, -1]]
    assert lens.tolist() == [4] and bonus.tolist() == [t_star]


def test_format_tree():
    text = format_tree(worked_tree(), decode=lambda t: f"<{t}>")
    lines = text.splitlines()
    assert len(lines) == 7  # header + 6 nodes
    assert lines[1].startswith("[0] '<0>'")
    assert lines[5].startswith("    [4] '<202>'  depth 2  score -1.6000")  # after node 3's chain


# ---------------------------------------------------------------- hand-picked edge cases


def test_branch_beats_spine_when_budget_equals_depth():
    # why: ddtree.md §2.5 item 6, with B = L the tree is the top-L prefixes, not the argmax chain
    lp = torch.tensor([[[-0.7, -0.8], [-0.5, -0.9]]])
    tree = build_ddtree(lp, torch.tensor([[[1, 2], [3, 4]]]), budget=2)
    assert tree.parents.tolist() == [[-1, 0, 0]] and tree.tokens.tolist() == [[0, 1, 2]]


def test_exact_ties_break_by_rank_tuple():
    # why: log-prob 0 everywhere makes every score equal; order must be lexicographic rank tuples
    # (0,) < (0,0) < (0,1) < (1,) < (1,0) < (1,1), and a prefix comes before its extensions.
    lp = torch.zeros(1, 2, 2)
    tree = build_ddtree(lp, torch.tensor([[[10, 11], [20, 21]]]), budget=6)
    assert tree.parents.tolist() == [[-1, 0, 1, 1, 0, 4, 4]]
    assert tree.tokens.tolist() == [[0, 10, 20, 21, 11, 20, 21]]
    assert tree.scores[0].tolist() == [0.0] * 7


def test_chain_k1():
    # why: K = 1 has no siblings, so the tree is the draft's argmax chain, cut at the budget
    lp = torch.tensor([[[-0.5], [-0.25], [-1.0], [-0.1], [-2.0]]])
    ids = torch.tensor([[[11], [12], [13], [14], [15]]])
    short = build_ddtree(lp, ids, budget=3)
    assert short.parents.tolist() == [[-1, 0, 1, 2]] and short.tokens.tolist() == [[0, 11, 12, 13]]
    long = build_ddtree(lp, ids, budget=9)  # why: budget > the L = 5 possible nodes
    assert long.node_count.tolist() == [6]
    assert long.parents.tolist() == [[-1, 0, 1, 2, 3, 4] + [-1] * 4]
    check_invariants(long, lp.tolist(), ids.tolist(), 9)


def test_single_depth():
    # why: L = 1 never pushes a child; the tree is a star of the top-budget ranks
    lp = torch.tensor([[[-0.1, -0.2, -0.3, -0.4, -0.5]]])
    ids = torch.tensor([[[50, 40, 30, 20, 10]]])
    tree = build_ddtree(lp, ids, budget=3)
    assert tree.parents.tolist() == [[-1, 0, 0, 0]] and tree.tokens.tolist() == [[0, 50, 40, 30]]
    assert tree.first_child.tolist() == [[1, -1, -1, -1]]
    assert tree.next_sibling.tolist() == [[-1, 2, 3, -1]]


def test_budget_one():
    # why: smallest verify width, N = 2: the root plus depth-1's best token
    tree = build_ddtree(torch.tensor([WORKED_LP]), torch.tensor([WORKED_IDS]), budget=1)
    assert tree.tokens.tolist() == [[0, 101]] and tree.anc_bits.tolist() == [[[1], [3]]]


def test_budget_exceeds_all_prefixes():
    # why: 2 + 4 = 6 prefixes exist; the other 34 rows are padding that sees only itself
    lp = torch.tensor([[[-0.5, -1.0], [-0.5, -1.0]]])
    tree = build_ddtree(lp, torch.tensor([[[1, 2], [3, 4]]]), budget=40)
    assert tree.node_count.tolist() == [7]
    check_invariants(tree, lp.tolist(), [[[1, 2], [3, 4]]], 40)


def test_neg_inf_entries():
    # why: -inf rank 0 at depth 1 leaves only the root; -inf deeper cuts the tree at that depth
    ids = torch.tensor([[[1, 2], [3, 4]], [[1, 2], [3, 4]], [[1, 2], [3, 4]]])
    lp = torch.tensor([[[-INF, -INF], [-0.5, -1.0]],
                       [[-0.5, -INF], [-INF, -INF]],
                       [[-0.5, -1.0], [-0.5, -INF]]])
    tree = build_ddtree(lp, ids, budget=8)
    assert tree.node_count.tolist() == [1, 2, 5]
    check_invariants(tree, lp.tolist(), ids.tolist(), 8)
    path, lens, bonus = walk_tree(tree, torch.full((3, 9), 1))
    assert lens.tolist() == [1, 2, 2] and bonus.tolist() == [1, 1, 1]


def test_batch_requests_are_independent():
    # why: requests of one batch differ in tables, roots and prefix lengths; each row must equal
    # the tree built for that request alone
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 12, generator=gen) * torch.tensor([0.5, 2.0, 6.0])[:, None, None]
    lp, ids = topk_logprobs(logits, 5)
    roots, prefix = torch.tensor([5, 6, 7]), torch.tensor([0, 9, 1000])
    tree = build_ddtree(lp, ids, 17, root_tokens=roots, prefix_lens=prefix)
    check_invariants(tree, lp.tolist(), ids.tolist(), 17, prefix.tolist(), roots.tolist())
    assert len({tuple(p) for p in tree.parents.tolist()}) == 3  # the shapes really differ
    for b in range(3):
        alone = build_ddtree(lp[b : b + 1], ids[b : b + 1], 17, roots[b : b + 1], prefix[b : b + 1])
        for name in ("tokens", "parents", "scores", "anc_bits", "positions", "first_child"):
            assert torch.equal(getattr(tree, name)[b], getattr(alone, name)[0]), (b, name)


@pytest.mark.parametrize(
    "depth, k, budget",
    [
        (7, 20, 100),  # the brief's 2-word case (L = 7 as the Kimi drafter)
        (7, 8, 62),  # N = 63: one word, bit 62 the highest used
        (7, 8, 63),  # N = 64: one word, bit 63 set makes the int64 negative
        (7, 8, 64),  # N = 65: first budget needing a second word
        (7, 20, 127),  # N = 128: two full words
        (7, 20, 128),  # N = 129: three words, the design's largest budget
        (3, 40, MAX_BUDGET),  # 17 words; 40 + 1600 + 64000 prefixes, so no padding
    ],
)
def test_multiword_masks(depth, k, budget):
    gen = torch.Generator().manual_seed(budget)
    lp, ids = topk_logprobs(torch.randn(2, depth, 64, generator=gen) * 3, k)
    tree = build_ddtree(lp, ids, budget)
    assert tree.anc_bits.shape[-1] == -(-(budget + 1) // 64)
    assert tree.node_count.tolist() == [budget + 1] * 2
    check_invariants(tree, lp.tolist(), ids.tolist(), budget)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_on_real_logprobs(seed, dtype):
    # why: real log_softmax values; in float64 nearly every sum rounds, so the oracle must use
    # the reference's incremental formula, and the scores must match it bit for bit
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 30, generator=gen, dtype=torch.float64) * 4
    lp, ids = torch.log_softmax(logits, dim=-1).to(dtype).sort(dim=-1, descending=True)
    lp, ids = lp[..., :5], ids[..., :5]
    tree = build_ddtree(lp, ids, 40)
    for b in range(2):
        assert tree_order(tree, ids[b].tolist(), b) == oracle_order_incremental(lp[b].tolist(), 40)


def test_sibling_score_is_incremental_bit_exact():
    # why: the published reference updates a sibling as (s - lp[r]) + lp[r+1], in that order;
    # these float64 decimals round differently under a fresh sum or s + (lp[r+1] - lp[r])
    lp = torch.tensor([[[-0.3, -INF], [-0.1, -0.3]]], dtype=torch.float64)
    tree = build_ddtree(lp, torch.tensor([[[1, 9], [2, 3]]]), budget=3)
    s = -0.3 + -0.1
    assert tree.scores[0].tolist() == [0.0, -0.3, s, s - -0.1 + -0.3]
    assert tree.scores[0, 3].item() == -0.6000000000000001 != -0.3 + -0.3


def test_empty_batch():
    # why: a scheduler step with no decoding requests must not crash
    tree = build_ddtree(torch.zeros(0, 3, 2), torch.zeros(0, 3, 2, dtype=torch.int64), 5)
    assert tree.tokens.shape == (0, 6) and tree.anc_bits.shape == (0, 6, 1)
    accepted, lens, bonus = walk_tree(tree, torch.zeros(0, 6, dtype=torch.int64))
    assert accepted.shape == (0, 6) and lens.shape == bonus.shape == (0,)


def test_non_contiguous_inputs_and_dtypes():
    # why: a transposed (non-contiguous) bf16 table and int32 ids must give the same tree
    lp = torch.tensor([WORKED_LP]).to(torch.bfloat16)
    ids = torch.tensor([WORKED_IDS], dtype=torch.int32)
    lp_t = lp.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    a = build_ddtree(lp, ids, 5)
    b = build_ddtree(lp_t, ids, 5)
    assert a.parents.tolist() == b.parents.tolist() == [[-1, 0, 1, 2, 1, 4]]
    assert torch.equal(a.scores, b.scores)
    moved = a.to("cpu")
    assert isinstance(moved, DDTree) and torch.equal(moved.anc_bits, a.anc_bits)


# ---------------------------------------------------------------- property tests (hypothesis)

# A tiny value set so exact ties are frequent; 0.0 (probability 1) ties a child with its parent.
# All are float32-exact-in-float64 and small, see oracle_order's docstring.
VALUES = [0.0, -0.1, -0.25, -0.5, -0.7, -1.0, -2.5, -INF]


@st.composite
def tables(draw, max_batch=3):
    batch = draw(st.integers(1, max_batch))
    depth = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    rows = [sorted(draw(st.lists(st.sampled_from(VALUES), min_size=k, max_size=k)), reverse=True)
            for _ in range(batch * depth)]
    lp = torch.tensor(rows, dtype=torch.float32).reshape(batch, depth, k)
    ids = random_ids(torch.Generator().manual_seed(draw(st.integers(0, 2**16))), batch, depth, k)
    return lp, ids, draw(st.integers(1, 40))


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(tables())
def test_property_invariants(case):
    lp, ids, budget = case
    prefix = torch.arange(lp.shape[0]) * 7
    tree = build_ddtree(lp, ids, budget, prefix_lens=prefix)
    check_invariants(tree, lp.tolist(), ids.tolist(), budget, prefix_lens=prefix.tolist())


@PROPERTY
@given(tables())
def test_property_matches_brute_force(case):
    lp, ids, budget = case
    tree = build_ddtree(lp, ids, budget)
    for b in range(lp.shape[0]):
        lp_b = lp[b].double().tolist()
        expected = oracle_order(lp_b, budget)
        assert tree_order(tree, ids[b].tolist(), b) == expected
        assert expected == oracle_order_incremental(lp_b, budget)  # the exactness claim


@PROPERTY
@given(tables(), st.integers(0, 2**16))
def test_property_walk_follows_planted_path(case, seed):
    lp, ids, budget = case
    tree = build_ddtree(lp, ids, budget)
    rng = random.Random(seed)
    batch, n_rows = tree.tokens.shape
    # why: random choices from the tree's own tokens often match children off the planted path
    target = torch.tensor([[rng.choice(tree.tokens[b].tolist()) for _ in range(n_rows)]
                           for b in range(batch)])
    expected_paths = []
    for b in range(batch):
        end = rng.randrange(int(tree.node_count[b]))  # plant root -> end, then miss
        path = [end]
        while path[-1] != 0:
            path.append(int(tree.parents[b, path[-1]]))
        path.reverse()
        for a, c in zip(path, path[1:], strict=False):
            target[b, a] = tree.tokens[b, c]
        target[b, end] = NO_CHILD
        expected_paths.append(path)
    accepted, lens, bonus = walk_tree(tree, target)
    for b in range(batch):
        path = expected_paths[b]
        assert accepted[b].tolist() == path + [-1] * (n_rows - len(path))
        assert int(lens[b]) == len(path) and int(bonus[b]) == NO_CHILD
        assert reference_walk(tree, target[b].tolist(), b) == (path, NO_CHILD)


@PROPERTY
@given(tables(), st.integers(0, 2**16))
def test_property_walk_matches_child_maps(case, seed):
    # why: unplanted random choices; compares against the reference's dict walk
    lp, ids, budget = case
    tree = build_ddtree(lp, ids, budget)
    gen = torch.Generator().manual_seed(seed)
    target = ids.flatten()[torch.randint(ids.numel(), tree.tokens.shape, generator=gen)]
    accepted, lens, bonus = walk_tree(tree, target)
    for b in range(tree.tokens.shape[0]):
        path, t = reference_walk(tree, target[b].tolist(), b)
        assert accepted[b, : len(path)].tolist() == path and int(lens[b]) == len(path)
        assert int(bonus[b]) == t


def test_walk_root_miss():
    # why: the target's first choice matches no depth-1 token: only the bonus is emitted
    tree = worked_tree()
    accepted, lens, bonus = walk_tree(tree, torch.tensor([[102, 202, 301, 302, 301, 5]]))
    assert accepted.tolist() == [[0, -1, -1, -1, -1, -1]]
    assert lens.tolist() == [1] and bonus.tolist() == [102]


def test_walk_ignores_rows_past_node_count():
    # why: a kernel may leave garbage in padding rows; only index < node_count may be accepted
    tree = worked_tree()
    tree.node_count[0] = 4  # rows 4 and 5 become "padding" that still links to node 1
    accepted, lens, bonus = walk_tree(tree, torch.tensor([[101, 202, 301, 302, 301, 5]]))
    assert accepted.tolist() == [[0, 1, -1, -1, -1, -1]]
    assert lens.tolist() == [2] and bonus.tolist() == [202]


def test_walk_ignores_padding_rows():
    # why: padding rows carry token 0 and parent -1; a choice of 0 must not enter them
    tree = build_ddtree(torch.tensor([[[-0.5, -INF]]]), torch.tensor([[[0, 9]]]), budget=4)
    accepted, lens, bonus = walk_tree(tree, torch.zeros(1, 5, dtype=torch.int64))
    assert accepted.tolist() == [[0, 1, -1, -1, -1]] and lens.tolist() == [2]


# ---------------------------------------------------------------- topk_logprobs


def test_topk_matches_log_softmax_sort():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 50, generator=gen, dtype=torch.float64) * 5
    values, ids = topk_logprobs(logits, 7)
    expected = torch.log_softmax(logits.float(), dim=-1).sort(dim=-1, descending=True)
    assert values.dtype == torch.float32 and ids.dtype == torch.int64
    assert values.shape == ids.shape == (2, 3, 7)
    torch.testing.assert_close(values, expected.values[..., :7], atol=0, rtol=0)
    assert torch.equal(ids, expected.indices[..., :7])  # no ties in continuous random logits


def test_topk_ties_lower_id_first():
    # why: bf16 logits tie often; rank order must not depend on the sort backend
    logits = torch.tensor([[[0.0, 2.0, 1.0, 2.0, 2.0, 1.0, 0.0, 2.0]]], dtype=torch.bfloat16)
    values, ids = topk_logprobs(logits, 6)
    assert ids.tolist() == [[[1, 3, 4, 7, 2, 5]]]
    assert values[0, 0, 0] == values[0, 0, 3] > values[0, 0, 4]
    _, all_equal = topk_logprobs(torch.zeros(1, 1, 5), 5)
    assert all_equal.tolist() == [[[0, 1, 2, 3, 4]]]


def test_topk_clamps_k_and_feeds_build():
    logits = torch.tensor([[[1.0, 3.0, 2.0]], [[0.0, 0.0, -INF]]])  # why: a masked vocab entry
    values, ids = topk_logprobs(logits, 100)  # why: k > V is clamped, as K = min(B, V)
    assert values.shape == (2, 1, 3) and ids[0, 0].tolist() == [1, 2, 0]
    assert values[1, 0, 2] == -INF
    tree = build_ddtree(values, ids, budget=3)  # the -inf entry never becomes a node
    assert tree.node_count.tolist() == [4, 3]


# ---------------------------------------------------------------- errors


def _lp(*shape):
    return torch.full(shape, -1.0)


def _ids(*shape):
    return torch.arange(math.prod(shape)).reshape(shape)


def _case(case_id: str, match: str, **kwargs):
    return pytest.param(kwargs, match, id=case_id)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        _case("budget-0", r"budget: expected an int in \[1, 1024\], got 0", budget=0),
        _case("budget-1025", r"budget: expected .*got 1025", budget=1025),
        _case("budget-float", r"budget: expected .*got 2.5", budget=2.5),
        _case("budget-bool", r"budget: expected", budget=True),
        _case("lp-rank-2", r"top_logprobs: expected shape \[B, L, K\]", top_logprobs=_lp(2, 3)),
        _case("ids-rank-4", r"top_ids: expected shape \[B, L, K\]", top_ids=_ids(2, 3, 4, 1)),
        _case("ids-shape-mismatch", r"top_ids: expected shape \(2, 3, 4\).*got \(2, 3, 3\)",
              top_ids=_ids(2, 3, 3)),
        _case("empty-depth", r"top_logprobs: expected L >= 1",
              top_logprobs=_lp(2, 0, 4), top_ids=_ids(2, 0, 4)),
        _case("lp-int-dtype", r"top_logprobs: .*floating",
              top_logprobs=torch.zeros(2, 3, 4, dtype=torch.int64)),
        _case("ids-float-dtype", r"top_ids: expected an integer dtype", top_ids=_ids(2, 3, 4).float()),
        _case("lp-nan", r"top_logprobs: expected no NaN and no \+inf .*, got NaN at \[b, d, r\] = \[1, 0, 0\]",
              top_logprobs=_lp(2, 3, 4).index_put_((torch.tensor(1),), torch.tensor(math.nan))),
        _case("lp-pos-inf", r"top_logprobs: expected no NaN and no \+inf .*, got \+inf at \[b, d, r\] = \[0, 0, 0\]",
              top_logprobs=_lp(2, 3, 4).index_fill_(2, torch.tensor(0), INF)),
        _case("lp-unsorted", r"top_logprobs: expected sorted descending along K, got \[0, 0, 1\] = -2.0 <",
              top_logprobs=torch.tensor([-1.0, -2.0, -0.5, -3.0]).expand(2, 3, 4)),
        # why: repeated ids (e.g. shard-local ids under vocab-parallel TP, ddtree.md §2.1)
        _case("ids-repeated", r"top_ids: expected distinct ids .*repeats in \[0, 0, :4\]",
              top_ids=torch.tensor([5, 6, 5, 7]).expand(2, 3, 4)),
        _case("root-tokens-len", r"root_tokens: expected shape \(2,\) = \[B\], got \(3,\)",
              root_tokens=torch.zeros(3, dtype=torch.int64)),
        _case("root-tokens-rank", r"root_tokens: expected shape",
              root_tokens=torch.zeros(2, 1, dtype=torch.int64)),
        _case("root-tokens-float", r"root_tokens: expected an integer dtype",
              root_tokens=torch.zeros(2)),
        _case("prefix-lens-len", r"prefix_lens: expected shape",
              prefix_lens=torch.zeros(1, dtype=torch.int64)),
        _case("prefix-lens-negative", r"prefix_lens: expected values >= 0",
              prefix_lens=torch.tensor([0, -1])),
    ],
)
def test_build_errors(kwargs, match):
    args = dict(top_logprobs=_lp(2, 3, 4), top_ids=_ids(2, 3, 4), budget=8) | kwargs
    with pytest.raises(ValueError, match=match):
        build_ddtree(**args)


def test_repeated_ids_only_matter_where_finite():
    # why: -inf ranks never become nodes, so a padded table may repeat ids there
    lp = torch.tensor([[[-1.0, -INF, -INF]]])
    tree = build_ddtree(lp, torch.tensor([[[4, 0, 0]]]), budget=3)
    assert tree.node_count.tolist() == [2]


@pytest.mark.parametrize(
    "logits, k, match",
    [
        (torch.zeros(2, 5), 2, r"logits: expected shape \[B, L, V\] \(rank 3\), got \(2, 5\)"),
        (torch.zeros(1, 2, 5, dtype=torch.int64), 2, r"logits: expected a floating dtype"),
        (torch.zeros(1, 2, 0), 2, r"logits: expected V >= 1"),
        (torch.zeros(1, 2, 5), 0, r"k: expected an int >= 1, got 0"),
        (torch.zeros(1, 2, 5), 1.5, r"k: expected an int >= 1, got 1.5"),
        (torch.zeros(1, 2, 5), True, r"k: expected an int >= 1"),
    ],
)
def test_topk_errors(logits, k, match):
    with pytest.raises(ValueError, match=match):
        topk_logprobs(logits, k)


def test_walk_and_format_errors():
    tree = worked_tree()
    with pytest.raises(ValueError, match=r"target_tokens: expected shape \(1, 6\)"):
        walk_tree(tree, torch.zeros(1, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"target_tokens: expected an integer dtype"):
        walk_tree(tree, torch.zeros(1, 6))
    with pytest.raises(ValueError, match=r"b: expected a request index in \[0, 1\), got 1"):
        format_tree(tree, b=1)
