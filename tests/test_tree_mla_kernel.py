"""tree_mla kernels (kernels/tree_mla/ triton_v1, triton_v2, triton_v2_split128, triton_v3,
triton_v4, triton_v4_split512, triton_v7, triton_v8, triton_v15, triton_v16, triton_v17,
triton_v26;
gluon_v9, gluon_v10, gluon_v10_by_heads, gluon_v11, gluon_v11_long, gluon_v12, gluon_v13,
gluon_v13_long, gluon_v14, gluon_v14_long, gluon_v18, gluon_v19, gluon_v25 and the engine-only
gluon_v20-gluon_v24 on the GPU): equal to the dense-mask reference.

On CPU the kernels run under the Triton interpreter (conftest.py) with fp32 dots (bf16 tl.dot
is wrong there), so CPU shapes stay small; `gpu` tests run the REAL shapes, CUDA-graph replay
against eager at every budget bucket, the no-sync check and bitwise batch invariance.
Every comparison goes through workbench.check.compare_outputs (the op's dtype tolerances, the
NaN/Inf pattern and the global relative error); every buffer the launcher allocates (outputs
and partials) is NaN-poisoned first, so an unwritten or wrongly read slot fails.
"""

from __future__ import annotations

import pytest
import torch
import triton
from sm90_compile import compile_sm90

from workbench.check import compare_outputs
from workbench.kernels.tree_mla import (
    BEST,
    PORTABLE,
    _common,
    gluon_v9,
    gluon_v10,
    gluon_v11,
    gluon_v12,
    gluon_v13,
    gluon_v14,
    gluon_v18,
    gluon_v19,
    gluon_v20,
    gluon_v21,
    gluon_v22,
    gluon_v23,
    gluon_v24,
    gluon_v25,
    register,
    triton_v1,
    triton_v2,
    triton_v3,
    triton_v4,
    triton_v7,
    triton_v8,
    triton_v15,
    triton_v16,
    triton_v17,
    triton_v26,
)
from workbench.ops.case import Case
from workbench.reference.tree_mla import pack_anc_bits, tree_mla

VERSIONS = {"v1": triton_v1.tree_mla_triton, "v2": triton_v2.tree_mla_triton,
            "v2_split128": triton_v2.tree_mla_triton_split128, "v3": triton_v3.tree_mla_triton,
            "v4": triton_v4.tree_mla_triton, "v4_split512": triton_v4.tree_mla_triton_split512,
            "v7": triton_v7.tree_mla_triton, "v8": triton_v8.tree_mla_triton,
            "v15": triton_v15.tree_mla_triton, "v16": triton_v16.tree_mla_triton,
            "v17": triton_v17.tree_mla_triton, "v26": triton_v26.tree_mla_triton}
# Gluon has no interpreter: the Gluon versions run in the `gpu` tests only (the CPU tests
# compile them for sm_90 and check their input errors)
GLUON = {"g9": gluon_v9.tree_mla_gluon, "g10": gluon_v10.tree_mla_gluon,
         "g10_by_heads": gluon_v10.tree_mla_gluon_by_heads, "g11": gluon_v11.tree_mla_gluon,
         "g11_long": gluon_v11.tree_mla_gluon_long, "g12": gluon_v12.tree_mla_gluon,
         "g13": gluon_v13.tree_mla_gluon, "g13_long": gluon_v13.tree_mla_gluon_long,
         "g14": gluon_v14.tree_mla_gluon, "g14_long": gluon_v14.tree_mla_gluon_long,
         "g18": gluon_v18.tree_mla_gluon, "g19": gluon_v19.tree_mla_gluon,
         "g20": gluon_v20.tree_mla_gluon, "g21": gluon_v21.tree_mla_gluon,
         "g22": gluon_v22.tree_mla_gluon, "g23": gluon_v23.tree_mla_gluon,
         "g24": gluon_v24.tree_mla_gluon, "g25": gluon_v25.tree_mla_gluon}
GPU_VERSIONS = {**VERSIONS, **GLUON}
# batch-variant by design (the engine preset's): its partition follows the launch's rows
ENGINE_ONLY = {"g20", "g21", "g22", "g23", "g24"}
# a CPU test's versions plus the Gluon ones as `gpu` cases (moved to CUDA by `_on`)
WITH_GLUON = [*VERSIONS, *(pytest.param(g, marks=pytest.mark.gpu) for g in GLUON)]
# BEST (gluon_v10) needs sm_90; the CPU tests exercise the presets' PORTABLE choice
tree_mla_triton = VERSIONS[PORTABLE.removeprefix("triton_")]
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


# ---------------------------------------------------------------- inputs


def tree_vis(parents: list[int]) -> torch.Tensor:
    """bool [N, N] ancestor-or-self from a parent list (parents[0] = -1)."""
    n = len(parents)
    vis = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        if parents[i] >= 0:
            vis[i] |= vis[parents[i]]
    return vis


def random_parents(n: int, g: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def make_case(prefix, parents, H=4, C=32, R=8, dtype=torch.bfloat16, seed=0, spare=3,
              q_std=1.0, gappy_kv=False, label="") -> Case:
    """One request per entry of `prefix` (all with the same tree `parents`, or a list of
    parent lists); NaN in every cache slot past P_b + N."""
    g = torch.Generator().manual_seed(seed)
    B = len(prefix)
    trees = parents if isinstance(parents[0], list) else [parents] * B
    N = len(trees[0])
    T = max(prefix) + N + spare
    P = torch.tensor(prefix)
    cache = torch.randn(B, T, C + R, generator=g).to(dtype)
    cache[torch.arange(T).view(1, T) >= (P + N).view(B, 1)] = NAN
    if gappy_kv:  # every other slot of a twice-as-long buffer: slot stride 2 * (C + R)
        wide = torch.full((B, 2 * T, C + R), NAN, dtype=dtype)
        wide[:, ::2] = cache
        cache = wide[:, ::2]
    q = (torch.randn(B, N, H, C + R, generator=g) * q_std).to(dtype)
    anc = pack_anc_bits(torch.stack([tree_vis(t) for t in trees]))
    dims = dict(B=B, N=N, H=H, C=C, R=R, T=T, P_sum=sum(prefix), W=anc.shape[-1])
    return Case("tree_mla", label or f"P={prefix} N={N}", (q, cache, P, anc, SCALE, C),
                dims=dims)


def _on(case: Case, version: str) -> Case:
    """The case on CUDA for a Gluon version (no interpreter), as made (CPU) otherwise."""
    if version in GLUON:
        case.args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in case.args)
    return case


def assert_matches_reference(case: Case, fn=None):
    fn = fn or tree_mla_triton
    out = fn(*case.args)
    ref = tree_mla(*case.args)  # float64 on the inputs' device (GPU: seconds, not minutes)
    rep = compare_outputs(ref, out, case, names=("o_lat", "lse"))
    assert rep["pass"], (case.label, rep["mismatches"][:4], rep["rel_err"])
    return out


def chain(n):
    return [-1] + list(range(n - 1))


def star(n):
    return [-1] + [0] * (n - 1)


# ---------------------------------------------------------------- EDGE (CPU, interpreter)

