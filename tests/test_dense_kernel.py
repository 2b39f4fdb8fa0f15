"""kernels/dense triton_v1 (rmsnorm) against the float64 reference, through workbench.check.

The checker NaN-fills every allocation (an unwritten output element shows as NaN), applies the
dtype-derived tolerance of cases.tolerance and checks that the inputs were not touched. The
registry's EDGE cases (one row, D prime, 3-d, stride-2 columns, zero/huge rows) run in
tests/test_equivalence.py (the engine preset's picks run by default); these are the other
dtypes and layouts. On CPU the kernel runs under the Triton interpreter (conftest.py); the
`gpu` test takes the REAL (kimi-k2.6) widths.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.rmsnorm_triton_v2 import rmsnorm as rmsnorm_v2
from workbench.kernels.dense.torch_bf16 import rmsnorm as rmsnorm_torch
from workbench.kernels.dense.triton_v1 import rmsnorm
from workbench.ops.case import Case

EPS = 1e-6


def test_engine_preset_runs_triton_v2_and_keeps_torch_bf16():
    spec = ops.op_spec("rmsnorm")
    assert ops.PRESETS["engine"]["rmsnorm"] == "triton_v2"  # session 18: 4 warps below D 2048
    assert "torch_bf16" in spec.variants and "triton" in spec.variant("triton_v1").needs
    assert "rmsnorm" not in ops.PRESETS["optimized"]  # not token-exact: engine only


def _cases(device) -> list[Case]:
    """The other input dtypes and layouts the model and the dist proof path hand the op."""
    g = torch.Generator(device=device).manual_seed(3)

    def randn(*s):
        return torch.randn(*s, generator=g, device=device)

    out = []
    for dt in (torch.float16, torch.float32, torch.float64):  # bf16: the EDGE cases
        w = (1 + 0.05 * randn(67)).to(dt)
        out.append(Case("rmsnorm", f"{dt} [3,5,67]", (randn(3, 5, 67).to(dt), w, EPS),
                        dims={"rows": 15, "D": 67}, why=f"{dt} in -> {dt} out, fp32 math"))
    w = (1 + 0.05 * randn(96)).to(torch.bfloat16)
    x = randn(3, 4, 96).to(torch.bfloat16).transpose(0, 1)  # [4, 3, 96]: rows do not flatten
    out.append(Case("rmsnorm", "[4,3,96] transposed", (x, w, EPS), dims={"rows": 12, "D": 96},
                    why="leading dims that do not flatten to one row stride"))
    x = randn(7, 2 * 96).to(torch.bfloat16)[:, 96:]  # unit columns, row stride 192
    out.append(Case("rmsnorm", "row-strided [7,96]", (x, w, EPS), dims={"rows": 7, "D": 96},
                    why="a column slice: rows 2D apart, read in place"))
    out.append(Case("rmsnorm", "fp32 weight", (randn(5, 96).to(torch.bfloat16), w.float(), EPS),
                    dims={"rows": 5, "D": 96}, why="weight dtype != x dtype"))
    return out


@pytest.mark.parametrize("variant", ["triton_v1", "triton_v2"])
def test_other_dtypes_and_layouts_match_the_reference(variant, device):
    df = check("rmsnorm", variant, cases=_cases(device))
    assert df["pass"].all(), failures(df)


# v2 (4 warps below D 2048) at widths on both sides of its switch: q_a's 1536 and 2048
@pytest.mark.parametrize("fn, D", [(rmsnorm, 67), (rmsnorm_v2, 67), (rmsnorm_v2, 1536),
                                   (rmsnorm_v2, 2048)], ids=["v1", "v2", "v2-1536", "v2-2048"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_rows_are_batch_invariant_and_close_to_torch_bf16(dtype, fn, D, device):
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(9, D, generator=g, device=device).to(dtype)
    w = torch.randn(D, generator=g, device=device).to(dtype)
    y = fn(x, w, EPS)
    assert y.dtype == dtype and y.shape == x.shape
    for i in (0, 4, 8):  # a row alone gives the same bits as within the batch
        assert torch.equal(fn(x[i : i + 1], w, EPS), y[i : i + 1])
    # the same fp32 math as torch_bf16 in another order: bf16 outputs at most one rounding
    # apart; fp32/float64 outputs carry the fp32 differences themselves (sum order ~sqrt(D) u
    # on rsqrt, 3 roundings of x * r * w on each side: measured <= 2.1 eps_fp32, bound 4)
    ref = rmsnorm_torch(x, w, EPS).double()
    # (the sum-order term grows as sqrt(D): the bound is scaled from the D = 67 measurement)
    tol = torch.finfo(torch.bfloat16).eps if dtype == torch.bfloat16 else \
        4 * torch.finfo(torch.float32).eps * max(1.0, (D / 67) ** 0.5)
    assert ((y.double() - ref).abs() <= tol * ref.abs()).all()


def test_empty_rows(device):
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    y = rmsnorm(x, torch.ones(64, dtype=torch.bfloat16, device=device), EPS)
    assert y.shape == (0, 64) and y.dtype == torch.bfloat16


def test_bad_arguments_raise_naming_the_argument(device):
    w = torch.ones(8, device=device)
    with pytest.raises(ValueError, match=r"x: expected one of .*got torch.int32"):
        rmsnorm(torch.ones(2, 8, dtype=torch.int32, device=device), w, EPS)
    with pytest.raises(ValueError, match=r"weight: expected shape \(8,\), got \(9,\)"):
        rmsnorm(torch.ones(2, 8, device=device), torch.ones(9, device=device), EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton_v1", "triton_v2"])
def test_real_widths_match_the_reference(variant):
    df = check("rmsnorm", variant, shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
