"""tree_mla triton_v5 (kernels/tree_mla/triton_v5.py): the position-invariant variant.

Two claims. (1) It computes the reference (EDGE shapes, fp32 on CPU: the interpreter's bf16
tl.dot is wrong, DESIGN.md §10). (2) The property it exists for (README.md, "Design (v5)"):
a DDTree row of a node at depth d is bitwise equal (torch.equal on o_lat and lse) to plain AR
decode of the same token at position P + d, i.e. prefix_lens = P + d, N = 1, anc = bit 0, the
prefix slots as they were and the node's root..self chain compacted into slots P..P+d (what the
commit step does after acceptance). CPU runs it in fp32 under the interpreter; `gpu` tests run
it in bf16 at K2.6's widths, and CUDA-graph replay against eager.
"""

from __future__ import annotations

import pytest
import torch

from workbench.check import compare_outputs
from workbench.kernels.tree_mla import triton_v5
from workbench.ops.case import Case
from workbench.reference.tree_mla import pack_anc_bits, tree_mla

v5 = triton_v5.tree_mla_triton
NAN = float("nan")
SCALE = 0.14468  # K2.6's softmax scale


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty -> NaN-filled (floats) / -1-filled (ints): outputs and partials poisoned."""
    empty = torch.empty

    def nan_empty(*shape, dtype=None, device=None, **kw):
        t = empty(*shape, dtype=dtype, device=device, **kw)
        return t.fill_(NAN if t.is_floating_point() else -1)

    monkeypatch.setattr(torch, "empty", nan_empty)


# ---------------------------------------------------------------- trees and inputs


def ddtree_parents(n: int, seed: int, spine: float = 0.8) -> list[int]:
    """DDTree-shaped (parents[i] < i): with probability `spine` a node extends the previous
    one (deep paths, so depths reach across tiles and splits), else it hangs anywhere."""
    g = torch.Generator().manual_seed(seed)
    par = [-1]
    for i in range(1, n):
        extend = float(torch.rand(1, generator=g)) < spine
        par.append(i - 1 if extend else int(torch.randint(0, i, (1,), generator=g)))
    return par


def chain(n):
    return [-1] + list(range(n - 1))


def star(n):
    return [-1] + [0] * (n - 1)


def ancestors(parents: list[int], i: int) -> list[int]:
    """Root .. i (depth order = slot order: parents have smaller indices)."""
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def anc_rows(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        vis[i, ancestors(parents, i)] = True
    return vis


def make_inputs(prefix, trees, H=4, C=32, R=8, dtype=torch.float32, seed=0, spare=3,
                device="cpu"):
    """One request per prefix length, trees[b] its parent list (all of one N); NaN in every
    cache slot past P_b + N. -> (q, kv_cache, prefix_lens, anc_bits, SCALE, C)."""
    g = torch.Generator().manual_seed(seed)
    B, N = len(prefix), len(trees[0])
    T = max(prefix) + N + spare
    P = torch.tensor(prefix)
    cache = torch.randn(B, T, C + R, generator=g).to(dtype)
    cache[torch.arange(T).view(1, T) >= (P + N).view(B, 1)] = NAN
    q = torch.randn(B, N, H, C + R, generator=g).to(dtype)
    anc = pack_anc_bits(torch.stack([anc_rows(t) for t in trees]))
    args = (q, cache, P, anc)
    return tuple(a.to(device) for a in args) + (SCALE, C)


def ar_inputs(args, parents, b=0, spare=3):
    """AR twin of every node of request b: request i (one per node) has the same prefix
    slots, node i's root..self chain in slots P..P+d, prefix_lens P + d, N = 1, anc = bit 0,
    q = node i's q row; NaN past P + d + 1."""
    q, cache, P_all, _anc, scale, C = args
    P, n = int(P_all[b]), len(parents)
    paths = [ancestors(parents, i) for i in range(n)]
    T = P + max(len(p) for p in paths) + spare
    ar = torch.full((n, T, cache.shape[-1]), NAN, dtype=cache.dtype, device=cache.device)
    for i, path in enumerate(paths):
        ar[i, :P] = cache[b, :P]
        ar[i, P:P + len(path)] = cache[b, P + torch.tensor(path, device=cache.device)]
    plen = torch.tensor([P + len(p) - 1 for p in paths], device=cache.device)
    one = torch.ones(n, 1, 1, dtype=torch.int64, device=cache.device)
    return (q[b].unsqueeze(1).contiguous(), ar, plen, one, scale, C)


