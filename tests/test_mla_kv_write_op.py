"""The "mla_kv_write" op: a layer's latent cache rows, [rmsnorm(c) | rope(k_pe)] at slot
prefix + row. Its reference is the model's former inline code (reference rmsnorm, rope and an
index_put), and kernels/dense mla_kv_write_triton_v1 (the "engine" preset's) matches it within
the dtype-derived tolerance through workbench.check, which NaN-poisons the cache first: only
the written rows compare, every other slot must stay NaN.

The registry's EDGE cases run in tests/test_equivalence.py (the engine preset's picks run by
default); the `gpu` test takes the REAL (kimi-k2.6) widths.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense.mla_kv_write_triton_v1 import mla_kv_write
from workbench.reference.layers import mla_kv_write as mla_kv_write_ref
from workbench.reference.layers import rmsnorm
from workbench.reference.rope import Rope, rope

C, R, T, EPS = 24, 8, 20, 1e-6


def _args(device, B=2, N=5, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(B, N, C + R, generator=g, device=device).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(C, generator=g, device=device)).to(torch.bfloat16)
    rp = Rope(R, 50000.0, 32.0, 4096, 32.0, 1.0)
    rp.reserve(T, device)
    pre = torch.tensor([3, 11][:B], device=device)
    pos = pre.view(B, 1) + torch.tensor([0, 1, 1, 2, 3][:N], device=device)  # tree depths
    cache = torch.full((B, T, C + R), float("nan"), dtype=torch.bfloat16, device=device)
    return kv, w, EPS, pos, rp.table(device), True, cache, pre


def test_engine_preset_runs_triton_v1_and_optimized_keeps_the_reference():
    assert ops.PRESETS["engine"]["mla_kv_write"] == "triton_v1"
    assert "mla_kv_write" not in ops.PRESETS["optimized"]  # fp32, not float64: engine only


def test_reference_is_the_models_former_inline_code(device):
    kv, w, eps, pos, tab, inter, cache, pre = _args(device)
    mla_kv_write_ref(kv, w, eps, pos, tab, inter, cache, pre)
    want = torch.full_like(cache, float("nan"))
    slots = pre.view(-1, 1) + torch.arange(kv.shape[1], device=device)
    want[torch.arange(2, device=device).view(2, 1), slots] = torch.cat(
        [rmsnorm(kv[..., :C], w, eps), rope(kv[..., C:], pos, tab, inter)], -1)
    assert torch.equal(cache.isnan(), want.isnan())
    assert torch.equal(cache.nan_to_num(), want.nan_to_num())


def test_triton_writes_only_its_rows_and_matches_the_reference(device):
    kv, w, eps, pos, tab, inter, cache, pre = _args(device, seed=1)
    want = cache.clone()
    mla_kv_write_ref(kv, w, eps, pos, tab, inter, want, pre)
    mla_kv_write(kv, w, eps, pos, tab, inter, cache, pre)
    assert torch.equal(cache.isnan(), want.isnan())  # 10 rows written, the rest still NaN
    assert int((~cache.isnan()).all(-1).sum()) == 10
    torch.testing.assert_close(cache.float().nan_to_num(), want.float().nan_to_num(),
                               rtol=2**-7, atol=1e-6)


def test_out_of_range_rows_write_nothing_or_raise_with_validate(device):
    kv, w, eps, pos, tab, inter, cache, pre = _args(device)
    pre[1] = T - 2  # request 1's rows 2..4 fall past the cache's end
    mla_kv_write(kv, w, eps, pos.clamp(max=T - 1), tab, inter, cache, pre)
    assert int((~cache[1].isnan()).all(-1).sum()) == 2 and not cache[1, :T - 2].isfinite().any()
    with pytest.raises(ValueError, match=r"prefix_lens: expected slots P_b \+ i within \[0, 20\)"):
        mla_kv_write(kv, w, eps, pos.clamp(max=T - 1), tab, inter, cache, pre, validate=True)
    pre[1] = 0
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 20\)"):
        mla_kv_write(kv, w, eps, pos + T, tab, inter, cache, pre, validate=True)


def test_bad_arguments_raise_naming_the_argument(device):
    kv, w, eps, pos, tab, inter, cache, pre = _args(device)
    with pytest.raises(ValueError, match=r"kv_cache: expected a bf16 tensor, got torch.float32"):
        mla_kv_write(kv, w, eps, pos, tab, inter, cache.float(), pre)
    with pytest.raises(ValueError, match=r"kv_cache: expected \[2, T, 32\], got \(2, 20, 31\)"):
        mla_kv_write(kv, w, eps, pos, tab, inter, cache[..., :31], pre)
    with pytest.raises(ValueError, match=r"positions: expected int \[2, 5\]"):
        mla_kv_write(kv, w, eps, pos[:, :4], tab, inter, cache, pre)
    with pytest.raises(ValueError, match=r"table: expected a unit-stride fp32 \[n, 8\]"):
        mla_kv_write(kv, w, eps, pos, tab.double(), inter, cache, pre)
    with pytest.raises(ValueError, match=r"norm_weight: expected \[C\] with C < 32"):
        mla_kv_write(kv, torch.ones(32, device=device), eps, pos, tab, inter, cache, pre)


@pytest.mark.gpu
def test_real_widths_match_the_reference():
    df = check("mla_kv_write", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
