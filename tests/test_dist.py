"""The decode loop on several ranks (workbench.dist) equals the single-process loop.

CPU only: gloo, fork start (0.3 s for 8 ranks), one thread per rank. The default `exact`
reductions keep every dot product whole, so the 2/4/8-rank loops are expected token-exact with
generate() on one process; check_tokens would accept a divergence only on a reference tie
(top-2 margin < TIE_MARGIN) and names position and margin otherwise. The engine layout (fp32
all-reduce) is tested separately, for what it promises: reduction-order noise.
Failure handling: a rank that raises, dies, or hangs in a collective ends all ranks with an
error naming the rank; nothing waits forever.
"""

import functools
import json
import os
import subprocess
import sys
import time
from argparse import Namespace

import pytest
import torch
import torch.distributed as dist

import workbench
from workbench import ops
from workbench.dist.check import TIE_MARGIN, check_tokens, reference_margins
from workbench.dist.comm import TorchComm
from workbench.dist.decode import dist_config, dist_generate, generate_main_distributed
from workbench.dist.launch import DistributedError, DistributedTimeout, run_distributed
from workbench.dist.layout import Layout, LayoutError, latent_cache_bytes, shard_tensor
from workbench.dist.model import build_dist_model
from workbench.dist.moe import ACC
from workbench.dist.vocab import dist_argmax, dist_sample, dist_topk_logprobs, stable_topk
from workbench.generate import generate
from workbench.reference.drafter import build_drafter
from workbench.reference.tree_build import topk_logprobs
from workbench.reference.tree_mla import causal_anc_bits
from workbench.replay import ReplayDrafter

CFG = dist_config("tiny-dist")  # tiny with 8 heads and expert width 256: every layout divides
LENGTHS = (3, 19, 8)  # mixed prompt lengths: the 19 pads the others' prefill rows
MAX_NEW, BUDGET, SEED = 16, 8, 0
RUN = {"timeout_s": 120, "collective_timeout_s": 60}


@functools.cache
def _ref():
    """Single-process target, prompts, AR / replay-DDTree / DFlash-DDTree results, margins."""
    g = torch.Generator().manual_seed(1000)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in LENGTHS]
    target = workbench.build_model(CFG, seed=SEED)
    ar = generate(target, prompts=prompts, max_new_tokens=MAX_NEW)
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    replay = generate(target, ReplayDrafter(CFG, seqs, hit_prob=0.8, seed=SEED), prompts,
                      max_new_tokens=MAX_NEW, budget=BUDGET)
    dflash = generate(target, build_drafter(CFG, seed=SEED), prompts, max_new_tokens=MAX_NEW,
                      budget=BUDGET)
    assert replay.tokens == dflash.tokens == ar.tokens and max(replay.accepted) >= 2
    return {"target": target, "prompts": prompts, "seqs": seqs, "ar": ar, "replay": replay,
            "dflash": dflash, "margins": reference_margins(target, prompts, ar.tokens)}


def _decode(world, mode, **kw):
    ref = _ref()
    extra = {} if mode == "ar" else {"budget": BUDGET, "drafter": mode, "replay": ref["seqs"],
                                     "replay_seed": SEED}
    return run_distributed(dist_generate, world, CFG, ref["prompts"], max_new_tokens=MAX_NEW,
                           seed=SEED, **extra, **kw, **RUN)


def _check_against_reference(out, mode):
    ref, res = _ref(), out["result"]
    ties = check_tokens(ref["ar"].tokens, res.tokens, ref["margins"])  # raises on a real one
    if ties:
        pytest.skip(f"divergence on a reference tie (margin < {TIE_MARGIN}): {ties}")
    assert res.tokens == ref["ar"].tokens
    # identical logits -> identical trees and walks: the same accepted lengths step by step
    assert res.accepted == ref[mode].accepted
    assert {r["layout"] for r in out["ranks"]} == {out["layout"]}


LAYOUTS = {2: [{"tp": 2}, {"ep": 2}], 4: [{"tp": 4}, {"ep": 4}, {"ep": 2, "tp": 2}],
           8: [{"tp": 8}, {"ep": 8}, {"ep": 4, "tp": 2}]}
FAST = {(2, "tp2", "ar"), (2, "ep2", "replay"), (4, "tp4", "replay"), (4, "ep4", "dflash"),
        (8, "ep8", "replay"), (8, "tp8", "ar"), (8, "ep4tp2", "dflash")}


def _cases():
    for world, layouts in LAYOUTS.items():
        for lay in layouts:
            name = "".join(f"{k}{v}" for k, v in sorted(lay.items(), key=lambda kv: kv[0] != "ep"))
            for mode in ("ar", "replay", "dflash"):
                marks = () if (world, name, mode) in FAST else (pytest.mark.slow,)
                yield pytest.param(world, lay, mode, marks=marks, id=f"{world}-{name}-{mode}")


@pytest.mark.parametrize("world,layout,mode", list(_cases()))
def test_distributed_loop_equals_single_process(world, layout, mode):
    _check_against_reference(_decode(world, mode, **layout), mode)


@pytest.mark.skipif(ACC != torch.float64, reason="the reference accumulates in fp32: engine "
                    "all-reduces then differ by rounding (see the sublayer test below)")
@pytest.mark.parametrize("world,layout,mode", [(4, {"tp": 4}, "ar"),
                                               (8, {"ep": 4, "tp": 2}, "replay")])
def test_engine_layout_loop_is_token_exact_on_the_float64_reference(world, layout, mode):
    """With float64 accumulation a K-split sum rounds to bf16 like the whole one, so the layout
    GPUs run (fp32/ACC all-reduce, no exact mode) is token-exact too."""
    _check_against_reference(_decode(world, mode, exact=False, **layout), mode)


@functools.cache
def _ref_cuda():
    """_ref's single-process loop on cuda:0: the synthetic weights are drawn on the device
    they live on (a CUDA generator's stream is not the CPU's), so GPU ranks compare with a GPU
    single process (float64 reference ops on both)."""
    prompts = _ref()["prompts"]
    target = workbench.build_model(CFG, seed=SEED, device="cuda")
    ar = generate(target, prompts=prompts, max_new_tokens=MAX_NEW)
    dflash = generate(target, build_drafter(CFG, seed=SEED, device="cuda"), prompts,
                      max_new_tokens=MAX_NEW, budget=BUDGET)
    return {"prompts": prompts, "ar": ar, "dflash": dflash,
            "margins": reference_margins(target, prompts, ar.tokens)}


