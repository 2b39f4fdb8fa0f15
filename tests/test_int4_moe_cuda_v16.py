"""int4_moe cuda_v16 (cuda_v15 with BN 64 and PF1 4 on unhinted calls of 2 tokens to 8 E slots):
the rule and the dispatch on the CPU; on the GPU the op against cuda_v14's launches at the
rule's knobs (their bits), eager and graph-replayed, and the reference. The shared suites
(EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _replayed, _routing

from workbench.kernels.int4_moe import cuda_v5, cuda_v10, cuda_v14, cuda_v15, cuda_v16

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v16_tiles_are_v14s_with_stream_knobs_between_one_token_and_8e():
    # why: session 44's sweep (H100) measured BN 64 / PF1 4 faster at T 9-128; T 1 (cuda_v9's
    # path) and T 512 (session 37: BN 64 slower) were not, and hinted calls keep cuda_v15's
    for T in (1, 2, 9, 17, 128, 383, 384, 512):
        v14, c = cuda_v14.tiles(T, **KIMI), cuda_v16.tiles(T, **KIMI)
        on = 2 <= T < 384
        assert c == (v14 | cuda_v16.STREAM if on else v14), T
        assert cuda_v16.streams(T, 8, 384, None) is on, T
    assert cuda_v16.tiles(17, **KIMI, slots=136) == cuda_v14.tiles(17, **KIMI, slots=136)
    assert cuda_v16.tiles(9, **KIMI)["PF1"] == 4 and cuda_v14.tiles(9, **KIMI)["PF1"] == 0


@pytest.mark.parametrize("hint, want", [(17, "cuda_v5"), (544, "cuda_v10"), (None, "cuda_v10")])
def test_v16_dispatches_as_v15(monkeypatch, hint, want):
    # why: small hinted calls reach cuda_v5 unchanged; the rest cuda_v10's op on v16's tiles
    # and cuda_v12's hot bands (cuda_v14's launches), the call's cfg and hint passed through
    seen = []
    for name, mod in (("cuda_v5", cuda_v5), ("cuda_v10", cuda_v10)):
        monkeypatch.setattr(mod, "int4_moe_cuda",
                            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n)
    ex = (torch.empty(48, 1, 1, dtype=torch.int32),) * 6
    assert cuda_v16.int4_moe_cuda("x", "ids", "w", ex, cfg={"KS2": 1},
                                  expected_slots=hint) == want
    (name, args, kw), = seen
    assert args == ("x", "ids", "w", ex)
    assert kw["cfg"] == {"KS2": 1} and kw["expected_slots"] == hint
    if name == "cuda_v10":
        assert kw["tiles_for"] is cuda_v16.tiles
        assert kw["hot_for"] is cuda_v14.cuda_v12.launch_bands
    assert cuda_v15.small_hinted(hint, 48) is (name == "cuda_v5")


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(9, 0.0), (33, 1.2), (128, 0.0), (512, 0.0), (1, 0.0)])
def test_v16_is_cuda_v14_at_its_knobs_gpu(real_experts, T, skew):
    # why: cuda_v16 is cuda_v14's launches with BN / PF1 from the rule: cuda_v14's bits at those
    # knobs, eager and graph-replayed on a new routing, and within the reference's tolerance;
    # outside the rule (T 1, T 512) cuda_v14's own bits
    x, ids, w, ex = _routing(real_experts, T, skew, 4400 + T)
    knobs = cuda_v16.STREAM if cuda_v16.streams(T, 8, 384, None) else None
    a = cuda_v16.int4_moe_cuda(x, ids, w, ex)
    assert torch.equal(a, cuda_v14.int4_moe_cuda(x, ids, w, ex, cfg=knobs))
    _close(a, x, ids, w, ex)
    out = _replayed(lambda: cuda_v16.int4_moe_cuda(x, ids, w, ex), real_experts, T, skew,
                    4500 + T, x, ids, w)  # a new routing
    assert torch.equal(out, cuda_v14.int4_moe_cuda(x, ids, w, ex, cfg=knobs))
