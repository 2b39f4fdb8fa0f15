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


@pytest.mark.parametrize("variant", ["reference", "torch_bf16"])
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


def test_v_up_returns_contiguous_value_heads(device):
    fn = ops.op_spec("mla_v_up").variant("torch_bf16").load()
    g = torch.Generator(device=device).manual_seed(1)
    o_lat = torch.randn(2, 3, 4, 24, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(4, 16, 24, generator=g, device=device) * 24**-0.5).to(torch.bfloat16)
    o = fn(o_lat, w)
    assert o.shape == (2, 3, 4, 16) and o.is_contiguous()
    want = torch.einsum("bnhc,hdc->bnhd", o_lat.float(), w.float())
    torch.testing.assert_close(o.float(), want, rtol=2**-7, atol=1e-3)
