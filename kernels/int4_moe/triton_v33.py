"""int4_moe triton_v33: v32 with the gate/up GEMM split twice along K where v19's 64-row tiles
expect between two and five CTAs an SM of gate/up programs unsplit (264 < expected programs <=
1.25 x 528: an EP8 rank at hints 5-11, T 1 on 384 experts), so the grid holds twice the
programs, each half as long; v32's tiles everywhere else.

Why (H200, session 23 call 7, traces/gpu/session23/README.md; `triton_v32 --ep 8 --T
8,8,9,9,17,17 --cfgs "base;KS1=2,TPS1=14;..." --by-kernel`): the gate/up GEMM split twice took
57.4 / 23.8 µs against 61.5 / 31.7 at hint 8 (the C 8 decode, ~476 programs: under one wave of
four CTAs an SM), 38.9 / 38.6 against 40.8 / 41.0 at hint 9 (the C 1 budget-8 verify, ~530),
and nothing at hint 17 (~924: 51.0 / 70.0 against 50.4 / 70.6); with 96 registers as well, or
the down GEMM split, no better or worse. A hypothesis (not profiled): under one wave each SM
streams its programs' 28 K tiles one after another with few loads in flight; twice the
programs put twice the tiles in flight.

Measured (H200, session 23 call 8): GPU tests pass (REAL shapes, graph replay); the EP8 step in
ABBA order against v32: **C 8 AR 9.165 / 9.164 vs 9.402 / 9.357 ms** (int4 GEMMs 3915 / 3904 vs
4148 / 4113 µs), **C 1 DDTree-8 11.405 / 11.414 vs 11.550 / 11.558**, C 1 AR and C 8 DDTree-8
(v32's tiles) within 0.05; but **T 1 on 384 experts is slower**: 80.8 / 81.2 vs 78.4 / 78.4 µs
(gate/up 43.3 vs 41.3, the SiLU summing two partials 2.3 vs 1.8), the REAL bench's and the
`optimized` preset's decode. Not BEST: the split wins where an EP rank's hint sizes the grid and
loses on all 384 experts at T 1 (~512 programs either way; why is not profiled), and the trained
token-exact suite has not run with it (no device time left). Next: the split at hinted calls
only (a rule on `slots`), then the exact suite.

Numerics: another fp32 association of each gate/up output's K sum where the split changes
(two partials summed by the SiLU launch, v13's scheme): within the harness tolerance of the
reference, not v32's bits there (v32's elsewhere).
Dimension legend: v16's.
"""

from __future__ import annotations

import triton
from torch import Tensor

from .triton_v3 import KT, normalised_split
from .triton_v13 import TARGET_PROGRAMS
from .triton_v23 import DECODE_TARGET1
from .triton_v29 import launch_v29
from .triton_v32 import expected_gate_up_programs
from .triton_v32 import tiles as _tiles_v32

SPLIT_ABOVE, SPLIT_UPTO = TARGET_PROGRAMS, 1.25 * DECODE_TARGET1  # expected gate/up programs


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v32's tiles; at v19's 64-row decode tiles with one gate/up K split whose expected grid
    lies in (SPLIT_ABOVE, SPLIT_UPTO] programs, two splits. Shapes only."""
    c = _tiles_v32(T, K, E, D, I, slots)
    if (c["BN"] == 64 and c["KS1"] == 1
            and SPLIT_ABOVE < expected_gate_up_programs(c, E, I) <= SPLIT_UPTO):
        ks1, tps1 = normalised_split(triton.cdiv(D, KT), 2)
        c = c | dict(KS1=ks1, TPS1=tps1)
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v32's contract and launches on v33's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v33's launcher):

        python -m workbench.kernels.int4_moe.triton_v33 [--ep 8] [--T 8,9]
            [--cfgs "v=32;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=32;base")


if __name__ == "__main__":
    raise SystemExit(_main())
