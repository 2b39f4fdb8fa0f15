"""tree_build kernels (kernels/tree_build/ triton_v1..v7): bit-identical to the reference.

Every kept version is tested (the hypothesis tables and the decode loop use the current best,
BEST). On CPU the kernels run under the Triton interpreter (conftest.py), a few ms per heap
pop, so CPU cases stay small; the interpreter runs the kernels' built-in-reduction pop by
default and the GPU's single tuple reduction where a test asks for it (`tuple_reduce=True`).
`gpu` tests: every budget 1..128, bs 256 x budget 128, ties, CUDA-graph replay equal to eager,
no host sync. Every comparison is bitwise on every DDTree field (float64 scores by their bit
patterns, so -0.0 and +0.0 differ).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.kernels.tree_build import (
    BEST,
    register,
)
from workbench.kernels.tree_build.__main__ import BUILDERS, FIELDS, tree_mismatches
from workbench.kernels.tree_build.triton_v1 import walk_commit_triton, walk_tree_triton
from workbench.reference.tree_build import build_ddtree, topk_logprobs, walk_tree

# the sweep's builders (one map of the versions), without its two timing ablations
BUILD = {k: f for k, f in BUILDERS.items() if k not in ("v2-noprefetch", "v3-builtin")}
TUPLE_POP = ("v1", "v3", "v4", "v5")  # versions with a tuple-reduction pop (the GPU default)
build_ddtree_triton = BUILD[BEST.removeprefix("triton_")]

INF = math.inf
NO_CHILD = 10**6  # a target choice no drafted token uses

# ddtree.md §2.6: L=3, K=2, budget 5
WORKED_LP = [[-0.1, -2.5], [-0.3, -1.5], [-0.2, -1.8]]
WORKED_IDS = [[101, 102], [201, 202], [301, 302]]


def assert_same_tree(ref, out):
    bad = tree_mismatches(ref, out)
    assert not bad, f"fields differing from the reference: {bad}"


def both(lp, ids, budget, roots=None, prefix=None, version=None, **kw):
    """(reference tree, kernel tree) for the same inputs; the reference runs on the CPU."""
    cpu = [None if t is None else t.cpu() for t in (lp, ids, roots, prefix)]
    build = BUILD[version] if version else build_ddtree_triton
    return build_ddtree(*cpu[:2], budget, *cpu[2:]), build(lp, ids, budget, roots, prefix, **kw)


def random_ids(gen: torch.Generator, batch: int, depth: int, k: int) -> torch.Tensor:
    """[B, L, K] distinct ids per depth, from a vocab of 3K so depths share some ids."""
    rows = [torch.randperm(3 * k, generator=gen)[:k] for _ in range(batch * depth)]
    return torch.stack(rows).reshape(batch, depth, k)


def real_table(batch, depth, k, seed, scale=3.0, vocab=200):
    """Top-k of random logits: float32 log-probs whose float64 sums really round."""
    gen = torch.Generator().manual_seed(seed)
    return topk_logprobs(torch.randn(batch, depth, vocab, generator=gen) * scale, k)


def planted_target(tree, seed: int) -> torch.Tensor:
    """[B, N] target choices that accept a random root->node path, then miss (NO_CHILD)."""
    rng = random.Random(seed)
    batch, n_rows = tree.tokens.shape
    tokens = tree.tokens.cpu()
    target = torch.tensor([[rng.choice(tokens[b].tolist()) for _ in range(n_rows)]
                           for b in range(batch)])
    for b in range(batch):
        end = rng.randrange(int(tree.node_count[b]))
        path = [end]
        while path[-1] != 0:
            path.append(int(tree.parents[b, path[-1]]))
        path.reverse()
        for a, c in zip(path, path[1:]):
            target[b, a] = tokens[b, c]
        target[b, end] = NO_CHILD
    return target.to(tree.tokens.device)


def assert_same_walk(ref_tree, tree, target):
    acc, lens, bonus = walk_tree(ref_tree, target.cpu())
    w = walk_commit_triton(tree, target)
    assert torch.equal(w.accepted_indices.cpu(), acc)
    assert torch.equal(w.accept_lens.cpu(), lens) and torch.equal(w.bonus.cpu(), bonus)
    # emitted = path tokens after the root, then the bonus; -1 padding
    tokens = ref_tree.tokens.gather(1, acc.clamp_min(0))
    for b in range(acc.shape[0]):
        n = int(lens[b])
        want = tokens[b, 1:n].tolist() + [int(bonus[b])] + [-1] * (acc.shape[1] - n)
        assert w.emitted[b].tolist() == want


# ---------------------------------------------------------------- hand-picked cases


@pytest.mark.parametrize("version, kw", [(v, {}) for v in BUILD] + [
    (v, {"tuple_reduce": True}) for v in TUPLE_POP])
def test_worked_vector(version, kw):
    lp, ids = torch.tensor([WORKED_LP]), torch.tensor([WORKED_IDS])
    ref, out = both(lp, ids, 5, torch.tensor([7]), torch.tensor([17]), version, **kw)
    assert out.parents.tolist() == [[-1, 0, 1, 2, 1, 4]]
    assert_same_tree(ref, out)
    target = torch.tensor([[101, 202, 301, 302, 301, 999]])  # path 0, 1, 4, 5 then bonus 999
    assert_same_walk(ref, out, target)
    assert walk_commit_triton(out, target).emitted.tolist() == [[101, 202, 301, 999, -1, -1]]


def _ties(batch, depth, k, value=0.0):
    return torch.full((batch, depth, k), value)


EDGE = {
    # name: (lp, ids, budget, why)
    "all-ties-L3-K3": (_ties(1, 3, 3), None, 20, "every score equal: rank tuples decide all"),
    "ties-minus-zero": (_ties(2, 3, 2, -0.0), None, 9,
                        "-0.0 scores tie +0.0 ones and keep their sign bit"),
    "K1-chain": (torch.tensor([[[-0.5], [-0.25], [-1.0], [-0.1], [-2.0]]]), None, 9,
                 "no siblings; budget > the 5 possible nodes leaves padding"),
    "L1-star": (torch.tensor([[[-0.1, -0.2, -0.3, -0.4, -0.5]]]), None, 3,
                "one depth: children of the root only"),
    "budget-1": (torch.tensor([WORKED_LP]), torch.tensor([WORKED_IDS]), 1, "N = 2"),
    "neg-inf": (torch.tensor([[[-INF, -INF], [-0.5, -1.0]], [[-0.5, -INF], [-INF, -INF]],
                              [[-0.5, -1.0], [-0.5, -INF]]]), None, 8,
                "-inf rank 0 leaves only the root; deeper -inf cuts the tree"),
    "L16-ties": (_ties(1, 16, 2, -0.0), None, 40,
                 "two key words: ties decided by digits of depths 10..16"),
    "L10-ties": (_ties(2, 10, 3), None, 24, "the first depth in the second key word"),
    "L9-ties": (_ties(1, 9, 3), None, 24, "the last depth of a one-word key (bits 0..6)"),
    "budget>prefixes": (torch.tensor([[[-0.5, -1.0], [-0.5, -1.0]]]), None, 40,
                        "6 prefixes exist; 34 padding rows see only themselves"),
}


@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("name", list(EDGE))
def test_edge_cases(name, version):
    lp, ids, budget, _why = EDGE[name]
    if ids is None:
        ids = random_ids(torch.Generator().manual_seed(1), *lp.shape)
    roots = torch.arange(lp.shape[0]) + 3
    ref, out = both(lp, ids, budget, roots, torch.arange(lp.shape[0]) * 100, version)
    assert_same_tree(ref, out)
    assert_same_walk(ref, out, planted_target(out, 0))


@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("budget", [63, 64, 65, 100, 128])
def test_mask_word_boundaries(budget, version):
    # why: N = 64 sets bit 63 (a negative int64 word); 65..128 need two words; N = 129 three
    lp, ids = real_table(1, 7, 12, seed=budget)
    ref, out = both(lp, ids, budget, version=version)
    assert out.anc_bits.shape[-1] == -(-(budget + 1) // 64)
    assert_same_tree(ref, out)


@pytest.mark.parametrize("depth, k, budget", [(16, 3, 48), (12, 5, 30), (7, 40, 20)])
def test_real_logprobs(depth, k, budget):
    # why: float64 sums of real log-probs round; K > budget reads ranks < budget only
    lp, ids = real_table(2, depth, k, seed=depth)
    ref, out = both(lp, ids, budget, torch.tensor([5, 6]), torch.tensor([0, 4095]))
    assert_same_tree(ref, out)
    assert_same_walk(ref, out, planted_target(out, depth))


@pytest.mark.parametrize("version", TUPLE_POP)
@pytest.mark.parametrize("depth, budget", [(4, 12), (12, 14)])
def test_tuple_reduction_pop(depth, budget, version):
    # why: the GPU's pop (one reduction carrying score, key words and meta) on ties and rounding
    gen = torch.Generator().manual_seed(depth)
    lp = torch.tensor([0.0, -0.25, -0.25, -INF])[torch.randint(4, (2, depth, 3), generator=gen)]
    lp = lp.sort(-1, descending=True).values
    ids = random_ids(gen, 2, depth, 3)
    assert_same_tree(*both(lp, ids, budget, version=version, tuple_reduce=True))
    assert_same_tree(*both(*real_table(1, depth, 4, seed=1), budget, version=version,
                           tuple_reduce=True))


@pytest.mark.parametrize("version", ["v6", "v7", "v9"])
@pytest.mark.parametrize("depth, budget", [(3, 20), (10, 24)])
def test_v6_high_word_ties(depth, budget, version):
    # why: v6 decides a pop on the score key's high int32 word (20 mantissa bits); float32
    # values a few ulps apart differ only in the low word, so its tie branch must narrow by the
    # low word before the rank key. Values: -1 and its float32 neighbours, with exact ties.
    gen = torch.Generator().manual_seed(depth)
    near = torch.tensor([-1.0]).float()
    vals = torch.cat([near, near.nextafter(torch.tensor(-2.0)),
                      near.nextafter(torch.tensor(-2.0)).nextafter(torch.tensor(-2.0)),
                      torch.tensor([-1.0 - 2**-20, -1.5, -INF])])
    lp = vals[torch.randint(len(vals), (2, depth, 4), generator=gen)]
    lp = lp.sort(-1, descending=True).values
    ids = random_ids(gen, 2, depth, 4)
    assert_same_tree(*both(lp, ids, budget, version=version))


def test_batch_of_different_requests():
    # why: requests of one launch differ in tables, -inf tails, roots and prefix lengths; each
    # row must equal the tree built for that request alone
    lp, ids = real_table(3, 5, 6, seed=3)
    lp[1, 2:, 2:] = -INF
    lp[2] = torch.tensor([-0.5, -0.5, -1.0, -1.0, -2.0, -2.0])  # ties
    roots, prefix = torch.tensor([5, 6, 7]), torch.tensor([0, 9, 1000])
    ref, out = both(lp, ids, 17, roots, prefix)
    assert_same_tree(ref, out)
    assert len({tuple(p) for p in out.parents.tolist()}) == 3
    for b in range(3):
        alone = build_ddtree_triton(lp[b : b + 1], ids[b : b + 1], 17, roots[b : b + 1],
                                    prefix[b : b + 1])
        for name in FIELDS:
            assert torch.equal(getattr(out, name)[b], getattr(alone, name)[0]), (b, name)


@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("lp_dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_input_dtypes_and_strides(lp_dtype, version):
    # why: int32 ids, other float widths (widened exactly to float64 as the reference does),
    # non-contiguous views of every input
    lp, ids = real_table(2, 5, 8, seed=5)
    lp = lp.to(lp_dtype).transpose(1, 2).contiguous().transpose(1, 2)  # [B, L, K], K-stride 5
    ids32 = torch.zeros(2, 5, 16, dtype=torch.int32)
    ids32[..., ::2] = ids.to(torch.int32)
    ids_view = ids32[..., ::2]  # K-stride 2
    roots = torch.tensor([[1, 0], [2, 0]], dtype=torch.int32)[:, 0]  # stride 2
    prefix = torch.tensor([3, 0, 8, 0], dtype=torch.int32)[::2]
    assert not (lp.is_contiguous() or ids_view.is_contiguous() or roots.is_contiguous())
    ref, out = both(lp, ids_view, 12, roots, prefix, version)
    assert_same_tree(ref, out)
    assert_same_tree(build_ddtree(lp.contiguous(), ids, 12, roots.long(), prefix.long()), out)


@pytest.mark.parametrize("version", list(BUILD))
def test_empty_batch(version):
    # why: a scheduler step with no decoding requests: no launch, empty outputs
    out = BUILD[version](torch.zeros(0, 3, 2), torch.zeros(0, 3, 2, dtype=torch.int64), 5)
    assert out.tokens.shape == (0, 6) and out.anc_bits.shape == (0, 6, 1)
    acc, lens, bonus = walk_tree_triton(out, torch.zeros(0, 6, dtype=torch.int64))
    assert acc.shape == (0, 6) and lens.shape == bonus.shape == (0,)


# ---------------------------------------------------------------- property tests (hypothesis)

# A tiny value set so exact ties are frequent (+0.0 and -0.0 tie too); -inf cuts the tree.
VALUES = [0.0, -0.0, -0.1, -0.25, -0.5, -1.0, -2.5, -INF]


@st.composite
def tables(draw, max_batch=3, max_depth=5, max_k=4, max_budget=40):
    batch = draw(st.integers(1, max_batch))
    depth = draw(st.integers(1, max_depth))
    k = draw(st.integers(1, max_k))
    if draw(st.booleans()):  # tie-heavy
        rows = [sorted(draw(st.lists(st.sampled_from(VALUES), min_size=k, max_size=k)),
                       reverse=True) for _ in range(batch * depth)]
        lp = torch.tensor(rows, dtype=torch.float32).reshape(batch, depth, k)
    else:  # real log-probs, -inf tails sometimes
        lp, _ = real_table(batch, depth, k, seed=draw(st.integers(0, 2**16)),
                           scale=draw(st.sampled_from([0.5, 3.0, 10.0])))
        cut = draw(st.integers(1, k + 1))
        lp[..., cut:] = -INF
    ids = random_ids(torch.Generator().manual_seed(draw(st.integers(0, 2**16))), batch, depth, k)
    return lp, ids, draw(st.integers(1, max_budget))


PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(tables(), st.integers(0, 2**16))
def test_property_bitwise_and_walk(case, seed):
    lp, ids, budget = case
    batch = lp.shape[0]
    roots, prefix = torch.arange(batch) + 11, torch.arange(batch) * 7
    ref, out = both(lp, ids, budget, roots, prefix)
    assert_same_tree(ref, out)
    assert_same_walk(ref, out, planted_target(out, seed))
    gen = torch.Generator().manual_seed(seed)  # unplanted choices: off-path children match too
    assert_same_walk(ref, out, ids.flatten()[torch.randint(ids.numel(), out.tokens.shape,
                                                           generator=gen)])


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tables(max_budget=24))
def test_property_bitwise_v6(case):
    # why: v6's pop path differs from BEST's (high-word decision, loads before the branch)
    assert_same_tree(*both(*case, version="v6"))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tables(max_budget=24))
def test_property_bitwise_v7(case):
    # why: v7 computes every successor score when its entry is created, not when it is popped
    # (-inf guards, -0.0 bits of successors in meta)
    assert_same_tree(*both(*case, version="v7"))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tables(max_budget=40), st.booleans())
def test_property_bitwise_v9(case, plane_blocks):
    # why: v9 keeps per-node depth / rank-key fields and rebuilds entry keys in its tie branch;
    # budgets > 32 cross its static blocks of 32 pops (and the one-block path, plane_blocks=False)
    lp, ids, budget = case
    assert_same_tree(*both(lp, ids, budget, version="v9", plane_blocks=plane_blocks))


@pytest.mark.slow
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tables(max_batch=2, max_depth=16, max_k=3, max_budget=128))
def test_property_bitwise_deep_and_wide(case):
    # why: depths 10..16 (two key words) and budgets up to 128 (up to three mask words)
    assert_same_tree(*both(*case))


# ---------------------------------------------------------------- errors and validation


def _lp(*shape):
    return torch.full(shape, -1.0)


def _ids(*shape):
    return torch.arange(math.prod(shape)).reshape(shape)


def _case(case_id, match, **kwargs):
    return pytest.param(kwargs, match, id=case_id)


@pytest.mark.parametrize("kwargs, match", [
    _case("budget-0", r"budget: expected an int in \[1, 128\], got 0", budget=0),
    _case("budget-129", r"budget: expected an int in \[1, 128\], got 129", budget=129),
    _case("budget-float", r"budget: expected .*got 2.5", budget=2.5),
    _case("budget-bool", r"budget: expected", budget=True),
    _case("lp-rank-2", r"top_logprobs: expected shape \[B, L, K\]", top_logprobs=_lp(2, 3)),
    _case("ids-rank-4", r"top_ids: expected shape \[B, L, K\]", top_ids=_ids(2, 3, 4, 1)),
    _case("ids-shape", r"top_ids: expected shape \(2, 3, 4\).*got \(2, 3, 3\)",
          top_ids=_ids(2, 3, 3)),
    _case("L-0", r"top_logprobs: expected 1 <= L <= 16", top_logprobs=_lp(2, 0, 4),
          top_ids=_ids(2, 0, 4)),
    _case("L-17", r"top_logprobs: expected 1 <= L <= 16.*\(2, 17, 4\)",
          top_logprobs=_lp(2, 17, 4), top_ids=_ids(2, 17, 4)),
    _case("lp-int", r"top_logprobs: expected dtype float32, float64, bfloat16 or float16",
          top_logprobs=torch.zeros(2, 3, 4, dtype=torch.int64)),
    _case("ids-float", r"top_ids: expected an integer dtype", top_ids=_ids(2, 3, 4).float()),
    _case("ids-bool", r"top_ids: expected an integer dtype",
          top_ids=torch.zeros(2, 3, 4, dtype=torch.bool)),
    _case("root-len", r"root_tokens: expected shape \(2,\) = \[B\], got \(3,\)",
          root_tokens=torch.zeros(3, dtype=torch.int64)),
    _case("root-float", r"root_tokens: expected an integer dtype", root_tokens=torch.zeros(2)),
    _case("prefix-rank", r"prefix_lens: expected shape", prefix_lens=torch.zeros(2, 1).long()),
    _case("prefix-list", r"prefix_lens: expected a Tensor or None", prefix_lens=[0, 1]),
])
@pytest.mark.parametrize("version", list(BUILD))
def test_launcher_errors_name_the_argument(kwargs, match, version):
    args = dict(top_logprobs=_lp(2, 3, 4), top_ids=_ids(2, 3, 4), budget=8) | kwargs
    with pytest.raises(ValueError, match=match):
        BUILD[version](**args)


@pytest.mark.parametrize("kwargs, match", [
    _case("nan", r"top_logprobs: expected no NaN and no \+inf .*got NaN at \[b, d, r\] = \[1, 0, 0\]",
          top_logprobs=_lp(2, 3, 4).index_put_((torch.tensor(1),), torch.tensor(math.nan))),
    _case("unsorted", r"top_logprobs: expected sorted descending along K",
          top_logprobs=torch.tensor([-1.0, -2.0, -0.5, -3.0]).expand(2, 3, 4)),
    _case("prefix-negative", r"prefix_lens: expected values >= 0",
          prefix_lens=torch.tensor([0, -1])),
    _case("ids-repeated", r"top_ids: expected distinct ids .*repeats in \[0, 0, :4\]",
          top_ids=torch.tensor([5, 6, 5, 7]).expand(2, 3, 4)),
])
def test_validate_flag_checks_contents(kwargs, match):
    # why: content checks read values back (a sync), so they run only with validate=True
    args = dict(top_logprobs=_lp(2, 3, 4), top_ids=_ids(2, 3, 4), budget=8) | kwargs
    build_ddtree_triton(**args)  # no check, no sync: an unspecified but memory-safe tree
    with pytest.raises(ValueError, match=match):
        build_ddtree_triton(**args, validate=True)


def test_validate_accepts_repeats_behind_neg_inf():
    # why: -inf ranks never become nodes, so padded tables may repeat ids there
    lp, ids = torch.tensor([[[-1.0, -INF, -INF]]]), torch.tensor([[[4, 0, 0]]])
    assert_same_tree(build_ddtree(lp, ids, 3), build_ddtree_triton(lp, ids, 3, validate=True))


def test_walk_errors():
    tree = build_ddtree_triton(torch.tensor([WORKED_LP]), torch.tensor([WORKED_IDS]), 5)
    with pytest.raises(ValueError, match=r"target_tokens: expected shape \(1, 6\)"):
        walk_tree_triton(tree, torch.zeros(1, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"target_tokens: expected an integer dtype"):
        walk_tree_triton(tree, torch.zeros(1, 6))


# ---------------------------------------------------------------- registry and the decode loop


def test_registered_variants():
    from workbench import ops

    register()
    assert register() == []  # idempotent
    for version in (1, 2, 3, 4, 5, 6, 7, 8, 9):
        with ops.use(tree_build=f"triton_v{version}"):
            assert ops.get("tree_build") is BUILD[f"v{version}"]


@pytest.mark.parametrize("budget, lengths, hit_prob", [
    (4, (5, 3), 0.9),  # replay drafter: multi-token paths walked and committed
    (7, (6,), 0.8),
    pytest.param(65, (4,), 0.9, marks=pytest.mark.slow),  # two mask words in the verify
])
def test_decode_token_exact_with_kernel(tiny_target, budget, lengths, hit_prob):
    from workbench.generate import generate
    from workbench.replay import ReplayDrafter

    register()
    g = torch.Generator().manual_seed(budget)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=12)
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    drafter = ReplayDrafter(tiny_target.cfg, seqs, hit_prob=hit_prob, seed=budget)
    dd = generate(tiny_target, drafter, prompts, max_new_tokens=12, budget=budget,
                  kernels={"tree_build": BEST})
    assert dd.tokens == ar.tokens
    assert max(dd.accepted) >= 2  # paths longer than the bonus were accepted


def test_decode_token_exact_dflash_drafter(tiny_target):
    # why: the real drafter path (random weights): mostly root-only acceptance, real top-K tables
    from workbench.generate import generate
    from workbench.reference.drafter import build_drafter

    register()
    prompts = [[5, 6, 7, 8], [20, 21, 22]]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=6)
    dd = generate(tiny_target, build_drafter(tiny_target.cfg, seed=0), prompts,
                  max_new_tokens=6, budget=6, kernels={"tree_build": BEST})
    assert dd.tokens == ar.tokens


# ---------------------------------------------------------------- GPU


def _gpu_inputs(batch, depth, budget, seed, vocab=1000):
    lp, ids = real_table(batch, depth, min(budget, vocab), seed=seed, vocab=vocab)
    gen = torch.Generator().manual_seed(seed)
    roots, prefix = torch.randint(0, vocab, (batch,), generator=gen), torch.randint(
        0, 4096, (batch,), generator=gen)
    return [t.cuda() for t in (lp, ids, roots, prefix)]


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("depth", [1, 7, 16])
def test_gpu_every_budget(depth, version):
    for budget in range(1, 129):
        lp, ids, roots, prefix = _gpu_inputs(4, depth, budget, seed=budget)
        ref, out = both(lp, ids, budget, roots, prefix, version)
        assert_same_tree(ref, out)


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("batch, depth, budget", [(256, 7, 128), (256, 16, 128), (64, 7, 64)])
def test_gpu_large_batches(batch, depth, budget, version):
    lp, ids, roots, prefix = _gpu_inputs(batch, depth, budget, seed=batch + budget)
    lp[batch // 2 :, 3:, 5:] = -INF  # half the requests run out of candidates
    ref, out = both(lp, ids, budget, roots, prefix, version)
    assert_same_tree(ref, out)
    assert_same_walk(ref, out, planted_target(out, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(BUILD))
@pytest.mark.parametrize("depth", [3, 7, 12, 16])
def test_gpu_ties(depth, version):
    # why: values from a tiny set (+0.0 and -0.0 included): exact float64 ties everywhere
    gen = torch.Generator().manual_seed(depth)
    lp = torch.tensor(VALUES)[torch.randint(len(VALUES), (256, depth, 8), generator=gen)]
    lp = lp.sort(-1, descending=True).values
    ids = random_ids(gen, 256, depth, 8)
    for budget in (1, 8, 31, 63, 64, 65, 100, 128):
        assert_same_tree(*both(lp.cuda(), ids.cuda(), budget, version=version))


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    lp, ids, roots, prefix = _gpu_inputs(64, 7, 64, seed=1)
    static = [t.clone() for t in (lp, ids, roots, prefix)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up (JIT) outside the capture
        build_ddtree_triton(*static[:2], 64, *static[2:])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree = build_ddtree_triton(*static[:2], 64, *static[2:])
        target = torch.gather(tree.tokens, 1, tree.first_child.clamp_min(0))
        walk = walk_commit_triton(tree, target)
    for seed in (2, 3):  # new inputs copied into the captured buffers, then replay
        fresh = _gpu_inputs(64, 7, 64, seed=seed)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        eager = build_ddtree_triton(*fresh[:2], 64, *fresh[2:])
        assert not tree_mismatches(eager, tree)
        assert_same_tree(build_ddtree(*[t.cpu() for t in fresh[:2]], 64,
                                      *[t.cpu() for t in fresh[2:]]), tree)
        eager_walk = walk_commit_triton(eager, torch.gather(eager.tokens, 1,
                                                            eager.first_child.clamp_min(0)))
        assert torch.equal(eager_walk.accepted_indices, walk.accepted_indices)
        assert torch.equal(eager_walk.emitted, walk.emitted)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    lp, ids, roots, prefix = _gpu_inputs(64, 7, 64, seed=4)
    tree = build_ddtree_triton(lp, ids, 64, roots, prefix)  # compile outside the check
    walk_commit_triton(tree, tree.tokens)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tree = build_ddtree_triton(lp, ids, 64, roots, prefix)
        walk_commit_triton(tree, tree.tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
