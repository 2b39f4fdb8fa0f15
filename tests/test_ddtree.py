"""DDTree decoding is lossless: token-exact with AR greedy, distribution-exact when sampling.

Two drafters drive the loop: the reference DFlash drafter with random weights (the real code
path; it agrees with a random target about as often as chance, so most steps accept only the
bonus) and a ReplayDrafter that plants the target's own greedy continuation at random ranks, so
multi-token paths are accepted, walked and committed (workbench/replay.py).
"""

import functools
import itertools

import pytest
import torch

import workbench
from workbench import ModelConfig
from workbench.generate import generate
from workbench.reference.drafter import build_drafter
from workbench.reference.tree_mla import causal_anc_bits
from workbench.replay import ReplayDrafter

BUDGETS = (1, 2, 7, 8, 16, 33, 64)
MAX_NEW = 24
BATCHES = {  # name -> (prompt lengths, max_new_tokens per request)
    "one": ((4,), MAX_NEW),
    "mixed-lengths": ((3, 19, 8), MAX_NEW),
    "finish-apart": ((6, 2, 11), (MAX_NEW, 5, 13)),  # requests end at different steps
    "dflash": ((5, 9), MAX_NEW),  # the reference drafter instead of the replay drafter
}


def _prompts(seed, lengths):
    g = torch.Generator().manual_seed(1000 + seed)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]


@functools.cache
def _target(seed):
    return workbench.build_model("tiny", seed=seed)


@functools.cache
def _ar(seed, batch):
    lengths, max_new = BATCHES[batch]
    return generate(_target(seed), prompts=_prompts(seed, lengths), max_new_tokens=max_new)


@pytest.mark.parametrize("seed,budget,batch", list(itertools.product((0, 1), BUDGETS, BATCHES)))
def test_ddtree_equals_ar_greedy(seed, budget, batch):
    lengths, max_new = BATCHES[batch]
    target, prompts = _target(seed), _prompts(seed, lengths)
    ar = _ar(seed, batch)
    if batch == "dflash":
        drafter = build_drafter(target.cfg, seed=seed)
    else:
        seqs = [p + t for p, t in zip(prompts, ar.tokens)]
        drafter = ReplayDrafter(target.cfg, seqs, hit_prob=0.8, seed=seed * 100 + budget)
    dd = generate(target, drafter, prompts, max_new_tokens=max_new, budget=budget)
    assert dd.tokens == ar.tokens
    acc = dd.accepted
    assert all(1 <= a <= min(budget, target.cfg.drafter.depth) + 1 for a in acc)
    if batch != "dflash":  # the replay drafter really exercises multi-token commits
        assert max(acc) >= 2 and len(dd.steps) < len(ar.steps)


def test_stop_token_mid_path_is_honoured():
    target = _target(0)
    prompts = _prompts(0, (4,))
    ar = _ar(0, "one")
    stop = ar.tokens[0][9]
    seqs = [prompts[0] + ar.tokens[0]]
    dd = generate(target, ReplayDrafter(target.cfg, seqs, hit_prob=1.0), prompts,
                  max_new_tokens=MAX_NEW, budget=16, stop_tokens=[stop])
    want = ar.tokens[0][: ar.tokens[0].index(stop) + 1]
    assert dd.tokens[0] == want
    assert max(dd.accepted) > 2  # the stop landed inside an accepted path


def test_commit_leaves_the_cache_ar_would_build():
    """After every DDTree step the committed rows equal a from-scratch causal recompute."""
    target = _target(1)
    prompts = _prompts(1, (3, 19, 8))
    ar = _ar(1, "mixed-lengths")
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    checked = []

    def on_step(stats, cache, prefix):
        for b, seq in enumerate(seqs):
            P = int(prefix[b])
            fresh = target.new_cache(1, P + 1)
            target(torch.tensor([seq[:P]]), torch.arange(P).view(1, -1), fresh,
                   torch.zeros(1, dtype=torch.long), causal_anc_bits(P))
            # equal up to bf16 rounding: the rows were computed in different batch shapes
            torch.testing.assert_close(cache[:, b, :P].float(), fresh[:, 0, :P].float(),
                                       atol=2e-2, rtol=2e-2)
        checked.append(stats["step"])

    generate(target, ReplayDrafter(target.cfg, seqs, hit_prob=0.9, seed=3), prompts,
             max_new_tokens=MAX_NEW, budget=8, on_step=on_step)
    assert len(checked) >= 5


def _micro(seed=0):
    """A 16-token vocabulary so the target's law can be enumerated exactly."""
    t = ModelConfig.preset("tiny")
    cfg = t.replace(vocab_size=16, drafter=t.drafter.__class__(
        **{**t.drafter.__dict__, "mask_token_id": 15}))
    return workbench.build_model(cfg, seed=seed, logit_scale=2.0)  # flat enough to sample


