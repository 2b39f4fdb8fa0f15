"""kernels/dense linear_triton_v1 (the skinny decode GEMM) against the float64 reference through
workbench.check (NaN-filled output, dtype-derived tolerance, inputs untouched): the registry's
EDGE cases here (it is not in a preset yet, so tests/test_equivalence.py's default run does not
take it), the dispatch rule (> 64 rows or non-bf16/fp16 inputs: torch_bf16's cuBLAS GEMM),
and, on the GPU, the REAL widths (single GPU and an EP8 rank's) and per-row batch invariance.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense import linear_triton_v1 as lt
from workbench.kernels.dense.torch_bf16 import linear as linear_torch


def test_registered_with_its_dispatch_described():
    v = ops.op_spec("linear").variant("triton_v1")
    assert "triton" in v.needs and "torch_bf16" in v.description


def test_edge_cases_match_the_reference(device):
    df = check("linear", "triton_v1", shapes="edge", seeds=2, device=device)
    assert len(df) >= 8 and df["pass"].all(), failures(df)


@pytest.mark.parametrize("M, N, K", [(1, 40, 24), (17, 2112, 96), (64, 33, 300)])
def test_tiles_cover_every_row_and_column(M, N, K):
    BM, BN, BK = lt.tiles(M, N, K)
    assert BM >= min(M, lt.MAX_ROWS) and BM in (16, 32, 64) and 16 <= BN <= 128
    assert BK >= 16 and (BK >= K or BK == 256)
    if N >= 2 * lt.SMS * 16:  # wide outputs keep at least one program per SM
        assert -(-N // BN) >= lt.SMS


def test_more_rows_and_wide_inputs_take_cublas(device, monkeypatch):
    calls = []
    monkeypatch.setattr(lt.torch_bf16, "linear", lambda x, w: calls.append(x.shape) or
                        linear_torch(x, w))
    w = torch.randn(8, 32, device=device).to(torch.bfloat16)
    lt.linear(torch.randn(65, 32, device=device).to(torch.bfloat16), w)  # > 64 rows
    lt.linear(torch.randn(3, 32, device=device, dtype=torch.float64), w)  # ACC rows
    assert calls == [(65, 32), (3, 32)]
    lt.linear(torch.randn(64, 32, device=device).to(torch.bfloat16), w)  # the kernel's
    assert len(calls) == 2


def test_bad_arguments_raise_naming_the_argument(device):
    x = torch.randn(3, 32, device=device).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"weight: expected \[N, 32\], got \(8, 31\)"):
        lt.linear(x, torch.zeros(8, 31, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"x: expected a float tensor"):
        lt.linear(x.int(), torch.zeros(8, 32, device=device))


@pytest.mark.gpu
def test_real_widths_match_the_reference():
    df = check("linear", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)


@pytest.mark.gpu
def test_a_rows_result_does_not_depend_on_the_row_count():
    # why: no split-K and a fixed K order: row 0 alone equals row 0 among 17 or 64 rows
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 7168, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(2112, 7168, generator=g, device="cuda") * 7168**-0.5).to(torch.bfloat16)
    one = lt.linear(x[:1], w)
    for m in (9, 17, 33, 64):
        assert torch.equal(lt.linear(x[:m], w)[:1], one), m