@pytest.mark.gpu
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "engine"])
@pytest.mark.parametrize("layout", [{"ep": 2}, {"tp": 2}], ids=["ep2", "tp2"])
@pytest.mark.parametrize("mode", ["ar", "dflash", "dflash-tp"])
def test_nccl_ranks_on_gpus_equal_the_single_process_loop(mode, layout, exact):
    """The same decode on 2 GPUs over real NCCL (nvidia-h200-x2 or larger; NVLink multicast
    off): tokens equal to the single-process loop's on one GPU, up to reference ties, and the
    same accepted lengths. exact=False is the layout a serving engine runs (ACC all-reduces).
    dflash-tp: the drafter split over the two GPUs (workbench/dist/drafter.py)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    ref = _ref_cuda()
    extra = {} if mode == "ar" else {"budget": BUDGET, "drafter": "dflash",
                                     "drafter_layout": "tp" if mode == "dflash-tp" else
                                     "replicated"}
    out = run_distributed(dist_generate, 2, CFG, ref["prompts"], max_new_tokens=MAX_NEW,
                          seed=SEED, exact=exact, backend="nccl", **layout, **extra, **RUN)
    assert all(r["layout"].startswith(f"{next(iter(layout)).upper()}2") for r in out["ranks"])
    print(f"NCCL {out['layout']} {mode}: decode {out['ranks'][0]['decode_s']:.2f} s, "
          f"{out['ranks'][0]['steps']} steps")
    res = out["result"]
    ties = check_tokens(ref["ar"].tokens, res.tokens, ref["margins"])  # raises on a real one
    if ties:
        pytest.skip(f"divergence on a reference tie (margin < {TIE_MARGIN}): {ties}")
    assert res.tokens == ref["ar"].tokens
    assert mode == "ar" or res.accepted == ref["dflash"].accepted


def test_sampled_decoding_stays_in_lockstep_and_equals_single_process():
    """T > 0: every rank draws from the same all-gathered logits with the same seeded
    generator, so the ranks agree (dist_generate checks) and match one process draw for draw."""
    ref = _ref()
    want = generate(ref["target"], prompts=ref["prompts"], max_new_tokens=MAX_NEW,
                    temperature=1.0, seed=7)
    out = run_distributed(dist_generate, 2, CFG, ref["prompts"], ep=2, max_new_tokens=MAX_NEW,
                          temperature=1.0, seed=SEED, sample_seed=7, **RUN)
    assert out["result"].tokens == want.tokens


def test_world_one_runs_without_a_process_group():
    out = dist_generate(0, 1, CFG, _ref()["prompts"], max_new_tokens=MAX_NEW, budget=None)
    assert out["result"].tokens == _ref()["ar"].tokens and out["layout"] == "single exact"


def test_replicated_latent_cache_is_measured_on_every_rank():
    out = _decode(4, "replay", ep=4)
    B, per_rank = len(LENGTHS), out["cache_bytes_per_rank"]
    slots = max(LENGTHS) + MAX_NEW + BUDGET + 2  # what generate() allocates
    assert per_rank == latent_cache_bytes(CFG, B, slots) == CFG.num_layers * B * slots * 40 * 2
    assert all(r["cache_bytes"] == per_rank for r in out["ranks"])  # replicated, not split
    # Kimi K2.6: 61 layers x 576 values x 2 B = 70,272 B per token on EVERY rank
    assert latent_cache_bytes(workbench.ModelConfig.preset("kimi-k2.6"), 1, 1) == 70272


# -- engine layout: fp32 all-reduce (what GPUs run and emulate.py times) ------------------------
def _engine_layer(rank, world, layout):
    """One attention and one MoE sublayer of the engine layout vs the reference, SAME input."""
    ref = workbench.build_model(CFG, seed=SEED)
    m = build_dist_model(CFG, Layout.make(world, rank, exact=False, **layout), TorchComm())
    g = torch.Generator().manual_seed(5)
    B, n = 3, 9
    x = torch.randn(B, n, CFG.hidden_size, generator=g).to(torch.bfloat16)
    pos, P = torch.arange(n).expand(B, n), torch.zeros(B, dtype=torch.long)
    anc = causal_anc_bits(n, B)
    r_layer, d_layer = ref.model.layers["1"], m.model.layers["1"]
    want_a = r_layer.self_attn(x, pos, ref.new_cache(B, n)[1], P, anc, ref.rope)
    got_a = m._attention(d_layer.self_attn, x, pos, m.new_cache(B, n)[1], P, anc)
    return want_a, got_a, r_layer.mlp(x), m._moe(d_layer.mlp, x, None)


@pytest.mark.parametrize("world,layout", [(2, {"tp": 2}), (4, {"ep": 4}), (8, {"ep": 4, "tp": 2})])
def test_engine_layout_sublayers_equal_reference_up_to_one_rounding(world, layout):
    """The engine layout sums K-split partials (in the reference's ACC dtype) across ranks: a
    sublayer's output may differ from the single-process op by one bf16 rounding of its result
    (2^-8 relative), never more. With an fp32 ACC such flips are common, and over a whole model
    one can tip a router near-tie into another expert: the loop tests use exact reductions."""
    want_a, got_a, want_m, got_m = run_distributed(_engine_layer, world, layout, **RUN)
    for want, got in ((want_a, got_a), (want_m, got_m)):
        ulp = want.float().abs().clamp_min(2.0**-20) * 2.0**-7  # one bf16 step, both sides
        assert bool(((got.float() - want.float()).abs() <= ulp).all())
        assert (got != want).float().mean() < 0.05  # flips are rare


def _engine_layer_bf16(rank, world, layout, dispatch="all_to_all"):
    from workbench.dist.moe import ep_dispatch, op_activations

    with op_activations(torch.bfloat16), ep_dispatch(dispatch):  # the full-size emulation's
        return _engine_layer(rank, world, layout)


@pytest.mark.parametrize("dispatch", ["all_to_all", "local"])
@pytest.mark.parametrize("world,layout", [(4, {"ep": 4}), (8, {"ep": 4, "tp": 2})])
def test_engine_bf16_sublayers_stay_close_to_the_reference(world, layout, dispatch):
    """bf16 partials (the emulated engine): stacked q_a | kv_a and gate | up GEMMs, the routed
    output folded into the shared expert's all-reduce (all_to_all: the owner's slice; local:
    every rank's own experts on all tokens, -1 slots elsewhere). Rounding order differs from
    the reference (bf16 partials, summed in bf16): close, not equal; a misplaced slice, a
    dropped branch or an expert counted on two ranks would be off by the outputs' own size."""
    want_a, got_a, want_m, got_m = run_distributed(_engine_layer_bf16, world, layout, dispatch,
                                                   **RUN)
    for want, got in ((want_a, got_a), (want_m, got_m)):
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        err = (got.float() - want.float()).abs().max()
        assert err <= 0.03 * want.float().abs().max(), float(err)


# -- vocab-parallel heads ---------------------------------------------------------------------
def _vocab_ops(rank, world, logits):
    V = logits.shape[-1]
    v0, v1 = rank * V // world, (rank + 1) * V // world
    comm = TorchComm()
    g = torch.Generator().manual_seed(100 + rank)  # per-rank Gumbel noise
    flat = logits[0, 0].expand(20000, V)  # many draws of one row
    from workbench.kernels.drafter._head_v7 import dist_head
    from workbench.kernels.drafter._shard_topk import shard_topk

    return (dist_argmax(logits[..., v0:v1], v0, comm),
            dist_topk_logprobs(logits[..., v0:v1], v0, 5, comm),
            dist_topk_logprobs(logits[..., v0:v1], v0, 100, comm),  # k > V/world and > V
            dist_sample(flat[:, v0:v1], v0, 1.0, g, comm),
            dist_topk_logprobs(logits[..., v0:v1], v0, 5, comm, shard_topk),  # the kernel's
            dist_head(logits[..., v0:v1], v0, 5, comm),  # triton_v7's whole head
            dist_head(logits[..., v0:v1], v0, 8, comm))  # k = V / world: 4 ranks' candidates


def test_distributed_drafter_head_takes_the_selected_variants_shard_topk():
    """The vocab-parallel head's top-k: the `drafter` variant's kernel where it names one
    (kernels/drafter HEAD_TOPK), stable_topk (None) elsewhere; a variant's whole head where it
    names one (HEAD)."""
    from workbench.dist.vocab import head_kernel, head_topk
    from workbench.kernels.drafter._head_v7 import dist_head
    from workbench.kernels.drafter._shard_topk import shard_topk

    assert head_topk() is None and head_kernel() is None  # the reference
    with ops.use(drafter="triton_v5"):
        assert head_topk() is None and head_kernel() is None
    with ops.use(drafter="triton_v6"):
        assert head_topk() is shard_topk and head_kernel() is None
    with ops.use(drafter="triton_v7"):  # the whole head, collectives included
        assert head_kernel() is dist_head


def test_distributed_drafter_runs_the_selected_variants_body(monkeypatch):
    """DistDrafter puts its vocab-parallel head on the `drafter` variant's block body; a
    variant without one is an error, never a silent switch to the reference body."""
    from workbench.dist.vocab import block_body
    from workbench.kernels import drafter as kd

    assert block_body() is None  # reference: DFlashDrafter.forward_block
    with ops.use(drafter="triton_v1"):
        assert block_body().__name__ == "block_hidden"
        monkeypatch.setattr(kd, "BLOCK_HIDDEN", {})
        with pytest.raises(ValueError, match="drafter: .*'triton_v1'.*expected one of"):
            block_body()


def test_vocab_parallel_argmax_topk_and_sampling_use_global_ids():
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 3, 32, generator=g) * 2).to(torch.bfloat16).float()
    logits[0, 1, 5] = logits[0, 1, 29] = 50.0  # a tie across shards: the lower id wins
    logits[1, 2, 9] = logits[1, 2, 10] = 40.0  # a tie inside one shard
    logits[1, 0, 16:24] = 30.0  # a whole shard tied at the top
    am, (lp, ids), (lp_all, ids_all), samples, (lp_k, ids_k), (lp7, ids7), (lp8, ids8) = (
        run_distributed(_vocab_ops, 4, logits, **RUN))
    assert torch.equal(am, logits.argmax(-1))
    # a drafter version's shard top-k (kernels/drafter HEAD_TOPK) changes no bit
    assert torch.equal(ids_k, ids) and torch.equal(lp_k.view(torch.int32), lp.view(torch.int32))
    # triton_v7's head (its log-softmax constants in Triton): the same ids, ulps apart
    assert torch.equal(ids7, ids)
    torch.testing.assert_close(lp7, lp, rtol=1e-6, atol=1e-5)
    rv8, ri8 = topk_logprobs(logits, 8)
    assert torch.equal(ids8, ri8)
    torch.testing.assert_close(lp8, rv8, rtol=1e-6, atol=1e-5)
    for k, (v, i) in ((5, (lp, ids)), (100, (lp_all, ids_all))):
        rv, ri = topk_logprobs(logits, k)
        assert torch.equal(i, ri), (i, ri)  # global ids, ties in id order
        torch.testing.assert_close(v, rv, atol=1e-6, rtol=0)
    p = torch.softmax(logits[0, 0].double(), -1)  # Gumbel-max draws follow softmax
    counts = torch.bincount(samples, minlength=32).double()
    keep = p * 20000 >= 5
    chi2 = float(((counts[keep] - 20000 * p[keep]) ** 2 / (20000 * p[keep])).sum())
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, chi2


