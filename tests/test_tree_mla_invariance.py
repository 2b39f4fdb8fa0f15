"""tree_mla triton_v5 / triton_v6 (kernels/tree_mla/triton_v5.py, triton_v6.py): the
position-invariant variants (v6: v5's tiles, TMA for the tiles wholly inside the prefix, v4's
short splits by the row's own key count).

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
from workbench.kernels.tree_mla import triton_v5, triton_v6
from workbench.ops.case import Case
from workbench.reference.tree_mla import pack_anc_bits, tree_mla

v5 = triton_v5.tree_mla_triton
v6 = triton_v6.tree_mla_triton
IMPLS = {"v5": v5, "v6": v6}
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


def assert_ar_equal(args, trees, fn=v5):
    """Every node of every request: fn's DDTree row == fn's AR call, bit for bit; the AR
    twins run as one batch of N one-row requests, and the deepest node also alone."""
    o, lse = fn(*args)
    for b, parents in enumerate(trees):
        ar = ar_inputs(args, parents, b)
        o_ar, lse_ar = fn(*ar)
        for i in range(len(parents)):
            assert torch.equal(o[b, i], o_ar[i, 0]) and torch.equal(lse[b, i], lse_ar[i, 0]), \
                (b, i, len(ancestors(parents, i)) - 1)
        deep = max(range(len(parents)), key=lambda i: len(ancestors(parents, i)))
        q1, c1, p1, a1, scale, C = ar
        o1, l1 = fn(q1[deep:deep + 1], c1[deep:deep + 1], p1[deep:deep + 1],
                    a1[deep:deep + 1], scale, C)
        assert torch.equal(o1[0, 0], o[b, deep]) and torch.equal(l1[0, 0], lse[b, deep])
    return o, lse


def assert_matches_reference(args, label, fn=v5):
    q, cache = args[:2]
    B, N, H, _ = q.shape
    # the dims set the tolerance's reduction lengths (workbench.ops.cases.tolerance)
    dims = dict(B=B, N=N, H=H, C=args[5], R=q.shape[-1] - args[5], T=cache.shape[1])
    case = Case("tree_mla", label, args, dims=dims)
    out = fn(*args)
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
@pytest.mark.parametrize("impl", list(IMPLS))
def test_matches_reference(impl, name, poisoned):
    prefix, trees, kw, _why = EDGE[name]
    out = assert_matches_reference(make_inputs(prefix, trees, **kw), name, IMPLS[impl])
    assert all(torch.isfinite(t.float()).all() for t in out)  # NaN past P + N never leaks


def test_v5_policy_from_row_length_only():
    # why: the partition is a function of a row's key count; the grid (from T) covers it
    assert [triton_v5.num_splits(L) for L in (0, 1, 512, 513, 8192, 8193, 40000)] == \
        [1, 1, 1, 2, 16, 15, 16]
    for T in (1, 64, 513, 4100, 40000):
        assert all(triton_v5.num_splits(L) <= triton_v5.splits_grid(T)
                   for L in range(0, T + 1, 1 if T < 5000 else 37))
    assert triton_v5.split_len(1000) % triton_v5.BLOCK_N == 0


def test_v6_policy_from_row_length_only():
    # why: v4's numbers on the row's key count L: 256-key splits up to L = 2048, then up to 32
    # splits of >= 512 keys; the grid (from T) covers every L <= T
    assert [triton_v6.num_splits(L) for L in (0, 1, 256, 257, 2048, 2049, 16384, 16385)] == \
        [1, 1, 1, 2, 8, 5, 32, 29]
    for T in (1, 64, 300, 2048, 2049, 4100, 40000):
        assert all(triton_v6.num_splits(L) <= triton_v6.splits_grid(T)
                   for L in range(0, T + 1, 1 if T < 5000 else 37))
    assert all(triton_v6.split_len(L) % triton_v6.BLOCK_N == 0 for L in (1, 2049, 9000, 40000))


# ---------------------------------------------------------------- the property (CPU)

PROPERTY = {
    # P: (tree, why)
    0: (ddtree_parents(24, 10), "no prefix: the root is key 0"),
    5: (ddtree_parents(72, 11, spine=0.95), "depths past 59: chains cross the tile at v = 64 "
        "and the second mask word"),
    63: (ddtree_parents(12, 12), "the root is the last key of tile 0"),
    64: (ddtree_parents(12, 13), "the root opens tile 1 (v6: tile 0 by TMA in both modes)"),
    65: (ddtree_parents(12, 17), "v6: tile 0 by TMA in both modes, tile 1 (prefix slot 64, "
         "then tree slots) gathered in both"),
    130: (ddtree_parents(16, 14), "prefix tiles, then a tile mixing prefix and tree"),
    230: (ddtree_parents(40, 18, spine=0.95), "v6: depths past 25: tile 3 ([192, 256)) is "
          "gathered in DDTree, TMA in the deep nodes' AR twins; len crosses 256: 1 -> 2 splits"),
    500: (ddtree_parents(20, 15, spine=0.9), "depths past 12: len crosses 512 (v5: one split "
          "-> two; v6: 2 -> 3 splits at 513)"),
    600: (ddtree_parents(10, 16), "every row in two splits (partials + combine)"),
}
# v6 only: where its policy switches (L crosses 2048: 8 splits of 256 -> 5 of 512) and a long
# prefix of TMA tiles in every split; v5 has one split policy there (covered by 500 / 600)
PROPERTY_V6 = {
    2040: (chain(9), "len 2041..2049 crosses 2048 at depth 8: the policy switches (8 x 256 -> "
           "5 x 512) at the same depth in DDTree and AR; every split's prefix tiles by TMA"),
}


# P values added for v6's TMA / gather boundary: v5 has no such boundary (opt-in for it)
_V6_ONLY = (65, 230)


@pytest.mark.parametrize("impl,P", [
    pytest.param(impl, P, marks=[pytest.mark.extended] if impl == "v5" and P in _V6_ONLY else [])
    for impl in IMPLS for P in PROPERTY])
def test_ddtree_row_equals_ar_decode(impl, P, poisoned):
    parents, _why = PROPERTY[P]
    args = make_inputs((P,), [parents], H=2, seed=P)
    assert_ar_equal(args, [parents], IMPLS[impl])


@pytest.mark.parametrize("P", list(PROPERTY_V6))
def test_v6_ddtree_row_equals_ar_decode_long(P, poisoned):
    parents, _why = PROPERTY_V6[P]
    args = make_inputs((P,), [parents], H=1, C=16, R=4, seed=P)
    assert_ar_equal(args, [parents], v6)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_batch_equals_each_request_alone(impl, poisoned):
    # why: B = 2 in one launch (different P, N-wide trees, one request in the split regime)
    # equals each request alone; and every node of both equals its AR twin
    fn = IMPLS[impl]
    trees = [ddtree_parents(9, 20), ddtree_parents(9, 21, spine=0.3)]
    args = make_inputs((600, 37), trees, H=2, seed=7)
    q, cache, P, anc, scale, C = args
    o, lse = assert_ar_equal(args, trees, fn)
    for b in range(2):
        ob, lb = fn(q[b:b + 1], cache[b:b + 1], P[b:b + 1], anc[b:b + 1], scale, C)
        assert torch.equal(ob[0], o[b]) and torch.equal(lb[0], lse[b]), b


def test_v6_tma_and_gather_loads_bitwise_equal(poisoned, monkeypatch):
    # why: the invariance leans on a tile giving the same bits whether its rows came by TMA
    # (loop 1) or by the gather (loop 2). bf16 values (upcast on CPU), TMA-eligible cache:
    # the bf16 property with AR twins whose deep tiles are TMA where DDTree gathers them
    # (P = 100, depths to 32: tile 1 [64, 128) is TMA for depth >= 28), then the same call
    # with TMA turned off (every tile through pointer loads) must give the same bits
    trees = [ddtree_parents(33, 22, spine=0.97)]
    args = make_inputs((100,), trees, H=2, C=32, R=8, dtype=torch.bfloat16, seed=3, spare=5)
    assert triton_v6._tma_ok(args[1], args[5])
    o, lse = assert_ar_equal(args, trees, v6)
    monkeypatch.setattr(triton_v6, "_tma_ok", lambda *a: False)
    o2, lse2 = v6(*args)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("P", [0, 63, 130])
def test_v6_equals_v5_where_the_partition_is_the_same(P, poisoned):
    # why: rows with L <= 256 are one split of 64-key tiles in both (v5: <= 512); v6 only
    # changes how prefix tiles arrive, so the bits must be v5's. (Past L = 256 the splits
    # differ and so do the bits: not expected to match.)
    parents = ddtree_parents(16, 40 + P)
    args = make_inputs((P,), [parents], H=3, seed=P + 1)
    o5, l5 = v5(*args)
    o6, l6 = v6(*args)
    assert torch.equal(o5, o6) and torch.equal(l5, l6)


# sm_90 build (no GPU needed): v6's two loops must run the same float code on their tiles.
_SM90_LOOPS = r"""
import json, re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from workbench.kernels.tree_mla import sm90, triton_v6
B, N, H, C, R, T = 1, 9, 64, 512, 64, 4096
args = (torch.zeros(B, N, H, C + R, dtype=torch.bfloat16),
        torch.zeros(B, T, C + R, dtype=torch.bfloat16), torch.zeros(B, dtype=torch.int64),
        torch.zeros(B, N, 1, dtype=torch.int64), 0.1447, C)