EDGE = {
    # name: (prefix lengths, tree, kwargs, why)
    "P0-N1": ((0,), [-1], {}, "empty prefix, one row: sees only itself (T = 4)"),
    "T1": ((0,), [-1], {"spare": 0}, "T = 1: the cache is the row itself, no splits"),
    "decode-N1": ((700,), [-1], {}, "plain decode: 2 prefix splits + a 1-key tree block"),
    "splits-3-ragged": ((1100, 0, 517), random_parents(7, torch.Generator().manual_seed(1)),
                        {"H": 3}, "3 / 0 / 2 splits in one launch, T not a multiple of 64"),
    "split-len-grows": ((8300,), star(3), {"H": 1, "spare": 13},
                        "P > MIN_SPLIT * MAX_SPLITS: split length 576, 15 splits"),
    "chain-129": ((5,), chain(129), {"H": 1}, "deepest tree: 3 mask words, bit 63 set"),
    "star-65": ((70,), star(65), {"H": 2}, "every node a child of the root; 2 words"),
    "chain-129-prefix": ((100, 64), chain(129), {"H": 1},
                         "3 mask words after prefixes on the TMA path (P = 64: one tile; "
                         "P = 100: the last tile shifted back)"),
    "padding-rows": ((9, 0), [[-1, 0, 1, 1, -1, -1], [-1, 0, -1, -1, -1, -1]], {},
                     "rows past node_count have no parent: they see only themselves"),
    "real-widths": ((70, 3), random_parents(5, torch.Generator().manual_seed(2)),
                    {"H": 2, "C": 512, "R": 64}, "C = 512, R = 64: K2.6's latent widths"),
    "large-scores": ((600,), random_parents(7, torch.Generator().manual_seed(3)),
                     {"q_std": 40.0}, "scores overflow exp unless each max is subtracted, "
                     "and partial lse values span a wide range"),
    "fp32": ((130,), random_parents(6, torch.Generator().manual_seed(4)),
             {"dtype": torch.float32}, "fp32 inputs: ieee dots, fp32 tolerances"),
    "fp16": ((66,), chain(4), {"dtype": torch.float16}, "fp16 inputs"),
    "strided-cache": ((40, 700), random_parents(5, torch.Generator().manual_seed(5)),
                      {"gappy_kv": True}, "kv_cache slot stride 2 * (C + R): strides honoured"),
    "odd-widths": ((20,), star(4), {"C": 24, "R": 5, "H": 5},
                   "C and R not powers of two (tile padding masked)"),
}


# CPU budget: v1, v3 and v4 keep both seeds; v2 runs seed 0, the policy twins (v2_split128,
# v4_split512) seed 1 and skip split-len-grows (at P = 8300 their partition is v2's / v4's)
EDGE_SEEDS = {"v1": (0, 1), "v2": (0,), "v2_split128": (1,), "v3": (0, 1), "v4": (0, 1),
              "v4_split512": (1,), "v7": (1,), "v8": (1,), "v15": (0, 1), "v16": (1,),
              "v17": (0, 1), "v26": (0, 1)}


@pytest.mark.parametrize("name", list(EDGE))
@pytest.mark.parametrize("version", list(VERSIONS))
def test_edge(name, version, poisoned):
    if version in ("v2_split128", "v4_split512") and name == "split-len-grows":
        pytest.skip("same partition as its base version at this P")
    prefix, tree, kw, _why = EDGE[name]
    for seed in EDGE_SEEDS[version]:
        assert_matches_reference(make_case(prefix, tree, seed=seed, **kw, label=name),
                                 VERSIONS[version])


@pytest.mark.parametrize("version", ["v2", "v2_split128", "v3", "v4"])
def test_v2_idle_split_programs_and_mixed_paths(version, poisoned):
    # why: T = 3706 sizes the grid for 8 / 16 splits but P = 3 and 0 need one program each
    # (the others must exit without writing), while P = 700 in the same launch goes through
    # the partials and the combine: direct and merged requests side by side
    case = make_case((3, 700, 0), random_parents(6, torch.Generator().manual_seed(11)),
                     spare=3000, label="idle programs")
    assert_matches_reference(case, VERSIONS[version])


@pytest.mark.parametrize("tma", [True, False])
def test_v3_tile_paths(tma, poisoned, monkeypatch):
    # why: v3's three prefix paths side by side: P < 64 (prefix in the masked loop, tiles
    # aligned below -P), P = 64 (one TMA tile), P = 65 and 520 (a split's last tile shifted
    # back to end at the split's end: P = 520's second split holds 8 keys, its tile reaches
    # into split 0's keys, which must count 0), P = 1100 (3 splits); NaN past P + N. The TMA
    # and pointer paths load the same rows under the same masks: bitwise equal
    case = make_case((63, 64, 65, 520, 0, 1100),
                     random_parents(5, torch.Generator().manual_seed(12)), label="v3 paths")
    assert triton_v3._tma_ok(case.args[1], case.args[5])
    out = assert_matches_reference(case, triton_v3.tree_mla_triton)
    if not tma:
        monkeypatch.setattr(triton_v3, "_tma_ok", lambda *a: False)
        ptr = triton_v3.tree_mla_triton(*case.args)
        assert torch.equal(ptr[0], out[0]) and torch.equal(ptr[1], out[1])


@pytest.mark.parametrize("loads", ["tma", "q_pointers", "pointers"])
def test_v4_part_paths(loads, poisoned, monkeypatch):
    # why: v4's paths side by side in one launch (T = 2108 sizes the grid for 8 parts): P < 64
    # (one part, masked loop, direct write), P = 64 and 256 (one 256-key split carrying the
    # tree: direct write), P = 300 (2 splits, the second's 44 keys in a tile shifted back into
    # split 0), P = 2048 (8 short splits, tree on the last), P = 2100 (long regime: 5 splits of
    # 512 + the tree's own part, merged last); NaN past P + N. Q and K by TMA, Q by pointers
    # (TREE_MLA_V4_ABLATE=qtma), both by pointers: bitwise the same
    case = make_case((63, 64, 256, 300, 2048, 2100),
                     random_parents(5, torch.Generator().manual_seed(13)), H=2,
                     label="v4 paths")
    assert [triton_v4.num_parts(p) for p in (63, 64, 256, 300, 2048, 2100)] == \
        [(0, 1), (1, 1), (1, 1), (2, 2), (8, 8), (5, 6)]
    out = assert_matches_reference(case, triton_v4.tree_mla_triton)
    if loads != "tma":
        monkeypatch.setenv("TREE_MLA_V4_ABLATE", "qtma")
        if loads == "pointers":
            monkeypatch.setattr(triton_v4, "_tma_ok", lambda *a: False)
        ptr = triton_v4.tree_mla_triton(*case.args)
        assert torch.equal(ptr[0], out[0]) and torch.equal(ptr[1], out[1])


