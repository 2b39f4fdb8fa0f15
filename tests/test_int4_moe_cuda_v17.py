"""int4_moe cuda_v17 (cuda_v16 with BN 64 from hints over E / 2 and PF1 4 from hints of E on an
EP rank's small hinted calls): the rule and the dispatch (cuda_v18's too: cuda_v17's `on_tiles`)
on the CPU; on the GPU the op against cuda_v5's launches at the rule's knobs (their bits), eager
and graph-replayed, and the reference (`ep8_rank_matches`, cuda_v18's test uses it too). The
shared suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing

from workbench.kernels.int4_moe import (
    cuda_v4,
    cuda_v5,
    cuda_v10,
    cuda_v12,
    cuda_v15,
    cuda_v16,
    cuda_v17,
    cuda_v18,
)

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


@pytest.mark.parametrize("version", [cuda_v17, cuda_v18], ids=["cuda_v17", "cuda_v18"])
@pytest.mark.parametrize("hint, want", [(17, "cuda_v4"), (65, "cuda_v4"), (136, "cuda_v4"),
                                        (544, "cuda_v10"), (None, "cuda_v10")])
def test_v17_dispatches_by_hint(monkeypatch, version, hint, want):
    # why: small hinted calls reach cuda_v5's launches (cuda_v4's op), the rest cuda_v16's
    # (cuda_v10's op with cuda_v12's hot bands), both on the version's own tiles, whose
    # non-small side is cuda_v16's; the call's cfg and hint pass through unchanged (cuda_v18
    # is cuda_v17's `on_tiles` on its tiles)
    seen = []
    for name, mod in (("cuda_v4", cuda_v4), ("cuda_v10", cuda_v10)):
        monkeypatch.setattr(mod, "int4_moe_cuda",
                            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n)
    ex = (torch.empty(48, 1, 1, dtype=torch.int32),) * 6
    assert version.int4_moe_cuda("x", "ids", "w", ex, cfg={"KS2": 1},
                                 expected_slots=hint) == want
    (name, args, kw), = seen
    assert args == ("x", "ids", "w", ex)
    assert kw["cfg"] == {"KS2": 1} and kw["expected_slots"] == hint
    assert kw["tiles_for"] is version.tiles
    if name == "cuda_v10":
        assert kw["hot_for"] is cuda_v12.launch_bands
        T = hint or 33
        assert version.tiles(T, E=48, **KIMI, slots=hint) == cuda_v16.tiles(T, E=48, **KIMI,
                                                                            slots=hint)
    assert cuda_v15.small_hinted(hint, 48) is (name == "cuda_v4")


def ep8_rank_matches(version, real_experts, T, skew, seed, knobs, same=None):
    """An EP8 rank's call (48 of 384 experts, -1 elsewhere) with the emulation's hint, ceil(T K
    / 8) = T slots: `version` against cuda_v5's launches at `knobs` (None: cuda_v16's op, for
    hints past cuda_v15's cut) bit for bit, eager and graph-replayed on a new routing (NaN-filled
    output first), and against the reference's tolerance; `same`: another op whose bits the
    eager call must also give."""
    x, ids, w, ex = _routing(real_experts, T, skew, seed)
    here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
    ex48 = type(ex)(*(t[:48] for t in ex))

    def want():
        if knobs is None:
            return cuda_v16.int4_moe_cuda(x, here, w, ex48, expected_slots=T)
        return cuda_v5.int4_moe_cuda(x, here, w, ex48, expected_slots=T, cfg=knobs or None)

    a = version.int4_moe_cuda(x, here, w, ex48, expected_slots=T)
    assert torch.equal(a, want())
    if same is not None:
        assert torch.equal(a, same(x, here, w, ex48, expected_slots=T))
    _close(a, x, here, w, ex48)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = version.int4_moe_cuda(x, here, w, ex48, expected_slots=T)
    x2, ids2, w2, _ = _routing(real_experts, T, skew, seed + 100)  # a new routing
    x.copy_(x2)
    here.copy_(torch.where(ids2 < 48, ids2, torch.full_like(ids2, -1)))
    w.copy_(w2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want())
    _close(out, x, here, w, ex48)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 0.0), (33, 0.0), (65, 1.2), (136, 0.0), (264, 0.0)])
def test_v17_is_cuda_v5_at_its_knobs_on_an_ep8_rank_gpu(real_experts, T, skew):
    # why: under 3 E slots cuda_v5's launches at the rule's knobs, which change no arithmetic:
    # cuda_v16's bits too; from 3 E cuda_v16's own op
    small = cuda_v15.small_hinted(T, 48)
    ep8_rank_matches(cuda_v17, real_experts, T, skew, 4700 + T,
                     cuda_v17.hinted_knobs(48, T) if small else None,
                     same=cuda_v16.int4_moe_cuda)