fn, _g, sig, const, attrs, warps, stages, fusion = next(
    r for r in sm90.capture(triton_v6, *args) if r[0].__name__ == "_attn_kernel")
ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                     target=GPUTarget("cuda", 90, 32),
                     options={"num_warps": warps, "num_stages": stages,
                              "enable_fp_fusion": fusion}).asm["ptx"].splitlines()
labels = {m.group(1): i for i, l in enumerate(ptx) if (m := re.match(r"(\$L__BB\w+):", l))}
loops = sorted({(labels[m.group(1)], i) for i, l in enumerate(ptx)
                if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);", l))
                and labels.get(m.group(1), i) < i})
loops = [(a, b) for a, b in loops if any("wgmma.mma_async" in l for l in ptx[a:b])
         and not any(a < c < d < b for c, d in loops)]  # innermost loops with MMAs
FLOAT = re.compile(r"(@%p\d+\s+)?(mul|add|sub|fma|ex2|max|min|selp|setp|neg|div|rcp|cvt|shfl"
                   r"|wgmma)\S*\s")
def canon(lines):  # float / MMA instructions, registers renamed by first use
    names, out = {}, []
    for l in lines:
        l = l.split("//")[0].strip()
        if FLOAT.match(l) and any(t in l for t in ("f32", "bf16", "f16", "wgmma", "shfl")):
            out.append(re.sub(r"%[a-z]+\d+", lambda m: names.setdefault(m.group(0),
                                                                         f"%v{len(names)}"), l))
    return out