def test_v4_split_policy_depends_on_prefix_only():
    # why: README's v4 policy table; the grid (from T alone) covers every P <= T
    assert [triton_v4.split_len(p) for p in (1, 2048, 2049, 8192, 16384, 16385, 32768)] == \
        [256, 256, 512, 512, 512, 576, 1024]
    assert [triton_v4.num_parts(p)[1] for p in (0, 63, 64, 1024, 2048, 4096, 8192, 32768)] == \
        [1, 1, 1, 4, 8, 9, 17, 33]
    assert [triton_v4.num_parts(p, 512)[1] for p in (1024, 2048, 2049)] == [2, 4, 6]
    for T in (1, 63, 64, 1027, 2048, 2049, 2600, 4099, 16387, 40000):
        for short in (triton_v4.SHORT_LEN, 512):
            assert all(triton_v4.num_parts(p, short)[1] <= triton_v4.parts_grid(T, short)
                       for p in range(0, T + 1, 1 if T < 5000 else 37))


def test_v7_policy_by_heads():
    # why: v7 = v4's kernels under policy_for(H): v4's policy at 64 heads (TP1), 128-key splits
    # and up to 64 of them below 32 heads (a TP8 rank's 8); the grid still covers every P <= T
    assert triton_v7.policy_for(64) is triton_v4.V4 and triton_v7.policy_for(32) is triton_v4.V4
    few = triton_v7.policy_for(8)
    assert [triton_v4.split_len(p, policy=few) for p in (1, 1024, 2048, 2049, 8192, 32768)] == \
        [128, 128, 128, 128, 128, 512]
    assert [triton_v4.num_parts(p, policy=few)[1] for p in (63, 64, 1024, 2048, 8192, 32768)] == \
        [1, 1, 8, 16, 65, 65]
    for T in (63, 64, 1027, 2048, 2049, 4099, 16387, 40000):
        assert all(triton_v4.num_parts(p, policy=few)[1] <= triton_v4.parts_grid(T, policy=few)
                   for p in range(0, T + 1, 1 if T < 5000 else 37))


def test_v7_few_heads_long_context_paths(poisoned):
    # why: v7's few-head policy past P = 2048 (128-key splits, the tree in a part of its own,
    # up to 64 parts merged) and below it (short splits, tree on the last), in one launch
    case = make_case((2100, 300, 40), random_parents(5, torch.Generator().manual_seed(14)),
                     H=2, label="v7 paths")
    assert [triton_v4.num_parts(p, policy=triton_v7.FEW_HEADS) for p in (2100, 300, 40)] == \
        [(17, 18), (3, 3), (0, 1)]
    assert_matches_reference(case, triton_v7.tree_mla_triton)


def test_v8_chunked_combine(poisoned):
    # why: v8's combine loads 16 parts a chunk into [16, 16, 32] tiles: C = 512 (K2.6's latent,
    # 16 column blocks), P = 4096 -> 33 parts (chunks of 16, 16, 1: the last one 15 dead parts
    # that must add nothing), P = 1000 -> 8 parts (one half-dead chunk), P = 40 -> direct
    # write; H = 3, N = 7: M = 21 rows, the second row block mostly past M. Within the
    # tolerances of v7 (a different, fixed summation order)
    case = make_case((4096, 1000, 40), random_parents(7, torch.Generator().manual_seed(15)),
                     H=3, C=512, R=64, label="v8 combine")
    assert [triton_v4.num_parts(p, policy=triton_v7.FEW_HEADS)[1] for p in (4096, 1000, 40)] == \
        [33, 8, 1]
    assert_matches_reference(case, triton_v8.tree_mla_triton)


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_v17_one_round_merge_is_the_two_pass_merge(dev, poisoned):
    # why: triton_v17 merges in one load round where the grid's parts fit one 128-part chunk
    # (ONE_ROUND: m from the chunk's own lse) and v8's two passes otherwise; both must give
    # the same bits (the same max, sums started from zeros), so a row's bits never depend on
    # the cache size T that picks the path. 33 parts (P 4096 under v7's 8-head policy), one
    # part's lse -inf (an empty ancestor word: weight 0), rows past M in the last block
    from workbench.kernels.tree_mla import triton_v17

    g = torch.Generator().manual_seed(17)
    B, M, C, P = 2, 11, 512, 4096
    pol = triton_v7.FEW_HEADS
    G = triton_v4.parts_grid(P + 5, policy=pol)
    assert triton_v4.num_parts(P, policy=pol)[1] == 33 and G <= triton_v17.CHUNK
    o_part = torch.randn(B, G, M, C, generator=g).to(dev)
    l_part = torch.randn(B, G, M, generator=g).to(dev) * 4
    l_part[0, 32, 3] = float("-inf")
    plen = torch.tensor([P, 1000], device=dev)
    consts = dict(SHORT_UPTO=pol.short_upto, SHORT_LEN=pol.short_len, LONG_MIN=pol.long_min,
                  MAX_SPLITS=pol.max_splits, BLOCK_N=64)
    outs = []
    for one in (True, False):
        o = torch.empty(B, M, C, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(B, M, device=dev)
        triton_v8._combine_kernel[(triton.cdiv(M, triton_v17.COMBINE_ROWS),
                                   C // triton_v17.COMBINE_COLS, B)](
            plen, o_part, l_part, o, lse, plen.stride(0), P + 5, M, G, C=C, CP=C,
            BLOCK_R=triton_v17.COMBINE_ROWS, BLOCK_C=triton_v17.COMBINE_COLS,
            NP=triton.next_power_of_2(G), CH=triton_v17.CHUNK, **consts, USE_PDL=False,
            ONE_ROUND=one, num_warps=4)
        outs.append((o, lse))
    (o1, l1), (o2, l2) = outs
    assert not o1.isnan().any() and not l1.isnan().any()
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16))
    assert torch.equal(l1.view(torch.int32), l2.view(torch.int32))


@pytest.mark.parametrize("version", [PORTABLE.removeprefix("triton_"),
                                     *(pytest.param(g, marks=pytest.mark.gpu) for g in GLUON)])
def test_harness_edge_cases(version, poisoned):
    # why: the registry's own EDGE cases (incl. a heads-major non-contiguous q)
    from workbench.ops.cases import tree_mla_cases

    device = "cuda" if version in GLUON else "cpu"
    for case in tree_mla_cases("edge", seed=7, device=device):
        assert_matches_reference(case, GPU_VERSIONS[version])


@pytest.mark.parametrize("version", WITH_GLUON)
def test_nan_past_length_never_leaks(version):
    # why: NaN (and inf) in every slot past P_b + N, and NaN in a request's own unused rows of
    # q: outputs stay finite for every real row
    case = _on(make_case((100, 3), random_parents(9, torch.Generator().manual_seed(6))),
               version)
    q, cache, P, anc, scale, C = case.args
    cache[0, 100 + 9:] = float("inf")
    o, lse = GPU_VERSIONS[version](q, cache, P, anc, scale, C)
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("version", [v for v in WITH_GLUON if getattr(v, "values", [v])[0]
                                     not in ENGINE_ONLY])
def test_batch_position_invariance(version):
    # why: a request's rows are bitwise the same alone and inside a batch of other requests
    # (its programs, tiles and split partition depend only on its own P_b); v2: the batch
    # mixes merged (P = 600) and one-split (37, 5) requests
    fn = GPU_VERSIONS[version]
    case = _on(make_case((600, 37, 5), [random_parents(6, torch.Generator().manual_seed(s))
                                        for s in range(3)], seed=3), version)
    q, cache, P, anc, scale, C = case.args
    o, lse = fn(*case.args)
    for b in range(3):
        ob, lb = fn(q[b:b + 1], cache[b:b + 1], P[b:b + 1], anc[b:b + 1], scale, C)
        assert torch.equal(ob[0], o[b]) and torch.equal(lb[0], lse[b]), b


