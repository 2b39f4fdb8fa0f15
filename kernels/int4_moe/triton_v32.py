"""int4_moe triton_v32: v30 with v31's 96 registers a thread (five CTAs an SM) only where the
64-row decode tiles' gate/up grid is expected to take more than WAVES = 1.5 waves of four CTAs
an SM: expected_active(E, hint) x 2 ceil(I / 64) x KS1 > 1.5 x 528 programs (an EP8 rank's
C 1 verify at budget 16: 14.4 x 64 = 922). v30's 128 registers everywhere else.

Why (H200, session 23 call 3, traces/gpu/session23/README.md): v31 (96 registers at every
64-row decode tile) against v30, by kernel on one EP8 rank: at hint 17 (the C 1 DDTree-16
verify, ~1.75 waves of 4-CTA programs) the GEMMs took 133.6 / 94.4 / 121.5 µs against 138.9 /
94.8 / 123.7 over three draws; at hint 8 (the C 8 decode, ~0.9 waves) the gate/up GEMM took
49.4 against 41.0. In the EP8 step (ABBA, one call): C 1 DDTree-16 14.16 / 14.18 ms against
14.26 / 14.29, C 1 AR 5.54 / 5.54 against 5.49 / 5.47, C 8 AR 9.58 / 9.59 against 9.39 / 9.40.
A hypothesis for the split (not profiled): occupancy helps where a grid has more programs than
four CTAs an SM hold (the verify's 1.75 waves become 1.4), and the 96-register build is slower a
program where every program is resident anyway.

Measured (H200, session 23 call 4): GPU tests pass; T 2 on 384 experts 132.9 vs v30's 134.7 /
135.4 µs; the EP8 step (ABBA) C 1 DDTree-16 14.163 / 14.171 vs 14.273 / 14.283 ms (int4 GEMMs
6963 / 6966 vs 7071 / 7078 µs), C 1 AR and DDTree-8 (v30's kernels) within 0.02 ms. BEST from
session 23.

Bits: v28's (registers change neither the tile nor any sum's order).
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v23 import DECODE_TARGET1
from .triton_v26 import expected_active
from .triton_v29 import launch_v29
from .triton_v30 import tiles as _tiles_v30
from .triton_v31 import DECODE_MAXNREG

WAVES = 1.5  # x DECODE_TARGET1 (four 128-register CTAs an SM): past it, DECODE_MAXNREG


def expected_gate_up_programs(c: dict, E: int, I: int) -> float:
    """The gate/up launch's programs on the experts expected active (a float of the shape)."""
    return expected_active(E, c["S_EXP"]) * 2 * -(-I // c["BN"]) * c["KS1"]


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v30's tiles; at v19's 64-row decode tiles whose gate/up grid is expected past WAVES
    waves of four CTAs an SM, DECODE_MAXNREG registers. Shapes only."""
    c = _tiles_v30(T, K, E, D, I, slots)
    if (c["BN"] == 64 and c.get("maxnreg") == 128
            and expected_gate_up_programs(c, E, I) > WAVES * DECODE_TARGET1):
        c = c | dict(maxnreg=DECODE_MAXNREG)
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v30's contract and launches on v32's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v32's launcher):

        python -m workbench.kernels.int4_moe.triton_v32 [--ep 8] [--T 9,17]
            [--cfgs "v=30;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=30;base")


if __name__ == "__main__":
    raise SystemExit(_main())
