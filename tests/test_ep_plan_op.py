"""The "ep_plan" op: one rank's expert-parallel exchange plan (reference/ep_plan.py) and
kernels/dense ep_plan_triton_v1 (the "engine" preset's), bitwise equal on every output.

Beyond equality with the reference, the plans of all W ranks must agree with each other: what
rank s sends to rank d (in send order) is exactly what d receives from s (in receive order),
and each sent element's `order` entry points back at it. The registry's EDGE cases run in
tests/test_equivalence.py (the engine preset's picks run by default); the `gpu` test takes
the REAL (kimi-k2.6, EP8) shapes.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.ep_routes import owned
from workbench.kernels.dense.ep_plan_triton_v1 import ep_plan as ep_plan_triton
from workbench.reference.ep_plan import ep_plan as ep_plan_ref

FIELDS = ("send_t", "order", "splits", "recv_t", "recv_e")


def _ids(T, K, n_experts, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = [torch.randperm(n_experts, generator=g)[:K] for _ in range(T)]
    return (torch.stack(rows) if rows else torch.empty(0, K, dtype=torch.int64)).to(device)


def test_engine_preset_runs_triton_v1():
    assert ops.PRESETS["engine"]["ep_plan"] == "triton_v1"
    assert "triton" in ops.op_spec("ep_plan").variant("triton_v1").needs


@pytest.mark.parametrize("T, K, world, tp, epg", [
    (1, 8, 8, 1, 48), (9, 8, 8, 1, 48), (17, 8, 8, 2, 24), (3, 4, 8, 1, 4), (65, 8, 8, 1, 48),
    (33, 8, 4, 4, 12), (130, 8, 8, 1, 48), (25, 3, 6, 3, 5)])
def test_every_rank_equals_the_reference_bitwise(T, K, world, tp, epg, device):
    # why: T below, at and above the world; tp 1 (EP), 2, 3, 4 (EP x TP); W not a power of 2
    ids = _ids(T, K, world // tp * epg, device, seed=T)
    for rank in range(world):
        want, got = ep_plan_ref(ids, rank, world, tp, epg), ep_plan_triton(ids, rank, world, tp,
                                                                          epg)
        for f in FIELDS:
            assert torch.equal(getattr(got, f), getattr(want, f)), (rank, f)


@pytest.mark.parametrize("variant", ["reference", "triton_v1"])
def test_the_ranks_plans_agree_with_each_other(variant, device):
    # why: what s sends to d is what d receives from s, row for row; the property the
    # all-to-all relies on, checked without trusting either implementation
    T, K, world, tp, epg = 23, 4, 4, 2, 5
    ids = _ids(T, K, world // tp * epg, device, seed=3)
    fn = ops.op_spec("ep_plan").variant(variant).load()
    plans = [fn(ids, r, world, tp, epg) for r in range(world)]
    for s, p in enumerate(plans):
        chunk, lo, hi = owned(T, s, world)
        sent = p.splits[0].tolist()
        assert sum(sent) == (hi - lo) * K * tp
        # order is the inverse of the send order: element e = (t - lo, j, i) sits at order[e]
        e = torch.arange((hi - lo) * K * tp, device=device)
        assert torch.equal(p.send_t[p.order], lo + e // (K * tp))
        start = 0
        for d, q in enumerate(plans):
            rows = p.send_t[start:start + sent[d]]
            start += sent[d]
            n_recv = q.splits[1].tolist()
            before = sum(n_recv[:s])
            got = q.recv_t[before:before + n_recv[s]]
            assert torch.equal(rows, got), (s, d)
            # and every such row's token has a pair routed to d's group
            assert bool(((ids[got] // epg) == d // tp).any(1).all()), (s, d)
        R = sum(p.splits[1].tolist())
        assert bool((p.recv_t[R:] == -1).all()) and bool((p.recv_e[R:] == -1).all())


def test_check_runs_the_edge_cases_bitwise(device):
    df = check("ep_plan", "triton_v1", shapes="edge", seeds=2, device=device)
    assert len(df) >= 7 and df["pass"].all(), failures(df)


def test_bad_arguments_raise_naming_the_argument(device):
    ids = _ids(4, 2, 8, device)
    with pytest.raises(ValueError, match=r"ids: expected int32 or int64"):
        ep_plan_triton(ids.float(), 0, 4, 1, 2)
    with pytest.raises(ValueError, match=r"ids: expected a \[T, K\] tensor"):
        ep_plan_triton(ids.flatten(), 0, 4, 1, 2)
    with pytest.raises(ValueError, match=r"tp: expected a divisor of world 4, got 3"):
        ep_plan_triton(ids, 0, 4, 3, 2)
    with pytest.raises(ValueError, match=r"rank: expected an int in \[0, 4\), got 4"):
        ep_plan_triton(ids, 4, 4, 1, 2)
    with pytest.raises(ValueError, match=r"ids: expected experts in \[0, 4\), got \[0, 7\]"):
        ep_plan_triton(ids, 0, 4, 2, 2, validate=True)


@pytest.mark.gpu
def test_real_shapes_match_the_reference():
    df = check("ep_plan", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
