"""The tensor-parallel DFlash drafter (workbench/dist/drafter.py): its shards reassemble the
drafter, the loop on 2 / 4 / 8 ranks drafts exactly what the single process drafts (exact
layout: the same trees, so the same accepted lengths step by step), and what it cannot run is
refused by name. CPU: gloo, as tests/test_dist.py.
"""

import functools

import pytest
import torch

import workbench
from workbench import ops
from workbench.dist.decode import dist_config, dist_generate
from workbench.dist.drafter import drafter_heads, shard_drafter, tp_block_body
from workbench.dist.launch import run_distributed
from workbench.dist.layout import Layout, LayoutError
from workbench.dist.moe import ACC
from workbench.generate import generate
from workbench.reference.drafter import build_drafter

CFG = dist_config("tiny-dist")  # drafter: 8 q heads, 2 KV heads, width 128, 2 layers
MAX_NEW, BUDGET, SEED = 12, 8, 0
RUN = {"timeout_s": 120, "collective_timeout_s": 60}


@functools.cache
def _ref():
    """Single-process prompts, AR tokens and DFlash-DDTree accepted lengths."""
    g = torch.Generator().manual_seed(2000)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 17, 9)]
    target = workbench.build_model(CFG, seed=SEED)
    ar = generate(target, prompts=prompts, max_new_tokens=MAX_NEW)
    dd = generate(target, build_drafter(CFG, seed=SEED), prompts, max_new_tokens=MAX_NEW,
                  budget=BUDGET)
    assert dd.tokens == ar.tokens
    return prompts, ar, dd


def _tp_decode(world, **kw):
    prompts, _, _ = _ref()
    return run_distributed(dist_generate, world, CFG, prompts, max_new_tokens=MAX_NEW,
                           seed=SEED, budget=BUDGET, drafter="dflash", drafter_layout="tp",
                           **kw, **RUN)["result"]


@pytest.mark.parametrize("world, layout", [(2, {"tp": 2}), (4, {"ep": 2, "tp": 2}),
                                           (8, {"ep": 8})],
                         ids=["tp2", "ep2tp2", "ep8 (KV heads replicated)"])
def test_tp_drafter_loop_drafts_what_the_single_process_drafts(world, layout):
    # exact layout: whole dot products everywhere, so every draft, tree and walk is the single
    # process's: the same tokens and the same accepted lengths step by step (random weights
    # accept little; the next test compares the drafts themselves, top-k by top-k)
    _, ar, dd = _ref()
    res = _tp_decode(world, **layout)
    assert res.tokens == ar.tokens
    assert res.accepted == dd.accepted


def _draft_inputs():
    """A drafter cache with committed context from seeded target features, and a block to
    draft: (hidden [B, n, F], positions, count, bonus, start), B = 3 of mixed lengths."""
    g = torch.Generator().manual_seed(7)
    B, n = 3, 11
    F = len(CFG.drafter.target_layer_ids) * CFG.hidden_size
    hidden = torch.randn(B, n, F, generator=g).bfloat16()
    count = torch.tensor([11, 4, 8])
    return hidden, torch.arange(n).expand(B, n), count, torch.tensor([17, 250, 3]), count


def _tp_draft(rank, world, layout, k, exact=True, kernels=None):
    from workbench.dist.comm import TorchComm
    from workbench.dist.drafter import make_dist_drafter
    from workbench.dist.model import build_dist_model

    lay = Layout.make(world, rank, exact=exact, **layout)
    target = build_dist_model(CFG, lay, TorchComm(), seed=SEED)
    hidden, pos, count, bonus, start = _draft_inputs()
    out = {}
    for how in ("replicated", "tp"):
        dr = make_dist_drafter(build_drafter(CFG, seed=SEED), target, how)
        cache = dr.new_cache(3, 16)
        with ops.use(kernels or {}):
            dr.materialize(cache, hidden, pos, count)
            out[how] = dr.draft_override(None, target, cache, bonus, start, k)
    return out


