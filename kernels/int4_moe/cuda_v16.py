"""int4_moe cuda_v16: cuda_v15, with two tile knobs on the unhinted calls between one token and
8 E slots (T 2-383 on 384 experts): the down GEMM's 64-column tiles (BN 64, cuda_v14's 128)
and the gate/up CTAs asking L2 for their weight slice 4 chunk pairs ahead (PF1 4, none).

Why (H100 80GB, session 44 call 6, traces/gpu/session44, `python -m
workbench.kernels.int4_moe.cuda_v15 --T 9,33,128 --rounds 2 --cfgs "base;BN=64;PF1=2;PF1=4;..."
--by-kernel`, medians of 2, graph-replayed µs): the REAL bench of call 1 put cuda_v15 at
0.97-0.99x Humming at uniform T 9-128, and by kernel the gate/up GEMM (cuda_v1.cu) already
streams at ~102 % of the copy floor's share (T 65: 1526 µs) while the Triton down GEMM sits at
~97.5 % (798.5 µs). BN 64 took T 9 577.8 -> **566.1** and T 33 1617.1 -> **1594.1**; PF1 4
took T 33 1602.8 -> **1581.4** and T 128 3005.1 -> **2975.5** (PF1 2 2970.4; every round under
every base round); U1 (stages ahead), RW1, the down GEMM's stages did not pay. At T 512 (8 E
slots) session 37 measured BN 64 slower (H200), so the rule stops there; T 1 keeps cuda_v9's
path's knobs (BN 64 already; PF1 unmeasured there), and an EP rank's hinted calls keep
cuda_v15's choice. Call 7's REAL bench: 3.5-6.5 % under cuda_v15 at T 9-128, and call 8 found
cuda_v16's outputs cuda_v15's bits at every REAL shape.

What: cuda_v15's dispatch (cuda_v5 on small hinted calls) and cuda_v14's launches on this
file's `tiles` elsewhere; the knobs change where weights are asked for and the down GEMM's
column tiling, not the K order of any dot product. Numerics, graph safety, load step:
cuda_v14's (not batch invariant). GPU only (cupy). Dimension legend: cuda_v1.cu's and
cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v5, cuda_v10, cuda_v12, cuda_v14, cuda_v15
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

STREAM = {"BN": 64, "PF1": 4}  # unhinted, K < T K < 8 E: narrower down tiles, L2 asked ahead


def streams(T: int, K: int, E: int, slots: int | None) -> bool:
    """Whether STREAM applies: an unhinted call of more than one token under 8 E slots."""
    return slots is None and K < T * K < 8 * E


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v14's tiles, with STREAM where `streams`."""
    c = cuda_v14.tiles(T, K, E, D, I, slots)
    return c | STREAM if streams(T, K, E, slots) else c


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """The contract of `workbench.reference.int4_moe.int4_moe`: cuda_v5 on cuda_v15's small
    hinted calls, else cuda_v14's op on this file's tiles (cfg overrides them)."""
    if cuda_v15.small_hinted(expected_slots, cuda_v15.num_experts(experts)):
        return cuda_v5.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                     cfg=cfg, expected_slots=expected_slots)
    return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                  cfg=cfg, expected_slots=expected_slots, tiles_for=tiles,
                                  hot_for=cuda_v12.launch_bands)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v16's op):

        python -m workbench.kernels.int4_moe.cuda_v16 [--T 9,33,128] [--skew 1.2]
            [--cfgs "v=cuda_v15;base;BN=128;PF1=0"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v15;base")


if __name__ == "__main__":
    raise SystemExit(_main())