seqs = [canon(ptx[a:b + 1]) for a, b in loops]
print(json.dumps({"loops": len(loops), "lens": [len(x) for x in seqs],
                  "equal": len(seqs) == 2 and seqs[0] == seqs[1]}))
"""


def test_v6_loops_compile_to_the_same_float_code_sm90():
    # why: on the GPU a tile reaches the tile function through the TMA loop in one mode and the
    # gather loop in the other (test_v6_tma_and_gather_loads_bitwise_equal checks the values
    # on CPU); compiled for sm_90 (a subprocess: the kernels must be JIT functions there),
    # both loops must hold the same float and wgmma instructions with the same dataflow
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SM90_LOOPS], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["loops"] == 2 and min(got["lens"]) > 100 and got["equal"], got


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("H", [64, 8])
@pytest.mark.parametrize("P", [1000, 4100])
def test_gpu_ddtree_row_equals_ar_decode_bf16(P, H, impl):
    # why: the loop's case: bf16 wgmma dots at K2.6's widths; P = 1000: depths cross split
    # boundaries (v5: len 1024 / 1025, 2 -> 3 splits; v6: 1024 / 1025, 4 -> 5) and, for v6,
    # the TMA / gather boundary (tile 15 [960, 1024) gathered in DDTree, TMA in AR twins of
    # depth >= 24); P = 4100: v5 9 splits, v6 9 of 512; two requests with different trees
    # (N = 33) in one launch
    trees = [ddtree_parents(33, 30 + H, spine=0.9), ddtree_parents(33, 31 + H, spine=0.5)]
    args = make_inputs((P, P - 7), trees, H=H, C=512, R=64, dtype=torch.bfloat16, seed=P,
                       device="cuda")
    assert_ar_equal(args, trees, IMPLS[impl])
    assert_matches_reference(args, f"gpu P={P} H={H}", IMPLS[impl])


@pytest.mark.gpu
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("budget", [1, 8, 32, 128])
def test_gpu_cuda_graph_replay_equals_eager(budget, impl):
    fn = IMPLS[impl]
    trees = [ddtree_parents(budget + 1, budget + b) for b in range(4)]
    args = make_inputs((4096, 1000, 63, 0), trees, H=64, C=512, R=64, dtype=torch.bfloat16,
                       seed=budget, device="cuda")
    q, cache, P, anc, scale, C = args
    eager = fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    # new contents, same buffers: the replay must read q and anc_bits from memory
    fresh = make_inputs((4096, 1000, 63, 0), [ddtree_parents(budget + 1, 99 + b)
                                             for b in range(4)], H=64, C=512, R=64,
                        dtype=torch.bfloat16, seed=budget + 100, device="cuda")
    q.copy_(fresh[0])
    anc.copy_(fresh[3])
    graph.replay()
    torch.cuda.synchronize()
    want = fn(*args)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    assert not torch.equal(out[0], eager[0])  # the replay saw the new inputs
    torch.cuda.set_sync_debug_mode("error")  # and the launcher never syncs
    try:
        fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
