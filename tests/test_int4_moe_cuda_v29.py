"""int4_moe cuda_v29 (cuda_v28 with the middle down launch on a side stream beside the hot down):
on the CPU the tiles, MS refused by name, the hook's order (cold, fork, the band on the side
stream, hot on the current one, join) and MS 0's one stream, and the hook under the Triton
interpreter on triton_v16's op (no streams on the CPU: the band runs on the current one, so
cuda_v27's hook's bits); on the GPU cuda_v28's bits eager and under graph replay. The shared
suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _routing, same_bits_eager_and_replayed
from test_int4_moe_cuda_v22 import _Side
from test_int4_moe_kernel import _bits_equal, _hot_case, _poisoned_buffers

from workbench.kernels.int4_moe import _knobs, cuda_v27, cuda_v28, cuda_v29, triton_v16

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v29_tiles_are_v28s_with_the_side_stream():
    for T, hint in ((1, None), (128, None), (512, None), (17, 17), (264, 264)):
        assert cuda_v29.tiles(T, **KIMI, slots=hint) == (
            cuda_v28.tiles(T, **KIMI, slots=hint) | {"MS": 1})
    assert "MS" in _knobs.knobs_read("cuda_v29") and "MS" not in _knobs.knobs_read("cuda_v28")


@pytest.mark.parametrize("bad", [-1, 2, True, 1.0, "1"])
def test_v29_ms_refused_by_name(bad):
    c = cuda_v29.tiles(512, **KIMI)
    with pytest.raises(ValueError, match=r"cfg\['MS'\]"):
        cuda_v29.check_ms(c | {"MS": bad})
    assert cuda_v29.check_ms(c) and not cuda_v29.check_ms(c | {"MS": 0})


class _R:  # the router's result as the hook reads it: T rows of bad flags
    bad = torch.zeros(512)
    max_active = 384


@pytest.mark.parametrize("ms", [1, 0])
def test_v29_hook_forks_the_band_after_the_cold_launch_and_joins_after_the_hot(monkeypatch, ms):
    # why: the band may only start once the cold launch is queued (it reads nothing the cold
    # launch writes, but the side stream must not run ahead of the routing and h the current
    # stream made), and the current stream must wait for it before the combine reads y
    seen = []

    class Recorder(_Side):  # cuda_v22's recorder, also noting whether a stream was asked for
        def __init__(self, device, on, key="model", priority=0):
            super().__init__(device, on, key, priority)
            seen.append(("side", on, key))

    monkeypatch.setattr(_Side, "seen", seen)
    monkeypatch.setattr(cuda_v29, "Side", Recorder)
    monkeypatch.setattr(cuda_v27, "grid_gemm", lambda n, c, r, NT, a, kw: seen.append("cold"))
    monkeypatch.setattr(cuda_v27, "hot_launch", lambda n, c, r, a, kw, kernel=None, programs=None:
                        seen.append("band" if kernel is cuda_v27._gemm_band_kernel else "hot"))
    c = cuda_v29.tiles(512, **KIMI) | {"MS": ms}
    cuda_v29.grid_gemm_mid_side(2, c, _R, 56, (), {"BM": 16})
    key = cuda_v29.MID_KEY
    assert seen == [("side", bool(ms), key), "cold", ("fork", key), ("run", key), "band", "hot",
                    ("join", key)]


def test_v29_ms_0_and_the_cpu_run_on_one_stream():
    # why: where Side makes no stream (MS 0, or no CUDA device), `run` must call the band on
    # the current stream and fork / join must do nothing: cuda_v28's launches
    for on, dev in ((False, "cpu"), (True, "cpu")):
        side = cuda_v29.Side(dev, on, key=cuda_v29.MID_KEY)
        assert side.stream is None and side.run(lambda: 7) == 7
        side.fork()
        side.join()


def test_v29_hook_on_triton_v16s_op_is_cuda_v27s(monkeypatch):
    # why: the side stream changes where the band runs, not what it computes: on the CPU (no
    # streams) the hook gives cuda_v27's hook's bits, every row written (NaN-poisoned buffers)
    _poisoned_buffers(monkeypatch)
    x, ids, w, ex, cfg = _hot_case(29, 12)  # expert 1: 20 slots (hot), 3: 11, 0 / 2 / 4: 2-3
    cfg |= {"BM2": 8, "MID": 2, "BM2_MID": 16, "MID_GRID": 2, "S_EXP": 40, "BN": 64,
            "BN_HOT": 64, "MS": 1}
    args = (x, ids, w, ex, None, cfg, None, triton_v16.tiles)
    want = triton_v16.launch_hinted(*args, gemm=cuda_v27.grid_gemm_mid)
    out = triton_v16.launch_hinted(*args, gemm=cuda_v29.grid_gemm_mid_side)
    assert not out.isnan().any() and _bits_equal(out, want)


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(128, 1.2), (512, 1.2), (512, 0.0)])
def test_v29_is_cuda_v28s_bits_gpu(real_experts, T, skew):
    # the same kernels, tiles and programs on two streams: each slot row of y from one program
    x, ids, w, ex = _routing(real_experts, T, skew, 2900 + T)
    want = cuda_v28.int4_moe_cuda(x, ids, w, ex)
    assert torch.equal(cuda_v29.int4_moe_cuda(x, ids, w, ex), want)
    assert torch.equal(cuda_v29.int4_moe_cuda(x, ids, w, ex, cfg={"MS": 0}), want)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v29_graph_replay_is_eager_gpu(real_experts, T):
    # the fork and join captured as graph branches
    same_bits_eager_and_replayed(cuda_v29.int4_moe_cuda, cuda_v29.int4_moe_cuda, real_experts, T,
                                 1.2, 2980 + T)