def test_split_policy_depends_on_prefix_only():
    # why: the policy table in README.md; the grid covers every P <= T from T alone
    assert [_common.num_splits(p) for p in (0, 1, 512, 513, 8192, 8193, 32768)] == \
        [0, 1, 1, 2, 16, 15, 16]
    # v2_split128's policy (README table): only P < 8192 partitions differently
    assert [_common.num_splits(p, 128) for p in (0, 1, 128, 129, 1024, 4096, 8192, 32768)] == \
        [0, 1, 1, 2, 8, 16, 16, 16]
    assert all(_common.split_len(p, 128) == _common.split_len(p) for p in range(8177, 40000, 61))
    for T in (1, 511, 513, 4096, 40000):
        for ms in (_common.MIN_SPLIT, 128):
            assert all(_common.num_splits(p, ms) <= _common.splits_grid(T, ms)
                       for p in range(0, T, 97))


# ---------------------------------------------------------------- errors


def _args(**over):
    case = make_case((3,), chain(2))
    q, cache, P, anc, scale, C = case.args
    args = dict(q=q, kv_cache=cache, prefix_lens=P, anc_bits=anc, softmax_scale=scale,
                kv_lora_rank=C)
    return args | over


@pytest.mark.parametrize("over, match", [
    (dict(q=torch.zeros(1, 2, 4)), r"q: expected shape \[B, N, H, C\+R\]"),
    (dict(q=torch.zeros(1, 2, 4, 40, dtype=torch.int32)), r"q: expected dtype bfloat16"),
    (dict(kv_cache=torch.zeros(1, 8, 41, dtype=torch.bfloat16)),
     r"kv_cache: expected shape \(1, T, 40\)"),
    (dict(kv_cache=torch.zeros(1, 8, 40)), r"kv_cache: expected dtype torch.bfloat16"),
    (dict(prefix_lens=torch.zeros(2, dtype=torch.int64)), r"prefix_lens: expected shape \(1,\)"),
    (dict(prefix_lens=torch.zeros(1)), r"prefix_lens: expected an integer dtype"),
    (dict(anc_bits=torch.zeros(1, 3, 1, dtype=torch.int64)), r"anc_bits: expected shape"),
    (dict(anc_bits=torch.zeros(1, 2, 1, dtype=torch.int32)), r"anc_bits: expected dtype int64"),
    (dict(kv_lora_rank=40), r"kv_lora_rank: expected an int in \[1, 39\]"),
    (dict(kv_lora_rank=32.0), r"kv_lora_rank: expected an int"),
    (dict(softmax_scale=torch.tensor(0.1)), r"softmax_scale: expected a Python float"),
])
def test_errors_name_the_argument(over, match):
    with pytest.raises(ValueError, match=match):
        tree_mla_triton(**_args(**over))


def test_validate_checks_contents():
    # why: P_b + N <= T reads prefix_lens back (a sync): only with validate=True; without it
    # the kernels clamp slots to the cache (memory-safe, unspecified values)
    args = _args(prefix_lens=torch.tensor([4]))  # T = 3 + 2 + 3 = 8 >= 4 + 2: fine
    tree_mla_triton(**args, validate=True)
    bad = _args(prefix_lens=torch.tensor([7]))
    tree_mla_triton(**bad)
    with pytest.raises(ValueError, match=r"kv_cache: expected at least 9 slots"):
        tree_mla_triton(**bad, validate=True)


# ---------------------------------------------------------------- registry and decode loop


def test_registered_variants():
    from workbench import ops

    register()
    assert register() == []  # idempotent
    with ops.use(tree_mla="triton_v1"):
        assert ops.get("tree_mla") is triton_v1.tree_mla_triton
    with ops.use(tree_mla="triton_v2"):
        assert ops.get("tree_mla") is triton_v2.tree_mla_triton
    with ops.use(tree_mla="triton_v2_split128"):
        assert ops.get("tree_mla") is triton_v2.tree_mla_triton_split128
    with ops.use(tree_mla="triton_v3"):
        assert ops.get("tree_mla") is triton_v3.tree_mla_triton
    with ops.use(tree_mla="triton_v4"):
        assert ops.get("tree_mla") is triton_v4.tree_mla_triton
    with ops.use(tree_mla="triton_v4_split512"):
        assert ops.get("tree_mla") is triton_v4.tree_mla_triton_split512
    with ops.use(tree_mla="triton_v8"):
        assert ops.get("tree_mla") is triton_v8.tree_mla_triton


def test_gluon_v20_takes_short_parts_for_few_rows_below_32_heads():
    # why: gluon_v20 is the engine preset's tree_mla: a launch's split policy follows its
    # query rows (B x N) at the few-head (EP8 / TP8) widths only; 64 heads are gluon_v19
    from workbench import ops
    from workbench.kernels.tree_mla import ENGINE

    # (B, N, H, T): B x ceil(N H / 64) row blocks x 33 parts at a 4096-key prefix (T - N);
    # H200's 132 SMs hold one wave of them (session 19 call 1's sweep: every launch within
    # one wave was faster short, every one past it slower)
    short = [(1, 1, 8, 4097), (1, 17, 8, 4113), (2, 9, 8, 4105), (4, 4, 8, 4100),
             (1, 1, 16, 1024)]
    long = [(8, 1, 8, 4097), (4, 9, 8, 4105), (2, 17, 8, 4113), (32, 1, 8, 1024),
            (1, 1, 32, 4097), (1, 1, 64, 4097), (3, 9, 8, 4105)]
    assert all(gluon_v20.short_parts(*s, sms=132) for s in short)
    assert not any(gluon_v20.short_parts(*s, sms=132) for s in long)
    assert ENGINE == "gluon_v24" and ops.PRESETS["engine"]["tree_mla"] == ENGINE
    assert ops.PRESETS["optimized"]["tree_mla"] == BEST  # token-exact presets: never v20
    assert ops.PRESETS["invariant"]["tree_mla"] != ENGINE
    with pytest.raises(ValueError, match=r"q: expected dtype bfloat16 or float16"):
        gluon_v20.tree_mla_gluon(**_args(q=torch.zeros(1, 2, 4, 40),
                                         kv_cache=torch.zeros(1, 8, 40)))


def test_gluon_v21_takes_the_transposed_decode_for_one_row_block_in_one_wave():
    # why: gluon_v21's third launch (triton_v15's 16-row blocks under 64-key parts) is for
    # requests whose rows fit one block; 65 parts at a 4096-key prefix, 129 at 8192, so 132
    # SMs hold B 2 at P 4096 and B 1 at P 8192 in one wave
    yes = [(1, 1, 8, 4097), (2, 1, 8, 4097), (1, 2, 8, 4098), (1, 1, 8, 8193), (8, 1, 8, 1025)]
    no = [(3, 1, 8, 4097), (1, 3, 8, 4099), (2, 1, 8, 8193), (1, 1, 64, 1025), (9, 1, 8, 1025)]
    assert all(gluon_v21.decode_parts(*s, sms=132) for s in yes)
    assert not any(gluon_v21.decode_parts(*s, sms=132) for s in no)


