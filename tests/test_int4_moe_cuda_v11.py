"""int4_moe cuda_v11 (cuda_v10 with the hot launch on a side stream and its tile rule): the rule
and its shared memory on the CPU; on the H200 the op against cuda_v10 with the same knobs (its
bits: WS moves only the stream) and against the reference at the rule's forms. The shared
suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing

from workbench.kernels.int4_moe import cuda_v10, cuda_v11

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v11_tiles_are_v10s_on_the_side_stream():
    # why: session 34 call 5 measured WS 1 with WT 8 at every T and WNT 4 / WST 3 / WMB 2 from
    # 8 slots expected an expert; everything else (cold tiles, down tiles) is cuda_v10's
    for T in (2, 17, 33, 128, 512, 2080):
        v10, c = cuda_v10.tiles(T, **KIMI), cuda_v11.tiles(T, **KIMI)
        want = cuda_v11.SIDE | (cuda_v11.WIDE_T512 if T * 8 >= 8 * 384 else {})
        assert {k: c[k] for k in want} == want
        assert {k: c[k] for k in v10 if k not in want} == {k: v10[k] for k in v10 if k not in want}
        cuda_v10.check_hot(c, T * 8, 384)  # fits 227 KB up to the large verify
    assert cuda_v11.tiles(17, **KIMI, slots=136)["WS"] == 1  # a hinted call's tiles too


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (512, 0.0), (512, 1.2)])
def test_v11_is_cuda_v10_with_its_knobs_gpu(real_experts, T, skew):
    # why: cuda_v11 is cuda_v10's op on another rule; with the rule's knobs given to cuda_v10
    # on one stream (WS 0) the bits are the same, and both match the reference
    x, ids, w, ex = _routing(real_experts, T, skew, 1800 + T)
    knobs = {k: v for k, v in cuda_v11.tiles(T, **KIMI).items() if k in cuda_v10.WIDE_KEYS}
    a = cuda_v11.int4_moe_cuda(x, ids, w, ex)
    assert torch.equal(a, cuda_v10.int4_moe_cuda(x, ids, w, ex, cfg=knobs | {"WS": 0}))
    _close(a, x, ids, w, ex)
