"""workbench.route_trace: the real loops' MoE routing at one (request, position), compared.

Tiny preset, CPU, reference kernels (the optimized ones run ~3 min per pair through the Triton
interpreter: the GPU command is in the module docstring). A ReplayDrafter (workbench/replay.py)
makes DDTree accept multi-token paths, so rows below a tree's root are traced, not only roots.
"""

import math

import pandas as pd
import pytest
import torch

from workbench.generate import generate
from workbench.ops import registry
from workbench.replay import ReplayDrafter, record_continuations
from workbench.route_trace import (
    NEAR_TIE_REL,
    ROUNDING_REL,
    RouteTrace,
    build_trace,
    compare_traces,
    recording,
    trace_pair,
    trace_run,
)
from workbench.shadow import exact_prompts, main, shadow

NEW, BUDGET, C = 6, 4, 3


@pytest.fixture(scope="module")
def setup():
    import workbench

    target = workbench.build_model("tiny", seed=0)
    prompts = exact_prompts(C, target.cfg.vocab_size, seed=C)
    return target, prompts, record_continuations(target, prompts, NEW)


def _drafter(setup, seed=0):  # fresh: a ReplayDrafter's generator advances with each run
    target, _, seqs = setup
    return ReplayDrafter(target.cfg, seqs, seed=seed)


def _below_root(tr: RouteTrace) -> list[int]:
    """Decode rows that sat below their tree's root (node > 0)."""
    return [r for r, (s, n) in enumerate(tr.where) if s >= 0 and n > 0]


def test_reference_loops_route_identically(setup):
    """The reference ops accumulate in float64 and round once, so a row's result does not
    depend on the rows sharing its launch (AR: one row a request; verify: budget + 1) or on the
    masked keys: measured bitwise equal on every traced row, so asserted exactly."""
    target, prompts, _ = setup
    ar, dd = trace_pair(target, _drafter(setup), prompts, 1, NEW - 1, NEW, BUDGET)
    assert _below_root(dd), dd.where  # the mapping below the root is exercised
    assert ar.layers == dd.layers == [i for i in range(target.cfg.num_layers)
                                      if target.cfg.is_moe_layer(i)]
    for i in ar.layers:
        assert torch.equal(ar.ids[i], dd.ids[i]) and torch.equal(ar.hidden[i], dd.hidden[i])
    assert torch.equal(ar.final, dd.final) and torch.equal(ar.top2, dd.top2)
    rep, table, line = compare_traces(ar, dd, target)
    assert table["ids_equal"].all() and (table["hidden_rel"] == 0).all()
    assert rep["layer"] is None and rep["explained"] is None
    assert line.startswith("NO DIVERGENCE") and "no routing differs" in line
    assert len(table) == (ar.row + 1) * (len(ar.layers) + 1)
    assert registry._WRAP.get() is None


def test_ddtree_rows_map_to_the_ar_rows(setup):
    """The traced DDTree node of each position has AR's MoE input there exactly (first MoE
    layer: tiny's layer 0 is dense), and another node of the same verify forward does not: the
    equality is the mapping's, not a constant. A wrong path fails the mapping's self-check."""
    target, prompts, _ = setup
    ar = trace_run(target, None, prompts, 2, NEW - 1, NEW)
    with recording(target, 2, C) as rec:
        res = generate(target, _drafter(setup), prompts, NEW, budget=BUDGET)
    dd = build_trace(rec, res, prompts[2], NEW - 1)
    first = dd.layers[0]
    rows = _below_root(dd)
    assert rows, dd.where
    for r in range(dd.row + 1):
        assert torch.equal(dd.hidden[first][r], ar.hidden[first][r]), r
    # the same step's root row (node 0) is another row of the sequence: it differs
    r = rows[0]
    s, n = dd.where[r]
    got = rec.of[2]
    n_pre = len(got.final) - len(res.steps)
    root = got.moe[(n_pre + s) * len(dd.layers)][1][0].float()
    assert not torch.equal(root, ar.hidden[first][r])
    path = got.walks[s]["path"]
    path[path.index(n)] = 0  # a wrong path: the root where node n was accepted
    with pytest.raises(RuntimeError, match=r"step \d+ node 0 .* expected"):
        build_trace(rec, res, prompts[2], NEW - 1)


def test_it_works_inside_a_shadow_and_with_a_dflash_drafter(setup):
    """A DFlash drafter calls lm_head with the target's weight: only the call after the final
    norm is the target's logits (the argmax self-check would fail otherwise)."""
    from workbench.reference.drafter import build_drafter

    target, prompts, _ = setup
    with shadow("tree_mla") as sh:
        dd = trace_run(target, build_drafter(target.cfg, seed=0), prompts, 0, 3, 4, BUDGET)
    assert sh.records and sh.summary()["pass"].all() and dd.row == len(prompts[0]) + 2


