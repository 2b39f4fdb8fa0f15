"""Knob variants in the benchmark harness (`workbench/bench_knobs.py`): `variant@KNOB=VALUE`
rows timed beside their variant on the same case inputs, checked against the reference, and
malformed or knob-less specs refused by name."""

import math

import pytest
import torch
from test_bench import quick  # noqa: F401  (fixture)

from workbench import bench as B
from workbench import bench_knobs
from workbench.ops.case import Case
from workbench.ops.registry import OpSpec, Variant


def _scaled(x, y, alpha=1.0, *, cfg=None):
    """x + alpha y, wrong by cfg's BAD (a knob that breaks the result) and slowed by REPS."""
    cfg = cfg or {}
    out = x + alpha * y
    for _ in range(cfg.get("REPS", 0)):
        out = out * 1.0
    return out + cfg.get("BAD", 0)


def _spec():
    spec = OpSpec("axpy_k", "x + a y with knobs")
    spec.add(Variant("reference", lambda x, y, alpha=1.0: x + alpha * y))
    spec.add(Variant("knobbed", _scaled))
    spec.add(Variant("plain", lambda x, y, alpha=1.0: x + alpha * y))
    spec.roofline = lambda c: {"bytes": 3 * 4 * c.args[0].numel(), "flops": 2 * c.args[0].numel()}
    return spec


def _case():
    return [Case("axpy_k", "n=256", (torch.randn(256), torch.randn(256)), {"alpha": 2.0})]


def test_split_reads_knobs_and_refuses_malformed_lists_by_name():
    assert bench_knobs.split("cuda_v28") == ("cuda_v28", {})
    assert bench_knobs.split("cuda_v28@TB1=4+PF1=2") == ("cuda_v28", {"TB1": 4, "PF1": 2})
    assert bench_knobs.split("v@X=0.5") == ("v", {"X": 0.5})
    for bad in ("v@", "v@TB1", "v@=4", "v@TB1=4+TB1=5", "v@TB1=4+"):
        with pytest.raises(ValueError, match=r"variants: expected v@KNOB=VALUE"):
            bench_knobs.split(bad)
    with pytest.raises(ValueError, match=r"variants: expected knob values that are numbers .*"
                                         r"got 'four'"):
        bench_knobs.split("v@TB1=four")


def test_with_knobs_merges_over_the_calls_cfg_and_needs_a_cfg_keyword():
    seen = []

    def f(x, *, cfg=None):
        seen.append(cfg)
        return x

    g = bench_knobs.with_knobs(f, {"TB1": 4}, "f@TB1=4")
    g(1)
    g(1, cfg={"TB1": 3, "WT": 8})  # the knob wins, the call's other knobs stay
    assert seen == [{"TB1": 4}, {"TB1": 4, "WT": 8}]
    assert bench_knobs.with_knobs(f, {}, "f") is f
    with pytest.raises(ValueError, match=r"variants: expected a variant whose function takes "
                                         r"cfg= for 'g@TB1=4'"):
        bench_knobs.with_knobs(lambda x: x, {"TB1": 4}, "g@TB1=4")


def test_bench_times_knob_variants_beside_their_variant(quick):  # noqa: F811
    # why: a knob's A/B must run on the bench's own case inputs, in its interleaved rounds,
    # and a knob that breaks the result must fail the check (not be timed)
    df = B.bench(_spec(), variants="reference,knobbed,knobbed@REPS=3,knobbed@BAD=1",
                 peers="none", cases=_case(), device="cpu", save=False, max_seconds=1,
                 rounds=2)
    by = {r.variant: r for r in df.itertuples()}
    assert by["knobbed"].ok and by["knobbed@REPS=3"].ok and by["knobbed@REPS=3"].us > 0
    assert by["knobbed@REPS=3"].kind == "variant"
    assert by["knobbed@BAD=1"].ok is False and math.isnan(by["knobbed@BAD=1"].us)


def test_bench_refuses_unknown_and_knobless_variants_by_name(quick):  # noqa: F811
    with pytest.raises(Exception, match=r"unknown variants of 'axpy_k' \['nope'\]"):
        B.bench(_spec(), variants="nope@TB1=4", cases=_case(), device="cpu", save=False)
    df = B.bench(_spec(), variants="plain@TB1=4", peers="none", cases=_case(), device="cpu",
                 save=False, max_seconds=1)
    row = df[df["variant"] == "plain@TB1=4"].iloc[0]
    assert not bool(row["ok"]) and math.isnan(row["us"])
    assert "variants: expected a variant whose function takes cfg=" in row["note"]
