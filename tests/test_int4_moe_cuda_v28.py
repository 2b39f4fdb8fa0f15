"""int4_moe cuda_v28 (cuda_v27's middle down launch only at the wide down tile, BM2_MID 32): on
the CPU the tile rule and the CLI's knobs; on the GPU the reference, cuda_v26's bits where the
rule turns the band off and cuda_v27's where it is on, graph replay. The shared suites (EDGE,
REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, same_bits_eager_and_replayed

from workbench.kernels.int4_moe import _knobs, cuda_v26, cuda_v27, cuda_v28

KIMI = dict(K=8, E=384, D=7168, I=2048)


@pytest.mark.parametrize("T, hint, mid", [(1, None, 0), (9, None, 0), (128, None, 0),
                                          (383, None, 0), (384, None, 16), (512, None, 16),
                                          (17, 17, 0), (136, 136, 0), (264, 264, 0),
                                          (544, 544, 0)])
def test_v28_tiles_are_v27s_with_the_band_only_at_the_wide_down_tile(T, hint, mid):
    # why: session 56 measured the band paying at skewed T 512 (BN 128, BM2 16) and costing at
    # skewed T 128 (BN 64, BM2 8); the rule follows the down tile, and the small hinted calls'
    # BN 128 at BM2 8 (cuda_v5's tiles, unmeasured with the band) stay off
    v27 = cuda_v27.tiles(T, **KIMI, slots=hint)
    assert cuda_v28.tiles(T, **KIMI, slots=hint) == v27 | {"BM2_MID": 32, "MID": mid}
    assert (v27["BN"] >= 128 and v27["BM2"] >= 16) == (mid > 0)


def test_v28_band_on_an_ep8_ranks_wide_hinted_calls():
    # an EP8 rank (48 experts) takes the wide down tile from hint 264: the rule follows the tile
    ep = dict(KIMI, E=48)
    assert [cuda_v28.tiles(h, **ep, slots=h)["MID"] for h in (17, 136, 264, 544)] == [0, 0, 16, 16]


def test_v28_sweep_cli_reads_the_middle_knobs():
    for knob in ("MID", "BM2_MID", "MID_GRID"):
        assert knob in _knobs.knobs_read("cuda_v28")


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(128, 1.2), (384, 1.2), (512, 0.0), (512, 1.2)])
def test_v28_matches_the_reference_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 2800 + T)
    _close(cuda_v28.int4_moe_cuda(x, ids, w, ex), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, twin", [(128, 1.2, "cuda_v26"), (9, 0.0, "cuda_v26"),
                                           (512, 1.2, "cuda_v27"), (512, 0.0, "cuda_v27")])
def test_v28_is_its_twins_bits_gpu(real_experts, T, skew, twin):
    # below the wide tile the rule's MID 0 is cuda_v26's launches; above it cuda_v27's at
    # BM2_MID 32
    x, ids, w, ex = _routing(real_experts, T, skew, 2850 + T)
    want = (cuda_v26.int4_moe_cuda(x, ids, w, ex) if twin == "cuda_v26" else
            cuda_v27.int4_moe_cuda(x, ids, w, ex, cfg={"BM2_MID": 32}))
    assert torch.equal(cuda_v28.int4_moe_cuda(x, ids, w, ex), want)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v28_graph_replay_is_eager_gpu(real_experts, T):
    same_bits_eager_and_replayed(cuda_v28.int4_moe_cuda, cuda_v28.int4_moe_cuda, real_experts, T,
                                 1.2, 2880 + T)
