"""kernels/dense moe_route_triton_v1 (the "engine" preset's router), moe_route_triton_v2 (the
router in one launch up to 32 rows) and moe_route_triton_v3 (v2's GEMM, v1's selection) against
the float64 reference (reference/moe_route.py),
through workbench.check and with explicit tie tables.

The checker NaN-fills every allocation, compares ids exactly (moe_route has no `ranked` ties
band) and weights within the dtype-derived tolerance, and checks the inputs are untouched.
The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default). On CPU the kernel runs under the Triton interpreter (conftest.py); the `gpu` test
takes the REAL (kimi-k2.6) widths.

Choices are set through the bias: h = 0 makes every score sigmoid(0) = 0.5 exactly (on both
sides), so choice = 0.5 + bias is known to the bit and ties are exact.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.config import ModelConfig
from workbench.kernels.dense import moe_route_triton_v1, moe_route_triton_v2, moe_route_triton_v3
from workbench.kernels.dense.linear_triton_v2 import counters
from workbench.kernels.dense.moe_route_triton_v1 import MAX_E
from workbench.kernels.dense.torch_bf16 import moe_route as moe_route_torch
from workbench.ops.case import Case
from workbench.reference.moe_route import moe_route as moe_route_ref

SCALING = 2.827  # kimi-k2.6's routed_scaling_factor; any positive value will do
ROUTE = {"triton_v1": moe_route_triton_v1.moe_route, "triton_v2": moe_route_triton_v2.moe_route,
         "triton_v3": moe_route_triton_v3.moe_route}


@pytest.fixture(params=list(ROUTE))
def version(request):
    return request.param


def _route(T, D, E, device, seed=0, bias_std=0.02):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(T, D, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(E, D, generator=g, device=device) * D**-0.5).to(torch.bfloat16)
    return h, w, bias_std * torch.randn(E, generator=g, device=device)


def _tied(bias: list[float], device, T=2):
    """Zero h: every score is 0.5, so choice = 0.5 + bias exactly (see the module docstring)."""
    E = len(bias)
    return (torch.zeros(T, 16, dtype=torch.bfloat16, device=device),
            torch.randn(E, 16, device=device).to(torch.bfloat16),
            torch.tensor(bias, dtype=torch.float32, device=device))


def test_engine_preset_runs_triton_v1_and_keeps_torch_bf16():
    spec = ops.op_spec("moe_route")
    assert ops.PRESETS["engine"]["moe_route"] == "triton_v1"
    assert "torch_bf16" in spec.variants and "triton" in spec.variant("triton_v1").needs
    assert "moe_route" not in ops.PRESETS["optimized"]  # not bitwise: engine only


def test_ids_equal_the_reference_where_margins_are_clear(device, version):
    # why: E = 384, K = 8 as Kimi, D small for the interpreter; the precondition makes sure no
    # two of the top K + 1 choices lie within 1e-6 (fp32 sigmoid/GEMM differences are ~1e-7)
    moe_route = ROUTE[version]
    h, w, b = _route(24, 64, 384, device, seed=5)
    want_ids, want_w = moe_route_ref(h, w, b, 8, SCALING)
    s = torch.sigmoid(torch.nn.functional.linear(h.double(), w.double())).float() + b
    top = s.sort(-1, descending=True).values[:, :9]
    assert (top[:, :-1] - top[:, 1:]).min() > 1e-6
    ids, wts = moe_route(h, w, b, 8, SCALING)
    assert ids.dtype == torch.int64 and wts.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(wts, want_w, rtol=8 * torch.finfo(torch.float32).eps, atol=0)
    # and torch_bf16 (the engine's previous router) picks the same experts
    assert torch.equal(ids, moe_route_torch(h, w, b, 8, SCALING)[0])


# (bias per expert, K, the expected ids): choice = 0.5 + bias
TIES = [
    ([0.0, 0.1, 0.1, -0.1, 0.1], 3, [1, 2, 4]),  # equal maxima: ascending expert index
    ([0.1, 0.0, 0.2, 0.0, 0.0, 0.2], 4, [2, 5, 0, 1]),  # ties at two levels, K cuts a tie group
    ([-0.5, 0.0, -0.5, -0.5], 3, [1, 0, 2]),  # choice exactly +0.0 ties among itself
    ([0.0] * 9, 9, list(range(9))),  # K = E all tied: the identity order
    ([float("nan"), 0.3, float("nan"), 0.0], 3, [0, 2, 1]),  # NaN first (torch's sort), in range
]


@pytest.mark.parametrize("bias, k, want", TIES, ids=["max-tie", "two-levels", "zero-tie",
                                                     "all-tied", "nan-bias"])
def test_tie_tables_lowest_index_first(bias, k, want, device, version):
    moe_route = ROUTE[version]
    h, w, b = _tied(bias, device)
    ids, wts = moe_route(h, w, b, k, SCALING)
    assert ids.tolist() == [want] * h.shape[0]
    assert torch.equal(ids, moe_route_ref(h, w, b, k, SCALING)[0])
    # every score is 0.5 (the bias only selects): the weights split the scaling evenly
    assert torch.allclose(wts, torch.full_like(wts, SCALING / k), rtol=1e-6, atol=0)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # interpreter
def test_signed_zero_choices_tie(device, version):
    # why: choice = s + bias with s = sigmoid(-200) = 0 (fp32 underflow on both sides) and a
    # bias of -0.0 or +0.0: the IEEE sum is +0.0 either way, and a -0.0 choice cannot arise
    # (s >= +0); the lowest index must win whatever the bias zero's sign
    moe_route = ROUTE[version]
    E = 6
    h = torch.ones(3, 1, dtype=torch.bfloat16, device=device)
    w = torch.full((E, 1), -200.0, dtype=torch.bfloat16, device=device)
    b = torch.tensor([-0.0, 0.0, -0.0, 0.0, -0.0, 0.0], device=device)
    ids, wts = moe_route(h, w, b, 4, SCALING)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    assert torch.equal(ids, moe_route_ref(h, w, b, 4, SCALING)[0])
    assert torch.equal(wts, torch.zeros_like(wts))  # 0 / (0 + 1e-20): no NaN


def test_empty_batch_and_extreme_k(device, version):
    moe_route = ROUTE[version]
    h, w, b = _route(0, 32, 13, device)
    ids, wts = moe_route(h, w, b, 4, SCALING)  # T = 0: no launch
    assert ids.shape == (0, 4) and ids.dtype == torch.int64 and wts.shape == (0, 4)
    h, w, b = _route(5, 32, 13, device, seed=1)
    for k in (1, 13):  # K = 1 (one round), K = E (the full stable order)
        want_ids, want_w = moe_route_ref(h, w, b, k, SCALING)
        ids, wts = moe_route(h, w, b, k, SCALING)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(wts, want_w, rtol=8 * torch.finfo(torch.float32).eps, atol=0)
    h, w, b = _route(3, 32, 1, device, seed=2)  # E = 1: BLOCK_E = 1
    ids, wts = moe_route(h, w, b, 1, SCALING)
    assert ids.tolist() == [[0]] * 3
    torch.testing.assert_close(wts, torch.full_like(wts, SCALING))


def test_other_layouts_and_dtypes_match_the_reference(device, version):
    h, w, b = _route(7, 2 * 64, 16, device, seed=3)
    cases = [
        Case("moe_route", "column slice h", (h[:, 64:], w[:, 64:].contiguous(), b, 4, SCALING),
             dims=dict(T=7, D=64, E=16, K=4), why="h rows 2D apart, read in place by the GEMM"),
        Case("moe_route", "fp32 h", (h.float(), w.float(), b, 4, SCALING),
             dims=dict(T=7, D=128, E=16, K=4), why="fp32 inputs (the dist proof path)"),
        Case("moe_route", "bf16 bias", (h, w, b.to(torch.bfloat16), 4, SCALING),
             dims=dict(T=7, D=128, E=16, K=4), why="bias dtype != fp32: upcast once"),
    ]
    df = check("moe_route", version, cases=cases)
    assert df["pass"].all(), failures(df)


def test_bad_arguments_raise_naming_the_argument(device, version):
    moe_route = ROUTE[version]
    h, w, b = _route(2, 16, 8, device)
    with pytest.raises(ValueError, match=r"top_k: expected an int in \[1, 8\] \(E\), got 0"):
        moe_route(h, w, b, 0, SCALING)
    with pytest.raises(ValueError, match=r"top_k: expected an int in \[1, 8\] \(E\), got 9"):
        moe_route(h, w, b, 9, SCALING)
    with pytest.raises(ValueError, match=r"bias: expected a floating tensor of shape \(8,\)"):
        moe_route(h, w, b[:7], 2, SCALING)
    with pytest.raises(ValueError, match=r"gate_weight: expected a floating tensor \[E, 16\]"):
        moe_route(h, w[:, :8], b, 2, SCALING)
    with pytest.raises(ValueError, match=r"h: expected a floating tensor \[T, D\]"):
        moe_route(h[None], w, b, 2, SCALING)
    big = MAX_E + 1
    with pytest.raises(ValueError, match=rf"gate_weight: expected 1 <= E <= {MAX_E}.*{big}"):
        moe_route(h, torch.zeros(big, 16, dtype=h.dtype, device=device),
                  torch.zeros(big, device=device), 2, SCALING)


@pytest.mark.parametrize("T", [1, 17, 40])  # 40: triton_v2 / v3 hand rows past MAX_T to v1
def test_local_ids_are_the_ranks_view_of_the_same_ids(T, device, version):
    # why: the EP-local step takes the router's third output instead of gathering local ids
    # (reference rule 5); every EP8 rank's range of E = 64 experts (K = 8: several ranks a
    # row, some rows none here), the first and last experts of the range included
    moe_route = ROUTE[version]
    h, w, b = _route(T, 64, 64, device, seed=T)
    ids, wts = moe_route(h, w, b, 8, SCALING)
    for first in range(0, 64, 8):
        got_ids, got_w, loc = moe_route(h, w, b, 8, SCALING, local_experts=(first, 8))
        assert torch.equal(got_ids, ids) and torch.equal(got_w, wts)  # the same routing
        here = (ids >= first) & (ids < first + 8)
        assert loc.dtype == torch.int64 and loc.shape == ids.shape
        assert torch.equal(loc, torch.where(here, ids - first, -1))
        r_ids, _, r_loc = moe_route_ref(h, w, b, 8, SCALING, local_experts=(first, 8))
        r_here = (r_ids >= first) & (r_ids < first + 8)  # the reference keeps the rule too
        assert torch.equal(r_loc, torch.where(r_here, r_ids - first, -1))
    if T == 17:  # a range of one expert, and the whole of E
        assert torch.equal(moe_route(h, w, b, 8, SCALING, local_experts=(0, 64))[2], ids)
        one = moe_route(h, w, b, 8, SCALING, local_experts=(63, 1))[2]
        assert torch.equal(one, torch.where(ids == 63, 0, -1))
    h0, w0, b0 = _route(0, 64, 64, device)
    empty = moe_route(h0, w0, b0, 8, SCALING, local_experts=(8, 8))
    assert len(empty) == 3 and empty[2].shape == (0, 8) and empty[2].dtype == torch.int64


@pytest.mark.parametrize("bad", [(-1, 4), (0, 0), (6, 3), (1.0, 2), [0, 4], (0, 4, 1), (True, 2)])
def test_bad_local_experts_raise_naming_the_argument(bad, device, version):
    h, w, b = _route(2, 16, 8, device)
    with pytest.raises(ValueError, match=r"local_experts: expected None or a tuple \(first, n\)"):
        ROUTE[version](h, w, b, 2, SCALING, local_experts=bad)


NEAR_TIE = 2e-6  # choice units: the fp32 router GEMM's error on a logit (~1e-6 over D 7168
# bf16 products) times the sigmoid's slope (<= 1/4), with 8x to spare


@pytest.mark.gpu
def test_real_widths_match_the_reference_up_to_near_ties(version):
    """REAL widths on the GPU: ids equal the float64 reference's except where the reference's
    own choices sit within NEAR_TIE of its K/K+1 boundary (H200, session 7: T 544 seed 0 row
    324, margin 4.8e-7: torch_bf16, the fp32 GEMM path, picks the same other expert there);
    weights within 1e-5 wherever the ids agree; and torch_bf16's ids on every row where the
    logits are its cuBLAS GEMM's (triton_v1; triton_v2 above MAX_T rows)."""
    moe_route = ROUTE[version]
    cfg = ModelConfig.preset("kimi-k2.6")
    D, E, K, sc = cfg.hidden_size, cfg.n_routed_experts, cfg.n_experts_per_tok, \
        cfg.routed_scaling_factor
    rows = near = 0
    for seed in (0, 1):
        for T in (1, 17, 544):  # one token, a 16-node tree + bonus, a 32-request batch of them
            h, w, b = _route(T, D, E, "cuda", seed=seed)
            ids, wt = moe_route(h, w, b, K, sc)
            ids_r, wt_r = moe_route_ref(h, w, b, K, sc)
            if version == "triton_v1" or T > moe_route_triton_v2.MAX_T:  # cuBLAS's logits
                assert torch.equal(ids, moe_route_torch(h, w, b, K, sc)[0]), (seed, T)
            choice = torch.sigmoid(h.double() @ w.double().t()).float() + b  # the reference's
            same = (ids == ids_r).all(1)
            torch.testing.assert_close(wt[same], wt_r[same], rtol=1e-5, atol=1e-5)
            for r in (~same).nonzero().flatten().tolist():
                edge = torch.sort(choice[r], descending=True, stable=True).values[K - 1]
                swapped = set(ids[r].tolist()) ^ set(ids_r[r].tolist())
                gaps = [abs(choice[r, e].item() - edge.item()) for e in swapped]
                assert max(gaps) <= NEAR_TIE, (seed, T, r, sorted(swapped), gaps)
                near += 1
            rows += T
    assert near <= rows // 100  # near-ties are rare: the comparison is not vacuous


