"""int4_moe cuda_v10 (cuda_v5 with the hot experts' gate/up on wide n-tiles): the tile rule, the
work-list bound, the knobs' checks and the sm_90 build on the CPU; on the H200 the hot launch
against the reference at every form of its knobs, WIDE 0 bitwise cuda_v5, and the work split
(CTA columns) changing no bit. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import itertools
import random
import re
import shutil

import pytest
import torch
from test_int4_moe_cuda import _build_sm90, _innermost_mma_loop

from workbench.kernels.int4_moe import cuda_v1, cuda_v5, cuda_v10
from workbench.reference.int4_moe import int4_moe

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v10_tiles_are_v5s_with_one_n_tile_a_cold_pass():
    # why: with the hot launch no cold expert holds more than WT (8) slots, so where cuda_v4's
    # rule takes two n-tiles a pass (T 512 on 384 experts) the cold launch goes back to one
    for T in (2, 17, 128, 512, 2080):
        v5 = cuda_v5.tiles(T, **KIMI)
        c = cuda_v10.tiles(T, **KIMI)
        want = cuda_v10.WIDE_DEFAULTS | ({"WT": 16} if T <= 32 else {}) | (
            {"WNT": 8, "WST": 5} if T * 8 >= 8 * 384 else {})  # call 4's forms by T
        assert {k: c[k] for k in cuda_v10.WIDE_DEFAULTS} == want
        assert c["NN1"] == 1
        if v5["NN1"] == 1:
            assert {k: c[k] for k in v5} == v5
        else:
            cu = cuda_v1.tiles(T, **KIMI)
            assert (c["KW1"], c["RW1"]) == (cu["KW1"], cu["RW1"])
    assert cuda_v5.tiles(512, **KIMI)["NN1"] == 2  # the case the rule is for exists


def _items(counts, ht, P):
    return sum(-(-c // P) for c in counts if c > ht)


@pytest.mark.parametrize("ht, P", [(0, 16), (8, 64), (8, 32), (15, 64), (100, 64)])
def test_v10_item_list_bound_holds_for_any_routing(ht, P):
    # why: the kernel's list is sized from shapes (max_items); a routing with more items would
    # drop work silently, so the bound must hold for every split of S slots over E experts:
    # the adversarial ones (as many hot experts as possible, each one slot past a pass) and
    # random Zipf-like ones
    rnd = random.Random(ht * 1000 + P)
    for S, E in ((8, 384), (136, 48), (1024, 384), (4096, 384), (16640, 384), (40, 4)):
        bound = cuda_v10.max_items(S, E, ht, P)
        n_hot = min(E, S // (ht + 1))
        if n_hot:
            worst = [ht + 1] * n_hot  # most hot experts, the rest of the slots on one
            worst[0] += S - sum(worst)
            assert _items(worst, ht, P) <= bound
        for size in (ht + 1, P + 1, max(ht + 1, P + 1), 2 * P + 1):  # one slot past a pass
            n = min(E, S // size)
            cs = [size] * n + ([S - size * n] if n < E else [])
            assert _items(cs, ht, P) <= bound
        for _ in range(200):
            w = [rnd.paretovariate(1.2) for _ in range(E)]
            cs = [0] * E
            for e in rnd.choices(range(E), weights=w, k=S):
                cs[e] += 1
            assert _items(cs, ht, P) <= bound


def test_v10_knobs_refused_by_name():
    base = cuda_v10.tiles(17, **KIMI)
    bad = [({"WIDE": 2}, "cfg['WIDE']"), ({"WT": -1}, "cfg['WT']"), ({"WT": 2.5}, "cfg['WT']"),
           ({"WU": 6}, "cfg['WU']"), ({"WNT": 3}, "cfg['WNT']"),
           ({"WU": 8, "WNT": 1}, "cfg['WNT']"), ({"WST": 9}, "cfg['WST']"), ({"WST": 1}, "cfg['WST']"),
           ({"WST": 5, "WT": 0}, "cfg"), ({"WNT": 8, "WST": 6}, "cfg"),  # past 227 KB
           ({"IT1": 1}, "cfg['IT1']"), ({"WMB": 3}, "cfg['WMB']"),
           ({"WMB": 2, "WNT": 8, "WST": 4}, "cfg['WMB']"), ({"WS": 2}, "cfg['WS']"),
           ({"WMB": 4, "WNT": 2}, "cfg['WMB']"), ({"WMB": 9, "WU": 4, "WNT": 2}, "cfg['WMB']"),
           ({"WMB": 0}, "cfg['WMB']")]
    for over, name in bad:
        with pytest.raises(ValueError, match=re.escape(name)):
            cuda_v10.check_hot(base | over, 10**6, 384)
    cuda_v10.check_hot(base, 136, 384)  # the defaults pass
    for more in ({"WNT": 2, "WMB": 3, "WST": 2}, {"WU": 4, "WNT": 2, "WMB": 6, "WST": 2},
                 {"WU": 4, "WNT": 4, "WMB": 4, "WST": 3}):  # built without spills (sm_90 test)
        cuda_v10.check_hot(base | more, 136, 384)
    with pytest.raises(ValueError, match="experts: expected fewer than 32768"):
        cuda_v10.check_hot(base, 136, 2**15)


def test_v10_defaults_fit_shared_memory_up_to_the_large_verify():
    # why: the list grows with T K; at the defaults the CTA fits 227 KB up to T 2080
    for T in (2, 17, 128, 512, 2080):
        cuda_v10.check_hot(cuda_v10.tiles(T, **KIMI), T * 8, 384)


def test_v10_resident_ctas_follow_shared_memory():
    # why: the hot grid is one wave of resident CTAs; WMB asks for registers, shared memory
    # decides what is left (WNT 2 / WST 3 at 8 warps: 86 KB, two of three asked)
    assert cuda_v10.ctas_an_sm(3, cuda_v10.smem_bytes(8, 2, 3, 100)) == 2
    assert cuda_v10.ctas_an_sm(3, cuda_v10.smem_bytes(8, 2, 2, 100)) == 3
    assert cuda_v10.ctas_an_sm(6, cuda_v10.smem_bytes(4, 2, 2, 100)) == 6
    assert cuda_v10.ctas_an_sm(2, 200 * 1024) == 1


HOT_SIG = "u64,u64,u64,u64,u64,u64,u64,u64,u64,int,int,int,int,int,int,int,int,int"  # int4_moe_hot


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v10_hot_kernel_builds_for_sm90_without_local_memory(tmp_path):
    # why: the hot CTA holds 2 x NT x 4 fp32 accumulators a thread at one CTA an SM; at every
    # (KPAD, WU, NT, ST) the knobs allow it compiles with mma.sync bf16 and no local memory at
    # all, and the cold launch's SKIP instance keeps its K loop off local memory too
    picks = [(kp, wu, nt, st, 2 if nt <= 2 else 1) for kp, (wu, nt), st in itertools.product(
        (0, 1), ((8, 8), (8, 2), (8, 4), (4, 4)), (2, 5, 6))] + [(0, 8, 4, 3, 2), (0, 8, 2, 2, 3), (0, 4, 2, 2, 6), (0, 4, 4, 3, 4)]  # WMB 2-6
    src = tmp_path / "hot.cu"
    src.write_text(f'#include "{cuda_v1._SRC}"\n#include "{cuda_v10._SRC}"\n' + "".join(
        f"template __global__ void int4_moe_hot<{', '.join(map(str, p))}>({HOT_SIG});\n"
        for p in picks) + "template __global__ void int4_moe_mma<0, 1, 0, 1, 4, 1, 3, 2, 1, 0, 8>"
        "(u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,int,int,int,int,int,int,int,int,int,"
        "u64,u64,u64,u64);\n")
    log, sass = _build_sm90(src)
    hot = [b for b in log.split("Compiling entry function")[1:] if "int4_moe_hot" in b]
    assert len(hot) == len(picks)
    for b in hot:
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in b, b
    assert "HMMA.16816.F32.BF16" in sass
    for fn in sass.split("Function : ")[1:]:
        if "int4_moe_hot" in fn[:200]:
            assert "LDL" not in fn and "STL" not in fn, fn[:80]
        else:
            loop = _innermost_mma_loop(fn)
            assert loop and not any(("LDL" in i or "STL" in i) for i in loop), fn[:80]


# ------------------------------------------------------------------ on the H200


def _routing(real_experts, T, skew, seed):
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(seed, "cuda")
    ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
    return r.normal(T, cfg.hidden_size), ids, r.uniform(T, K) + 0.05, ex


def same_bits_eager_and_replayed(op, twin, real_experts, T, skew, seed):
    """op's output on `_routing`'s case equals twin's bit for bit, and op captured in a CUDA
    graph, its output NaN-filled and the graph replayed, gives the same bits again."""
    x, ids, w, ex = _routing(real_experts, T, skew, seed)
    a = op(x, ids, w, ex)
    assert torch.equal(a, twin(x, ids, w, ex))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(x, ids, w, ex)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, a)


def _replayed(capture, real_experts, T, skew, seed, x, ids, w):
    """capture() recorded in a CUDA graph, then a new routing (seed) copied into x / ids / w,
    the output NaN-poisoned and the graph replayed: the replay's output (what a graph-safe op
    computes for the new inputs, compared by the caller with an eager call on them)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = capture()
    x2, ids2, w2, _ = _routing(real_experts, T, skew, seed)
    x.copy_(x2)
    ids.copy_(ids2)
    w.copy_(w2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return out


def _close(out, x, ids, w, ex):
    ref = int4_moe(x, ids, w, ex)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"WT": 0}, {"WT": 0, "WNT": 2}, {"WT": 0, "WNT": 4, "WU": 4},
                                 {"WT": 3, "WST": 2}, {"WT": 16, "WST": 5}, {"WY": 1},
                                 {"WNT": 8, "WST": 4}, {"WNT": 2, "WST": 3}, {"WNT": 2, "WST": 7},
                                 {"WNT": 4, "WST": 3, "WMB": 2}, {"WS": 1, "WT": 8}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (128, 0.0), (512, 1.2)])