def test_gluon_v24_wave_parts_fill_one_wave():
    # why: gluon_v24's rule: S = SMs // (B x row blocks) - 1 prefix parts, so B x row blocks x
    # (the parts any prefix gets, tree part included) never passes the SMs; only where it won
    # on the H200 (session 20: S >= 15, a request's rows <= 8), else 0 (gluon_v23's launches)
    for B, N, H in [(8, 1, 8), (5, 1, 8), (1, 1, 8), (4, 2, 4), (8, 1, 1)]:
        S = gluon_v24.wave_splits(B, N, H, 132)
        assert S == 132 // B - 1 and S >= gluon_v24.MIN_SPLITS
        for P in (64, 700, 4096, 4097, 8192, 32768):
            parts = triton_v4.num_parts(P, policy=gluon_v24.wave_policy(S))[1]
            assert 2 <= parts <= S + 1 and B * parts <= 132, (B, N, P, parts)
    for B, N, H in [(9, 1, 8), (16, 1, 8), (32, 1, 8), (8, 2, 8), (2, 17, 8), (1, 1, 64)]:
        assert gluon_v24.wave_splits(B, N, H, 132) == 0, (B, N, H)
    assert triton_v4.num_parts(4096, policy=gluon_v24.wave_policy(15))[1] == 14  # 320-key parts


@pytest.mark.parametrize("S, P", [(3, 700), (15, 4200)])
def test_gluon_v24_wave_policy_matches_reference(S, P):
    # why: the wave policy (short_upto 0: every prefix in <= S long parts plus the tree part)
    # behind v4's Triton attention and v17's merge, on the interpreter
    pol = gluon_v24.wave_policy(S)
    case = make_case((P, P - 9), random_parents(3, torch.Generator().manual_seed(P)), H=4,
                     C=64, R=16, seed=P)
    assert_matches_reference(case, lambda *a: triton_v4._launch(
        *a, False, pol, combine=triton_v17._launch_combine))


@pytest.mark.parametrize("merge, P, parts", [
    ("v22", 700, 11), ("v22", 4200, 67), ("v23", 700, 11), ("v23", 8192, 129)])
def test_gluon_v22_and_v23_merges_match_reference(merge, P, parts):
    # why: gluon_v22's merge (triton_v8's kernel on 8 x 32 tiles, one round of <= 64 parts;
    # v17's past 64) and gluon_v23's decode merge (4 x 32 tiles, 128 parts a round) behind
    # v4's Triton attention under 64-key parts, on the interpreter: a few parts and more than
    # one round's worth
    pol = triton_v4.Policy(short_upto=2048, short_len=64, long_min=64, max_splits=128)
    assert triton_v4.num_parts(P, policy=pol)[1] == parts
    case = make_case((P, P - 9), random_parents(3, torch.Generator().manual_seed(P)), H=4,
                     C=64, R=16, seed=P)
    fn = gluon_v22.merge if merge == "v22" else gluon_v23.decode_merge
    assert_matches_reference(case, lambda *a: triton_v4._launch(*a, False, pol, combine=fn))


def _engine_launch(version, case, B, N, H):
    """What the launch an engine-only version names for this shape returns, run directly."""
    from workbench.kernels.tree_mla import triton_v7, triton_v17

    q, cache = case.args[:2]
    shape = (B, N, H, cache.shape[1], gluon_v20.sm_count(q.device))
    if version != "g20" and gluon_v21.decode_parts(*shape):
        merge = triton_v17._launch_combine if version in ("g21", "g22") else \
            gluon_v23.decode_merge
        return triton_v15._launch(*case.args, False, gluon_v21.DECODE, combine=merge)
    if gluon_v20.short_parts(*shape):
        merge = triton_v17.combine_for(H) if version in ("g20", "g21") else gluon_v22.merge
        return gluon_v11._launch(*case.args, False, triton_v7.FEW_HEADS, publish=True,
                                 rcp=True, combine=merge)
    S = gluon_v24.wave_splits(B, N, H, shape[-1])
    if version == "g24" and S:
        return gluon_v11._launch(*case.args, False, gluon_v24.wave_policy(S), publish=True,
                                 rcp=True, combine=triton_v17._launch_combine)
    return gluon_v19.tree_mla_gluon(*case.args)


@pytest.mark.gpu
@pytest.mark.parametrize("version", sorted(ENGINE_ONLY))
@pytest.mark.parametrize("B, N, H, ctx", [
    (1, 1, 8, 4096), (2, 1, 8, 4096), (3, 1, 8, 4096), (8, 1, 8, 4096), (4, 1, 8, 1024),
    (1, 2, 8, 8192), (1, 9, 8, 4096), (1, 17, 8, 4096), (2, 9, 8, 1024), (4, 17, 8, 4096),
    (1, 1, 64, 4096), (16, 1, 8, 4096), (6, 1, 8, 4096)])
def test_gpu_engine_versions_are_the_launches_they_name(version, B, N, H, ctx):
    # why: gluon_v20-v24 only choose, by shape, between launches measured and tested on their
    # own (gluon_v19; the short parts with v17's merge, or v22's; v21's transposed decode with
    # v17's merge, or v23's; v24's one-wave long parts): each call's bits are the named launch's, and the reference's within tolerance
    case = _gpu_case(B, N, H, ctx, seed=B + N)
    o, lse = GLUON[version](*case.args)
    want = _engine_launch(version, case, B, N, H)
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1])
    assert_matches_reference(case, GLUON[version])


def test_presets_select_best_where_it_runs_else_portable():
    # why: BEST (Gluon) has no interpreter: a preset must still run on a CPU box, with the
    # portable version, while an explicit request for the Gluon kernel fails by name
    from workbench import ops

    assert ops.PRESETS["optimized"]["tree_mla"] == BEST == "gluon_v19"
    assert ops.PORTABLE["tree_mla"] == PORTABLE
    runs = ops.op_spec("tree_mla").variant(BEST).unavailable_reason() is None
    want = BEST if runs else PORTABLE
    for preset in ("optimized", "engine"):
        named = ops.PRESETS[preset]["tree_mla"]
        runs_named = ops.op_spec("tree_mla").variant(named).unavailable_reason() is None
        want = named if runs_named else PORTABLE
        assert ops.resolve_preset(ops.PRESETS[preset])["tree_mla"] == want
        with ops.use(preset):
            assert ops.selected("tree_mla") == want
    if not runs:
        with pytest.raises(ops.VariantUnavailable, match=f"tree_mla={BEST} cannot run here"):
            with ops.use(tree_mla=BEST):
                pass


@pytest.mark.parametrize("budget", [None, 5])
def test_decode_token_exact_with_kernel(tiny_target, budget):
    # why: the kernel in every attention call of the loop (prefill chunks = chain masks, AR
    # decode N = 1, DDTree verify trees, padding rows), token-exact with the reference loop
    from workbench.generate import generate
    from workbench.replay import ReplayDrafter

    register()
    prompts = [[5, 9, 200, 31, 7], [44, 3, 12]]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=6)
    if budget is None:
        out = generate(tiny_target, prompts=prompts, max_new_tokens=6,
                       kernels={"tree_mla": PORTABLE})
    else:
        seqs = [p + t for p, t in zip(prompts, ar.tokens)]
        drafter = ReplayDrafter(tiny_target.cfg, seqs, hit_prob=0.9, seed=1)
        out = generate(tiny_target, drafter, prompts, max_new_tokens=6, budget=budget,
                       kernels={"tree_mla": PORTABLE})
        assert max(out.accepted) >= 2  # multi-token paths were verified by the kernel
    assert out.tokens == ar.tokens


