"""Plain decoding: batching, caching and seeding never change the tokens; bad inputs fail clearly."""

import pytest
import torch

from workbench.generate import PREFILL_CHUNK, generate
from workbench.reference.tree_mla import causal_anc_bits

# three prompts of different lengths; the long one spans two prefill chunks
PROMPTS = [[5, 6, 7], [11 + (i * 7) % 400 for i in range(PREFILL_CHUNK + 9)], list(range(3, 13))]


@pytest.fixture(scope="module")
def greedy64(tiny_target):
    return generate(tiny_target, prompts=PROMPTS, max_new_tokens=64)


def test_batched_equals_each_prompt_alone(tiny_target, greedy64):
    for b, p in enumerate(PROMPTS):
        alone = generate(tiny_target, prompts=[p], max_new_tokens=64)
        assert alone.tokens[0] == greedy64.tokens[b], f"request {b}"
    assert [len(t) for t in greedy64.tokens] == [64] * 3


def test_cached_decode_equals_full_recompute(tiny_target, greedy64):
    """Recompute every position from scratch, no cache reuse: argmax must give the same tokens."""
    for b in (0, 2):  # the short prompts: one forward over prompt + generated (< 128 rows)
        seq = PROMPTS[b] + greedy64.tokens[b]
        n = len(seq) - 1
        cache = tiny_target.new_cache(1, n + 1)
        out = tiny_target(torch.tensor([seq[:n]]), torch.arange(n).view(1, -1), cache,
                          torch.zeros(1, dtype=torch.long), causal_anc_bits(n))
        pred = out.logits[0].argmax(-1)[len(PROMPTS[b]) - 1 :]
        assert pred.tolist() == greedy64.tokens[b]


def test_stats_count_steps_and_experts(tiny_target, greedy64):
    cfg = tiny_target.cfg
    assert len(greedy64.steps) == 63  # the first token comes from the prefill
    assert greedy64.tokens_per_step == 1.0
    moe_layers = cfg.num_layers - cfg.first_k_dense
    for s in greedy64.steps:
        assert len(s["distinct_experts"]) == moe_layers
        # 3 live rows x top-k: between k and 3k distinct experts per layer
        assert all(cfg.n_experts_per_tok <= e <= 3 * cfg.n_experts_per_tok
                   for e in s["distinct_experts"])


def test_stop_tokens_and_per_request_lengths(tiny_target, greedy64):
    stop = greedy64.tokens[0][5]  # a token request 0 emits at step 5
    r = generate(tiny_target, prompts=PROMPTS, max_new_tokens=[64, 3, 10], stop_tokens=[stop])
    first = greedy64.tokens[0].index(stop)
    assert r.tokens[0] == greedy64.tokens[0][: first + 1]  # stop token included, then stop
    for b, n in ((1, 3), (2, 10)):
        cut = greedy64.tokens[b][:n]
        if stop in cut:
            cut = cut[: cut.index(stop) + 1]
        assert r.tokens[b] == cut


def test_temperature_same_seed_same_tokens(tiny_target):
    a = generate(tiny_target, prompts=PROMPTS[:1], max_new_tokens=16, temperature=1.0, seed=3)
    b = generate(tiny_target, prompts=PROMPTS[:1], max_new_tokens=16, temperature=1.0, seed=3)
    c = generate(tiny_target, prompts=PROMPTS[:1], max_new_tokens=16, temperature=1.0, seed=4)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens  # 16 draws from peaked but not one-hot distributions


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompts=[]), "prompts: expected a non-empty list"),
    (dict(prompts=[[1], []]), r"prompts\[1\]: expected at least one token"),
    (dict(prompts=[[1, 99999]]), r"prompts\[0\]: expected token ids in \[0, 512\)"),
    (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens: expected a positive int"),
    (dict(prompts=[[1]], max_new_tokens=[2, 3]), "max_new_tokens"),
    (dict(prompts=[[1]], temperature=-1.0), "temperature: expected >= 0"),
    (dict(prompts=[[1]], budget=0), r"budget: expected an int in \[1, 1024\]"),
    (dict(prompts=[[1]], budget=4), "drafter: expected a DFlashDrafter"),
    (dict(prompts=[[1]], kernels={"int4_moe": "nope"}), "no variant 'nope'; known"),
    (dict(prompts=[[1]], kernels={"nope": "reference"}), "unknown op 'nope'; known ops"),
])
def test_bad_inputs_raise_clear_errors(tiny_target, kwargs, match):
    with pytest.raises((ValueError, KeyError), match=match):
        generate(tiny_target, **kwargs)


