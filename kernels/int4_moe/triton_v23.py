"""int4_moe triton_v23: v22 with the gate/up GEMM's K splits at the 64-row decode tiles (at most
K slots expected) sized for four CTAs an SM (528 programs on 132 SMs) instead of two (264);
the down GEMM's splits and everything else v22's.

Why (H200, session 19 call 3, `scripts/sweep_int4_splits.py --variant triton_v22`, graph
replay, traces/gpu/session19/call3_sweep_int4_splits_v22.txt): on the hinted EP8 rank's decode
(T 1, hint 1, one routed slot: the C 1 AR step's MoE call) v22 splits gate/up 4 ways (64 N
tiles x 4 = 256 programs of 7 K tiles) and down 2 ways; the 64-row tiles run at 128 registers,
four CTAs an SM (session 17), so that grid is half a wave. 7 gate/up splits (448 programs of 4
K tiles) took 28.4-29.6 µs against 29.7-31.6 at 4 (down at 1-3 splits; single 0.25 s timings,
±5 µs between neighbours). On all 384 experts at T 1 (8 active) and at hint 17 the rule gives
v22's splits (one), where the sweep's best was v22's own.
Measured in the EP8 step (session 19 call 4): NOT faster (C 1 AR 6.23 vs 6.19 ms of kernels; the
GEMMs 1074 vs 1067 µs a step, the SiLU that sums the splits 146 vs 122): a measured negative.
Numerics: another fp32 association of gate/up's K run where the splits differ (hinted decode):
within the harness tolerance of the reference, not v22's bits there; v22's bits elsewhere.
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v13 import TARGET_PROGRAMS, splits
from .triton_v16 import grid_gemm_hot
from .triton_v22 import tiles as _tiles_v22

DECODE_TARGET1 = 2 * TARGET_PROGRAMS  # four 128-register CTAs an SM on the H200's 132


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v22's tiles; at the 64-row decode tiles, gate/up's splits for DECODE_TARGET1 programs.
    Shapes only (graph-safe)."""
    c = _tiles_v22(T, K, E, D, I, slots)
    if c["BN"] == 64 and c["S_EXP"] <= K:
        s = splits(64, T, K, E, D, I, slots, target1=DECODE_TARGET1)
        c |= dict(KS1=s["KS1"], TPS1=s["TPS1"])
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v22's contract and launches on v23's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v23's launcher):

        python -m workbench.kernels.int4_moe.triton_v23 [--T 1,9,17] [--cfgs "v=22;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=22;base")


if __name__ == "__main__":
    raise SystemExit(_main())