# ---------------------------------------------------------------- GPU


def _gpu_case(B, N, H, ctx, seed, budget_tree=True):
    g = torch.Generator().manual_seed(seed)
    trees = [random_parents(N, g) if budget_tree else chain(N) for _ in range(B)]
    prefix = [max(0, ctx - int(torch.randint(0, 64, (1,), generator=g))) for _ in range(B)]
    case = make_case(prefix, trees, H=H, C=512, R=64, seed=seed)
    case.args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in case.args)
    return case


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(GPU_VERSIONS))
@pytest.mark.parametrize("H", [64, 8])
@pytest.mark.parametrize("B, N, ctx", [(1, 9, 1024), (1, 17, 4096), (1, 33, 8192),
                                       (1, 65, 32768), (1, 129, 8192), (8, 9, 4096),
                                       (4, 33, 1024), (64, 9, 1024), (16, 129, 1024)])
def test_gpu_real_shapes(B, N, H, ctx, version):
    for seed in (0, 1):
        assert_matches_reference(_gpu_case(B, N, H, ctx, seed), GPU_VERSIONS[version])


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(GPU_VERSIONS))
@pytest.mark.parametrize("budget", [1, 8, 16, 32, 64, 128])
def test_gpu_cuda_graph_replay_equals_eager(budget, version):
    tree_mla_triton = GPU_VERSIONS[version]
    case = _gpu_case(4, budget + 1, 64, 4096, seed=budget)
    q, cache, P, anc, scale, C = case.args
    eager = tree_mla_triton(*case.args)
    tree_mla_triton(*case.args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tree_mla_triton(*case.args)
    # new contents, same buffers: the replay must read q and anc_bits from memory
    fresh = _gpu_case(4, budget + 1, 64, 4096, seed=budget + 100)
    q.copy_(fresh.args[0])
    anc.copy_(fresh.args[3])
    graph.replay()
    torch.cuda.synchronize()
    want = tree_mla_triton(*case.args)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    assert not torch.equal(out[0], eager[0])  # the replay saw the new inputs
    assert_matches_reference(case, tree_mla_triton)


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(GPU_VERSIONS))
def test_gpu_no_host_sync(version):
    tree_mla_triton = GPU_VERSIONS[version]
    case = _gpu_case(2, 33, 64, 4096, seed=5)
    tree_mla_triton(*case.args)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tree_mla_triton(*case.args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("version", [v for v in GPU_VERSIONS if v not in ENGINE_ONLY])
@pytest.mark.parametrize("ctx", [8192, 500])  # 500: v2 finishes every request in one launch
def test_gpu_row_result_independent_of_rows_in_launch(version, ctx):
    # why: DESIGN.md §7 stretch: a row's result depends on its q, P_b, keys and ancestor set
    # only: the first 9 rows of a 33-row launch equal a 9-row launch bit for bit, and a
    # request's rows equal themselves in a batch of 16
    tree_mla_triton = GPU_VERSIONS[version]
    big = _gpu_case(16, 33, 64, ctx, seed=9)
    q, cache, P, anc, scale, C = big.args
    o, lse = tree_mla_triton(*big.args)
    o9, lse9 = tree_mla_triton(q[:, :9], cache, P, anc[:, :9].clone(), scale, C)
    assert torch.equal(o9, o[:, :9]) and torch.equal(lse9, lse[:, :9])
    o1, lse1 = tree_mla_triton(q[3:4], cache[3:4], P[3:4], anc[3:4], scale, C)
    assert torch.equal(o1[0], o[3]) and torch.equal(lse1[0], lse[3])


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(GLUON))
@pytest.mark.parametrize("name", list(EDGE))
def test_gpu_edge_gluon(name, version, poisoned):
    # why: Gluon has no interpreter, so the CPU EDGE table runs here; the widths and dtypes
    # its tiles cannot take (fp32, C not a power of two) must be refused by name
    prefix, tree, kw, _why = EDGE[name]
    for seed in (0, 1):
        case = _on(make_case(prefix, tree, seed=seed, **kw, label=name), version)
        if name == "fp32":
            with pytest.raises(ValueError, match=r"q: expected dtype bfloat16 or float16"):
                GLUON[version](*case.args)
        elif name == "odd-widths":
            with pytest.raises(ValueError, match=r"kv_lora_rank: expected a power of two"):
                GLUON[version](*case.args)
        else:
            assert_matches_reference(case, GLUON[version])


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, H, ctx", [(1, 9, 64, 1024), (2, 129, 8, 8192), (4, 17, 64, 40)])
@pytest.mark.parametrize("old, new", [(gluon_v9, gluon_v10), (gluon_v13, gluon_v14)],
                         ids=["v10_bitwise_v9", "v14_bitwise_v13"])
def test_gpu_gluon_bitwise_predecessor(old, new, B, N, H, ctx):
    # why: v10 changes only where the PV wgmma reads P from (its own shared-memory buffer, not
    # a register operand): the same bf16 P and V through the same wgmma shapes and order; v14
    # only where each partition's geometry comes from (computed again from the kernel's
    # arguments instead of handed over at the fork): the same arithmetic, the same bits
    case = _gpu_case(B, N, H, ctx, seed=N)
    o_old, l_old = old.tree_mla_gluon(*case.args)
    o_new, l_new = new.tree_mla_gluon(*case.args)
    assert torch.equal(o_old, o_new) and torch.equal(l_old, l_new)


# ---------------------------------------------------------------- peers


def test_sglang_extend_peer_matches_reference():
    # why: the peer is timed beside our kernel; it must compute the same thing
    from workbench.kernels.tree_mla.peers import _prepare, sglang_extend_tree
    from workbench.peers import peer_names

    assert "sglang_extend_triton" in peer_names("tree_mla")
    case = make_case((70, 3), random_parents(37, torch.Generator().manual_seed(8)), H=2)
    ref_o, _ = tree_mla(*case.args)
    o = sglang_extend_tree(*_prepare(case))
    err = ((o.double() - ref_o.double()).norm() / ref_o.double().norm()).item()
    assert err < 1e-2


def test_gluon_splits_the_score_tile_across_warpgroups_sm90():
    # why: the next tree_mla kernel's premise (scripts/gluon_mla_tile_probe.py, README "Next:
    # Gluon"): on this toolchain Gluon compiles a 64 x 64 absorbed-MLA tile for sm_90 with S
    # split by keys over the two warpgroups (36 wgmma m64n32 a warpgroup where Triton's layout
    # issues m64n64: the duplicate QK^T) and each warpgroup's 256 value columns, no spill
    split, dup, loop = compile_sm90(
        "import sys; sys.path.insert(0, 'scripts'); import gluon_mla_tile_probe as p; "
        "out = [p.compile_tile([4, 2]), p.compile_tile([8, 1]), p.compile_loop()]")
    assert split["wgmma"] == {"m64n256k16": 4, "m64n32k16": 36}, split
    assert dup["wgmma"] == {"m64n256k16": 4, "m64n64k16": 36}, dup
    assert "0 B spill" in split["ptxas"], split
    # the loop with a 2-slot K ring and online softmax fits sm_90's 227 KB, spill-free
    assert loop["smem"] <= 227 * 1024 and "0 B spill" in loop["ptxas"], loop


