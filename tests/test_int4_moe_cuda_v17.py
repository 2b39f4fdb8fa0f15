"""int4_moe cuda_v17 (cuda_v16 with BN 64 from hints over E / 2 and PF1 4 from hints of E on an
EP rank's small hinted calls): the rule and the dispatch on the CPU; on the GPU the op against
cuda_v5's launches at the rule's knobs (their bits), eager and graph-replayed, and the
reference. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing

from workbench.kernels.int4_moe import cuda_v4, cuda_v5, cuda_v15, cuda_v16, cuda_v17

KIMI = dict(K=8, D=7168, I=2048)


def test_v17_knobs_only_on_small_hinted_calls_past_half_an_expert_a_slot():
    # why: session 45 (H100, EP8 rank 0's 48 experts) measured BN 64 faster at hints 33 / 65 /
    # 136 and PF1 4 at 65 / 136, both slower at 17, PF1 4 slower at 33; hints from 3 E take
    # cuda_v14's path (cuda_v15's cut) and keep cuda_v16's tiles, as unhinted calls do
    want = {1: {}, 17: {}, 24: {}, 25: cuda_v17.HINTED_BN, 33: cuda_v17.HINTED_BN,
            47: cuda_v17.HINTED_BN, 48: cuda_v17.HINTED_BN | cuda_v17.HINTED_PF,
            136: cuda_v17.HINTED_BN | cuda_v17.HINTED_PF, 143: cuda_v17.HINTED_BN | cuda_v17.HINTED_PF,
            144: {}, 264: {}, None: {}}
    for hint, knobs in want.items():
        assert cuda_v17.hinted_knobs(48, hint) == knobs, hint
        T = hint or 33
        c = cuda_v17.tiles(T, E=48, **KIMI, slots=hint)
        if cuda_v15.small_hinted(hint, 48):
            assert c == cuda_v5.tiles(T, E=48, **KIMI, slots=hint) | knobs, hint
        else:
            assert c == cuda_v16.tiles(T, E=48, **KIMI, slots=hint), hint
    for T in (1, 9, 128, 512):  # unhinted: cuda_v16's tiles at Kimi's 384 experts
        assert cuda_v17.tiles(T, E=384, **KIMI) == cuda_v16.tiles(T, E=384, **KIMI), T
    # the knobs leave cuda_v5's K splits alone (computed for its 128-column down grid)
    c5, c17 = cuda_v5.tiles(65, E=48, **KIMI, slots=65), cuda_v17.tiles(65, E=48, **KIMI, slots=65)
    assert {k: c17[k] for k in ("KS1", "TPS1", "KS2", "TPS2")} == \
        {k: c5[k] for k in ("KS1", "TPS1", "KS2", "TPS2")}
    assert c17["BN"] == 64 and c5["BN"] == 128 and c17["PF1"] == 4


@pytest.mark.parametrize("hint, want", [(17, "cuda_v4"), (65, "cuda_v4"), (544, "cuda_v16"),
                                        (None, "cuda_v16")])
def test_v17_dispatches_by_hint(monkeypatch, hint, want):
    # why: small hinted calls reach cuda_v5's launches (cuda_v4's op) on cuda_v17's tiles, the
    # rest cuda_v16's op; the call's cfg and hint pass through unchanged
    seen = []
    for name, mod in (("cuda_v4", cuda_v4), ("cuda_v16", cuda_v16)):
        monkeypatch.setattr(mod, "int4_moe_cuda",
                            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n)
    ex = (torch.empty(48, 1, 1, dtype=torch.int32),) * 6
    assert cuda_v17.int4_moe_cuda("x", "ids", "w", ex, cfg={"KS2": 1},
                                  expected_slots=hint) == want
    (name, args, kw), = seen
    assert args == ("x", "ids", "w", ex)
    assert kw["cfg"] == {"KS2": 1} and kw["expected_slots"] == hint
    if name == "cuda_v4":
        assert kw["tiles_for"] is cuda_v17.tiles
    assert cuda_v15.small_hinted(hint, 48) is (name == "cuda_v4")


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 0.0), (33, 0.0), (65, 1.2), (136, 0.0), (264, 0.0)])
def test_v17_is_cuda_v5_at_its_knobs_on_an_ep8_rank_gpu(real_experts, T, skew):
    # why: an EP8 rank's call (48 of 384 experts, -1 elsewhere) with the loop's hint: under 3 E
    # cuda_v5's launches at the rule's knobs, bit for bit (and cuda_v16's bits where the knobs
    # change no arithmetic), eager and graph-replayed on a new routing, within the reference's
    # tolerance; from 3 E cuda_v16's own bits
    x, ids, w, ex = _routing(real_experts, T, skew, 4700 + T)
    here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
    ex48 = type(ex)(*(t[:48] for t in ex))
    hint = T  # the emulation's hint: ceil(T K / 8) = T slots a rank
    small = cuda_v15.small_hinted(hint, 48)

    def want():
        if not small:
            return cuda_v16.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)
        return cuda_v5.int4_moe_cuda(x, here, w, ex48, expected_slots=hint,
                                     cfg=cuda_v17.hinted_knobs(48, hint) or None)

    a = cuda_v17.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)
    assert torch.equal(a, want())
    assert torch.equal(a, cuda_v16.int4_moe_cuda(x, here, w, ex48, expected_slots=hint))
    _close(a, x, here, w, ex48)

    def capture():
        return cuda_v17.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = capture()
    x2, ids2, w2, _ = _routing(real_experts, T, skew, 4800 + T)  # a new routing
    x.copy_(x2)
    here.copy_(torch.where(ids2 < 48, ids2, torch.full_like(ids2, -1)))
    w.copy_(w2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want())
