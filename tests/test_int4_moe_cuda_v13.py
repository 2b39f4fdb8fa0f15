"""int4_moe cuda_v13 (cuda_v12 with the down GEMM in two launches, each behind its experts'
gate/up launch): on the CPU (Triton interpreter) the two down launches write exactly cuda_v12's
down partials, every routed slot by one of them, and bad knobs are refused by name; on the
H200 the op against cuda_v12 (its bits) eager and graph-replayed, and the reference. The shared
suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import functools
import types

import pytest
import torch
from test_int4_moe_kernel import _experts, _hot_routing, _routing

from workbench.kernels.int4_moe import cuda_v12, cuda_v13, triton_v7, triton_v16, triton_v34
from workbench.kernels.int4_moe.triton_v24 import _router
from workbench.kernels.int4_moe.triton_v29 import grid_gemm_idle_last

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v13_tiles_are_v12s_with_the_split():
    for T in (2, 17, 128, 512):
        v12, c = cuda_v12.tiles(T, **KIMI), cuda_v13.tiles(T, **KIMI)
        assert {k: c[k] for k in v12} == v12 and c["DS"] == 1


@pytest.mark.parametrize("cfg, wt, why", [
    ({"HOT": 16, "KS2": 1, "TPS2": 2}, 5, "hot mode: expert 1 (20 slots) on triton_v16's hot "
     "launch, 3 (12) on LO 5's, 0 / 2 / 4 (2-3) on HOT 5's"),
    ({"HOT": 64, "KS2": 1, "TPS2": 2}, 5, "T <= HOT: no hot launch, LO 5 takes 1 and 3"),
    ({"HOT": 64, "KS2": 2, "TPS2": 1}, 2, "two K splits (cuda_v12: A_STRIDE's launch): LO 2 "
     "takes 0, 1, 2, 3, HOT 2 takes 4"),
    ({"HOT": 16, "KS2": 1, "TPS2": 2}, 0, "every active expert past WT: the cold launch runs "
     "no program"),
])
def test_v13_down_launches_write_v12s_partials(cfg, wt, why):
    # why: cuda_v13 runs cuda_v12's down programs in two launches by slot count (LO / HOT);
    # y starts NaN, so a slot no launch writes, or one both write from different tiles,
    # shows; the rows of the unrouted slot stay NaN in both
    T, E, D, I, K = 20, 6, 256, 512, 2
    ex = _experts(E, D, I, seed=13)
    _, w = _routing(T, E, K, seed=13)
    ids = _hot_routing(T)
    ids[0, 1] = -1  # not routed here: expert 3 keeps 11 slots
    x = torch.randn(T, D).bfloat16()
    tiles = functools.partial(triton_v34.tiles, slots=None)
    p = triton_v7.prepare(x, ids, w, ex, None, cfg, tiles, router=_router)
    assert triton_v16.hot_mode(p.c, T) == (cfg["HOT"] == 16)
    h = torch.randn(p.S, 2, p.Ip).bfloat16()
    ys = []
    for hooks in ([grid_gemm_idle_last], [cuda_v13.gemm_hot(wt), cuda_v13.gemm_cold(wt)]):
        y = triton_v7.down_partials(p).fill_(float("nan"))
        for gemm in hooks:
            triton_v7.down_gemm(p, h, y, ex[5], gemm, True, {})
        ys.append(y)
    routed = (ids.flatten() >= 0).nonzero().flatten()
    assert not ys[0][:, routed].isnan().any()
    assert torch.equal(ys[1][:, routed], ys[0][:, routed])
    assert ys[1][:, 1].isnan().all()  # slot (token 0, k 1) is -1


def test_v13_bad_knobs_refused_by_name():
    with pytest.raises(ValueError, match=r"cfg\['DS'\]"):
        cuda_v13.launch_split({"DS": 3}, None, None, None, None, 0, 0, None)
    r = types.SimpleNamespace(bad=torch.empty(512))  # T 512 > HOT: the hot launch's mode
    with pytest.raises(ValueError, match=r"cfg\['WT'\]"):
        cuda_v13.gemm_hot(64)(2, {"HOT": 64, "KS1": 1, "KS2": 1}, r, 1, (), {})


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, cfg", [(512, 0.0, None), (512, 1.2, None), (128, 1.2, None),
                                          (65, 0.0, None), (17, 1.2, None), (9, 0.0, None),
                                          (128, 1.2, {"WS": 0}), (512, 1.2, {"DS": 0}),
                                          (512, 0.0, {"DS": 2}), (65, 1.2, {"DS": 2}),
                                          (128, 1.2, {"DS": 2, "WS": 0})])
def test_v13_is_cuda_v12_gpu(real_experts, T, skew, cfg):
    # why: the split moves whole experts between two launches of cuda_v12's down programs, so
    # cuda_v12's bits, eager and graph-replayed on a new routing (the slot counts, and so the
    # bands, change on the device), on two streams, on three (DS 2) and on one (WS 0), and
    # the reference
    from test_int4_moe_cuda_v10 import _close, _replayed
    from test_int4_moe_cuda_v10 import _routing as _real_routing

    x, ids, w, ex = _real_routing(real_experts, T, skew, 3700 + T)
    a = cuda_v13.int4_moe_cuda(x, ids, w, ex, cfg=cfg)
    assert torch.equal(a, cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=cfg))
    _close(a, x, ids, w, ex)
    out = _replayed(lambda: cuda_v13.int4_moe_cuda(x, ids, w, ex, cfg=cfg), real_experts, T,
                    skew, 3800 + T, x, ids, w)
    assert torch.equal(out, cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=cfg))
