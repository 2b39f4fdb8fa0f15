"""explain_divergence (workbench/dist/check.py): the first routing flip behind a divergence.

CPU, `tiny`, reference ops. A test-local variant of an op (added to the registry for one test,
removed after) perturbs one MoE layer's input at one row, so the flip is forced where we choose:
  * a rounding-level nudge (~1 bf16 ulp per element, signed against the router's gap) on the
    first MoE layer's most nearly tied row flips exactly that decision: found, explained;
  * the same nudge on the last MoE layer's most decided row flips nothing (no MoE layer below
    it): the "no routing differs" path, with the input difference reported;
  * a router variant that swaps an expert on a decided row (a kernel bug): found, not explained.
"""

from __future__ import annotations

import contextlib
import functools
import random

import pytest
import torch

import workbench
from workbench import ops
from workbench.dist.check import (
    NEAR_TIE_REL,
    ROUNDING_REL,
    check_explained,
    explain_divergence,
    explain_divergences,
    first_discrete_divergence,
    logit_margin,
    loop_chunks,
    router_margin,
    routing_trace,
)
from workbench.generate import generate
from workbench.reference.layers import ACC, add_rmsnorm, rmsnorm
from workbench.reference.moe_route import moe_route

NEW = 10  # generated tokens: the sequence is prompt + these


@functools.cache
def _case():
    torch.set_num_threads(1)
    target = workbench.build_model("tiny", seed=0)
    rng = random.Random(3)
    prompt = [rng.randrange(3, target.cfg.vocab_size) for _ in range(9)]
    tokens = generate(target, None, [prompt], max_new_tokens=NEW).tokens[0]
    trace = routing_trace(target, prompt + tokens)
    K = target.cfg.n_experts_per_tok
    margins = {i: [router_margin(h, target.model.layers[str(i)].mlp, K)
                   for h in trace["hidden"][i]] for i in trace["hidden"]}
    return target, prompt, tokens, trace, margins


@contextlib.contextmanager
def _variant(op: str, fn):
    """A test-local variant of `op`, selectable with ops.use while the block runs."""
    spec = ops.op_spec(op)
    spec.add(ops.Variant("test_local", fn, description="test-local perturbation"))
    try:
        yield {op: "test_local"}
    finally:
        del spec.variants["test_local"]


def _nudged_norm(target, layer: int, row: int, m: dict, ulps: float = 1.0):
    """add_rmsnorm (the residual add + post-attention norm that makes each MoE input) that
    moves layer `layer`'s MoE input at `row` by ~`ulps` bf16 ulps per element, each against
    the sign of d(K/K+1 gap)/dh: a rounding-level change aimed at the gap."""
    lyr = target.model.layers[str(layer)]
    W = lyr.mlp.gate.weight.to(ACC)
    a, b = m["pair"]

    def fn(x, r, weight, eps):
        res, y = add_rmsnorm(x, r, weight, eps)
        if weight is not lyr.post_attention_layernorm.weight or y.shape[1] <= row:
            return res, y
        h = y[0, row].to(ACC)
        s = torch.sigmoid(W @ h)
        g = s[a] * (1 - s[a]) * W[a] - s[b] * (1 - s[b]) * W[b]
        y = y.clone()
        y[0, row] = (h - torch.sign(g) * h.abs() * ulps * 2.0**-7).to(y.dtype)
        return res, y

    return fn


def _argrow(margins, layer, pick):
    rels = [m["margin_rel"] for m in margins[layer]]
    return rels.index(pick(rels))


def test_a_rounding_nudge_on_a_router_near_tie_is_found_and_explained():
    target, prompt, tokens, _, margins = _case()
    first = min(margins)  # the first MoE layer: nothing discrete differs above it
    row = _argrow(margins, first, min)
    assert margins[first][row]["margin_rel"] < NEAR_TIE_REL  # a near tie exists on tiny
    with _variant("add_rmsnorm", _nudged_norm(target, first, row, margins[first][row])) as sel:
        rep, line = explain_divergence(target, prompt, tokens, None, sel)
    assert rep["layer"] == first and [f["row"] for f in rep["flips"]] == [row], line
    f = rep["flips"][0]
    assert set(f["ids_a"]) != set(f["ids_b"]) and f["router_ok_a"] and f["router_ok_b"]
    assert f["router_margin"] == margins[first][row]["margin"] > 0 > f["router_margin_b"]
    assert 0 < f["hidden_rel"] < ROUNDING_REL and f["hidden_diff"] > 0
    # only that row's input moved in that layer: the flip is the perturbation's, not noise's
    assert rep["hidden"][first]["max_rel"] == pytest.approx(f["hidden_rel"])
    assert rep["explained"] and line.startswith("EXPLAINED"), line
    print(line)