# -- the comparison rule on synthetic traces ---------------------------------------------------
P, POS, D = 2, 1, 8  # rows 0..2: two prompt rows, the row predicting position 1
LAYERS = [1, 2]


def _trace(mode="ar", ids=None, hidden=None, margin_rel=0.5, argmax=5, lrel=0.5,
           final=None) -> RouteTrace:
    R = P + POS
    g = torch.Generator().manual_seed(0)
    h = {i: torch.randn(R, D, generator=g) for i in LAYERS} if hidden is None else hidden
    ids = {i: torch.tensor([[0, 1]] * R) for i in LAYERS} if ids is None else ids
    mr = {i: torch.full((R,), margin_rel, dtype=torch.float64) for i in LAYERS}
    return RouteTrace(
        mode=mode, request=0, position=POS, prompt_len=P, seq=[3, 4, 5, argmax],
        tokens=[5, argmax], where=[(-1, 0), (-1, 1), (0, 0)], layers=LAYERS, ids=ids, hidden=h,
        margin={i: m * 0.01 for i, m in mr.items()}, margin_rel=mr,
        ref_ids={i: v.clone() for i, v in ids.items()},
        pair={i: torch.tensor([[1, 2]] * R) for i in LAYERS},
        final=torch.ones(R, D) if final is None else final,
        argmax=torch.tensor([4, 5, argmax]), top2=torch.tensor([[2.0, 1.0]] * R),
        top2_ids=torch.tensor([[argmax, 7]] * R), logit_margin_rel=lrel)


def _flipped(base: RouteTrace, layer: int, row: int, scale: float = 1.0, **kw) -> RouteTrace:
    """A DDTree trace: base's inputs scaled by `scale` from `layer` on, ids [0, 2] at (layer,
    row), argmax 6."""
    ids = {i: v.clone() for i, v in base.ids.items()}
    ids[layer][row] = torch.tensor([0, 2])
    hid = {i: v * (scale if i >= layer else 1.0) for i, v in base.hidden.items()}
    return _trace("ddtree", ids=ids, hidden=hid, argmax=6, **kw)


def test_a_flip_on_a_near_tie_through_rounding_is_explained():
    a = _trace(margin_rel=NEAR_TIE_REL / 2)
    b = _flipped(a, 2, P + POS - 1, scale=1 + ROUNDING_REL / 4, margin_rel=NEAR_TIE_REL / 2)
    rep, table, line = compare_traces(a, b)
    assert rep["explained"] is True and rep["layer"] == 2 and rep["reproduced"]
    (f,) = rep["flips"]
    assert f["row"] == 2 and f["position"] == 1 and f["ids_a"] == [0, 1] and f["ids_b"] == [0, 2]
    assert math.isclose(f["hidden_rel"], ROUNDING_REL / 4, rel_tol=1e-6)
    assert line.startswith("EXPLAINED (router near-tie)") and "first routing flip at layer 2" \
        in line
    pred = table[table["predicting"]].set_index("layer")
    assert list(pred["ids_equal"]) == [True, False, False]  # layers 1, 2 and the argmax


def test_a_flip_on_a_decided_router_is_not_explained():
    a = _trace(margin_rel=4 * NEAR_TIE_REL)
    b = _flipped(a, 1, 0, scale=1 + ROUNDING_REL / 4)
    rep, _, line = compare_traces(a, b)
    assert rep["explained"] is False and rep["layer"] == 1
    assert line.startswith("NOT explained (kernel?)") and "row 0 (position -1" in line


def test_a_flip_behind_a_large_input_difference_is_not_explained():
    a = _trace(margin_rel=NEAR_TIE_REL / 2)
    b = _flipped(a, 1, 2, scale=1 + 4 * ROUNDING_REL, margin_rel=NEAR_TIE_REL / 2)
    rep, _, line = compare_traces(a, b)
    assert rep["explained"] is False and line.startswith("NOT explained")


def test_the_first_flipped_layer_is_found_layer_major():
    """A flip at layer 1 on a prompt row comes before one at layer 2 on the predicting row."""
    a = _trace(margin_rel=NEAR_TIE_REL / 2)
    b = _flipped(a, 2, 2, margin_rel=NEAR_TIE_REL / 2)
    b.ids[1][0] = torch.tensor([1, 3])
    rep, _, _ = compare_traces(a, b)
    assert rep["layer"] == 1 and [f["row"] for f in rep["flips"]] == [0]