@pytest.mark.parametrize("n,k", [(1, 1), (37, 1), (37, 8), (37, 37), (2048, 16)])
def test_stable_topk_is_the_stable_sorts_first_k(n, k):
    """Bit for bit the first k of torch.sort(stable, descending), values and indices, on rows
    full of ties (a few distinct values), -inf, both signs of zero, negatives and positives."""
    g = torch.Generator().manual_seed(n * 100 + k)
    x = torch.randint(-3, 3, (3, 4, n), generator=g).float() * 0.5  # many exact ties
    x[0] = torch.randn(4, n, generator=g)  # no ties
    x[1, 0, ::3] = -torch.inf
    x[1, 1, ::2] = -0.0  # ranks as +0.0 (equal to it), lower index first
    x[1, 2] = -torch.inf  # a whole row of -inf
    x[2, 3] = torch.linspace(-1e30, 1e30, n)  # extremes
    for row in (x, x[..., : max(k, n // 2)]):
        kk = min(k, row.shape[-1])
        vals, idx = torch.sort(row, dim=-1, descending=True, stable=True)
        got_v, got_i = stable_topk(row, kk)
        assert torch.equal(got_i, idx[..., :kk])
        assert torch.equal(got_v, vals[..., :kk])
        assert got_i.dtype == torch.int64 and got_v.dtype == torch.float32


# -- layouts and shards -----------------------------------------------------------------------
def test_layout_errors_name_the_field_and_the_fix():
    tiny = workbench.ModelConfig.preset("tiny")  # 4 heads, expert width 32
    with pytest.raises(LayoutError, match="moe_intermediate=32 .* INT4 groups of 32"):
        Layout.make(2, tp=2).check(tiny)  # 16-wide down_proj slices would split a group
    with pytest.raises(LayoutError, match="num_heads=4 is not a multiple of 8"):
        Layout.make(8, ep=8).check(tiny)
    with pytest.raises(LayoutError, match="tp \\* ep == world size 8"):
        Layout.make(8, tp=2, ep=2)
    Layout.make(2, ep=2).check(tiny)  # EP keeps experts whole: fine
    Layout.make(2, tp=2, exact=True).check(tiny)  # exact MoE-TP splits down by D rows: fine


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("world,layout", [(4, {"tp": 4}), (8, {"ep": 8}), (8, {"ep": 4, "tp": 2})])
def test_shards_cover_every_weight_exactly_once(world, layout, exact):
    """Filled with distinct values, the ranks' shards of a split tensor hold each value once;
    a replicated tensor is held whole by every rank."""
    from workbench.weights import layer_state

    for name, t in layer_state(CFG, 1, 0).items():
        full = torch.arange(t.numel(), dtype=torch.float64).view(t.shape)
        shards = [shard_tensor(name, full, CFG, Layout.make(world, r, exact=exact, **layout))
                  for r in range(world)]
        held = torch.cat([s.flatten() for s in shards]).sort().values
        if held.numel() == t.numel():
            assert torch.equal(held, full.flatten()), name
        else:  # replicated: q_a / kv_a, norms, router
            assert all(torch.equal(s, full) for s in shards), name


def _ckpt_logits(rank, world, path):
    m = build_dist_model(None, Layout.make(world, rank, ep=world, exact=True), TorchComm(),
                         checkpoint=path)
    ids = torch.tensor([[5, 6, 7, 8]])
    return m(ids, torch.arange(4).view(1, -1), m.new_cache(1, 4), torch.zeros(1, dtype=torch.long),
             causal_anc_bits(4)).logits


def test_shards_load_from_a_checkpoint_one_layer_at_a_time(tmp_path):
    from workbench.checkpoint import write_synthetic_checkpoint

    write_synthetic_checkpoint(CFG, tmp_path, seed=SEED)
    got = run_distributed(_ckpt_logits, 2, str(tmp_path), **RUN)
    ref = _ref()["target"]
    want = ref(torch.tensor([[5, 6, 7, 8]]), torch.arange(4).view(1, -1), ref.new_cache(1, 4),
               torch.zeros(1, dtype=torch.long), causal_anc_bits(4)).logits
    assert torch.equal(got, want)


# -- failures end all ranks with a clear error ----------------------------------------------------
def _raise_on(rank, world, bad):
    if rank == bad:
        raise ValueError("boom on purpose")
    dist.all_reduce(torch.ones(1))  # the others wait for the failed rank in a collective
    return rank


def _die_on(rank, world, bad):
    if rank == bad:
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def _skip_collective(rank, world):
    if rank == 1:
        time.sleep(60)  # alive but never joins: rank 0's all_reduce must time out
    dist.all_reduce(torch.ones(1))


def _sleep(rank, world):
    time.sleep(60)


def test_a_rank_that_raises_ends_all_ranks_and_is_named():
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match="rank 2 of 4 failed: ValueError: boom") as e:
        run_distributed(_raise_on, 4, 2, **RUN)
    assert e.value.rank == 2 and "Traceback" in str(e.value)
    assert time.monotonic() - t0 < 15


def test_a_rank_that_dies_is_named_with_its_exit_code():
    with pytest.raises(DistributedError, match="rank 1 of 2 failed: exited with code 3"):
        run_distributed(_die_on, 2, 1, **RUN)


def test_a_silent_death_goes_before_the_peer_error_it_caused(monkeypatch):
    # why: CI (session 6) got "rank 0 failed: ... Connection reset by peer (then rank 1: exited
    # with code 3)": the peer's error landed in the queue between the supervisor's drain and
    # silent_deaths' own drain, and was listed first. Deterministic here: a fake queue that
    # delivers rank 0's error exactly then, rank 1 already dead with code 3
    import workbench.dist.launch as launch

    class Queue:
        _reader, calls, items = None, 0, []

        def empty(self):
            self.calls += 1
            if self.calls == 2:  # between the loop's drain and silent_deaths' drain
                self.items.append(("err", 0, "RuntimeError: Connection reset by peer", "tb0"))
            return not self.items

        def get(self):
            return self.items.pop(0)

    class Proc:
        sentinel = None

        def __init__(self, alive, code):
            self.alive, self.exitcode = alive, code

        def is_alive(self):
            return self.alive

    monkeypatch.setattr(launch, "wait", lambda *a, **k: None)
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    with pytest.raises(DistributedError, match="rank 1 of 2 failed: exited with code 3") as e:
        launch._supervise([Proc(True, None), Proc(False, 3)], Queue(), time.monotonic() + 5, 5)
    assert "then rank 0: RuntimeError: Connection reset" in str(e.value)


def test_a_hung_collective_times_out_with_a_clear_error():
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match="rank 0 of 2 failed") as e:
        run_distributed(_skip_collective, 2, timeout_s=30, collective_timeout_s=2)
    assert "timed out" in str(e.value).lower() or "timeout" in str(e.value).lower()
    assert time.monotonic() - t0 < 20


def test_the_watchdog_ends_ranks_stuck_outside_collectives():
    t0 = time.monotonic()
    with pytest.raises(DistributedTimeout, match=r"ranks \[0, 1\] of 2 still running"):
        run_distributed(_sleep, 2, timeout_s=3)
    assert time.monotonic() - t0 < 15


# -- command line ---------------------------------------------------------------------------------
def _cli_args(**kw):
    ref = _ref()
    base = dict(preset="tiny-dist", checkpoint=None, drafter_checkpoint=None, device="cpu",
                seed=SEED, budget=BUDGET, max_new_tokens=MAX_NEW, prompt_ids=ref["prompts"],
                temperature=0.0, stop_ids=None, kernels=None, json=True, tp=None, ep=2)
    return Namespace(**{**base, **kw})


def test_cli_entry_starts_its_own_ranks(capsys):
    assert generate_main_distributed(_cli_args()) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == _ref()["ar"].tokens and out["layout"] == "EP2 exact"
    assert len(out["ranks"]) == 2


@pytest.mark.slow
def test_torchrun_launch(tmp_path):
    ref = _ref()
    from workbench.dist.launch import _free_port

    # a free port, not torchrun's fixed 29500: pytest-xdist may run another launch meanwhile
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(_free_port()), "-m", "workbench.dist", "--tp", "2", "--max-new-tokens", str(MAX_NEW), "--json"]
    for p in ref["prompts"]:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1  # only rank 0 prints
    assert json.loads(lines[0])["tokens"] == ref["ar"].tokens


