"""int4_moe triton_v19: v18 with v7's 64-row tiles (BN 64, 128 registers: four CTAs an SM
instead of two) where at most one token's slots are expected (decode: T 1, or an EP rank's
share of the hint <= K), v18's 128-row tiles above.

Why (H200, session 17 call 4, `triton_v18 --T 1,9,17,33 --cfgs "base;warps=8;warps=8,stages=4;
BN=64,maxnreg=128" --rounds 3`, traces/gpu/session17/README.md): at T 1 the 64-row tiles run
81.6 µs against 83.8 (every round), and 6-10 % slower from T 9 (489.0 against 462.2 at T 9),
as session 15 measured (1.5 µs at T 1, 6-8 % from T 9). Session 17's stream probe says why the
small grids gain: with no arithmetic the 128-row grid streams T 1's bytes as fast as the 64-row
one (34.3 + 18.9 µs against 33.7 + 19.0), so the GEMMs' ~15 µs above the stream is the
arithmetic the K loop cannot hide, and T 1's 256 + 448 programs at 8 warps an SM hide less of
it than 512 + 896 programs at 16 (twice the warps per byte, 3.13 SASS a weight against 2.59:
what loses from T 9, where issue, not latency, binds). Twice the warps from 8-warp CTAs
instead (`warps=8`) was slower at every T (85.1 at T 1).
The K splits follow v13's rule for the 64-row grid (`triton_v13.splits`): the same splits at
T 1 on 384 experts (one: a row's K order, and so its bits, are v18's there), more programs a
split on a hinted EP rank (hint 1: 4 splits of 7 K tiles for gate/up instead of 7 of 4).

Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v13 import splits
from .triton_v16 import grid_gemm_hot
from .triton_v18 import tiles as _tiles_v18


def decode_tiles(c: dict, T: int, K: int, E: int, D: int, I: int, slots: int | None) -> dict:
    """c with v7's 64-row tiles at 128 registers and v13's splits for them (v19, v25)."""
    return c | dict(BN=64, maxnreg=128) | splits(64, T, K, E, D, I, slots)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v18's tiles; at most K slots expected: BN 64 at 128 registers and v13's splits for it.
    Shapes only (graph-safe)."""
    c = _tiles_v18(T, K, E, D, I, slots)
    return decode_tiles(c, T, K, E, D, I, slots) if c["S_EXP"] <= K else c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v18's contract and launches (`triton_v18.int4_moe_triton`) on v19's tiles; cfg: tile
    overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v19's launcher):

        python -m workbench.kernels.int4_moe.triton_v19 [--T 1,2,4,8,9] [--cfgs "v=18;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=18;base")


if __name__ == "__main__":
    raise SystemExit(_main())
