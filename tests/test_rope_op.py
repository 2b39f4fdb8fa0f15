"""The "rope" op: its reference is Rope.apply bit for bit (the token-exact CPU suite does not
move), and kernels/dense rope_triton_v1 (the "engine" preset's) matches it within the
dtype-derived tolerance through workbench.check (NaN-filled allocations, inputs untouched).

The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default). On CPU the kernel runs under the Triton interpreter (conftest.py), where it is
bitwise (no FMA contraction); the `gpu` test takes the REAL (kimi-k2.6) shapes.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.rope_triton_v1 import rope as rope_triton
from workbench.ops.case import Case
from workbench.reference.rope import Rope
from workbench.reference.rope import rope as rope_ref

T = 97  # table rows: positions draw from [0, T)


def _rope(dim: int, interleaved: bool, device) -> Rope:
    r = Rope(dim, 50000.0, 32.0, 4096, 32.0, 1.0, interleaved=interleaved)  # YaRN ramp active
    r.reserve(T, device)
    return r


def test_engine_preset_runs_triton_v2_and_optimized_keeps_the_reference():
    assert ops.PRESETS["engine"]["rope"] == "triton_v2"  # session 18: v1's kernel, 4 rows a program
    assert "triton" in ops.op_spec("rope").variant("triton_v2").needs
    assert "rope" not in ops.PRESETS["optimized"]  # FMA-contracted on the GPU: engine only


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "rotate-half"])
@pytest.mark.parametrize("heads", [0, 3], ids=["no-heads", "heads"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_reference_op_is_rope_apply_bit_for_bit(interleaved, heads, dtype, device):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(2, 7, *((heads,) if heads else ()), 64, generator=g, device=device).to(dtype)
    pos = torch.randint(0, T, (2, 7), generator=g, device=device)
    r = _rope(64, interleaved, device)
    want = r.apply(x, pos)
    assert torch.equal(rope_ref(x, pos, r.table(device), interleaved), want)
    # the table-less Rope.apply (a Rope never reserved) gives the same bits (reserve's claim)
    bare = Rope(64, 50000.0, 32.0, 4096, 32.0, 1.0, interleaved=interleaved)
    assert torch.equal(bare.apply(x, pos), want)


def _cases(device) -> list[Case]:
    """Input dtypes and layouts beyond the registry's EDGE cases (bf16 there)."""
    g = torch.Generator(device=device).manual_seed(3)
    r = _rope(64, True, device)
    pos = torch.randint(0, T, (3, 5), generator=g, device=device)

    def case(x, label, why, interleaved=True, p=pos):
        dims = dict(rows=p.numel(), H=x.shape[-2] if x.dim() == p.dim() + 2 else 1, R=64)
        return Case("rope", label, (x, p, r.table(device), interleaved), dims=dims, why=why)

    out = [case(torch.randn(3, 5, 2, 64, generator=g, device=device).to(dt), f"{dt}",
                f"{dt} in -> {dt} out, fp32 math") for dt in (torch.float16, torch.float32,
                                                                torch.float64)]
    x = torch.randn(5, 3, 4, 64, generator=g, device=device).to(torch.bfloat16)
    out.append(case(x.transpose(0, 1), "[3,5,4,64] transposed",
                    "leading dims that do not flatten to one row stride (copied)"))
    x = torch.randn(3, 4, 5, 64, generator=g, device=device).to(torch.bfloat16)
    out.append(case(x.transpose(1, 2), "heads-major", "H stride > row stride (read in place)",
                    interleaved=False))
    x = torch.randn(3, 5, 128, generator=g, device=device).to(torch.bfloat16)
    out.append(case(x[..., ::2], "stride-2 R", "non-unit stride along R"))
    e = torch.empty(2, 0, dtype=torch.int64, device=device)
    out.append(case(torch.randn(2, 0, 3, 64, device=device).to(torch.bfloat16), "N=0",
                    "no rows: no launch, an empty result", p=e))
    return out


@pytest.mark.parametrize("variant", ["triton_v1", "triton_v2"])
def test_other_dtypes_and_layouts_match_the_reference(variant, device):
    df = check("rope", variant, cases=_cases(device))
    assert df["pass"].all(), failures(df)


