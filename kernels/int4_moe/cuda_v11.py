"""int4_moe cuda_v11: cuda_v10 with the hot launch on a side stream beside the cold launch (WS
1) and the tile rule that side stream makes pay: every expert past 8 slots hot at every T
(WT 8), and from 8 slots expected an expert (T K >= 8 E: T 512 on 384 experts) two hot CTAs an
SM on 32-slot passes (WNT 4 / WST 3 / WMB 2) instead of one on 64-slot passes.

Why (H200, session 34 call 5, traces/gpu/session34, `python -m
workbench.kernels.int4_moe.cuda_v10 --T 17,33,65,128 --skew 1.2 --cfgs "base;WS=1;WS=1,WT=8"
--rounds 3`, medians, graph-replayed µs): on one stream the hot launch runs alone before the
cold one, so its ramp and tail (CTAs that find no item, uneven passes) idle SMs; at T <= 32
cuda_v10 kept experts of 9-16 slots cold (WT 16) for that reason, and each streams its weights
twice there (session 34 call 4: REAL skewed T 17 0.92x Humming, triton_v34 0.98x). On a
high-priority side stream the cold launch's CTAs take the SMs the hot launch leaves:
skewed T 17 **440.5 vs 471.0** (WS 1 + WT 8; WS 1 alone 470.5), T 33 722.0 vs 735.2, T 65
1194.6-1203.7 vs 1232.9, T 128 1922.3 (WT 16 / 8 alike there: T > 32) vs 1951.6; T 512 skewed
3895.9 (WS 1) / 3924.2 (+ WMB 2) vs 3994.7, uniform **3802.7 (+ WMB 2) vs 4137.3** (WS 1
alone 4044.3).

What: cuda_v10's kernels, launches and bits (WS changes only the stream the hot launch is
issued on; `test_v10_side_stream_is_one_stream_bitwise_gpu`), on this file's `tiles`. Knobs
(cfg): cuda_v10's. Numerics, graph safety, load step: cuda_v10's (not batch invariant).
GPU only (cupy). Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v10
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

SIDE = {"WS": 1, "WT": 8}  # the hot launch beside the cold one; every expert past 8 slots hot
WIDE_T512 = {"WNT": 4, "WST": 3, "WMB": 2}  # T K >= 8 E: two CTAs an SM on 32-slot passes


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v10's tiles with SIDE everywhere and WIDE_T512 where T K
    >= 8 E (cuda_v10's WNT 8 / WST 5 there)."""
    c = cuda_v10.tiles(T, K, E, D, I, slots) | SIDE
    if T * K >= 8 * E:
        c |= WIDE_T512
    return c


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v10's op (contract, checks, launches) on this file's tiles; cfg overrides them."""
    return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                  cfg=cfg, expected_slots=expected_slots, tiles_for=tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v11's op):

        python -m workbench.kernels.int4_moe.cuda_v11 [--T 17,128,512] [--skew 1.2]
            [--cfgs "v=cuda_v10;v=triton_v34;base;WS=0"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v10;v=triton_v34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
