"""Acceptance replay: traces, the replay walk's statistics and paths, generate's replay mode."""

import math

import pytest
import torch

from workbench.acceptance import AcceptanceTrace, ReplayWalk, truncated_geometric
from workbench.generate import generate
from workbench.reference.tree_build import build_ddtree


@pytest.mark.parametrize("mean,depth", [(4.48, 7), (1.0, 7), (8.0, 7), (1.7, 1), (2.5, 3)])
def test_truncated_geometric_matches_the_mean(mean, depth):
    p = truncated_geometric(mean, depth)
    assert len(p) == depth + 1 and abs(sum(p) - 1) < 1e-12 and min(p) >= 0
    assert abs(sum(k * x for k, x in enumerate(p, 1)) - mean) < 1e-9


def test_trace_builders_files_and_errors(tmp_path):
    with pytest.raises(ValueError, match="mean: expected a tau in"):
        truncated_geometric(9.0, 7)  # longer than the deepest path can accept
    rec = AcceptanceTrace.from_results({4: [1, 1, 2, 4], 8: [3]}, "unit")
    assert rec.pmf[4] == [0.5, 0.25, 0.0, 0.25] and rec.mean(8) == 3.0
    assert rec.budget_for(16) == 8 and rec.budget_for(3) == 4  # nearest on a log scale
    assert "trace budget 8" in rec.label(16)
    back = AcceptanceTrace.load(rec.save(tmp_path / "t.json"))
    assert back.pmf == rec.pmf and back.source == "unit"
    assert back.meta["samples"] == rec.meta["samples"] == {"4": 4, "8": 1}  # JSON keys
    geo = AcceptanceTrace.from_mean(4.48, 8, 7)
    assert abs(geo.mean(8) - 4.48) < 1e-9 and "truncated geometric" in geo.source
    with pytest.raises(ValueError, match="non-negative"):
        AcceptanceTrace({8: [0.5, -0.1]}, "bad")


def _chain_trees(B, depth, prefix):
    """B requests whose best-first tree of budget 2*depth has a rank-0 chain of length depth
    (peaked log-probs), plus rank-1 siblings: the deepest path is the chain."""
    lp = torch.tensor([[-0.01, -5.0]] * depth).expand(B, depth, 2).contiguous()
    ids = torch.arange(2 * depth).view(depth, 2).expand(B, depth, 2) + 10
    return build_ddtree(lp, ids, 2 * depth, root_tokens=torch.full((B,), 3), prefix_lens=prefix)


def test_replay_walk_statistics_and_real_paths():
    """4096 draws: the realised mean is the trace's within 4 standard errors, each accepted
    path is a root-to-leaf chain of real tree nodes, and the bonus is the target's choice."""
    B, depth = 512, 7
    trace = AcceptanceTrace.from_mean(4.48, 8, depth)
    walk = ReplayWalk(trace, 8, B, 64, "cpu", seed=3)
    g = torch.Generator().manual_seed(0)
    lens, n = [], 0
    for rep in range(8):  # eight "steps": the committed length grows, so do the draws
        tree = _chain_trees(B, depth, torch.full((B,), 5 + 7 * rep))
        N = tree.tokens.shape[1]
        choice = torch.randint(0, 500, (B, N), generator=g)
        acc_idx, acc_len, bonus, max_len = walk(tree, choice)
        assert (max_len == depth + 1).all()
        for b in range(0, B, 97):  # spot-check paths
            k = int(acc_len[b])
            path = acc_idx[b, :k].tolist()
            assert path[0] == 0 and (acc_idx[b, k:] == -1).all()
            assert [int(tree.depths[b, i]) for i in path] == list(range(k))
            assert all(int(tree.parents[b, c]) == p for p, c in zip(path, path[1:]))
            assert int(bonus[b]) == int(choice[b, path[-1]])
        lens += acc_len.tolist()
        n += B
    realised = sum(lens) / n
    se = trace.std(8) / math.sqrt(n)
    assert abs(realised - trace.mean(8)) < 4 * se, (realised, trace.mean(8), se)