def assert_ar_equal(args, trees):
    """Every node of every request: v5's DDTree row == v5's AR call, bit for bit; the AR
    twins run as one batch of N one-row requests, and the deepest node also alone."""
    o, lse = v5(*args)
    for b, parents in enumerate(trees):
        ar = ar_inputs(args, parents, b)
        o_ar, lse_ar = v5(*ar)
        for i in range(len(parents)):
            assert torch.equal(o[b, i], o_ar[i, 0]) and torch.equal(lse[b, i], lse_ar[i, 0]), \
                (b, i, len(ancestors(parents, i)) - 1)
        deep = max(range(len(parents)), key=lambda i: len(ancestors(parents, i)))
        q1, c1, p1, a1, scale, C = ar
        o1, l1 = v5(q1[deep:deep + 1], c1[deep:deep + 1], p1[deep:deep + 1],
                    a1[deep:deep + 1], scale, C)
        assert torch.equal(o1[0, 0], o[b, deep]) and torch.equal(l1[0, 0], lse[b, deep])
    return o, lse


def assert_matches_reference(args, label):
    q, cache = args[:2]
    B, N, H, _ = q.shape
    # the dims set the tolerance's reduction lengths (workbench.ops.cases.tolerance)
    dims = dict(B=B, N=N, H=H, C=args[5], R=q.shape[-1] - args[5], T=cache.shape[1])
    case = Case("tree_mla", label, args, dims=dims)
    out = v5(*args)
    rep = compare_outputs(tree_mla(*args), out, case, names=("o_lat", "lse"))
    assert rep["pass"], (label, rep["mismatches"][:4], rep["rel_err"])
    return out


# ---------------------------------------------------------------- vs the reference (CPU)

EDGE = {
    # name: (prefix lengths, trees, kwargs, why)
    "P0-N1": ((0,), [[-1]], {}, "empty prefix, one row: its only key is itself"),
    "P1-chain": ((1,), [chain(5)], {}, "one prefix key, then a chain"),
    "P70-star": ((70,), [star(9)], {"H": 8}, "P not a multiple of 64: the tile at v = 64 "
                 "mixes prefix slots 64..69 and tree slots (the rank -> bit map); H = 8"),
    "split-crossing": ((500,), [ddtree_parents(20, 1)], {"H": 2},
                       "rows of one launch with 1 split (len <= 512) and 2 (len > 512)"),
    "random-2-words": ((37,), [ddtree_parents(70, 2, spine=0.5)], {"H": 1},
                       "N = 70: two mask words, ranks carried across the word boundary"),
    "B2-ragged-nan": ((130, 3), [ddtree_parents(6, 3), star(6)], {"spare": 70},
                      "two requests, different P and trees; NaN in the 70 slots past P + N"),
    "chain-66": ((0,), [chain(66)], {"H": 1}, "bit 63 set (word 0 negative as int64) and ranks "
                 "carried into word 1; P = 0: the tree starts tile 0"),
    "H65": ((500,), [chain(16)], {"H": 65, "C": 16, "R": 4},
            "H > 64: a second head-block program per node (rows >= H masked), each with its "
            "own slot map, and a split boundary inside the tree (len 512 -> 513 at depth 12)"),
    "bf16": ((90,), [ddtree_parents(5, 4)], {"dtype": torch.bfloat16}, "bf16 (upcast on CPU)"),
    "fp16": ((64,), [chain(3)], {"dtype": torch.float16}, "fp16, P = 64: one full tile"),
}


@pytest.mark.parametrize("name", list(EDGE))
def test_v5_matches_reference(name, poisoned):
    prefix, trees, kw, _why = EDGE[name]
    out = assert_matches_reference(make_inputs(prefix, trees, **kw), name)
    assert all(torch.isfinite(t.float()).all() for t in out)  # NaN past P + N never leaks