def test_no_flip_says_no_routing_differs():
    a = _trace()
    rep, _, line = compare_traces(a, _trace("ddtree"))
    assert rep["layer"] is None and "no routing differs" in line and line.startswith("NO DIV")
    # another argmax without a flip: the argmax rule (near-tie, rounding-level inputs)
    tie = _trace(lrel=NEAR_TIE_REL / 2)
    rep, _, line = compare_traces(tie, _trace("ddtree", argmax=6))
    assert rep["explained"] is True and line.startswith("EXPLAINED (argmax near-tie)")
    assert "no routing differs" in line
    rep, _, line = compare_traces(a, _trace("ddtree", argmax=6))
    assert rep["explained"] is False and line.startswith("NOT routing-driven, NOT explained")


def test_traces_that_differ_before_the_row_are_refused():
    a, b = _trace(), _trace("ddtree")
    b.seq[P] = 9  # position 0 already differs
    with pytest.raises(ValueError, match=r"position: expected <= 0 .*first divergence.*got 1"):
        compare_traces(a, b)


@pytest.mark.slow  # > 20 s in the interpreter: scheduled first (conftest)
def test_kernel_loop_against_the_reference_loop(setup):
    """kernels_a: run A is the reference AR loop, run B the AR loop with one op on a kernel
    (int4_moe's test_decode_token_exact_small_gpu witness); on tiny the two loops agree."""
    from workbench import ops
    from workbench.kernels.int4_moe import register

    register()
    best = ops.resolve_selection("optimized")["int4_moe"]  # PORTABLE where BEST cannot run
    target, prompts, seqs = setup
    seen = []  # the int4_moe variant each MoE call ran (an outer wrapper sees every call)

    def spy(name, fn):
        if name == "int4_moe":
            seen.append(ops.selected(name))
        return fn

    with registry.wrapping(spy):
        ref, got = trace_pair(target, None, prompts, 1, 2, 3, None,
                              kernels={"int4_moe": best}, kernels_a=None)
    n = len(seen) // 2
    assert seen == ["reference"] * n + [best] * n and n > 0
    assert ref.seq == seqs[1][: len(ref.seq)]  # the reference loop's own tokens
    rep, _, line = compare_traces(ref, got, target, names=("reference", "kernel"))
    assert rep["explained"] is None and line.startswith("NO DIVERGENCE")
    assert "real loops emit reference" in line and " vs kernel " in line


def test_an_ar_trace_serves_every_budget(setup, monkeypatch):
    """The AR loop does not depend on the budget, so the exact suite traces it once per
    (request, position) and hands it to every budget's pair (explain_in_real_loops' ar_traces):
    the pair then runs only the DDTree loop, and compares as with a fresh AR trace."""
    import workbench.route_trace as rt
    from workbench.dist.check import explain_in_real_loops, reference_margins

    target, prompts, seqs = setup
    ar, dd = trace_pair(target, _drafter(setup), prompts, 1, NEW - 1, NEW, BUDGET)
    runs = []  # each traced loop's budget
    real_loop = rt._traced_loop
    monkeypatch.setattr(rt, "_traced_loop", lambda *a, **k: runs.append(a[5]) or real_loop(*a, **k))
    ar2, dd2 = trace_pair(target, _drafter(setup), prompts, 1, NEW - 1, NEW, BUDGET,
                          ar_trace=ar)
    assert ar2 is ar and runs == [BUDGET]  # the DDTree loop only
    assert torch.equal(dd2.final, dd.final) and dd2.where == dd.where
    assert compare_traces(ar2, dd2, target)[2] == compare_traces(ar, dd, target)[2]
    with pytest.raises(ValueError, match=r"ar_trace: expected the AR trace of request 2 "
                                         r"position 1 .* got \('ar', 1, 5"):
        trace_pair(target, _drafter(setup), prompts, 2, 1, NEW, BUDGET, ar_trace=ar)
    with pytest.raises(ValueError, match="ar_trace: expected .* got \\('ddtree'"):
        trace_pair(target, _drafter(setup), prompts, 1, NEW - 1, NEW, BUDGET, ar_trace=dd)

    # explain_in_real_loops fills the dict on the first budget and reads it on the next: a
    # made-up divergence (request 0, position 2; the loops emit the reference tokens, so it is
    # traced, then "not reproduced") costs one AR loop for both budgets
    ref = [s[len(p):] for s, p in zip(seqs, prompts)]
    got = [list(r) for r in ref]
    got[0][2] = (got[0][2] + 1) % target.cfg.vocab_size
    margins = reference_margins(target, prompts, ref)
    cache, runs[:] = {}, []
    first = explain_in_real_loops(target, _drafter(setup), prompts, ref, got, [], BUDGET, None,
                                  NEW, margins=margins, ar_traces=cache)
    second = explain_in_real_loops(target, _drafter(setup), prompts, ref, got, [], BUDGET + 2,
                                   None, NEW, margins=margins, ar_traces=cache)
    assert list(cache) == [(0, 2)] and cache[(0, 2)].mode == "ar"
    assert runs == [None, BUDGET, BUDGET + 2]  # AR once, then each budget's DDTree loop
    assert [r["request"] for r, _ in first] == [r["request"] for r, _ in second] == [0]
    assert not first[0][0]["reproduced"] and "not reproduced" in first[0][1]