def test_commit_tree_kv_matches_a_row_loop():
    """The fixed-shape commit (no host sync) moves exactly the accepted rows, even when a
    source slot is a later destination, and leaves every other slot alone."""
    from workbench.generate import commit_tree_kv

    g = torch.Generator().manual_seed(0)
    layers, B, T, C = 2, 3, 16, 4
    cache = torch.randn(layers, B, T, C, generator=g)
    prefix = torch.tensor([2, 7, 0])
    acc_idx = torch.tensor([[0, 3, 4, -1, -1], [0, 1, 2, 3, 4], [0, -1, -1, -1, -1]])
    acc_len = torch.tensor([3, 5, 1])
    want = cache.clone()
    for b in range(B):
        rows = [cache[:, b, int(prefix[b]) + int(acc_idx[b, d])].clone()
                for d in range(int(acc_len[b]))]
        for d, r in enumerate(rows):
            want[:, b, int(prefix[b]) + d] = r
    commit_tree_kv(cache, prefix, acc_idx, acc_len)
    assert torch.equal(cache, want)


# -- one CUDA graph per step (workbench/cuda_graph.py) ----------------------------------------
def test_cuda_graph_needs_greedy_and_a_gpu(tiny_target):
    with pytest.raises(ValueError, match="cuda_graph: needs greedy"):
        generate(tiny_target, None, [[1, 2]], max_new_tokens=2, temperature=1.0,
                 cuda_graph=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_graph: needs the target on a CUDA device"):
            generate(tiny_target, None, [[1, 2]], max_new_tokens=2, cuda_graph=True)


@pytest.fixture(scope="module")
def tiny_gpu_pair():
    import workbench
    from workbench.reference.drafter import build_drafter

    target = workbench.build_model("tiny", seed=0, device="cuda")
    return target, build_drafter(target.cfg, seed=0, device="cuda")


GPU_PROMPTS = [[5, 9, 2, 7], [3] * 11, [8, 1]]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 1, 8, 16, 32, 64, 128])
def test_gpu_cuda_graph_step_equals_eager(tiny_gpu_pair, budget):
    """Every budget 1..128 (and AR) captures and replays, emitting the eager loop's tokens
    under the same (optimized) kernels."""
    target, drafter = tiny_gpu_pair
    kw = dict(max_new_tokens=20, budget=budget, kernels="optimized")
    eager = generate(target, drafter, GPU_PROMPTS, **kw)
    graphed = generate(target, drafter, GPU_PROMPTS, cuda_graph=True, **kw)
    assert graphed.tokens == eager.tokens
    assert [s["accepted"] for s in graphed.steps] == [s["accepted"] for s in eager.steps]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 8, 128])
def test_gpu_engine_preset_graph_equals_eager(tiny_gpu_pair, budget):
    """The engine preset (what the full-size emulation times: int4_moe ENGINE, the engine's
    dense ops and tree_mla) in the decode loop: every step captured and replayed emits the
    eager loop's tokens and accepted lengths. Its kernels are not batch-invariant, so DDTree
    vs AR is not asserted here (the optimized preset's tests above do that)."""
    from workbench import ops

    target, drafter = tiny_gpu_pair
    sel = ops.resolve_selection("engine")
    kw = dict(max_new_tokens=20, budget=budget, kernels=sel)
    eager = generate(target, drafter, GPU_PROMPTS, **kw)
    graphed = generate(target, drafter, GPU_PROMPTS, cuda_graph=True, **kw)
    assert graphed.tokens == eager.tokens
    assert [s["accepted"] for s in graphed.steps] == [s["accepted"] for s in eager.steps]
    assert all(len(t) == 20 for t in eager.tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [8, 128])