# -- single-rank emulation (tiny here; kimi-k2.6 on the H200) -----------------------------------
def test_link_model_formulas():
    from workbench.dist.emulate import NVLINK4, Link

    link = Link("test", bw_gbps=100.0, alpha_us=10.0, efficiency=1.0)
    assert link.seconds("all_reduce", 1e9, 8) == pytest.approx(10e-6 + 2 * 7 / 8 * 1e-2)
    assert link.seconds("all_gather", 1e6, 8) == pytest.approx(10e-6 + 7e6 / 1e11)
    assert link.seconds("all_to_all", 1e6, 8) == pytest.approx(10e-6 + 1e-5)
    assert NVLINK4.seconds("all_reduce", 0, 8) == pytest.approx(NVLINK4.alpha_us * 1e-6)


# a DDTree step's drafter collectives under the emulation's default drafter_layout "tp": two
# all-reduces a drafter layer, the head's two vocab-parallel all-gathers, fc's one all-gather
DRAFT_TP = 2 * CFG.drafter.num_layers + 2 + 1


def test_emulation_ep8_local_dispatch_has_no_all_to_all():
    """ep_dispatch="local": each rank runs its own experts on the replicated stream and the
    routed partials join the shared expert's all-reduce, so a MoE layer costs one collective
    (all_to_all: three), and the rows say which dispatch they timed."""
    from workbench.dist.emulate import emulate

    rows = emulate("tiny-dist", ("ep8",), batches=(2,), budgets=(None, 8), tau=2.5, ctx=32,
                   device="cpu", repeats=1, progress=None, ep_dispatch="local")
    moe_layers = CFG.num_layers - CFG.first_k_dense
    for r in rows:
        assert r["ep_dispatch"] == "local" and r["kernel_ms"] > 0
        want = CFG.num_layers + 1 + moe_layers + 1 + (0 if r["mode"] == "AR" else DRAFT_TP)
        assert r["collectives"] == want, (r["mode"], r["collectives"])
    with pytest.raises(ValueError, match="ep_dispatch: expected one of"):
        emulate("tiny-dist", ("ep8",), batches=(1,), budgets=(None,), device="cpu",
                repeats=1, progress=None, ep_dispatch="deepep")