def test_one_loop_a_side_traces_every_watched_request(setup, monkeypatch):
    """The exact suite's C 32 cases have 6-15 divergent requests: trace_pairs records all of
    them in one AR and one DDTree loop, each trace equal to that request's own trace_pair;
    a request whose rows cannot map (here: a position past a stop token) fails alone."""
    import workbench.route_trace as rt
    from workbench.route_trace import trace_pairs

    target, prompts, seqs = setup
    runs = []
    real_loop = rt._traced_loop
    monkeypatch.setattr(rt, "_traced_loop", lambda *a, **k: runs.append(a[5]) or real_loop(*a, **k))
    watch = {2: NEW - 2, 0: NEW - 1, 1: 2}
    cache: dict = {}
    pairs = trace_pairs(target, _drafter(setup), prompts, watch, NEW, BUDGET, ar_traces=cache)
    assert runs == [None, BUDGET] and sorted(pairs) == [0, 1, 2]
    assert sorted(cache) == sorted(watch.items())
    for b, n in watch.items():
        one = trace_pair(target, _drafter(setup), prompts, b, n, NEW, BUDGET)
        for got, want in zip(pairs[b], one):
            assert (got.mode, got.request, got.position, got.where, got.seq) == (
                want.mode, b, n, want.where, want.seq)
            for i in want.layers:
                assert torch.equal(got.hidden[i], want.hidden[i])
                assert torch.equal(got.ids[i], want.ids[i])
            assert torch.equal(got.final, want.final) and torch.equal(got.top2, want.top2)
            assert got.hidden[want.layers[0]].dtype == torch.float32
    runs.clear()
    again = trace_pairs(target, _drafter(setup), prompts, watch, NEW, BUDGET, ar_traces=cache)
    assert runs == [BUDGET] and all(again[b][0] is cache[(b, n)] for b, n in watch.items())

    stop = seqs[1][len(prompts[1]) + 1]  # request 1's second token stops it
    ok = [b for b in (0, 2) if stop not in seqs[b][len(prompts[b]):len(prompts[b]) + 4]]
    failed: dict = {}
    out = trace_pairs(target, _drafter(setup), prompts, {1: 3, **{b: 3 for b in ok}}, NEW,
                      BUDGET, stop_tokens=[stop], failed=failed)
    assert list(failed) == [1] and isinstance(failed[1], ValueError)
    assert "position: expected < 2" in str(failed[1]) and sorted(out) == ok
    with pytest.raises(ValueError, match="position: expected < 2"):
        trace_pairs(target, _drafter(setup), prompts, {1: 3}, NEW, BUDGET, stop_tokens=[stop])
    with pytest.raises(ValueError, match="request: expected one of the recorded requests"):
        with recording(target, (0, 1), C) as rec:
            res = generate(target, None, prompts, 2)
        build_trace(rec, res, prompts[0], 1)


def test_replay_drafter_restarts_its_draws_every_loop(setup):
    """A routing trace re-runs a divergent DDTree loop with the same ReplayDrafter: the loop
    must see the same trees (so the same verify batches) as the run it explains."""
    target, prompts, _ = setup
    d = _drafter(setup)
    runs = [generate(target, d, prompts, max_new_tokens=NEW, budget=BUDGET) for _ in range(2)]
    assert runs[0].accepted == runs[1].accepted and max(runs[0].accepted) >= 2