def test_gpu_cuda_graph_ddtree_equals_ar(tiny_gpu_pair, budget):
    """DDTree under graphs emits AR's tokens, under the exact suite's rule: the optimized
    preset's int4_moe (cuda_v15 / v16 / v18 from sessions 43 / 44 / 45) is not batch-invariant
    (its hot bands and bf16 h follow the call's slots an expert, and a DDTree-128 verify of 3
    requests is 1548 slots on tiny's 16 experts), so a divergence passes only as a reference
    tie or an explained, reproduced near-tie of the real loops (check.assert_tokens_explained);
    bitwise AR == DDTree is the invariant preset's claim (tests/test_exact_gpu.py)."""
    from workbench import ops
    from workbench.dist.check import assert_tokens_explained

    target, drafter = tiny_gpu_pair
    ar = generate(target, None, GPU_PROMPTS, max_new_tokens=20, kernels="optimized",
                  cuda_graph=True)
    dd = generate(target, drafter, GPU_PROMPTS, max_new_tokens=20, budget=budget,
                  kernels="optimized", cuda_graph=True)
    assert all(len(t) == 20 for t in dd.tokens)
    assert_tokens_explained(target, drafter, GPU_PROMPTS, ar.tokens, dd.tokens, budget,
                            ops.resolve_selection("optimized"), 20)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [1, 8, 32])
def test_gpu_cuda_graph_with_materialize_in_step_equals_eager(tiny_gpu_pair, budget):
    """drafter_materialize's kernel inside the captured step (commit phase): the graphed loop
    emits the eager loop's tokens, and the eager loop with the reference materialisation on
    the host (the same kernels otherwise) emits them too."""
    from workbench import ops

    target, drafter = tiny_gpu_pair
    opt = dict(ops.PRESETS["optimized"])
    assert opt["drafter_materialize"] == "triton_v1"
    kw = dict(max_new_tokens=24, budget=budget)
    eager = generate(target, drafter, GPU_PROMPTS, kernels=opt, **kw)
    graphed = generate(target, drafter, GPU_PROMPTS, kernels=opt, cuda_graph=True, **kw)
    host = generate(target, drafter, GPU_PROMPTS, kernels={**opt, "drafter_materialize":
                                                             "reference"}, **kw)
    assert graphed.tokens == eager.tokens == host.tokens
    assert [s["accepted"] for s in graphed.steps] == [s["accepted"] for s in eager.steps]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [8, 32])
def test_gpu_trained_pair_graph_with_materialize_in_step_equals_eager(budget):
    """The shipped trained pair: its drafter is accepted (multi-token commits), so a wrong or
    stale in-graph context would show as different accepted lengths; graphed == eager, with
    the optimized kernels (drafter_materialize=triton_v1 among them)."""
    from workbench.train import TRAINED_DIR, load_pair, pair_present

    if not pair_present(TRAINED_DIR):
        pytest.skip("no trained pair in workbench/assets/trained")
    target, drafter, tok = load_pair(device="cuda")
    prompts = [tok.encode(text).ids for text in (  # Python, the pair's training language
        "import os\n\n\ndef main(argv):\n    ", "class Point:\n    def __init__(self, x, y):\n",
        "for i in range(10):\n    if i % 2 == 0:\n        ")]
    kw = dict(max_new_tokens=32, budget=budget, kernels="optimized")
    eager = generate(target, drafter, prompts, **kw)
    graphed = generate(target, drafter, prompts, cuda_graph=True, **kw)
    assert graphed.tokens == eager.tokens
    assert [s["accepted"] for s in graphed.steps] == [s["accepted"] for s in eager.steps]
    assert eager.tokens_per_step > 1.5, eager.tokens_per_step  # the context was committed