def test_replay_walk_clips_to_the_deepest_path():
    tree = _chain_trees(64, 2, torch.arange(64))  # depth-2 chain: at most 3 tokens a step
    trace = AcceptanceTrace({8: [0.0, 0.0, 0.0, 0.0, 1.0]}, "always 5")
    acc_idx, acc_len, _, max_len = ReplayWalk(trace, 8, 64, 128, "cpu")(
        tree, torch.zeros_like(tree.tokens))
    assert (acc_len == 3).all() and (max_len == 3).all()
    assert trace.clipped_mean(8, 3) == 3.0


@pytest.fixture(scope="module")
def tiny_pair(tiny_target):
    from workbench.reference.drafter import build_drafter

    return tiny_target, build_drafter(tiny_target.cfg, seed=0)


def test_generate_replay_mode_is_labelled_seeded_and_matches_the_trace(tiny_pair):
    target, drafter = tiny_pair
    trace = AcceptanceTrace.from_mean(3.0, 8, drafter.cfg.depth)
    prompts = [[5, 6, 7], list(range(20, 31)), [9] * 6, [4, 4]]
    kw = dict(budget=8, acceptance=trace)
    r = generate(target, drafter, prompts, seed=1, max_new_tokens=36, **kw)
    assert r.mode == "ddtree-replay" and r.acceptance.startswith("replay tau 3.00")
    assert r.to_json()["acceptance"] == r.acceptance
    # a draw is a function of (seed, request, committed length): a shorter run with the same
    # seed emits a prefix of the same tokens, another seed other lengths
    short = generate(target, drafter, prompts, seed=1, max_new_tokens=10, **kw)
    assert short.tokens == [t[:10] for t in r.tokens]
    other = generate(target, drafter, prompts, seed=2, max_new_tokens=10, **kw)
    assert other.accepted[:8] != short.accepted[:8]
    # realised tau against the expectation given each step's deepest path (the clip)
    acc, want, var = [], 0.0, 0.0
    for s in r.steps:
        for a, live, m in zip(s["accepted"], s["active"], s["max_accept"]):
            if live:
                acc.append(a)
                mu = trace.clipped_mean(8, m)
                want += mu
                var += sum((min(k, m) - mu) ** 2 * p
                           for k, p in enumerate(trace.probs(8), 1))
    assert len(acc) >= 30
    assert abs(sum(acc) - want) < 4 * math.sqrt(var) + 1e-9, (sum(acc) / len(acc), want / len(acc))
    assert all(len(t) == 36 for t in r.tokens)


def test_generate_replay_needs_a_budget(tiny_target, tmp_path):
    trace = AcceptanceTrace.from_mean(2.0, 8, 7)
    with pytest.raises(ValueError, match="replay needs a DDTree budget"):
        generate(tiny_target, None, [[1, 2]], max_new_tokens=2, acceptance=trace)


def test_shipped_trace_is_loadable():
    from pathlib import Path

    path = Path(__file__).parent.parent / "traces" / "acceptance_trained_replay.json"
    if not path.exists():
        pytest.skip("no recorded trace yet")
    t = AcceptanceTrace.load(path)
    assert set(t.pmf) == {1, 2, 4, 8, 16, 32, 64}
    means = [t.mean(b) for b in sorted(t.pmf)]
    assert means == sorted(means) and 1.0 < means[0] and means[-1] <= 8.0  # tau grows with B
    assert len(t.pmf[1]) <= 2  # budget 1: a depth-1 tree accepts at most 2 tokens


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [8, 64])
def test_gpu_replay_cuda_graph_equals_eager(budget):
    """Graph safety: the replay step captured as one CUDA graph draws exactly what the eager
    loop draws for the same seed (the draw is a function of the step's inputs)."""
    import workbench
    from workbench.reference.drafter import build_drafter

    target = workbench.build_model("tiny", seed=0, device="cuda")
    drafter = build_drafter(target.cfg, seed=0, device="cuda")
    trace = AcceptanceTrace.from_mean(4.48, 8, drafter.cfg.depth)
    kw = dict(max_new_tokens=40, budget=budget, kernels="optimized", acceptance=trace, seed=5)
    prompts = [[5, 9, 2, 7], [3] * 11, [8, 1]]
    eager = generate(target, drafter, prompts, **kw)
    graphed = generate(target, drafter, prompts, cuda_graph=True, **kw)
    assert graphed.mode == eager.mode == "ddtree-replay"
    assert graphed.tokens == eager.tokens
    assert [s["accepted"] for s in graphed.steps] == [s["accepted"] for s in eager.steps]
    assert eager.tokens_per_step > 2.0
