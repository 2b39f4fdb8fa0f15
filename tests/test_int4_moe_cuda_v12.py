"""int4_moe cuda_v12 (cuda_v11 with the hot experts in two bands from T K >= 8 E): the rule and
the band's knobs on the CPU; on the H200 the op against cuda_v11 (its bits: a hot expert's
columns are the same mma sequence on either hot launch) and against the reference. The shared
suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _replayed, _routing

from workbench.kernels.int4_moe import cuda_v10, cuda_v11, cuda_v12

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v12_tiles_are_v11s_with_a_band_from_t512():
    # why: session 35 call 3 measured four 4-warp CTAs an SM on 16-slot passes faster for
    # uniform T 512's 9-16-slot experts only; elsewhere cuda_v12 is cuda_v11 (WB 0)
    for T in (2, 17, 128, 512, 2080):
        v11, c = cuda_v11.tiles(T, **KIMI), cuda_v12.tiles(T, **KIMI)
        assert {k: c[k] for k in v11} == v11
        if T * 8 >= 8 * 384:
            assert {k: c[k] for k in cuda_v12.BAND} == cuda_v12.BAND
            cuda_v10.check_hot(cuda_v12.band_knobs(c), T * 8, 384)  # the band launch fits too
        else:
            assert c["WB"] == 0


def test_v12_band_knobs_default_where_the_tiles_have_no_band():
    # why: a cfg WB at T 128 (tiles without WB*) raised KeyError 'WBU' from inside the hook
    # (session 54 call 4's sweep died on it); a WB alone takes BAND's launch shape
    c = cuda_v12.tiles(128, **KIMI) | {"WB": 32}
    band = cuda_v12.band_knobs(c)
    assert {k: band[k] for k in ("WU", "WNT", "WST", "WMB")} == {
        k: cuda_v12.BAND[b] for b, k in cuda_v12.BAND_KEYS.items()}
    assert band["WHI"] == 32
    cuda_v10.check_hot(band, 128 * 8, 384)
    assert cuda_v12.band_knobs(c | {"WBNT": 4})["WNT"] == 4  # a given band knob wins


def test_v10_band_top_refused_by_name():
    c = cuda_v12.tiles(512, **KIMI)
    for bad in (8, 3, 16.0):  # at most WT, or not an int
        with pytest.raises(ValueError, match=r"cfg\['WHI'\]"):
            cuda_v10.check_hot(c | {"WHI": bad}, 4096, 384)
    cuda_v10.check_hot(c | {"WHI": 16}, 4096, 384)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, wb", [(512, 0.0, None), (512, 1.2, None), (128, 1.2, 16),
                                         (65, 1.2, 12)])
def test_v12_is_cuda_v11_gpu(real_experts, T, skew, wb):
    # why: the bands move experts between two launches of one kernel whose columns do not
    # depend on the CTA shape or the n-tiles: cuda_v11's bits, eager and graph-replayed, and
    # the reference; T 128 / 65 force a band where the rule has none (WB 12: an odd pass)
    x, ids, w, ex = _routing(real_experts, T, skew, 3500 + T)
    cfg = None if wb is None else {"WB": wb} | {k: cuda_v12.BAND[k] for k in cuda_v12.BAND_KEYS}
    a = cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=cfg)
    assert torch.equal(a, cuda_v11.int4_moe_cuda(x, ids, w, ex))
    _close(a, x, ids, w, ex)
    out = _replayed(lambda: cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=cfg), real_experts, T,
                    skew, 3600 + T, x, ids, w)  # a new routing, same shapes
    assert torch.equal(out, cuda_v11.int4_moe_cuda(x, ids, w, ex))