@pytest.mark.parametrize("over, match", [
    (dict(q=torch.zeros(1, 2, 4, 40), kv_cache=torch.zeros(1, 8, 40)),
     r"q: expected dtype bfloat16 or float16"),
    (dict(kv_lora_rank=24), r"kv_lora_rank: expected a power of two in \[32, 512\]"),
    (dict(kv_cache=torch.zeros(1, 8, 41, dtype=torch.bfloat16)[..., :40]),
     r"kv_cache: expected rows TMA can read"),  # 82-byte slot stride
    (dict(kv_cache=torch.zeros(1, 8, 40, dtype=torch.bfloat16).transpose(1, 2)
          .contiguous().transpose(1, 2)), r"kv_cache: expected rows TMA can read"),
    (dict(), r"q: expected a CUDA tensor"),  # valid inputs on the CPU
])
def test_gluon_v9_errors_name_the_argument(over, match):
    # why: gluon_v9's tiles take bf16/fp16, C a power of two and TMA-readable cache rows, and
    # run on an sm_90 GPU only; anything else is refused by name before a launch (CPU, under
    # the interpreter, so the shared shape checks pass first)
    with pytest.raises(ValueError, match=match):
        gluon_v9.tree_mla_gluon(**_args(**over))


def test_gluon_v9_compiles_to_split_score_tiles_sm90():
    # why: gluon_v9's design (README "Design (v9)"; v10 the same with P's own buffer): for
    # sm_90 each of its two loops issues 36 wgmma m64n32k16 (S split by keys, no m64n64: no
    # duplicate QK^T) and 4 m64n256k16 (each warpgroup's 256 value columns), K and Q arrive by
    # TMA in 128-byte-swizzled [64, 64] boxes, the combine is a programmatic dependent, and it
    # fits 227 KB of shared memory
    for r in compile_sm90(
            "from workbench.kernels.tree_mla import sm90_gluon as s; "
            "out = [{k: v for k, v in r.items() if k not in ('ptx', 'cubin')} for r in "
            "[s.compile_attn(64, 9, 4096), s.compile_attn(8, 129, 32768, p_smem=True)]]"):
        assert r["wgmma"] == {"m64n256k16": 8, "m64n32k16": 72}, r
        assert r["smem"] <= 227 * 1024 and int(r["regs"]) <= 255, r
        assert r["tma"] >= 4 and r["gdc"] == 1 and r["boxes"] == [[64, 64]] * 4, r


def test_gluon_v18_attention_compiles_under_the_few_heads_policy_sm90():
    # why: gluon_v18 runs gluon_v13's attention kernel with triton_v7's 8-head constexprs
    # (128-key parts, up to 64 splits): the same wgmma tiles, registers and shared memory
    # as under v4's, so only its parts and merge differ
    r = compile_sm90(
        "from workbench.kernels.tree_mla import sm90_gluon as s, triton_v7; "
        "out = [{k: v for k, v in s.compile_attn(8, 17, 4096, version=13, policy=p).items() "
        "if k not in ('ptx', 'cubin')} for p in (None, triton_v7.policy_for(8))]")
    assert r[0] == r[1], r
    assert set(r[1]["wgmma"]) == {"m64n64k16", "m64n256k16"} and r[1]["gdc"] == 1, r
    assert r[1]["smem"] <= 227 * 1024 and int(r[1]["regs"]) <= 255, r


@pytest.mark.parametrize("prefix, N, H, C", [
    ([600], 5, 4, 256),  # 3 short parts (256 keys), the tree on the last; 2 merge chunks
    ([300, 40, 1030], 9, 8, 128),  # 2 / 1 / 5 parts: one request writes directly, no ticket
    ([2200], 3, 16, 128),  # past SHORT_UPTO: 5 long parts of 512 and the tree's own part
])
def test_v26_merges_in_kernel_with_v4s_bits(prefix, N, H, C, poisoned, monkeypatch):
    # why: triton_v26's last part to finish merges its row block's partials with the
    # combine's arithmetic, so its outputs are triton_v4's bit for bit (and the reference's
    # within tolerance); its counters are back to zero after every launch (graph replay and
    # the next call need no memset), and a second call gives the same bits
    from workbench.kernels.dense.linear_triton_v2 import counters

    g = torch.Generator().manual_seed(sum(prefix) + N)
    case = make_case(prefix, [random_parents(N, g) for _ in prefix], H=H, C=C, R=16,
                     seed=N, label=f"v26 P={prefix}")
    o4, lse4 = triton_v4.tree_mla_triton(*case.args)
    monkeypatch.setattr(triton_v4, "_launch_combine", None)  # v26 must not launch it
    o, lse = triton_v26.tree_mla_triton(*case.args)
    assert torch.equal(o, o4) and torch.equal(lse, lse4)
    assert not counters(o.device, 1, pool="tree_mla").any()
    o2, lse2 = triton_v26.tree_mla_triton(*case.args)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    assert_matches_reference(case, triton_v26.tree_mla_triton)


def test_v26_attention_builds_as_v4s_with_the_merge_sm90():
    # why: the in-kernel merge must not cost the attention kernel its tiles: v4's wgmma, TMA
    # and shared memory, a few bytes more spill at most, the ticket atomics in the PTX, and no
    # griddepcontrol (there is no dependent combine launch to release)
    r = compile_sm90(
        "import torch, triton; from triton.backends.compiler import GPUTarget; "
        "from triton.compiler import ASTSource; "
        "from workbench.kernels._sm90 import ptxas_stats; "
        "from workbench.kernels.tree_mla import sm90, triton_v4, triton_v26; "
        "args = (torch.zeros(1, 9, 64, 576, dtype=torch.bfloat16), "
        "torch.zeros(1, 4096, 576, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64), "
        "torch.zeros(1, 9, 1, dtype=torch.int64), 0.1447, 512); out = {}\n"
        "for name, m in (('v4', triton_v4), ('v26', triton_v26)):\n"
        "    for fn, _g, sig, const, attrs, w, st, fu in sm90.capture(m, *args):\n"
        "        if fn.__name__ != '_attn_kernel': continue\n"
        "        ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, "
        "attrs=attrs), target=GPUTarget('cuda', 90, 32), options={'num_warps': w, "
        "'num_stages': st})\n"
        "        ptx = ck.asm['ptx']; regs, spill = ptxas_stats(ptx)\n"
        "        out[name] = dict(spill=int(spill), smem=ck.metadata.shared, "
        "wgmma=ptx.count('wgmma.mma_async'), tma=ptx.count('cp.async.bulk.tensor'), "
        "gdc=ptx.count('griddepcontrol'), atom=ptx.count('atom.'), merge=const['MERGE'])")
    v4, v26 = r["v4"], r["v26"]
    assert (v26["wgmma"], v26["tma"], v26["smem"]) == (v4["wgmma"], v4["tma"], v4["smem"]), r
    assert v26["spill"] <= v4["spill"] + 16 and v26["gdc"] == 0 and v4["gdc"] >= 1, r
    assert v26["merge"] and not v4["merge"] and v26["atom"] >= 2 and v4["atom"] == 0, r