def test_local_dispatch_is_the_default_and_tells_int4_moe_what_to_expect(monkeypatch):
    """Session 10 measured "local" faster at C 1 / 8 / 32 (it is the default now) once the op
    sizes its tiles for ~T K / ep routed slots instead of all T K: moe_ep_local passes that."""
    import inspect

    from workbench.dist import moe
    from workbench.dist.emulate import emulate
    from workbench.ops.cases import _experts, _Rand
    from workbench.reference.int4_moe import int4_moe
    from workbench.reference.moe_route import local_ids

    assert moe.ep_dispatch_mode() == "local"
    assert inspect.signature(emulate).parameters["ep_dispatch"].default == "local"
    seen = {}

    def recording(x, ids, w, ex, **kw):
        seen.update(kw, routed=int((ids >= 0).sum()))
        return int4_moe(x, ids, w, ex, **kw)

    monkeypatch.setattr(moe.ops, "get", lambda name: recording)
    lay = Layout.make(8, rank=3, ep=8)
    ex = _experts(_Rand(0, "cpu"), 4, 64, 32)  # this rank's 4 of 32 experts
    ids = torch.stack([torch.randperm(32)[:4] for _ in range(5)])  # T 5, K 4
    here = local_ids(ids, (12, 4))  # rank 3's experts 12..15, as the router stores them
    out = moe.moe_ep_local(torch.randn(5, 64).bfloat16(), here, torch.rand(5, 4), ex, lay)
    assert out.shape == (5, 64) and seen["expected_slots"] == -(-5 * 4 // 8)
    assert seen["routed"] == int(((ids >= 12) & (ids < 16)).sum())


def test_emulation_projects_tp8_and_ep8_over_both_links():
    from workbench.dist.emulate import emulate

    rows = emulate("tiny-dist", ("tp8", "ep8"), batches=(1, 4), budgets=(None, 8), tau=2.5,
                   ctx=32, device="cpu", repeats=1, progress=None, ep_dispatch="all_to_all")
    assert len(rows) == 2 * 2 * 2 * 2  # layouts x C x modes x links
    by = {(r["layout"], r["C"], r["mode"], r["link"]): r for r in rows}
    moe_layers = CFG.num_layers - CFG.first_k_dense
    for (lay, C, mode, link), r in by.items():
        assert r["step_ms"] > r["compute_ms"] > 0 and r["tokens_per_s"] > 0
        if link == "NVLink4":  # the same logged bytes priced over a slower link
            assert by[(lay, C, mode, "PCIe5x16")]["comm_ms"] > r["comm_ms"]
        # per forward: one all-reduce per attention and dense layer; MoE-TP one per layer,
        # EP two all-to-alls + one all-reduce (the shared expert's partial with the owner's
        # routed slice folded in: bf16 rows); one logits all-gather. A DDTree step adds the
        # tensor-parallel drafter's (the emulation's default: DRAFT_TP).
        per_moe = 1 if lay == "TP8" else 3
        want = CFG.num_layers + 1 + moe_layers * per_moe + 1 + (0 if mode == "AR" else DRAFT_TP)
        assert r["collectives"] == want, (lay, mode, r["collectives"])
    assert by[("TP8", 1, "DDTree-8", "NVLink4")]["tokens_per_s"] > 0
    for lay in ("TP8", "EP8"):  # 9 verify rows touch more experts and cache than 1
        assert (by[(lay, 4, "DDTree-8", "NVLink4")]["verify_floor_ms"]
                > by[(lay, 4, "AR", "NVLink4")]["verify_floor_ms"])
    for r in rows:  # the kernel-sum (graph-replay) estimate: profiled, named, priced alike
        assert 0 < r["kernel_ms"] and r["top_kernels"]
        assert r["kernel_total_ms"] == pytest.approx(r["kernel_ms"])  # CPU: the sum both ways
        # the rank's roofline: every phase floored, the bar's ratio against it
        phases = ("verify",) if r["mode"] == "AR" else ("verify", "draft", "commit")
        assert r["floor_ms"] == pytest.approx(sum(r[f"{p}_floor_ms"] for p in phases))
        assert all(r[f"{p}_floor_ms"] > 0 for p in phases)
        assert r["x_floor"] == pytest.approx(r["kernel_step_ms"] / r["floor_ms"])
        assert r["floor_tokens_per_s"] > r["kernel_tokens_per_s"]
        assert r["kernel_step_ms"] == pytest.approx(r["kernel_ms"] + r["comm_ms"])
        assert r["kernel_tokens_per_s"] == pytest.approx(
            r["C"] * r["tau"] / (r["kernel_step_ms"] / 1e3))


def test_emulation_of_the_first_layers_only():
    """--layers N: a full-size rank's per-layer work on a card its whole depth does not fit.
    The model really is N layers deep (one all-reduce per attention layer, one per MoE layer,
    the drafter's taps inside it), the floor is the shorter model's, and the rows say N;
    a depth outside the model is refused by name before anything is built."""
    from workbench.config import ConfigError
    from workbench.dist.emulate import NVLINK4, emulate

    kw = dict(batches=(1,), budgets=(None, 8), tau=2.5, ctx=32, device="cpu", repeats=1,
              progress=None, links=(NVLINK4,))
    full = {r["mode"]: r for r in emulate("tiny-dist", ("ep8",), **kw)}
    cut = {r["mode"]: r for r in emulate("tiny-dist", ("ep8",), layers=4, **kw)}
    assert CFG.num_layers == 6 and {r["layers"] for r in full.values()} == {6}
    for mode, r in cut.items():
        assert r["layers"] == 4
        want = 4 + 1 + (4 - CFG.first_k_dense) + 1 + (0 if mode == "AR" else DRAFT_TP)
        assert r["collectives"] == want, (mode, r["collectives"])
        assert 0 < r["verify_floor_ms"] < full[mode]["verify_floor_ms"]
    for bad in (3, 7, 4.0):
        with pytest.raises(ConfigError, match=r"layers: expected an int in \[4, 6\]"):
            emulate("tiny-dist", ("ep8",), layers=bad, **kw)


def test_emulation_floors_price_the_card_given():
    """The floors default to the H200's copy speed and peak (the bar's card); a run on
    another card can price them at its own, and the rows say which. The toy rank's phases are
    bound by bytes, so half the bandwidth doubles every floor."""
    from workbench.dist.emulate import NVLINK4, emulate
    from workbench.loopbench import H200_BF16_TFLOPS, H200_COPY_TBS

    kw = dict(batches=(1,), budgets=(None,), ctx=32, device="cpu", repeats=1, progress=None,
              links=(NVLINK4,))
    (h200,) = emulate("tiny-dist", ("ep8",), **kw)
    (slow,) = emulate("tiny-dist", ("ep8",), bw_tbs=H200_COPY_TBS / 2, tflops=1e6, **kw)
    assert (h200["floor_bw_tbs"], h200["floor_tflops"]) == (H200_COPY_TBS, H200_BF16_TFLOPS)
    assert slow["floor_bw_tbs"] == H200_COPY_TBS / 2
    assert slow["verify_floor_ms"] == pytest.approx(2 * h200["verify_floor_ms"], rel=1e-6)
    for name, bad in (("bw_tbs", 0), ("tflops", -1.0), ("bw_tbs", "4")):
        with pytest.raises(ValueError, match=f"{name}: expected a positive number"):
            emulate("tiny-dist", ("ep8",), **{name: bad}, **kw)


def test_stacked_weight_is_one_buffer_the_parameters_view():
    """Engine path: projections of one input share a GEMM through one [sum O, I] buffer; the
    parameters become views of it (no doubled memory, later in-place loads land in it)."""
    from workbench.dist.model import stacked_weight
    from workbench.reference.model import Linear

    g = torch.Generator().manual_seed(0)
    a, b = Linear(8, 3), Linear(8, 5)
    wa, wb = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)
    a.weight.data.copy_(wa)
    b.weight.data.copy_(wb)
    wa, wb = a.weight.detach().clone(), b.weight.detach().clone()  # in the weights' dtype
    s = stacked_weight(a, b)
    assert s.shape == (8, 8) and torch.equal(s[:3], wa) and torch.equal(s[3:], wb)
    assert a.weight.data_ptr() == s.data_ptr() and b.weight.data_ptr() == s[3:].data_ptr()
    assert stacked_weight(a, b).data_ptr() == s.data_ptr()  # adjacent already: no new buffer
    b.weight.data.copy_(2 * wb)  # a load_shard-style copy into the parameter
    assert torch.equal(stacked_weight(a, b)[3:], 2 * wb)