@pytest.mark.parametrize("world, layout", [(2, {"tp": 2}), (8, {"ep": 8})], ids=["tp2", "ep8"])
def test_tp_draft_is_the_single_process_draft_bit_for_bit(world, layout):
    # the draft itself (per-depth top-k log-probs and ids, k past one vocab shard): exact
    # layout, so the TP drafter's is the replicated drafter's bit for bit (both put the same
    # vocab-parallel head on the final hidden), and its ids the single process's
    from workbench.reference.drafter import draft_topk

    k = 80  # > V/8 = 64: candidates from several shards
    target = workbench.build_model(CFG, seed=SEED)
    dr = build_drafter(CFG, seed=SEED)
    hidden, pos, count, bonus, start = _draft_inputs()
    cache = dr.new_cache(3, 16)
    dr.materialize(cache, hidden, pos, count)
    lp, ids = draft_topk(dr, target, cache, bonus, start, k)
    out = run_distributed(_tp_draft, world, layout, k, **RUN)
    (rlp, rids), (tlp, tids) = out["replicated"], out["tp"]
    assert torch.equal(tids, rids) and torch.equal(tlp, rlp)
    assert torch.equal(tids, ids)
    # the vocab-parallel log-softmax (shard max / sum merged) rounds its log Z differently
    torch.testing.assert_close(tlp, lp, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_tp_draft_takes_the_variants_whole_head():
    # triton_v7 is triton_v6's body with its own vocab-parallel head (kernels/drafter HEAD):
    # through DistDrafter.draft_override on a TP2 rank pair, the same ids as v6's head, the
    # log-probs within fp32 ulps (the head's log-softmax constants are Triton's)
    k = 20  # each rank of tiny-dist's 512-id vocab offers 20 of its 256; the merge
    # picks 20 of the 40
    v6 = run_distributed(_tp_draft, 2, {"tp": 2}, k, exact=False,
                         kernels={"drafter": "triton_v6"}, **RUN)
    v7 = run_distributed(_tp_draft, 2, {"tp": 2}, k, exact=False,
                         kernels={"drafter": "triton_v7"}, **RUN)
    for how in ("replicated", "tp"):
        (lp6, ids6), (lp7, ids7) = v6[how], v7[how]
        assert torch.equal(ids7, ids6)
        torch.testing.assert_close(lp7, lp6, rtol=1e-6, atol=1e-5)


@pytest.mark.skipif(ACC != torch.float64, reason="fp32 accumulation: the engine's all-reduced "
                    "partials round differently from the whole sums")
def test_tp_drafter_engine_layout_on_the_float64_reference():
    # the engine layout (partial o_proj / down sums all-reduced) with float64 accumulation
    # rounds like the whole sums: the same drafts on the CPU proof path
    _, ar, dd = _ref()
    res = _tp_decode(4, tp=4, exact=False)
    assert res.tokens == ar.tokens and res.accepted == dd.accepted


@pytest.mark.parametrize("exact", [False, True], ids=["engine", "exact"])
def test_shards_reassemble_the_drafter(exact):
    full = build_drafter(CFG, seed=3)
    world, c = 8, full.cfg
    shards = [shard_drafter(full, Layout.make(world, r, ep=8, exact=exact)) for r in range(world)]
    d, G = c.head_dim, c.num_heads // c.num_kv_heads
    for li, layer in enumerate(full.layers):
        a = layer.self_attn
        q = torch.cat([s.layers[li].self_attn.q_proj.weight for s in shards])
        assert torch.equal(q, a.q_proj.weight)
        for r, s in enumerate(shards):  # one q head a rank; its KV head is the one it reads
            (q0, _), (k0, k1) = drafter_heads(c, Layout.make(world, r, ep=8, exact=exact))
            assert (k0, k1) == (q0 // G, q0 // G + 1) and s.cfg.num_kv_heads == 1
            assert torch.equal(s.layers[li].self_attn.k_proj.weight,
                               a.k_proj.weight[k0 * d:k1 * d])
        o = [s.layers[li].self_attn.o_proj.weight for s in shards]
        down = [s.layers[li].mlp.down_proj.weight for s in shards]
        cat = 0 if exact else 1  # exact: output rows; engine: input columns
        assert torch.equal(torch.cat(o, cat), a.o_proj.weight)
        assert torch.equal(torch.cat(down, cat), layer.mlp.down_proj.weight)
        for name in ("gate_proj", "up_proj"):
            assert torch.equal(torch.cat([getattr(s.layers[li].mlp, name).weight
                                          for s in shards]),
                               getattr(layer.mlp, name).weight)
    # the context projection by output rows (gathered whole in materialize); norms replicated
    assert torch.equal(torch.cat([s.fc.weight for s in shards]), full.fc.weight)
    for s in shards:
        assert torch.equal(s.hidden_norm.weight, full.hidden_norm.weight)
        assert s.fc_gather is None  # joined to a comm by TPDistDrafter, not by the shard
        assert s.cfg.num_heads == 1 and s.cfg.intermediate_size == c.intermediate_size // 8


def test_a_kimi_rank_reads_an_eighth_of_the_drafters_layers():
    # K2.6's drafter (64 q / 8 KV heads, width 18432) on 8 ranks, shapes only (meta tensors):
    # a rank's layers and fc are 1/8 of the drafter's (~0.79 of ~6.3 GB; 77 of 617 MB)
    from workbench.reference.drafter import empty_drafter

    full = empty_drafter(workbench.ModelConfig.preset("kimi-k2.6").drafter, "meta")
    shard = shard_drafter(full, Layout.make(8, 0, ep=8))
    size = lambda m, pre: sum(p.numel() * p.element_size()  # noqa: E731
                              for n, p in m.named_parameters() if n.startswith(pre))
    assert size(shard, "layers.") * 8 == pytest.approx(size(full, "layers."), rel=1e-3)  # norms
    assert size(shard, "fc.") * 8 == size(full, "fc.") > 0.6e9
    assert size(full, "layers.") > 6e9


def test_layouts_the_tp_drafter_cannot_split_are_refused_by_name():
    tiny = workbench.ModelConfig.preset("tiny").drafter  # 4 q heads, 2 KV heads
    with pytest.raises(LayoutError, match="drafter.num_heads=4 is not a multiple of 8"):
        drafter_heads(tiny, Layout.make(8, 0, ep=8))
    odd = tiny.__class__(**{**tiny.__dict__, "num_heads": 12, "num_kv_heads": 3})
    with pytest.raises(LayoutError, match="drafter.num_kv_heads=3: expected a multiple or a "
                       "divisor of the 4 ranks"):
        drafter_heads(odd, Layout.make(4, 0, ep=4))
    with pytest.raises(ValueError, match="drafter_layout: expected one of .*'sharded'"):
        dist_generate(0, 1, CFG, [[5, 6]], max_new_tokens=2, budget=4, drafter="dflash",
                      drafter_layout="sharded")


def test_drafter_layouts_are_checked_in_one_place():
    from workbench.dist.drafter import check_drafter_layouts

    assert check_drafter_layouts("tp") == ("tp",)
    assert check_drafter_layouts(("replicated", "tp"), several=True) == ("replicated", "tp")
    assert check_drafter_layouts("replicated", several=True) == ("replicated",)
    with pytest.raises(ValueError, match=r"expected one of \('replicated', 'tp'\), got "
                                         r"\('replicated', 'tp'\)"):
        check_drafter_layouts(("replicated", "tp"))  # the loop runs one layout
    with pytest.raises(ValueError, match=r"or a tuple of them, got \(\)"):
        check_drafter_layouts((), several=True)
    with pytest.raises(ValueError, match=r"got \('tp', 8\)"):
        check_drafter_layouts(("tp", 8), several=True)


def test_tp_block_body_is_the_kernels_or_an_error_never_the_reference_in_disguise():
    assert tp_block_body(exact=True) is None and tp_block_body(exact=False) is None  # reference
    from workbench.kernels.drafter import triton_v2, triton_v3, triton_v4

    for name, mod in (("triton_v2", triton_v2), ("triton_v3", triton_v3), ("triton_v4", triton_v4)):
        with ops.use(drafter=name):
            assert tp_block_body(exact=False) is mod.block_hidden
            with pytest.raises(ValueError, match="exact layout runs the reference body"):
                tp_block_body(exact=True)
    with ops.use(drafter="triton_v1"):  # v1 adds its projections in place: no reduce hook
        with pytest.raises(ValueError, match="needs a block body taking reduce= for variant "
                           "'triton_v1'"):
            tp_block_body(exact=False)


@pytest.mark.parametrize("version", ["triton_v2", "triton_v4"])
def test_kernel_body_reduces_each_row_parallel_projection(version):
    # the triton_v2 / v4 body calls `reduce` on every o_proj and down_proj output before it
    # joins the residual; an identity reduce leaves the bits of the plain call
    import importlib

    block_hidden = importlib.import_module(f"workbench.kernels.drafter.{version}").block_hidden

    target = workbench.build_model(CFG, seed=SEED)
    dr = build_drafter(CFG, seed=SEED)
    cache = dr.new_cache(2, 16)
    hidden = torch.randn(2, 6, dr.fc.weight.shape[1]).bfloat16()
    dr.materialize(cache, hidden, torch.arange(6).expand(2, 6), torch.tensor([6, 4]))
    bonus, start = torch.tensor([7, 9]), torch.tensor([6, 4])
    seen = []

    def identity(r):
        seen.append(tuple(r.shape))
        return r

    plain = block_hidden(dr, target, cache, bonus, start)
    hooked = block_hidden(dr, target, cache, bonus, start, reduce=identity)
    assert torch.equal(plain, hooked)
    assert seen == [(2 * CFG.drafter.block_size, CFG.hidden_size)] * (2 * CFG.drafter.num_layers)


def test_emulation_prices_the_tp_drafters_collectives():
    # a DDTree step's draft adds two all-reduces a drafter layer to the replicated drafter's
    # two vocab-parallel all-gathers, its commit one all-gather of fc's output columns, and a
    # rank's draft floor reads ~1/8 of the layers, its commit floor ~1/8 of fc
    from workbench.dist.emulate import emulate

    rows = emulate("tiny-dist", ("ep8",), batches=(1,), budgets=(None, 8), tau=2.5, ctx=32,
                   device="cpu", repeats=1, progress=None, drafter_layout=("replicated", "tp"))
    # AR once (no draft), DDTree once a drafter layout, each priced over both links
    assert [(r["mode"], r["drafter_layout"]) for r in rows[::2]] == [
        ("AR", ""), ("DDTree-8", "replicated"), ("DDTree-8", "tp")]
    rep, tp = rows[2], rows[4]
    assert tp["collectives"] == rep["collectives"] + 2 * CFG.drafter.num_layers + 1
    assert tp["draft_floor_ms"] < rep["draft_floor_ms"]
    assert tp["commit_floor_ms"] < rep["commit_floor_ms"]
    with pytest.raises(ValueError, match="drafter_layout: expected one of"):
        emulate("tiny-dist", ("ep8",), batches=(1,), budgets=(8,), device="cpu", repeats=1,
                progress=None, drafter_layout="sharded")


def test_tp_kernel_body_drafts_what_the_replicated_kernel_drafts():
    # the engine layout on triton_v2's body: each rank's partial o_proj / down sums, bf16,
    # all-reduced through `reduce`. Against the float64 single-process draft it errs no more
    # than the replicated triton_v2 draft does (bf16 partials round once more; a missing or
    # doubled reduce would be off by whole logits), and the clear winners are the same
    from workbench.reference.drafter import draft_topk

    out = run_distributed(_tp_draft, 2, {"tp": 2}, 8, exact=False,
                          kernels={"drafter": "triton_v2"}, **RUN)
    (rlp, _), (tlp, tids) = out["replicated"], out["tp"]
    dr, target = build_drafter(CFG, seed=SEED), workbench.build_model(CFG, seed=SEED)
    hidden, pos, count, bonus, start = _draft_inputs()
    cache = dr.new_cache(3, 16)
    dr.materialize(cache, hidden, pos, count)
    lp, ids = draft_topk(dr, target, cache, bonus, start, 8)
    err_tp, err_rep = ((x - lp).abs().max().item() for x in (tlp, rlp))
    assert err_tp <= 1.5 * err_rep + 0.02, (err_tp, err_rep)  # session 41: 0.27 vs 0.28
    clear = (lp[..., 0] - lp[..., 1]) > 0.5  # [B, L]: a top-1 no rounding can flip
    assert clear.any() and torch.equal(tids[..., 0][clear], ids[..., 0][clear])


def _tp_context(rank, world, kernels):
    """Every rank's drafter cache after materialising _draft_inputs' context on its TP shard,
    gathered along the KV heads (world = KV heads: one a rank)."""
    from workbench.dist.comm import TorchComm
    from workbench.dist.drafter import make_dist_drafter
    from workbench.dist.model import build_dist_model

    comm = TorchComm()
    target = build_dist_model(CFG, Layout.make(world, rank, tp=world), comm, seed=SEED)
    dr = make_dist_drafter(build_drafter(CFG, seed=SEED), target, "tp")
    hidden, pos, count, _, _ = _draft_inputs()
    cache = dr.new_cache(3, 16)
    with ops.use(kernels):
        dr.materialize(cache, hidden, pos, count)
    return comm.all_gather_cat(cache.k, -2), comm.all_gather_cat(cache.v, -2)


@pytest.mark.parametrize("kernels", [{}, {"drafter_materialize": "triton_v1"}],
                         ids=["reference", "triton_v1"])
def test_tp_context_is_the_single_process_context(kernels):
    # fc split by output rows, its columns all-gathered before the hidden norm: the ranks'
    # caches hold the single process's context K/V bit for bit (whole dot products; the CPU
    # GEMM's order along F does not depend on the output width), and rows past count stay
    # unwritten (NaN)
    full = build_drafter(CFG, seed=SEED)
    hidden, pos, count, _, _ = _draft_inputs()
    want = full.new_cache(3, 16)
    with ops.use(kernels):
        full.materialize(want, hidden, pos, count)
    k, v = run_distributed(_tp_context, CFG.drafter.num_kv_heads, kernels, **RUN)
    assert want.k[:, 1, 4:].isnan().all() and not want.k[:, 1, :4].isnan().any()
    torch.testing.assert_close(k, want.k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v, want.v, rtol=0, atol=0, equal_nan=True)


def test_cli_drafter_layout_without_ranks_is_an_error():
    # one process has nothing to split the drafter over: say so, never ignore the flag
    from workbench.__main__ import main

    with pytest.raises(SystemExit, match="--drafter-layout tp: splits the drafter over ranks"):
        main(["generate", "--preset", "tiny", "--budget", "4", "--drafter-layout", "tp"])