def test_v5_policy_from_row_length_only():
    # why: the partition is a function of a row's key count; the grid (from T) covers it
    assert [triton_v5.num_splits(L) for L in (0, 1, 512, 513, 8192, 8193, 40000)] == \
        [1, 1, 1, 2, 16, 15, 16]
    for T in (1, 64, 513, 4100, 40000):
        assert all(triton_v5.num_splits(L) <= triton_v5.splits_grid(T)
                   for L in range(0, T + 1, 1 if T < 5000 else 37))
    assert triton_v5.split_len(1000) % triton_v5.BLOCK_N == 0


# ---------------------------------------------------------------- the property (CPU)

PROPERTY = {
    # P: (tree, why)
    0: (ddtree_parents(24, 10), "no prefix: the root is key 0"),
    5: (ddtree_parents(72, 11, spine=0.95), "depths past 59: chains cross the tile at v = 64 "
        "and the second mask word"),
    63: (ddtree_parents(12, 12), "the root is the last key of tile 0"),
    64: (ddtree_parents(12, 13), "the root opens tile 1"),
    130: (ddtree_parents(16, 14), "prefix tiles, then a tile mixing prefix and tree"),
    500: (ddtree_parents(20, 15, spine=0.9), "depths past 12: len crosses 512, one split -> two"),
    600: (ddtree_parents(10, 16), "every row in two splits (partials + combine)"),
}


@pytest.mark.parametrize("P", list(PROPERTY))
def test_v5_ddtree_row_equals_ar_decode(P, poisoned):
    parents, _why = PROPERTY[P]
    args = make_inputs((P,), [parents], H=2, seed=P)
    assert_ar_equal(args, [parents])


def test_v5_batch_equals_each_request_alone(poisoned):
    # why: B = 2 in one launch (different P, N-wide trees, one request in the split regime)
    # equals each request alone; and every node of both equals its AR twin
    trees = [ddtree_parents(9, 20), ddtree_parents(9, 21, spine=0.3)]
    args = make_inputs((600, 37), trees, H=2, seed=7)
    q, cache, P, anc, scale, C = args
    o, lse = assert_ar_equal(args, trees)
    for b in range(2):
        ob, lb = v5(q[b:b + 1], cache[b:b + 1], P[b:b + 1], anc[b:b + 1], scale, C)
        assert torch.equal(ob[0], o[b]) and torch.equal(lb[0], lse[b]), b


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("H", [64, 8])
@pytest.mark.parametrize("P", [1000, 4100])
def test_gpu_v5_ddtree_row_equals_ar_decode_bf16(P, H):
    # why: the loop's case: bf16 wgmma dots at K2.6's widths; P = 1000: depths cross the
    # split boundary at len 1024 (and 1025: 2 -> 3 splits); P = 4100: 9 splits, tree in the
    # last; two requests with different trees (N = 33) in one launch
    trees = [ddtree_parents(33, 30 + H, spine=0.9), ddtree_parents(33, 31 + H, spine=0.5)]
    args = make_inputs((P, P - 7), trees, H=H, C=512, R=64, dtype=torch.bfloat16, seed=P,
                       device="cuda")
    assert_ar_equal(args, trees)
    assert_matches_reference(args, f"gpu P={P} H={H}")


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [1, 8, 32, 128])
def test_gpu_v5_cuda_graph_replay_equals_eager(budget):
    trees = [ddtree_parents(budget + 1, budget + b) for b in range(4)]
    args = make_inputs((4096, 1000, 63, 0), trees, H=64, C=512, R=64, dtype=torch.bfloat16,
                       seed=budget, device="cuda")
    q, cache, P, anc, scale, C = args
    eager = v5(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = v5(*args)
    # new contents, same buffers: the replay must read q and anc_bits from memory
    fresh = make_inputs((4096, 1000, 63, 0), [ddtree_parents(budget + 1, 99 + b)
                                             for b in range(4)], H=64, C=512, R=64,
                        dtype=torch.bfloat16, seed=budget + 100, device="cuda")
    q.copy_(fresh[0])
    anc.copy_(fresh[3])
    graph.replay()
    torch.cuda.synchronize()
    want = v5(*args)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    assert not torch.equal(out[0], eager[0])  # the replay saw the new inputs
    torch.cuda.set_sync_debug_mode("error")  # and the launcher never syncs
    try:
        v5(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