def test_kernel_classes_group_a_kernel_table():
    import pandas as pd

    from workbench.dist.kernel_classes import by_class, kernel_class

    assert kernel_class("_gemm_kernel") == "int4 MoE GEMMs"
    assert kernel_class("_route_kernel") == "int4 MoE routing"
    assert kernel_class("_attn_kernel") == "attention (tree_mla, drafter)"
    assert kernel_class("nvjet_sm90_tst_64x8_64x16_2x4_h_bz_splitK_TNT") == \
        "dense GEMMs (cuBLAS)"
    assert kernel_class("void cublasLt::splitKreduce_kernel<32, 16, int>") == \
        "dense GEMMs (cuBLAS)"
    assert kernel_class("_ep_plan_kernel") == "our small kernels"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4>").startswith("torch")
    t = pd.DataFrame({"layout": "EP8", "C": 1, "mode": "AR",
                      "kernel": ["_gemm_kernel", "_rmsnorm_kernel", "Memcpy DtoH", "_gemm_kernel"],
                      "calls": [2, 3, 1, 2], "us": [100.0, 6.0, 1.5, 50.0]})
    g = by_class(t)
    assert g.cls.tolist() == ["int4 MoE GEMMs", "our small kernels",
                              "torch glue (copies, casts, cats, gathers, fills, sorts)"]
    assert g.ms.tolist() == [0.15, 0.006, 0.0015] and g.calls.tolist() == [4, 3, 1]