def test_gluon_v25_is_gluon_v19_under_the_long_policy(monkeypatch):
    # why: gluon_v25 changes only the split policy of gluon_v19's launch: past P = 2048 at 32
    # heads or more >= 1024-key splits (at most 8), v4's below 32 heads (gluon_v19 call for
    # call there); the policy reads P and H only, never the launch's rows (batch invariance)
    from workbench.kernels.tree_mla import triton_v4

    seen = []
    monkeypatch.setattr(gluon_v25, "_launch", lambda *a, **kw: seen.append((a, kw)))
    for H in (8, 16, 32, 64):
        for N in (1, 9):
            gluon_v25.tree_mla_gluon(torch.empty(2, N, H, 576), torch.empty(2, 64, 576),
                                     torch.zeros(2, dtype=torch.int32),
                                     torch.zeros(2, N, 1, dtype=torch.int64), SCALE, 512)
    for (a, kw), (H, N) in zip(seen, [(h, n) for h in (8, 16, 32, 64) for n in (1, 9)]):
        assert a[7] == (gluon_v11.LONG if H >= 32 else triton_v4.V4), (H, N)
        assert kw == {"publish": True, "rcp": True}
    assert len(seen) == 8
    # the long policy's partition at the REAL contexts (host twins of the kernels' _parts)
    assert [triton_v4.num_parts(P, policy=gluon_v11.LONG) for P in (1024, 2048, 4096, 8192,
                                                                    32768)] == \
        [(4, 4), (8, 8), (4, 5), (8, 9), (8, 9)]
    assert [triton_v4.num_parts(P) for P in (4096, 8192)] == [(8, 9), (16, 17)]


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, H, ctx", [(1, 9, 8, 8192), (2, 17, 16, 4096), (1, 33, 64, 2048)])
def test_gpu_gluon_v25_is_gluon_v19_where_the_policies_agree(B, N, H, ctx):
    # why: below 32 heads, and at any head count up to P = 2048, v4's policy and the long one
    # cut the same parts: gluon_v25's bits are gluon_v19's there
    case = _gpu_case(B, N, H, ctx, seed=N)
    o, lse = gluon_v25.tree_mla_gluon(*case.args)
    o19, lse19 = gluon_v19.tree_mla_gluon(*case.args)
    assert torch.equal(o, o19) and torch.equal(lse, lse19)


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, H, ctx", [(1, 129, 64, 1024), (1, 9, 64, 8192), (8, 17, 64, 4096),
                                          (32, 9, 8, 4096), (1, 1, 8, 8192)])
def test_gpu_v26_is_v4_bitwise(B, N, H, ctx):
    # why: triton_v26's in-kernel merge runs the combine's arithmetic on the same partials,
    # whichever part finishes last: triton_v4's bits at the REAL shapes, twice in a row (the
    # counters reset themselves), and under CUDA-graph replay
    from workbench.kernels.dense.linear_triton_v2 import counters

    case = _gpu_case(B, N, H, ctx, seed=N + B)
    want = triton_v4.tree_mla_triton(*case.args)
    for _ in range(2):
        got = triton_v26.tree_mla_triton(*case.args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not counters(got[0].device, 1, pool="tree_mla").any()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = triton_v26.tree_mla_triton(*case.args)
    for _ in range(3):
        out[0].fill_(NAN)
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def test_gluon_v19_epilogue_multiplies_by_a_reciprocal_sm90():
    # why: gluon_v19's epilogue scales O by one reciprocal of l a row (session 16's ncu: the
    # per-value div.full.f32 of gluon_v13's epilogue is most of ~1000 straight-line SASS that
    # every short part's CTA fetches cold); the kernel's tiles, registers and shared memory
    # stay gluon_v13's, and gluon_v13's build (RCP off) keeps its divisions
    r = compile_sm90(
        "from workbench.kernels.tree_mla import sm90_gluon as s; "
        "out = [dict({k: v for k, v in r.items() if k not in ('ptx', 'cubin')}, "
        "div=r['ptx'].count('div.full.f32')) for r in "
        "(s.compile_attn(8, 1, 8192, version=13), s.compile_attn(8, 1, 8192, version=19))]")
    g13, g19 = r
    assert g13["div"] == 256 and g19["div"] <= 8, r  # a division a value vs a few a row
    assert {k: v for k, v in g13.items() if k != "div"} == \
        {k: v for k, v in g19.items() if k != "div"}, r


@pytest.mark.parametrize("version", [11, 12, 13, 14])
def test_gluon_v11_compiles_to_whole_score_tiles_sm90(version):
    # why: gluon_v11's seesaw (README "Design (v11)"): each warpgroup scores whole tiles (wgmma
    # m64n64k16, the rope part with Q from registers) and owns C/2 value columns (m64n256k16,
    # its own P from registers, the other's from shared memory); two 4-warp partitions (the
    # second with setmaxnreg), every load by TMA in 128-byte-swizzled [64, 64] boxes, within
    # 227 KB of shared memory with Q, two K slots and P0; gluon_v12 the same kernel with the
    # K halves in 64-column chunks (one [64, 64] box a chunk)
    r = compile_sm90(
        "from workbench.kernels.tree_mla import sm90_gluon as s; "
        f"r = s.compile_attn(64, 9, 4096, version={version}); "
        "out = dict({k: v for k, v in r.items() if k not in ('ptx', 'cubin')}, "
        "setmaxnreg=r['ptx'].count('setmaxnreg'), arrive=r['ptx'].count('bar.arrive 1'), "
        "sync=r['ptx'].count('bar.sync 1')); "
        "import re; L = [x.strip() for x in r['ptx'].splitlines() "
        "if x.strip() and not x.strip().startswith(('//', '.loc', '$L'))]; "
        "out['pub'] = sum(bool(re.match(r'bar\\.sync\\s+\\d, 128;', a)) and "
        "b.startswith('bar.sync 1') for a, b in zip(L, L[1:]))")
    assert set(r["wgmma"]) == {"m64n64k16", "m64n256k16"}, r
    assert r["smem"] <= 227 * 1024 and int(r["regs"]) <= 255, r
    assert r["setmaxnreg"] >= 2 and r["gdc"] == 1 and r["boxes"] == [[64, 64]] * 4, r
    # the warpgroups hand m, the factor, P and l over on named barriers 10-14, a bar.sync on
    # each side (what racecheck follows): five handoffs, ten sites
    assert r["arrive"] == 0 and r["sync"] == 10, r
    # gluon_v13 (and v14): each of the five publishing sites (M0 and LSUM in warpgroup 0; M1,
    # P1 and LW1 in warpgroup 1) right after a partition barrier over the publisher's 128
    # threads (what racecheck needs to see the handoff); v11 and v12 have none there
    assert r["pub"] == (5 if version >= 13 else 0), r