@pytest.mark.parametrize("rows, heads", [(1, 0), (3, 0), (5, 3), (9, 8), (17, 8)])
def test_v2_is_v1_bit_for_bit(rows, heads, device):
    # why: triton_v2 only changes the rows a program (4 instead of 32): the same per-element
    # fp32 math, so v1's bits at row counts inside, at and past a program's boundary
    v1 = ops.op_spec("rope").variant("triton_v1").load()
    v2 = ops.op_spec("rope").variant("triton_v2").load()
    r = _rope(64, True, device)
    g = torch.Generator(device=device).manual_seed(rows * 10 + heads)
    shape = (2, rows, heads, 64) if heads else (2, rows, 64)
    x = torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)
    pos = torch.randint(0, T, (2, rows), generator=g, device=device)
    y2 = v2(x, pos, r.table(device), True)
    assert not y2.isnan().any()
    assert torch.equal(y2, v1(x, pos, r.table(device), True))


def test_out_of_range_positions_give_nan_rows_or_raise_with_validate(device):
    r = _rope(64, True, device)
    x = torch.randn(1, 4, 2, 64, device=device).to(torch.bfloat16)
    pos = torch.tensor([[0, T, -1, T - 1]], device=device)
    y = rope_triton(x, pos, r.table(device), True)  # no sync: bad rows are NaN, no table read
    assert y[0, [1, 2]].isnan().all() and not y[0, [0, 3]].isnan().any()
    with pytest.raises(ValueError, match=rf"positions: expected values in \[0, {T}\)"):
        rope_triton(x, pos, r.table(device), True, validate=True)
    ok = pos.clamp(0, T - 1)
    assert torch.equal(rope_triton(x, ok, r.table(device), True, validate=True),
                       rope_ref(x, ok, r.table(device), True))


def test_bad_arguments_raise_naming_the_argument(device):
    r = _rope(64, True, device)
    tab = r.table(device)
    x = torch.randn(2, 3, 64, device=device)
    pos = torch.zeros(2, 3, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"table: expected the \[n, R\] fp32 cos\|sin table"):
        rope_triton(x, pos, None, True)
    with pytest.raises(ValueError, match=r"table: expected shape \[n, 32\], got \(97, 64\)"):
        rope_triton(x[..., :32], pos, tab, True)
    with pytest.raises(ValueError, match=r"table: expected float32"):
        rope_triton(x, pos, tab.double(), True)
    with pytest.raises(ValueError, match=r"positions: expected an int32 or int64 tensor"):
        rope_triton(x, pos.float(), tab, True)
    with pytest.raises(ValueError, match=r"positions: expected x's leading shape \(2, 3\)"):
        rope_triton(x, pos[:1], tab, True)  # Rope.apply would broadcast; the op does not
    with pytest.raises(ValueError, match=r"x: expected an even last dim"):
        rope_triton(x[..., :63], pos, tab[:, :63], True)
    with pytest.raises(ValueError, match=r"rope table: none reserved on cpu"):
        Rope(64, 50000.0, 1.0, 4096, 32.0, 1.0).table("cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton_v1", "triton_v2"])
def test_real_shapes_match_the_reference(variant):
    df = check("rope", variant, shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)


@pytest.mark.parametrize("variant", ["reference", "triton_v1", "triton_v2"])
def test_out_writes_the_models_q_buffer_in_place(variant, device):
    # why: the model writes rope(q_pe) into qq[..., C:] of its [B, N, H, C+R] query buffer, so
    # no cat follows; the values must be the no-out call's, and nothing outside the view moves
    fn = ops.op_spec("rope").variant(variant).load()
    r = _rope(64, True, device)
    g = torch.Generator(device=device).manual_seed(9)
    q = torch.randn(2, 5, 3, 32 + 64, generator=g, device=device).to(torch.bfloat16)
    pos = torch.randint(0, T, (2, 5), generator=g, device=device)
    qq = torch.full((2, 5, 3, 40 + 64), float("nan"), dtype=torch.bfloat16, device=device)
    got = fn(q[..., 32:], pos, r.table(device), True, out=qq[..., 40:])
    assert got.data_ptr() == qq[..., 40:].data_ptr()
    assert torch.equal(qq[..., 40:], fn(q[..., 32:], pos, r.table(device), True))
    assert bool(qq[..., :40].isnan().all())
    if variant != "reference":
        with pytest.raises(ValueError, match=r"out: expected a \(2, 5, 3, 64\) torch.bfloat16"):
            fn(q[..., 32:], pos, r.table(device), True, out=qq[..., 40:].float())