def test_emulation_op_table_charges_the_step_to_registry_ops(tmp_path):
    """--op-table (session 19): one more profiled eager call with every registry op in a range
    of its own; on CPU each op's CPU time, the rows written per configuration, and the main
    table (kernel_ms) untouched by the ranges."""
    import pandas as pd

    from workbench.dist.emulate import main

    csv, ops_csv, glue_csv = tmp_path / "e.csv", tmp_path / "ops.csv", tmp_path / "glue.csv"
    opk_csv = tmp_path / "op_kernels.csv"
    assert main(["--preset", "tiny-dist", "--layouts", "ep8", "--batches", "1",
                 "--budgets", "ar,8", "--ctx", "32", "--repeats", "1", "--device", "cpu",
                 "--csv", str(csv), "--op-table", str(ops_csv),
                 "--glue-table", str(glue_csv), "--op-kernel-table", str(opk_csv)]) == 0
    table, ops_ = pd.read_csv(csv), pd.read_csv(ops_csv)
    assert not {"op_list", "glue_list", "op_kernel_list"} & set(table.columns)
    assert (table.kernel_ms > 0).all()
    glue = pd.read_csv(glue_csv)  # CPU: no kernels, so no rows, but the columns are there
    assert glue.empty and {"layout", "C", "mode", "kernel", "calls", "us"} <= set(glue.columns)
    opk = pd.read_csv(opk_csv)
    assert opk.empty and {"layout", "C", "mode", "op", "kernel", "calls", "us"} <= set(opk.columns)
    assert set(ops_["mode"]) == {"AR", "DDTree-8"} and (ops_.us > 0).all()
    ar = ops_[ops_["mode"] == "AR"].set_index("op")
    # each op's roofline floor beside its time (floors.price_ops, session 59); none for ops
    # no bytes are charged to
    assert (ar.loc[["int4_moe", "linear", "tree_mla", "lm_head"], "floor_us"] > 0).all()
    assert ar.loc["rope", "floor_us"] != ar.loc["rope", "floor_us"]  # NaN
    layers = CFG.num_layers
    assert ar.loc["tree_mla", "calls"] == layers and ar.loc["rope", "calls"] == layers
    assert ar.loc["int4_moe", "calls"] == layers - CFG.first_k_dense
    dd = ops_[ops_["mode"] == "DDTree-8"].set_index("op")
    assert "tree_build" in dd.index
    # the draft's code outside registry ops has rows of its own (loopbench.op_range), once a
    # draft; AR drafts nothing
    from workbench.dist.vocab import DRAFT_BODY, DRAFT_TOPK

    assert dd.loc[DRAFT_BODY, "calls"] >= 1 and dd.loc[DRAFT_TOPK, "calls"] >= 1
    assert not {DRAFT_BODY, DRAFT_TOPK} & set(ar.index)


def test_op_range_is_a_range_only_under_op_ranges():
    import contextlib

    from workbench.loopbench import op_range, op_ranges

    assert isinstance(op_range("x"), contextlib.nullcontext)  # outside: nothing, not timed
    with op_ranges():
        assert not isinstance(op_range("x"), contextlib.nullcontext)
    assert isinstance(op_range("x"), contextlib.nullcontext)


def test_op_kernel_times_charge_each_kernel_to_its_innermost_range():
    """The GPU join of op_kernel_times on synthetic profiler events (no GPU here): a kernel
    inside two nested op ranges goes to the inner one, one outside every range to "(glue)",
    other annotations are neither ranges nor kernels, and ranges are counted as calls."""
    from types import SimpleNamespace as NS

    from workbench.loopbench import op_kernel_times

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, s, e, dev=cuda, ann=False):
        return NS(name=name, device_type=dev, time_range=NS(start=s, end=e),
                  is_user_annotation=ann)

    events = [ev("op::moe", 0, 100, ann=True), ev("op::linear", 10, 30, ann=True),
              ev("gemm", 12, 20), ev("gemm", 21, 29), ev("combine", 40, 50),
              ev("glue_add", 110, 113), ev("moe", 0, 100, ann=True),  # a phase annotation
              ev("op::rope", 200, 205, ann=True), ev("rope_k", 201, 204),
              ev("op::moe", 0, 120, dev=cpu), ev("zero", 130, 130)]
    by_kernel = {}
    per = op_kernel_times(NS(events=lambda: events), cuda=True, by_kernel=by_kernel)
    assert per == {"moe": [1, 10.0], "linear": [1, 16.0], "rope": [1, 3.0],
                   "(glue)": [0, 3.0]}
    # every op's kernels by name ("(glue)"'s: session 57; the ops': session 59)
    assert by_kernel == {"(glue)": {"glue_add": [1, 3.0]}, "linear": {"gemm": [2, 16.0]},
                         "moe": {"combine": [1, 10.0]}, "rope": {"rope_k": [1, 3.0]}}
    cpu_by = {}
    cpu_per = op_kernel_times(NS(events=lambda: events), cuda=False, by_kernel=cpu_by)
    assert cpu_per == {"moe": [1, 120.0]} and cpu_by == {}


def test_op_kernel_times_prefer_a_range_on_the_kernels_own_stream():
    """A side stream's kernel that runs while another op's range is open on the main stream
    goes to the range on its own stream (int4_moe's hot launch beside the shared expert), and
    to any stream's innermost range where its own stream has none holding it."""
    from types import SimpleNamespace as NS

    from workbench.loopbench import op_kernel_times

    cuda = torch.autograd.DeviceType.CUDA

    def ev(name, s, e, stream, ann=False):
        return NS(name=name, device_type=cuda, time_range=NS(start=s, end=e),
                  is_user_annotation=ann, device_resource_id=stream)

    events = [ev("op::int4_moe", 0, 60, 7, ann=True), ev("op::int4_moe", 0, 100, 9, ann=True),
              ev("op::shared", 60, 90, 7, ann=True), ev("cold", 20, 50, 7),
              ev("hot_early", 10, 40, 9), ev("hot", 62, 70, 9),  # beside shared's range
              ev("shared_k", 61, 80, 7), ev("tail", 120, 124, 7),
              ev("op::combine", 200, 210, 7, ann=True), ev("late", 202, 206, 9)]
    per = op_kernel_times(NS(events=lambda: events), cuda=True)
    assert per == {"int4_moe": [2, 30.0 + 30.0 + 8.0], "shared": [1, 19.0],
                   "combine": [1, 4.0], "(glue)": [0, 4.0]}  # late: stream 7's range (none on 9)
    # without stream ids: time alone (the side kernel inside shared's narrower range)
    for e in events:
        e.device_resource_id = None
    per = op_kernel_times(NS(events=lambda: events), cuda=True)
    assert per == {"int4_moe": [2, 30.0 + 30.0], "shared": [1, 19.0 + 8.0],
                   "combine": [1, 4.0], "(glue)": [0, 4.0]}