def test_v10_hot_forms_match_reference_gpu(real_experts, T, skew, cfg):
    x, ids, w, ex = _routing(real_experts, T, skew, 1300 + T)
    _close(cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg=cfg), x, ids, w, ex)


def every_expert_hot_on_edge_cases(version) -> None:
    """`version`'s op at WT 0 (every expert on its hot launch) on the EDGE cases of seeds 0 / 1
    against the reference (the duplicate-id case raises, tested elsewhere)."""
    from workbench.ops.cases import int4_moe_cases

    for seed in (0, 1):
        for c in int4_moe_cases("edge", seed, device="cuda"):
            if "duplicate" in c.label:
                continue
            x, ids, w, ex = c.args
            _close(version.int4_moe_cuda(x, ids, w, ex, cfg={"WT": 0}), x, ids, w, ex)


@pytest.mark.gpu
def test_v10_every_expert_hot_on_edge_cases_gpu():
    # why: WT 0 sends every expert to the hot launch: K padding (D 32 / 64 / 96), one expert
    # holding every token (the others' NaN scales never read), K = E, -1 slots, strided x
    every_expert_hot_on_edge_cases(cuda_v10)


@pytest.mark.gpu
def test_v10_one_expert_with_every_token_gpu(real_experts):
    # why: 512 slots on one expert are 16 passes of 32 in neighbouring CTA columns, plus 7
    # uniform slots a token elsewhere
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K, T = cfg.n_routed_experts, cfg.n_experts_per_tok, 512
    r = _Rand(77, "cuda")
    ids = r.distinct(E - 1, K, T) + 1
    ids[:, 0] = 0
    x, w = r.normal(T, cfg.hidden_size), r.uniform(T, K) + 0.05
    _close(cuda_v10.int4_moe_cuda(x, ids, w, ex), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, hint", [(17, 1.2, None), (512, 0.0, None), (512, 1.2, None),
                                           (136, 0.0, 136)])
