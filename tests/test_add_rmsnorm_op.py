"""The "add_rmsnorm" op: the residual add and the next RMSNorm. Its reference is the model's
former two steps (a bf16 add, the reference rmsnorm); kernels/dense add_rmsnorm_triton_v1
(the "engine" preset's) gives h bitwise and y within the dtype-derived tolerance, through
workbench.check (NaN-filled outputs, inputs untouched).

The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default); the `gpu` test takes the REAL (kimi-k2.6) width.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.add_rmsnorm_triton_v1 import add_rmsnorm
from workbench.kernels.dense.triton_v1 import rmsnorm as rmsnorm_triton
from workbench.reference.layers import add_rmsnorm as add_rmsnorm_ref
from workbench.reference.layers import rmsnorm

EPS = 1e-6


def _rows(device, *shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*shape, generator=g, device=device).mul(s).to(dtype) for s in (1, 3)]


def test_engine_preset_runs_triton_v1_and_optimized_keeps_the_reference():
    assert ops.PRESETS["engine"]["add_rmsnorm"] == "triton_v1"
    assert "add_rmsnorm" not in ops.PRESETS["optimized"]  # fp32 norm: engine only


def test_reference_is_the_models_add_then_norm(device):
    x, r = _rows(device, 3, 5, 64)
    w = torch.rand(64, device=device).to(torch.bfloat16) + 0.5
    h, y = add_rmsnorm_ref(x, r, w, EPS)
    assert torch.equal(h, x + r) and torch.equal(y, rmsnorm(x + r, w, EPS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_h_is_bitwise_the_add_and_y_the_engine_norm(dtype, device):
    # why: h is the residual stream itself (rounded once, as torch's add); y must be what the
    # engine's one-kernel RMSNorm gives for that h (same fp32 math)
    x, r = _rows(device, 9, 96, dtype=dtype, seed=1)
    w = torch.rand(96, device=device).to(torch.bfloat16) + 0.5
    h, y = add_rmsnorm(x, r, w, EPS)
    assert h.dtype == y.dtype == dtype and torch.equal(h, x + r)
    torch.testing.assert_close(y, rmsnorm_triton(x + r, w, EPS), rtol=2**-7, atol=1e-6)


def test_bad_arguments_raise_naming_the_argument(device):
    x, r = _rows(device, 2, 32)
    w = torch.ones(32, device=device)
    with pytest.raises(ValueError, match=r"r: expected \(2, 32\) torch.bfloat16 \(x's shape"):
        add_rmsnorm(x, r[:1], w, EPS)
    with pytest.raises(ValueError, match=r"r: expected .*\(x's shape and dtype\)"):
        add_rmsnorm(x, r.float(), w, EPS)
    with pytest.raises(ValueError, match=r"weight: expected a float tensor of shape \(32,\)"):
        add_rmsnorm(x, r, torch.ones(31, device=device), EPS)
    with pytest.raises(ValueError, match=r"x: expected a tensor of one of"):
        add_rmsnorm(x.double(), r.double(), w, EPS)


@pytest.mark.gpu
def test_real_width_matches_the_reference():
    df = check("add_rmsnorm", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