def test_the_same_nudge_on_a_decided_router_flips_nothing():
    target, prompt, tokens, _, margins = _case()
    last = max(margins)  # no MoE layer below it: a non-flip here means no flip anywhere
    row = _argrow(margins, last, max)
    assert margins[last][row]["margin_rel"] > 4 * NEAR_TIE_REL
    with _variant("add_rmsnorm", _nudged_norm(target, last, row, margins[last][row])) as sel:
        rep, line = explain_divergence(target, prompt, tokens, None, sel)
    assert rep["layer"] is None and rep["flips"] == [] and not rep["explained"]
    assert rep["hidden"][last]["max_abs"] > 0 and all(
        v["max_abs"] == 0 for i, v in rep["hidden"].items() if i != last)
    assert line.startswith("NOT routing-driven") and f"at layer {last}" in line, line


def test_identical_runs_report_no_flip_and_no_difference():
    target, prompt, tokens, _, _ = _case()
    rep, line = explain_divergence(target, prompt, tokens, None, None, position=4)
    assert rep["row"] == len(prompt) + 3 and not rep["reproduced"] and rep["logit_diff"] == 0
    assert rep["flips"] == [] and all(v["max_abs"] == 0 for v in rep["hidden"].values())
    assert "NOT routing-driven" in line and "no routing differs" in line


def test_a_router_that_swaps_a_decided_expert_is_not_explained():
    target, prompt, tokens, _, margins = _case()
    first = min(margins)
    row = _argrow(margins, first, max)
    gate = target.model.layers[str(first)].mlp.gate.weight

    def swapped(h, gate_weight, bias, top_k, scaling):  # a kernel bug on one row of one layer
        ids, w = moe_route(h, gate_weight, bias, top_k, scaling)
        if gate_weight is gate and ids.shape[0] > row:
            ids = ids.clone()
            ids[row, -1] = next(e for e in range(bias.numel()) if e not in ids[row])
        return ids, w

    with _variant("moe_route", swapped) as sel:
        rep = first_discrete_divergence(target, prompt, tokens, None, sel)
        _, line = explain_divergence(target, prompt, tokens, None, sel)
    f = rep["flips"][0]
    assert rep["layer"] == first and f["row"] == row and f["hidden_rel"] == 0
    assert f["router_ok_a"] and not f["router_ok_b"]
    assert f["router_margin_rel"] > NEAR_TIE_REL and line.startswith("NOT explained"), line


def test_loop_schedules_replay_the_full_forward_bit_for_bit():
    # the reference ops are batch-invariant: AR steps and padded tree-like steps of a repeated
    # request see the same numbers as one forward: a schedule (fillers, batch) changes nothing
    target, prompt, tokens, full, _ = _case()
    seq, P = prompt + tokens, len(prompt)
    for chunks, pad, batch in ((loop_chunks(P, [1] * NEW, len(seq)), None, 1),
                               (loop_chunks(P, [3, 1, 4, 2, 5], len(seq)), 6, 3)):
        t = routing_trace(target, seq, None, chunks, pad, batch)
        assert torch.equal(t["logits"], full["logits"])
        for i in full["routing"]:
            assert torch.equal(t["routing"][i], full["routing"][i])
            assert torch.equal(t["hidden"][i], full["hidden"][i])


def test_loop_chunks_and_its_errors():
    assert loop_chunks(5, [1] * 10, 8) == [5, 1, 1, 1]
    assert loop_chunks(5, [3, 2, 4], 12) == [5, 3, 2, 2]
    with pytest.raises(ValueError, match="covers 7 of 9"):
        loop_chunks(5, [2], 9)
    target, prompt, tokens, _, _ = _case()
    with pytest.raises(ValueError, match="summing to"):
        routing_trace(target, prompt + tokens, None, [len(prompt)])


def test_explain_divergences_names_each_divergent_request():
    target, prompt, tokens, _, margins = _case()
    first = min(margins)
    row = _argrow(margins, first, min)
    got = list(tokens)
    got[6] = (got[6] + 1) % target.cfg.vocab_size  # a pretend divergence at position 6
    with _variant("add_rmsnorm", _nudged_norm(target, first, row, margins[first][row])) as sel:
        out = explain_divergences(target, [prompt, prompt], [tokens, tokens], [tokens, got],
                                  None, sel)
    assert len(out) == 1 and out[0][0]["request"] == 1 and out[0][0]["position"] == 6
    assert out[0][1].startswith("request 1: ")
    # the nudged row feeds position 6 only if it precedes it
    assert out[0][0]["explained"] == (row <= len(prompt) + 5)
    # requests=: only those (the ones another witness left unexplained) are replayed
    got2 = list(tokens)
    got2[3] = (got2[3] + 1) % target.cfg.vocab_size
    with _variant("add_rmsnorm", _nudged_norm(target, first, row, margins[first][row])) as sel:
        both = explain_divergences(target, [prompt] * 3, [tokens] * 3, [tokens, got, got2],
                                   None, sel)
        only = explain_divergences(target, [prompt] * 3, [tokens] * 3, [tokens, got, got2],
                                   None, sel, requests=[2])
    assert [(r["request"], r["position"]) for r, _ in both] == [(1, 6), (2, 3)]
    assert [(r["request"], r["position"]) for r, _ in only] == [(2, 3)]
    assert only[0][1] == both[1][1]