def test_v10_hot_off_is_cuda_v5_gpu(real_experts, T, skew, hint):
    # why: WIDE 0 must be cuda_v5's launches (its tiles, NN1 2 at T 512 included), so its bits
    x, ids, w, ex = _routing(real_experts, T, skew, 1400 + T)
    if hint is not None:
        ids = torch.where(ids < 48, ids, torch.full_like(ids, -1))
        ex = type(ex)(*(t[:48] for t in ex))
    a = cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg={"WIDE": 0}, expected_slots=hint)
    assert torch.equal(a, cuda_v5.int4_moe_cuda(x, ids, w, ex, expected_slots=hint))


@pytest.mark.gpu
@pytest.mark.parametrize("T", (65, 512))
def test_v10_cta_columns_change_no_bit_gpu(real_experts, T):
    # why: an item is one CTA's whole K in one warp, so how items are spread over the columns
    # (WY) cannot change a bit; and a one-token call is cuda_v9's
    from workbench.kernels.int4_moe import cuda_v9

    x, ids, w, ex = _routing(real_experts, T, 1.2, 1500 + T)
    a = cuda_v10.int4_moe_cuda(x, ids, w, ex)
    for hy in (1, 3, 64):
        assert torch.equal(a, cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg={"WY": hy}))
    x1, ids1, w1, _ = _routing(real_experts, 1, 0.0, 1500)
    assert torch.equal(cuda_v10.int4_moe_cuda(x1, ids1, w1, ex),
                       cuda_v9.int4_moe_cuda(x1, ids1, w1, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (512, 0.0), (512, 1.2)])
def test_v10_side_stream_is_one_stream_bitwise_gpu(real_experts, T, skew):
    # why: WS 1 only moves the hot launch to a side stream running beside the cold one; the
    # hot and cold rows of h are disjoint, so every bit is WS 0's, eager and graph-replayed
    # (the fork and join captured as parallel branches), and the launch path does not sync
    x, ids, w, ex = _routing(real_experts, T, skew, 1600 + T)
    for wt in ({}, {"WT": 8}):
        a = cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg=wt)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            b = cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg={"WS": 1} | wt)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(a, b)
    out = _replayed(lambda: cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg={"WS": 1}), real_experts,
                    T, skew, 1700 + T, x, ids, w)
    assert torch.equal(out, cuda_v10.int4_moe_cuda(x, ids, w, ex))