def test_sampled_ddtree_matches_target_distribution():
    """Sample-and-walk is lossless: tokens 2 and 3 follow the target's exact marginals."""
    target = _micro()
    prompt, n = [3, 7, 1], 3000
    # exact law by enumeration: p(t1), p(t2 | t1), p(t3 | t1, t2)
    def probs(prefixes):
        B, L = len(prefixes), len(prefixes[0])
        cache = target.new_cache(B, L + 1)
        out = target(torch.tensor(prefixes), torch.arange(L).expand(B, L), cache,
                     torch.zeros(B, dtype=torch.long), causal_anc_bits(L, B))
        return out.logits[:, -1].float().softmax(-1)  # [B, V]

    p1 = probs([prompt])[0]
    p2 = probs([prompt + [a] for a in range(16)])  # [16, V]
    p3 = probs([prompt + [a, b] for a in range(16) for b in range(16)]).view(16, 16, 16)
    m2 = p1 @ p2
    m3 = torch.einsum("a,ab,abc->c", p1, p2, p3)

    greedy = generate(target, prompts=[prompt], max_new_tokens=3).tokens[0]
    drafter = ReplayDrafter(target.cfg, [prompt + greedy] * n, hit_prob=1.0, seed=5)
    res = generate(target, drafter, [prompt] * n, max_new_tokens=3, budget=4,
                   temperature=1.0, seed=11)
    toks = torch.tensor(res.tokens)  # [n, 3]
    assert max(res.accepted) >= 2  # some second/third tokens came from the tree walk
    for pos, law in ((1, m2), (2, m3)):
        counts = torch.bincount(toks[:, pos], minlength=16).double()
        expected = law.double() * n
        keep = expected >= 5  # chi-square needs enough mass per cell; pool the rest
        obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
        exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
        chi2 = float(((obs - exp) ** 2 / exp.clamp_min(1e-9)).sum())
        dof = int(keep.sum())  # cells - 1 (the pooled cell included)
        # 99.9% quantile of chi2(dof) via the Wilson-Hilferty approximation
        crit = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3
        assert chi2 < crit, f"token {pos + 1}: chi2 {chi2:.1f} >= {crit:.1f} (dof {dof})"


def test_tree_verify_rows_equal_causal_recompute_of_their_paths():
    """Node i's verify logits equal a plain causal forward over prefix + root-to-i path."""
    from workbench.reference.tree_build import build_ddtree

    target = _target(0)
    V = target.cfg.vocab_size
    g = torch.Generator().manual_seed(7)
    prompts = _prompts(0, (6, 11))
    P = torch.tensor([len(p) for p in prompts])
    L, K, budget = 3, 3, 9
    lp = torch.rand(2, L, K, generator=g).sort(-1, descending=True).values.log()
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(2 * L)]).view(2, L, K)
    root = torch.tensor([41, 42])
    tree = build_ddtree(lp, ids, budget, root_tokens=root, prefix_lens=P)
    cache = target.new_cache(2, 32)
    for b, p in enumerate(prompts):  # commit each prompt
        n = len(p)
        c1 = target.new_cache(1, 32)
        target(torch.tensor([p]), torch.arange(n).view(1, -1), c1,
               torch.zeros(1, dtype=torch.long), causal_anc_bits(n))
        cache[:, b] = c1[:, 0]
    out = target(tree.tokens, tree.positions, cache, P, tree.anc_bits)
    for b, p in enumerate(prompts):
        for i in range(int(tree.node_count[b])):
            path, j = [], i
            while j >= 0:
                path.append(int(tree.tokens[b, j]))
                j = int(tree.parents[b, j])
            seq = p + path[::-1]
            c1 = target.new_cache(1, 32)
            ref = target(torch.tensor([seq]), torch.arange(len(seq)).view(1, -1), c1,
                         torch.zeros(1, dtype=torch.long), causal_anc_bits(len(seq)))
            torch.testing.assert_close(out.logits[b, i], ref.logits[0, -1], atol=0.1, rtol=0.02)
            assert out.logits[b, i].argmax() == ref.logits[0, -1].argmax()


def test_finished_requests_never_write_past_the_cache():
    """A request that stops mid-path must not advance its cache position by the whole path.

    The other request keeps decoding for many steps; the finished one's rows are still
    computed each step at its frozen position, which must stay inside the cache.
    """
    target = _target(0)
    prompts = [list(range(5, 45)), [3, 4]]  # the finished request has the longest prompt
    ar = generate(target, prompts=prompts, max_new_tokens=[12, 60])
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    drafter = ReplayDrafter(target.cfg, [seqs[0], seqs[1][:4]], hit_prob=1.0)  # B barely hits
    seen = []  # (request 0 live at the start of the step, its cache position after it)
    dd = generate(target, drafter, prompts, max_new_tokens=[12, 60], budget=64,
                  on_step=lambda s, cache, prefix: seen.append((s["active"][0], int(prefix[0]))))
    assert dd.tokens == ar.tokens
    after = [p for live, p in seen if not live]  # steps after request 0 finished
    assert len(after) >= 3  # request 1 really went on without it
    # frozen, and never past what it emitted: the last emitted token is never committed, so
    # the cache position is at most prompt + emitted - 1 (a whole-path advance would pass it)
    assert len(set(after)) == 1 and max(p for _, p in seen) <= 40 + 12 - 1