def test_run_a_traces_are_kept_across_calls(monkeypatch):
    # the exact suite compares six DDTree budgets against one AR run: with memo_a, run A's
    # teacher-forced trace (same sequence, same schedule) is computed once; the reports are
    # those of fresh traces, and another schedule is traced anew
    import workbench.dist.check as check

    target, prompt, tokens, _, margins = _case()
    first = min(margins)
    row = _argrow(margins, first, min)
    got = list(tokens)
    got[6] = (got[6] + 1) % target.cfg.vocab_size
    real, runs = check.routing_trace, []
    monkeypatch.setattr(check, "routing_trace",
                        lambda *a, **k: runs.append(a[2]) or real(*a, **k))
    memo: dict = {}
    with _variant("add_rmsnorm", _nudged_norm(target, first, row, margins[first][row])) as sel:
        fresh = explain_divergences(target, [prompt], [tokens], [got], None, sel)
        kept = [explain_divergences(target, [prompt], [tokens], [got], None, sel, memo_a=memo)
                for _ in range(2)]
        ar = loop_chunks(len(prompt), [1] * (len(prompt) + 7), len(prompt) + 7)
        other = explain_divergences(target, [prompt], [tokens], [got], None, sel,
                                    schedule=lambda b, n: {"chunks_a": ar}, memo_a=memo)
    assert runs == [None, sel] * 2 + [sel] + [None, sel]  # fresh, kept x2 (A once), other
    assert [r[1] for r in kept[0]] == [r[1] for r in kept[1]] == [r[1] for r in fresh]
    assert len(memo) == 2 and other[0][0]["explained"] == fresh[0][0]["explained"]


def test_logit_margin_is_the_argmax_gap_over_its_one_sigma_scale():
    target, prompt, tokens, trace, _ = _case()
    row = len(prompt) + 2  # predicts tokens[3]
    m = logit_margin(target, trace["final"][row])
    top2 = trace["logits"][row].topk(2)
    assert m["ids"] == tuple(top2.indices.tolist()) and m["ids"][0] == tokens[3]
    assert m["margin"] == pytest.approx(float(top2.values[0] - top2.values[1]), rel=1e-4)
    # margin_rel: the rms relative change of the normed row that closes the gap at 1 sigma;
    # moving every element by exactly that fraction, each against the gap, closes it more
    # than once (|.|_1 >= |.|_2 alignment), a random-sign move of it about once on average
    act = target.model.embed_tokens.weight.dtype
    h = rmsnorm(trace["final"][row].to(act), target.model.norm.weight,
                target.cfg.rms_norm_eps).to(ACC)
    W = target.lm_head.weight.to(ACC)
    g = W[m["ids"][0]] - W[m["ids"][1]]
    closed = float((h * g * torch.sign(h * g)).sum()) * m["margin_rel"]
    assert closed >= m["margin"] * (1 - 1e-9)


def _div(request, position, margin):
    return {"request": request, "position": position, "margin": margin}


def test_check_explained_passes_ties_and_reproduced_explanations_only():
    ref = [[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]]
    got = [[5, 6, 7], [5, 9, 7], [5, 6, 8], [4, 6, 7]]
    margins = [[1.0, 1.0, 1.0], [1.0, 0.001, 1.0], [1.0, 1.0, 0.5], [0.3, 1.0, 1.0]]
    rep = {"request": 2, "explained": True, "reproduced": True}
    found = check_explained(ref, got, margins, [(rep, "request 2: EXPLAINED (router near-tie): "
                                                 "x"), ({"request": 3, "explained": True,
                                                        "reproduced": True}, "request 3: "
                                                       "EXPLAINED (argmax near-tie): y")])
    assert [(d["request"], d["position"]) for d in found] == [(1, 1), (2, 2), (3, 0)]
    assert found[0]["why"].startswith("reference tie") and [d["why"] for d in found[1:]] == [
        "EXPLAINED (router near-tie)", "EXPLAINED (argmax near-tie)"]
    for bad in ({"explained": True, "reproduced": False}, {"explained": False,
                                                           "reproduced": True}):
        with pytest.raises(AssertionError, match="request 2 position 2"):
            check_explained(ref, got, margins, [({"request": 2, **bad}, "NOT explained: z")])
    with pytest.raises(AssertionError, match="no explanation"):  # a request nobody explained
        check_explained(ref, got, margins, [])
