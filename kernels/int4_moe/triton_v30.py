"""int4_moe triton_v30: v29 with the K-split GEMMs' grids sized by the experts EXPECTED active,
not the worst case: A_GRID = ceil(A_SPARE x expected_active(E, expected slots)) programs an
(N tile, K split) take the active experts in turn (a, a + A_GRID, ...); v28's launches where
the GEMMs are not split along K.

Why (a hypothesis, to measure against v29): an EP8 rank's decode (C 1 AR: hint 1, ~1 expert
expected of at most 8) launches 8 experts' programs a GEMM and 7 of 8 exit at once; v29 only
moves them behind the real ones. Sized by the expectation (A_GRID 2 at hint 1: 512 gate/up
programs, one wave of four 128-register CTAs an SM) the launch holds ~4x fewer programs, and
a draw with more active experts than A_GRID runs them in turn inside one wave of programs
where the worst-case grid runs ~2-4 waves of them: the same tiles, fewer launches' worth of
idle dispatch. With no expert on the rank (a third of the step's layers at C 1) both GEMMs
launch 512 / 448 programs that exit, instead of 2048 / 1792.

Measured (H200, session 23 call 1, traces/gpu/session23/README.md): with no expert on the rank
the two GEMM launches take 1.2 + 1.1 µs (v28 / v29: 2.1 + 2.0); with one, v29's 10.2 + 7.1; the
EP8 C 1 AR step 5.456 / 5.452 ms against v29's 5.469 / 5.474 and v28's 5.500 / 5.496 (ABCCBA in
one call). BEST from session 23.

Bits: v28's (each expert's tile is the work v7's program does for it; no sum crosses experts).
Graph-safe: A_GRID is a float of E and the hint, never the draw.
Dimension legend: v16's.
"""

from __future__ import annotations

import math

from torch import Tensor

from .triton_v26 import expected_active
from .triton_v26 import tiles as _tiles_v26
from .triton_v29 import launch_v29

A_SPARE = 2.0  # programs an (N tile, K split) per expert expected active


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v26's tiles with A_GRID = ceil(A_SPARE x the experts expected active). Shapes only."""
    c = _tiles_v26(T, K, E, D, I, slots)
    want = A_SPARE * expected_active(E, c["S_EXP"])  # 2.0000000000000004 at one slot:
    return c | dict(A_GRID=max(1, math.ceil(want - 1e-9)))  # the float's error is not a program


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v29's contract and launches on v30's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v30's launcher):

        python -m workbench.kernels.int4_moe.triton_v30 [--ep 8] [--T 1,1,1]
            [--cfgs "v=28;v=29;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=28;v=29;base")


if __name__ == "__main__":
    raise SystemExit(_main())