def _ep8_forward(device, on: bool, kernels=None, fork: str = "before-route"):
    """The EP8 engine path's logits (bf16 rows, local dispatch) of one 3-row verify with the
    side streams (the shared expert beside the routed ones, forked `fork`; the attention's
    cache write and q_pe RoPE beside q's path) `on`, or every op on one stream."""
    from workbench.dist.emulate import rank_model
    from workbench.dist.model import attn_stream, shared_fork, shared_stream
    from workbench.dist.moe import op_activations
    from workbench.reference.tree_mla import causal_anc_bits

    model, _ = rank_model("tiny-dist", "ep8", device=device)
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(2, 40)
    for layer in cache:
        layer[:, :32].copy_(torch.randn(layer[:, :32].shape, generator=g))
    prefix = torch.full((2,), 32, dtype=torch.long, device=device)
    ids = torch.randint(3, model.cfg.vocab_size, (2, 3), generator=g).to(device)
    with ops.use(kernels), op_activations(torch.bfloat16), shared_stream(on), attn_stream(on), \
            shared_fork(fork):
        out = model(ids, prefix[:, None] + torch.arange(3, device=device), cache, prefix,
                    causal_anc_bits(3, 2, device))
    return out.logits


def test_side_streams_change_no_bit():
    """model.shared_stream / attn_stream (session 20): the EP engine path computes the shared
    expert and the router + routed experts as two branches joined by one add, and the
    attention's cache write and q_pe RoPE beside q's path; on a CPU (or with the switches off)
    they run one after the other. The logits are the same bits either way."""
    from workbench.dist.model import _ATTN_STREAM, _SHARED_STREAM, beside

    assert _SHARED_STREAM == [False] and _ATTN_STREAM == [False]  # off unless asked for
    one_stream = _ep8_forward("cpu", False)
    assert torch.equal(_ep8_forward("cpu", True), one_stream)
    assert torch.equal(_ep8_forward("cpu", True, fork="after-route"), one_stream)
    order = []
    assert beside(lambda: order.append("side") or 1, lambda: order.append("main") or 2,
                  torch.device("cpu")) == (1, 2) and order == ["side", "main"]


def test_emulation_graph_flag_is_cuda_only_and_says_how_it_timed(tmp_path):
    """--graph times kernel_ms from a CUDA-graph replay; on a CPU there is none: the rows say
    "eager", graph_replay_ms is NaN and nothing fails; --shared-stream is recorded per row."""
    import pandas as pd

    from workbench.dist.emulate import main

    csv = tmp_path / "e.csv"
    assert main(["--preset", "tiny-dist", "--layouts", "ep8", "--batches", "1",
                 "--budgets", "ar", "--ctx", "32", "--repeats", "1", "--device", "cpu",
                 "--graph", "--shared-stream", "on", "--csv", str(csv)]) == 0
    t = pd.read_csv(csv)
    assert (t.kernel_timing == "eager").all() and t.graph_replay_ms.isna().all()
    assert (t.shared_stream == "on").all() and (t.kernel_ms > 0).all()
    assert (t.attn_stream == "on").all()  # on by default from session 21 (measured faster)
    assert (t.main_priority == -1).all()  # the captured step above its side streams (session 21)
    assert (t.shared_fork == "after-route").all()  # the emulation's default from session 21


def test_shared_fork_rejects_unknown_places():
    from workbench.dist.model import shared_fork

    with pytest.raises(ValueError, match=r"shared_fork: expected one of \('before-route', "
                                         r"'after-route'\), got 'middle'"):
        with shared_fork("middle"):
            pass


def test_emulation_main_priority_is_recorded_and_checked(tmp_path):
    """--main-priority (graph capture on a higher-priority stream than the side streams') is a
    row column; a positive priority (lower than CUDA's lowest, 0) is refused by name."""
    import pandas as pd

    from workbench.dist.emulate import main
    from workbench.dist.model import capture_priority, main_priority

    csv = tmp_path / "e.csv"
    assert main(["--preset", "tiny-dist", "--layouts", "ep8", "--batches", "1",
                 "--budgets", "ar", "--ctx", "32", "--repeats", "1", "--device", "cpu",
                 "--graph", "--main-priority", "0", "--csv", str(csv)]) == 0
    assert (pd.read_csv(csv).main_priority == 0).all()  # not the default (-1): the flag's
    with main_priority(-2):
        assert capture_priority() == -2
    assert capture_priority() == 0
    with pytest.raises(ValueError, match=r"main_priority: expected an int <= 0 \(lower is "
                                         r"higher\), got 1"):
        with main_priority(1):
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("priority", [0, -1])
def test_gpu_graph_replay_captures_the_side_stream_fork_and_join(priority):
    """emulate --graph's capture (`_graph_profiled`) of a step that forks a side stream with
    `beside`: the replay computes what the eager call did (the join orders the add after both
    branches), its profile holds both branches' kernels and the timed replay is > 0; also
    captured on a higher-priority main stream (`main_priority`, the side stream at 0)."""
    from workbench.dist.comm import StepLog
    from workbench.dist.emulate import StandInComm, _graph_profiled
    from workbench.dist.model import beside, main_priority, shared_stream

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a, b, c = (torch.randn(256, 256, generator=g, device=dev) for _ in range(3))
    out = torch.empty(256, 256, device=dev)

    def step():
        with shared_stream(True):
            x, y = beside(lambda: a @ b, lambda: torch.tanh(a @ c), dev)
        out.copy_(x + y)

    step()
    want = out.clone()
    out.fill_(float("nan"))
    with main_priority(priority):
        prof, wall = _graph_profiled(step, StandInComm(0, 8, StepLog(dev)), dev)
    assert torch.equal(out, want) and wall > 0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) >= 4  # two GEMMs, tanh, the add (and the copy)


@pytest.mark.gpu
def test_gpu_side_streams_change_no_bit():
    # why: on the GPU the side streams really fork and join (the cache write and q_pe's RoPE
    # beside q's path, the shared expert beside the routed experts): the logits are the bits
    # of the one-stream schedule (reference ops at tiny-dist widths)
    one_stream = _ep8_forward("cuda", False)
    assert torch.equal(_ep8_forward("cuda", True), one_stream)
    assert torch.equal(_ep8_forward("cuda", True, fork="after-route"), one_stream)
