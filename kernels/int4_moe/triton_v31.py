"""int4_moe triton_v31: v30 with the 64-row decode tiles compiled at 96 registers a thread
instead of 128: five 128-thread CTAs an SM instead of four (v19's BN 64 tiles, three stages,
43 KB of shared memory a CTA: 215 of the SM's 227 KB), the same splits, grids and bits.

Why (a hypothesis, session 23): session 22's ncu of an EP8 rank's verify GEMMs (hint 17, ~15 of
48 experts active) found them latency-bound at 25 % occupancy: 3.75 warps a scheduler, 1.4-1.6
eligible, none eligible in a third of the cycles, IPC 2.6-2.7. The sm_90 build at 96 registers
keeps the K loop (401 -> 403 SASS an iteration) with no spill (`sm90` capture at T 17 on 48
experts). Session 18 measured 96 / 112 registers at T 1 on 384 experts and saw nothing (81.6 /
82.1 vs 82.1 µs): there the gate/up grid is under one wave; the verify's is ~1.8.

Measured (H200, session 23 call 3, traces/gpu/session23/README.md): at hint 17 the GEMMs took
133.6 / 94.4 / 121.5 µs against v30's 138.9 / 94.8 / 123.7 over three draws, at hint 8 the
gate/up GEMM 49.4 against 41.0; in the EP8 step (ABBA) C 1 DDTree-16 14.16 / 14.18 vs 14.26 /
14.29 ms, C 1 AR 5.54 / 5.54 vs 5.49 / 5.47, C 8 AR 9.58 / 9.59 vs 9.39 / 9.40: not BEST
(triton_v32 keeps the registers where they won).

Bits: v28's (registers change neither the tile nor any sum's order).
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v29 import launch_v29
from .triton_v30 import tiles as _tiles_v30

DECODE_MAXNREG = 96  # registers a thread at v19's 64-row tiles (v19-v30: 128)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v30's tiles; at v19's 64-row decode tiles, DECODE_MAXNREG registers. Shapes only."""
    c = _tiles_v30(T, K, E, D, I, slots)
    if c["BN"] == 64 and c.get("maxnreg") == 128:
        c = c | dict(maxnreg=DECODE_MAXNREG)
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v30's contract and launches on v31's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v31's launcher):

        python -m workbench.kernels.int4_moe.triton_v31 [--ep 8] [--T 17,17]
            [--cfgs "v=30;base;maxnreg=80,stages=2"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=30;base")


if __name__ == "__main__":
    raise SystemExit(_main())