# -- bad input ---------------------------------------------------------------------------------
def test_bad_request_and_position_name_argument_expected_and_got(setup):
    target, prompts, _ = setup
    with pytest.raises(ValueError, match=r"request: expected an index in \[0, 3\).*got 5"):
        trace_pair(target, _drafter(setup), prompts, 5, 1, NEW, BUDGET)
    with pytest.raises(ValueError, match=r"request: expected an index in \[0, 3\).*got -1"):
        trace_run(target, None, prompts, -1, 1, NEW)
    with pytest.raises(ValueError, match=rf"position: expected an index in \[0, {NEW}\).*got 9"):
        trace_pair(target, _drafter(setup), prompts, 1, 9, NEW, BUDGET)
    # fewer tokens than max_new_tokens (a stop token): checked against what was generated
    stop = setup[2][1][len(prompts[1]) + 1]  # request 1's second token stops it
    with pytest.raises(ValueError, match=r"position: expected < 2 \(tokens generated for "
                                         r"request 1 in the ar loop\), got 3"):
        trace_run(target, None, prompts, 1, 3, NEW, stop_tokens=[stop])
    with pytest.raises(ValueError, match="budget: expected a DDTree budget"):
        trace_pair(target, None, prompts, 1, 1, NEW, None)
    assert registry._WRAP.get() is None


def test_cli_route_trace_prints_the_table_and_writes_the_csv(tmp_path, capsys):
    out = tmp_path / "rt.csv"
    rc = main(["--preset", "tiny", "--kernels", "reference", "--batch", "3", "--budget", "4",
               "--max-new-tokens", "4", "--device", "cpu", "--route-trace", "1:3",
               "--csv", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "route trace, request 1 position 3" in text and "NO DIVERGENCE" in text
    df = pd.read_csv(out)
    assert {"row", "position", "layer", "ids_ar", "ids_dd", "ids_equal", "gap_ar", "gap_rel_ar",
            "gap_dd", "gap_rel_dd", "hidden_rel"} <= set(df)
    assert df["ids_equal"].all() and (df["hidden_rel"] == 0).all()


@pytest.mark.parametrize("args, msg", [
    (["--route-trace", "1:x", "--budget", "4"], "route-trace: expected REQ:POS"),
    (["--route-trace", "1:2"], "route-trace: expected --budget"),
    (["--route-trace", "1:9", "--budget", "4"], "position: expected an index in [0, 4)"),
])
def test_cli_route_trace_bad_input(args, msg, capsys):
    assert main(["--preset", "tiny", "--kernels", "reference", "--batch", "3",
                 "--max-new-tokens", "4", "--device", "cpu", *args]) == 2
    assert msg in capsys.readouterr().err


def test_exact_rule_takes_a_real_loop_witness_only_when_it_watched_the_divergence(setup):
    """check.explain_in_real_loops (the exact suite's second witness): a divergence the traced
    real loops do not emit (here: a forged DDTree token; the reference loops agree bitwise) is
    not reproduced, so check_explained still rejects it; a request without a divergence gets
    no trace at all."""
    from workbench.dist.check import check_explained, explain_in_real_loops

    target, prompts, _ = setup
    ar = generate(target, None, prompts, NEW).tokens
    forged = [list(t) for t in ar]
    pos = 2
    forged[1][pos] = (forged[1][pos] + 1) % target.cfg.vocab_size
    reports = explain_in_real_loops(target, _drafter(setup), prompts, ar, forged, [], BUDGET,
                                    None, NEW)
    assert [rep["request"] for rep, _ in reports] == [1]
    rep, line = reports[0]
    assert rep["witness"] == "real-loop trace" and not rep["reproduced"], line
    assert "not reproduced" in line
    margins = [[1.0] * len(t) for t in ar]  # decided everywhere: only an explanation passes
    with pytest.raises(AssertionError, match="request 1 position 2"):
        check_explained(ar, forged, margins, reports)
    margins[1][pos] = 0.001  # a reference tie passes anyway: no trace is run for it
    assert explain_in_real_loops(target, _drafter(setup), prompts, ar, forged, [], BUDGET, None,
                                 NEW, margins=margins) == []


def test_assert_tokens_explained_is_the_exact_rule_in_one_call(setup):
    """check.assert_tokens_explained (tests/test_generate.py's DDTree == AR under graphs, the
    int4_moe decode-loop test): equal tokens pass at once; a forged divergence the real loops
    do not emit is traced, logged and rejected."""
    from workbench.dist.check import assert_tokens_explained

    target, prompts, _ = setup
    ar = generate(target, None, prompts, NEW).tokens
    assert assert_tokens_explained(target, _drafter(setup), prompts, ar, ar, BUDGET, None,
                                   NEW) == []
    forged = [list(t) for t in ar]
    forged[2][1] = (forged[2][1] + 1) % target.cfg.vocab_size
    lines = []
    with pytest.raises(AssertionError, match="request 2 position 1"):
        assert_tokens_explained(target, _drafter(setup), prompts, ar, forged, BUDGET, None, NEW,
                                log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("request 2: real-loop trace") \
        and "not reproduced" in lines[0]
