"""The "ep_combine" op: the EP owner's weighted slot sum of what came back (reference/ep_plan.py,
float64, the single-process combine's order) and kernels/dense ep_combine_triton_v1 (the
"engine" preset's, fp32) within the dtype-derived tolerance through workbench.check
(NaN-filled allocations: the padding rows must be written as zeros, inputs untouched).

The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default); the `gpu` test takes the REAL (kimi-k2.6, EP8) widths.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.ep_combine_triton_v1 import ep_combine
from workbench.reference.ep_plan import ep_combine as ep_combine_ref
from workbench.reference.ep_plan import ep_plan


def test_engine_preset_runs_triton_v1():
    assert ops.PRESETS["engine"]["ep_combine"] == "triton_v1"
    assert "triton" in ops.op_spec("ep_combine").variant("triton_v1").needs


@pytest.mark.parametrize("tp", [1, 2])
def test_plan_then_combine_is_the_slot_order_weighted_sum(tp, device):
    # why: with the plan's own order, what the owner gets back must combine into
    # sum_j w[t, j] * (sum_i y[t, j, i]) for each owned token, padding rows zero; written
    # out without the plan's machinery (rows indexed by (t, j, i) directly)
    g = torch.Generator(device="cpu").manual_seed(tp)
    T, K, world, epg, D = 7, 3, 4, 3, 40
    ids = torch.stack([torch.randperm(world // tp * epg, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g).to(device)
    y = torch.randn(T, K, tp, D, generator=g).to(torch.bfloat16).to(device)  # (t, j, i) rows
    rank = 1
    plan = ep_plan(ids.to(device), rank, world, tp, epg)
    chunk, lo, hi = 2, 2, 4  # ceil(7 / 4) = 2 rows per rank: rank 1 owns tokens 2, 3
    back = torch.empty(hi - lo, K, tp, D, dtype=torch.bfloat16, device=device).view(-1, D)
    back[plan.order] = y[lo:hi].reshape(-1, D)  # arrivals in send order
    want = (w[lo:hi, :, None].double() * y[lo:hi].double().sum(2)).sum(1)
    for fn in (ep_combine_ref, ep_combine):
        out = fn(back, plan.order, w[lo:hi], chunk, tp, torch.bfloat16)
        assert out.shape == (chunk, D) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), want, rtol=2**-7, atol=1e-5)
    padded = ep_combine(back, plan.order, w[lo:hi], 4, tp, torch.bfloat16)
    assert torch.equal(padded[2:], torch.zeros_like(padded[2:]))


def test_check_runs_the_edge_cases(device):
    df = check("ep_combine", "triton_v1", shapes="edge", seeds=2, device=device)
    assert len(df) >= 5 and df["pass"].all(), failures(df)


def test_bad_arguments_raise_naming_the_argument(device):
    back = torch.zeros(12, 8, dtype=torch.bfloat16, device=device)
    order = torch.arange(12, device=device)
    w = torch.ones(3, 4, device=device)
    with pytest.raises(ValueError, match=r"back: expected 24 rows \(Tm 3 x K 4 x tp 2\)"):
        ep_combine(back, order, w, 3, 2, torch.bfloat16)
    with pytest.raises(ValueError, match=r"chunk: expected an int >= Tm \(3\), got 2"):
        ep_combine(back, order, w, 2, 1, torch.bfloat16)
    with pytest.raises(ValueError, match=r"order: expected int \[12\]"):
        ep_combine(back, order[:5], w, 3, 1, torch.bfloat16)
    with pytest.raises(ValueError, match=r"back: expected a \[S, D\] tensor of one of"):
        ep_combine(back.double(), order, w, 3, 1, torch.bfloat16)  # ACC: the reference's job
    with pytest.raises(ValueError, match=r"order: expected send positions in \[0, 12\)"):
        ep_combine(back, order + 1, w, 3, 1, torch.bfloat16, validate=True)


@pytest.mark.gpu
def test_real_widths_match_the_reference():
    df = check("ep_combine", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
