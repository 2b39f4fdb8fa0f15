"""The absorbed-MLA projections' `out=` / layout contracts the model relies on: mla_q_absorb
writes q_lat into the model's [B, N, H, C+R] query buffer (qq[..., :C]) with the values of a
plain call, and torch_bf16's mla_v_up returns a contiguous [B, N, H, dv] (the model's reshape
to [B, N, H dv] for o_proj is then a view, not a copy). Values against the reference run in
tests/test_equivalence.py (the registry's EDGE cases).
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops


@pytest.mark.parametrize("variant", ["reference", "torch_bf16", "triton_v1"])
def test_q_absorb_out_fills_the_query_buffer(variant, device):
    fn = ops.op_spec("mla_q_absorb").variant(variant).load()
    g = torch.Generator(device=device).manual_seed(0)
    B, N, H, dn, C, R = 2, 3, 4, 16, 24, 8
    q = torch.randn(B, N, H, dn + R, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(H, dn, C, generator=g, device=device) * dn**-0.5).to(torch.bfloat16)
    qq = torch.full((B, N, H, C + R), float("nan"), dtype=torch.bfloat16, device=device)
    got = fn(q[..., :dn], w, out=qq[..., :C])
    assert got.data_ptr() == qq.data_ptr()
    assert torch.equal(qq[..., :C], fn(q[..., :dn], w))
    assert bool(qq[..., C:].isnan().all())  # the rope columns are the rope op's


@pytest.mark.parametrize("variant", ["torch_bf16", "triton_v1", "triton_v2"])
def test_v_up_returns_contiguous_value_heads(variant, device):
    fn = ops.op_spec("mla_v_up").variant(variant).load()
    g = torch.Generator(device=device).manual_seed(1)
    o_lat = torch.randn(2, 3, 4, 24, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(4, 16, 24, generator=g, device=device) * 24**-0.5).to(torch.bfloat16)
    o = fn(o_lat, w)
    assert o.shape == (2, 3, 4, 16) and o.is_contiguous()
    want = torch.einsum("bnhc,hdc->bnhd", o_lat.float(), w.float())
    torch.testing.assert_close(o.float(), want, rtol=2**-7, atol=1e-3)


# -- triton_v1 (kernels/dense/mla_proj_triton_v1.py) -------------------------------------------
def _f64(x, w, op):
    eq = "bnhk,hko->bnho" if op == "mla_q_absorb" else "bnhk,hok->bnho"
    return torch.einsum(eq, x.double(), w.double())


@pytest.mark.parametrize("op", ["mla_q_absorb", "mla_v_up"])
@pytest.mark.parametrize("B, N", [(1, 1), (1, 17), (3, 33)])  # rows 1, 17, 99 (two row tiles)
def test_triton_v1_matches_float64_at_ep8_widths(op, B, N, device):
    """8 heads, dn = dv = 128, C = 512 (an EP8 rank's Kimi shapes): within bf16 rounding of the
    float64 product; q_absorb writes all of its NaN-poisoned view of the q buffer and nothing
    past it."""
    fn = ops.op_spec(op).variant("triton_v1").load()
    g = torch.Generator(device=device).manual_seed(B * 100 + N)
    H, dn, C = 8, 128, 512
    w_kvb = (torch.randn(H, 2 * dn, C, generator=g, device=device) * 0.05).to(torch.bfloat16)
    if op == "mla_q_absorb":  # the model's slices: q[..., :dn] of [.., dn + R], W_UK of kv_b
        x = torch.randn(B, N, H, dn + 64, generator=g, device=device).to(torch.bfloat16)[..., :dn]
        w = w_kvb[:, :dn]
        out = torch.full((B, N, H, C + 64), float("nan"), dtype=torch.bfloat16, device=device)
        got = fn(x, w, out=out[..., :C])
        assert bool(out[..., C:].isnan().all())
    else:
        x = torch.randn(B, N, H, C, generator=g, device=device).to(torch.bfloat16)
        w = w_kvb[:, dn:]
        got = fn(x, w)
    want = _f64(x, w, op)
    assert not got.isnan().any()
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=2e-3)


def test_triton_v1_q_absorb_out_that_does_not_merge_is_still_written(device):
    """An `out` whose B and N cannot be one axis (a transposed buffer) gets the values of a
    plain call through a copy, not a silently dropped write."""
    fn = ops.op_spec("mla_q_absorb").variant("triton_v1").load()
    g = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(2, 3, 2, 16, generator=g, device=device).to(torch.bfloat16)
    w = torch.randn(2, 16, 32, generator=g, device=device).to(torch.bfloat16)
    buf = torch.full((3, 2, 2, 32), float("nan"), dtype=torch.bfloat16, device=device)
    out = buf.transpose(0, 1)  # [2, 3, 2, 32], B and N do not merge
    fn(x, w, out=out)
    assert torch.equal(out, fn(x, w))


def test_triton_v1_acc_rows_take_the_bmm_path(device):
    """fp32 activations (the ACC proof path) are torch_bf16's bmm, value for value."""
    g = torch.Generator(device=device).manual_seed(4)
    x = torch.randn(1, 2, 3, 16, generator=g, device=device)
    w = torch.randn(3, 16, 24, generator=g, device=device)
    for op in ("mla_q_absorb", "mla_v_up"):
        xv = x if op == "mla_q_absorb" else torch.randn(1, 2, 3, 24, generator=g, device=device)
        got = ops.op_spec(op).variant("triton_v1").load()(xv, w)  # W_UK [H, dn, C] / W_UV [H, dv, C]
        assert torch.equal(got, ops.op_spec(op).variant("torch_bf16").load()(xv, w))


@pytest.mark.parametrize("op, w_shape, match", [
    ("mla_q_absorb", (3, 16, 24), r"w_uk.*\[2, 16, O\]"),  # wrong head count
    ("mla_q_absorb", (2, 8, 24), r"w_uk.*\[2, 16, O\]"),  # wrong contracted width
    ("mla_v_up", (2, 8, 12), r"w_uv.*\[2, O, 16\]"),
])
def test_triton_v1_names_a_bad_weight(op, w_shape, match):
    x = torch.zeros(1, 1, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        ops.op_spec(op).variant("triton_v1").load()(x, torch.zeros(w_shape, dtype=torch.bfloat16))


# -- triton_v2 (kernels/dense/mla_proj_triton_v2.py) -------------------------------------------
@pytest.mark.parametrize("B, N, H, kernel", [(1, 1, 8, True), (1, 4, 8, True), (2, 2, 8, True),
                                             (1, 5, 8, False), (1, 17, 8, False),
                                             (1, 1, 64, False)])
def test_triton_v2_takes_the_kernel_only_for_few_rows_of_few_heads(B, N, H, kernel, device):
    """Session 27's probe: cuBLAS's 1-4-row kernel is 1.5 µs slower than triton_v1's at 8
    heads, faster from 8 rows and at 64 heads; v2 is each path's values where its rule sends
    the call (NaN-free, within bf16 rounding of float64)."""
    from workbench.kernels.dense import mla_proj_triton_v1, mla_proj_triton_v2, torch_bf16

    g = torch.Generator(device=device).manual_seed(B * 1000 + N * 10 + H)
    x = torch.randn(B, N, H, 512, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(H, 128, 512, generator=g, device=device) * 0.05).to(torch.bfloat16)
    assert mla_proj_triton_v2.uses_kernel(x) == kernel
    got = ops.op_spec("mla_v_up").variant("triton_v2").load()(x, w)
    path = mla_proj_triton_v1.mla_v_up if kernel else torch_bf16.mla_v_up
    assert torch.equal(got, path(x, w)) and got.is_contiguous()
    torch.testing.assert_close(got.double(), _f64(x, w, "mla_v_up"), rtol=2**-7, atol=2e-3)
