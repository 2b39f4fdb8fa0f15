"""int4_moe cuda_v14: cuda_v12 with, where T K >= 8 E (T 512 on 384 experts), the down GEMM on
h's bf16 hi half only (triton_v7's NH2 1) instead of hi + lo: one rounding of h to bf16, the
down operand of Humming, Marlin and the Triton fused_moe.

Why (H200, session 37 call 1, traces/gpu/session37, `python -m
workbench.kernels.int4_moe.cuda_v13 --T 512 [--skew 1.2] --cfgs "DS=0;DS=0,NH2=1;..." --rounds
3 --by-kernel`, DS 0 being cuda_v12's launches; medians of 3, graph-replayed µs): at T 512 the
down GEMM is MMA- and activation-bound (uniform `_gemm_kernel` ~1230 µs for 3.17 GB, 2.6 TB/s
against ~85 % of copy at T 9-128): hi + lo doubles its MMA columns and activation reads.
NH2 1 took uniform T 512 3612.8 -> **3491.2** and skewed T 512 3815.3 -> **3523.2** (every
round under every base round; `_gemm_kernel` 1230 -> 990 µs uniform, 1094 + 432 -> 883 + 325
skewed), and changed nothing at T 9-128 (uniform T 9 / 33 / 128 458.1 / 1272.7 / 2527.1 vs
449.0 / 1368.0 / 2540.7, skewed T 17 / 65 / 128 within 2.2 %: the down GEMM streams its
weights at ~85 % of copy there), so the rule is the shapes' where it pays. The other down
tiles in the same call (BM2 8 / 32, BN 64) were slower at T 512.

What: cuda_v12's tiles, kernels and launches; from 8 E expected slots (the hint, else T K)
cfg NH2 1 (`HALF`), which the
down launch reads (`triton_v7.down_gemm`; the gate/up epilogue still writes lo, 16 MB at T
512). Numerics: the down GEMM's activations are h rounded once to bf16 (cuda_v12: hi + lo, h
to ~16 bits of mantissa); int4_moe's tolerance is two bf16 roundings of the output, and the
error this adds is measured against the fp64 reference by `scripts/probe_int4_h_precision.py`
(CPU: tiny at 0.24-0.37 of the band). Deterministic, not batch invariant (cuda_v12's), graph
safe, load step cuda_v4's. GPU only (cupy). Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v10, cuda_v12
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

HALF = {"NH2": 1}  # T K >= 8 E: the down GEMM on h's bf16 hi


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v12's tiles, with HALF where the expected routed slots
    (the hint, else T K) are at least 8 E: where the down GEMM holds ~11 slots an expert and
    stops streaming at copy speed (an EP rank's hinted call counts its own slots, not T K)."""
    c = cuda_v12.tiles(T, K, E, D, I, slots)
    return c | HALF if (T * K if slots is None else slots) >= 8 * E else c


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v12's op (contract, checks, launches, hot bands) on this file's tiles."""
    return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                  cfg=cfg, expected_slots=expected_slots, tiles_for=tiles,
                                  hot_for=cuda_v12.launch_bands)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v14's op):

        python -m workbench.kernels.int4_moe.cuda_v14 [--T 128,512] [--skew 1.2]
            [--cfgs "v=cuda_v12;base;NH2=2"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v12;base")


if __name__ == "__main__":
    raise SystemExit(_main())
