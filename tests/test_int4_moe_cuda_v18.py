"""int4_moe cuda_v18 (cuda_v17 with 4 gate/up K parts on an EP rank's small hinted calls of
E / 3 to 5 E / 2 slots): the rule and the dispatch on the CPU; on the GPU the op against cuda_v5's
launches at the rule's knobs (their bits), eager and graph-replayed, and the reference. The
shared suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing

from workbench.kernels.int4_moe import cuda_v4, cuda_v5, cuda_v15, cuda_v17, cuda_v18

KIMI = dict(K=8, D=7168, I=2048)


def test_v18_splits_gate_up_four_ways_from_a_third_to_two_and_a_half_slots_an_expert():
    # why: session 45 (H100, EP8 rank 0's 48 experts) measured KW1 4 faster at hints 17-100 and
    # not at 9 / 12 / 136; hints from 3 E take cuda_v14's path and unhinted calls cuda_v16's
    for hint, on in ((1, False), (12, False), (15, False), (16, True), (17, True), (65, True),
                     (119, True), (120, False), (136, False), (144, False), (None, False)):
        assert cuda_v18.ksplit(48, hint) is on, hint
        T = hint or 33
        c17 = cuda_v17.tiles(T, E=48, **KIMI, slots=hint)
        assert cuda_v18.tiles(T, E=48, **KIMI, slots=hint) == (c17 | cuda_v18.KSPLIT if on else c17)
    for T in (1, 9, 128, 512):  # unhinted, Kimi's 384 experts
        assert cuda_v18.tiles(T, E=384, **KIMI) == cuda_v17.tiles(T, E=384, **KIMI), T
    assert cuda_v17.tiles(17, E=48, **KIMI, slots=17)["KW1"] == 2  # the rule's parts there


@pytest.mark.parametrize("hint, want", [(17, "cuda_v4"), (136, "cuda_v4"), (544, "cuda_v17"),
                                        (None, "cuda_v17")])
def test_v18_dispatches_by_hint(monkeypatch, hint, want):
    # why: small hinted calls reach cuda_v5's launches (cuda_v4's op) on cuda_v18's tiles, the
    # rest cuda_v17's op; the call's cfg and hint pass through unchanged
    seen = []
    for name, mod in (("cuda_v4", cuda_v4), ("cuda_v17", cuda_v17)):
        monkeypatch.setattr(mod, "int4_moe_cuda",
                            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n)
    ex = (torch.empty(48, 1, 1, dtype=torch.int32),) * 6
    assert cuda_v18.int4_moe_cuda("x", "ids", "w", ex, cfg={"KS2": 1},
                                  expected_slots=hint) == want
    (name, args, kw), = seen
    assert args == ("x", "ids", "w", ex)
    assert kw["cfg"] == {"KS2": 1} and kw["expected_slots"] == hint
    if name == "cuda_v4":
        assert kw["tiles_for"] is cuda_v18.tiles
    assert cuda_v15.small_hinted(hint, 48) is (name == "cuda_v4")


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(12, 0.0), (17, 0.0), (33, 1.2), (100, 0.0), (136, 0.0)])
def test_v18_is_cuda_v5_at_its_knobs_on_an_ep8_rank_gpu(real_experts, T, skew):
    # why: an EP8 rank's call (48 of 384 experts, -1 elsewhere) with the loop's hint: cuda_v5's
    # launches at cuda_v18's tiles bit for bit (cuda_v17's bits outside `ksplit`), eager and
    # graph-replayed on a new routing, within the reference's tolerance
    x, ids, w, ex = _routing(real_experts, T, skew, 4900 + T)
    here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
    ex48 = type(ex)(*(t[:48] for t in ex))
    hint = T  # the emulation's hint: ceil(T K / 8) = T slots a rank
    knobs = cuda_v17.hinted_knobs(48, hint) | (cuda_v18.KSPLIT if cuda_v18.ksplit(48, hint) else {})

    def want():
        return cuda_v5.int4_moe_cuda(x, here, w, ex48, expected_slots=hint, cfg=knobs or None)

    a = cuda_v18.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)
    assert torch.equal(a, want())
    if not cuda_v18.ksplit(48, hint):
        assert torch.equal(a, cuda_v17.int4_moe_cuda(x, here, w, ex48, expected_slots=hint))
    _close(a, x, here, w, ex48)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cuda_v18.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)
    x2, ids2, w2, _ = _routing(real_experts, T, skew, 5000 + T)  # a new routing
    x.copy_(x2)
    here.copy_(torch.where(ids2 < 48, ids2, torch.full_like(ids2, -1)))
    w.copy_(w2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want())
    _close(out, x, here, w, ex48)