@pytest.mark.parametrize("T, D", [(1, 1024), (17, 1024), (32, 512), (9, 200)])
def test_v2_one_launch_is_deterministic_and_resets_its_counters(T, D, device):
    # why: triton_v2's logits are K-slice partials summed by whichever slice arrives last, in
    # slice order, and its top-k by whichever expert tile arrives last: two calls must agree
    # bit for bit, match the reference's ids (clear margins checked), and leave every ticket
    # counter at zero for the next launch or graph replay (D 200: a slice ends mid-step)
    E, K = 384, 8
    t = moe_route_triton_v2.tiles(T, E, D)
    assert t["SPLIT"] > 1 or D == 200
    h, w, b = _route(T, D, E, device, seed=T)
    s = torch.sigmoid(torch.nn.functional.linear(h.double(), w.double())).float() + b
    top = s.sort(-1, descending=True).values[:, : K + 1]
    assert (top[:, :-1] - top[:, 1:]).min() > 1e-6
    want_ids, want_w = moe_route_ref(h, w, b, K, SCALING)
    ids, wts = moe_route_triton_v2.moe_route(h, w, b, K, SCALING)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(wts, want_w, rtol=1e-5, atol=1e-6)
    again = moe_route_triton_v2.moe_route(h, w, b, K, SCALING)
    assert torch.equal(again[0], ids) and torch.equal(again[1], wts)
    assert int(counters(h.device, E // t["BN"] + 1, pool="moe_route").abs().sum()) == 0


def test_v2_runs_triton_v1_past_32_rows_and_for_fp32(device):
    # why: the one-launch top-k runs in one program, so more rows (and fp32 inputs, which its
    # bf16 MMA cannot take) go to triton_v1: a documented dispatch with v1's bits
    for T, dt in ((moe_route_triton_v2.MAX_T + 1, torch.bfloat16), (3, torch.float32)):
        h, w, b = _route(T, 64, 40, device, seed=T)
        h, w = h.to(dt), w.to(dt)
        got = moe_route_triton_v2.moe_route(h, w, b, 6, SCALING)
        want = moe_route_triton_v1.moe_route(h, w, b, 6, SCALING)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_v2_compiles_for_sm90_without_spills():
    # why: the one-launch router must fit its GEMM, the slice sum and the top-k in one program
    # without spilling, with its MMAs and its four ticket atomics (two takes, two resets)
    from sm90_compile import compile_sm90

    for r in compile_sm90("from workbench.kernels.dense import moe_route_triton_v2 as v; "
                          "out = [v.sm90_report(T, 384, 7168) for T in (1, 17, 32)]"):
        assert r["spill"] == "0" and int(r["regs"]) <= 255, r
        assert r["mma"] > 0 and r["atom"] == 4 and r["split"] == 8, r


@pytest.mark.parametrize("T", [1, 17, moe_route_triton_v2.MAX_T + 1])
def test_v3_is_v1s_selection_on_v2s_logits(T, device):
    # why: v3 composes two measured pieces: v2's GEMM phases (logits summed in slice order) at
    # 32-expert tiles, then v1's selection kernel; past MAX_T rows it is v1's launch
    h, w, b = _route(T, 512, 384, device, seed=300 + T)
    ids, wts = moe_route_triton_v3.moe_route(h, w, b, 8, SCALING)
    if T <= moe_route_triton_v2.MAX_T:
        logits = moe_route_triton_v2.launch(h, w, b, 8, SCALING, moe_route_triton_v3.GEMM_TILES,
                                            topk=False)[2]
        want = moe_route_triton_v1.select(logits, b, 8, SCALING)
    else:
        want = moe_route_triton_v1.moe_route(h, w, b, 8, SCALING)
    assert torch.equal(ids, want[0]) and torch.equal(wts, want[1])
