"""int4_moe cuda_v18 (cuda_v17 with 4 gate/up K parts on an EP rank's small hinted calls of
E / 3 to 5 E / 2 slots): the rule on the CPU (the dispatch: tests/test_int4_moe_cuda_v17.py);
on the GPU the op against cuda_v5's launches at the rule's knobs (their bits), eager and
graph-replayed, and the reference. The shared suites (EDGE, REAL, EP8, graph replay) run it
from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
from test_int4_moe_cuda_v17 import ep8_rank_matches

from workbench.kernels.int4_moe import cuda_v17, cuda_v18

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


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(12, 0.0), (17, 0.0), (33, 1.2), (100, 0.0), (136, 0.0)])
def test_v18_is_cuda_v5_at_its_knobs_on_an_ep8_rank_gpu(real_experts, T, skew):
    # why: cuda_v5's launches at cuda_v18's tiles bit for bit; outside `ksplit` cuda_v17's bits
    # (inside it the gate/up K association differs: the reference's tolerance only). The
    # dispatch is cuda_v17's (tests/test_int4_moe_cuda_v17.py runs it for both)
    knobs = cuda_v17.hinted_knobs(48, T) | (cuda_v18.KSPLIT if cuda_v18.ksplit(48, T) else {})
    ep8_rank_matches(cuda_v18, real_experts, T, skew, 4900 + T, knobs,
                     same=None if cuda_v18.ksplit(48, T) else cuda_v17.int4_moe_cuda)
