"""kernels/dense swiglu_mlp_triton_v1 (the "engine" preset's shared expert / dense MLP) against
the float64 reference through workbench.check (NaN-filled allocations, dtype-derived
tolerance, inputs untouched), and against torch_bf16, whose roundings it repeats.

The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default); these add other dtypes and layouts. On CPU the kernel runs under the Triton
interpreter (conftest.py); the `gpu` test takes the REAL (kimi-k2.6) widths.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.swiglu_mlp_triton_v1 import silu_mul, swiglu_mlp
from workbench.kernels.dense.torch_bf16 import swiglu_mlp as swiglu_torch
from workbench.ops.case import Case


def _w(g, *s, dtype=torch.bfloat16):
    return (torch.randn(*s, generator=g, device=g.device) * s[-1] ** -0.5).to(dtype)


def test_engine_preset_runs_triton_v6_and_keeps_torch_bf16():
    # why: session 20 (H200, EP8 step, graph-replayed): v1's SiLU launch with its GEMMs on
    # linear triton_v5 (v4's swap-AB kernel for wide outputs, v3's rule for narrow ones)
    spec = ops.op_spec("swiglu_mlp")
    assert ops.PRESETS["engine"]["swiglu_mlp"] == "triton_v6"
    assert ops.PRESETS["engine"]["linear"] == "triton_v5"
    assert "torch_bf16" in spec.variants and "triton" in spec.variant("triton_v6").needs


def test_other_dtypes_and_layouts_match_the_reference(device):
    g = torch.Generator(device=device).manual_seed(7)
    D, Fw = 96, 40
    out = []
    for dt in (torch.float32, torch.float64):  # the dist proof path hands ACC partials
        args = (_w(g, 3, 5, D, dtype=dt) * 8, _w(g, Fw, D), _w(g, Fw, D), _w(g, D, Fw))
        out.append(Case("swiglu_mlp", f"{dt} x, bf16 weights", args,
                        dims={"rows": 15, "D": D, "F": Fw}, why="weights cast to x's dtype"))
    x = (_w(g, 4, 2 * D) * 8)[:, D:]  # row stride 2D: F.linear reads it in place
    out.append(Case("swiglu_mlp", "row-strided x", (x, _w(g, Fw, D), _w(g, Fw, D),
                                                     _w(g, D, Fw)),
                    dims={"rows": 4, "D": D, "F": Fw}, why="a column slice of a wider row"))
    df = check("swiglu_mlp", "triton_v1", cases=out)
    assert df["pass"].all(), failures(df)


def test_silu_mul_repeats_torch_bf16_roundings(device):
    # why: gate/up outputs are bf16 GEMM results; SiLU(g) * u in fp32 rounded once is what
    # torch_bf16 computes, so the two agree to within one bf16 ulp (Triton's exp differs)
    g = torch.Generator(device=device).manual_seed(1)
    a = (torch.randn(9, 300, generator=g, device=device) * 4).to(torch.bfloat16)
    b = torch.randn(9, 300, generator=g, device=device).to(torch.bfloat16)
    want = (torch.nn.functional.silu(a.float()) * b.float()).to(torch.bfloat16)
    got = silu_mul(a, b)
    assert got.dtype == torch.bfloat16 and got.shape == (9, 300)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    x = _w(g, 5, 64) * 8
    wts = (_w(g, 32, 64), _w(g, 32, 64), _w(g, 64, 32))
    torch.testing.assert_close(swiglu_mlp(x, *wts).float(), swiglu_torch(x, *wts).float(),
                               rtol=2**-6, atol=1e-3)


def test_empty_rows_and_bad_arguments(device):
    g = torch.Generator(device=device).manual_seed(2)
    wg, wu, wd = _w(g, 16, 32), _w(g, 16, 32), _w(g, 32, 16)
    assert swiglu_mlp(torch.empty(0, 32, dtype=torch.bfloat16, device=device), wg, wu,
                      wd).shape == (0, 32)
    x = _w(g, 3, 32)
    with pytest.raises(ValueError, match=r"up: expected \(16, 32\) \(gate's shape\), got"):
        swiglu_mlp(x, wg, wu[:8], wd)
    with pytest.raises(ValueError, match=r"down: expected \(32, 16\), got \(16, 32\)"):
        swiglu_mlp(x, wg, wu, wd.t())
    with pytest.raises(ValueError, match=r"gate: expected \[F, 32\]"):
        swiglu_mlp(x, wg[:, :8], wu, wd)


@pytest.mark.gpu
def test_real_widths_match_the_reference():
    df = check("swiglu_mlp", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)


def test_stacked_gate_up_take_one_gemm_and_agree(device):
    # why: when up follows gate in one buffer (workbench.dist.model.stacked_weight) the op
    # runs one [M, 2F] GEMM; the result must match the two-GEMM path
    from workbench.kernels.dense.torch_bf16 import adjacent

    g = torch.Generator(device=device).manual_seed(4)
    gu, wd = _w(g, 2 * 24, 64), _w(g, 64, 24)
    gate, up = gu[:24], gu[24:]
    assert adjacent(gate, up) and not adjacent(up, gate)
    assert not adjacent(gate.clone(), up.clone())
    x = _w(g, 7, 64) * 8
    torch.testing.assert_close(swiglu_mlp(x, gate, up, wd).float(),
                               swiglu_mlp(x, gate.clone(), up.clone(), wd).float(),
                               rtol=2**-7, atol=1e-5)


@pytest.mark.parametrize("variant", ["triton_v2", "triton_v3", "triton_v4", "triton_v5",
                                     "triton_v6"])  # on linear v1-v5
def test_on_the_skinny_linears_matches_the_reference(device, variant):
    df = check("swiglu_mlp", variant, shapes="edge", seeds=1, device=device)
    assert df["pass"].all(), failures(df)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton_v2", "triton_v3", "triton_v4", "triton_v5",
                                     "triton_v6"])
def test_on_the_skinny_linears_real_widths_match_the_reference(variant):
    df = check("swiglu_mlp", variant, shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
