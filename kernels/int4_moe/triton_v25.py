"""int4_moe triton_v25: v24 with v19's 64-row tiles (BN 64, 128 registers: four CTAs an SM)
wherever at most DECODE_ACTIVE = 3 K experts are expected active (v19-v24: at most K slots),
v24's 128-row tiles above; v24's router, splits rule, SiLU and combine.

Why (H200, session 21 call 2, `triton_v24 --ep 8 --T 1,8,17,33 --cfgs "base;BN=64,maxnreg=128"
--rounds 3`, traces/gpu/session21/README.md): on one EP8 rank (48 local experts, the other
ranks' slots -1, the hint T K / 8) the verify of a C 1 DDTree-16 step (T 17, hint 17, ~16
experts active) ran **135.4 µs on the 64-row tiles against 147.8** on v24's 128-row ones, every
round; at hint 33 (~24-26 active) the 128-row tiles won (186.4 against 193.8), at hints 1 and 8
(already 64-row in v24) they tie. A hypothesis, which call 5's draws below do not bear out
as a rule: the gate/up grid at ~16 active experts is 16 x 16 = 256
programs of 128 rows, two thirds of one wave at three CTAs an SM (396 slots), against 512
programs of 64 rows at four (528 slots): the small grid leaves SMs idle, the case v19 made for
T 1 (its stream probe: the arithmetic the K loop cannot hide is hidden better by more warps
an SM). With ~25 active experts the 128-row grid fills its wave and the 64-row one spills into
a second (800 programs), as at T 9 on 384 experts (session 17: 64-row 6-10 % slower). The
bound 3 K sits between the measured 17 and 33 (24 at K 8: 384 programs of 128 rows, ~one
wave); hints 18-24 are not measured.
Measured (session 21 call 3): GPU tests 18 passed (v24's bits on 384 experts at T 1-17 and on
a hinted EP8 rank at T 1-33, uniform and skewed; REAL shapes; graph replay). The EP8 step
(`emulate ... --kernels engine,int4_moe=triton_v25 --graph` against `--kernels engine`, same
call): the int4 GEMMs of a C 1 DDTree-16 step **7147 vs 7279 µs** (-1.8 %; the configurations
whose tiles are v24's differ by 10-15 µs), the step 14.76 vs 14.91 ms; C 1 / 8 AR and C 8
DDTree-16 (hints 1, 8, 136: v24's tiles) within 0.02 ms. The rank alone depends on the draw:
the CLI's T 9 / 17 draws of that call put 11 experts on the rank, where the 64-row tiles lost
(108.7 / 108.3 vs 100.7 / 101.3 µs), call 2's T 17 draw put 16 there (won 135.4 vs 147.8);
hint 24 (~20 experts) 188.0 vs 183.6. Call 5 (`--T 9,9,9,17,17,17,24 --by-kernel --rounds 2`,
seven draws, v24 / v25 µs, experts on the rank): 4: 69.8 / **58.7**, 7: 85.9 / **76.1**, 10:
**98.8** / 104.9, 11: **100.3** / 107.3, 14: 128.5 / **120.6**, 15: 136.0 / **132.6** and
141.5 / **133.0**; the gate/up GEMM decides it (e.g. 7 experts 53.6 -> 40.8, 11: 56.0 ->
62.1), the down GEMM moves 1-3 µs either way. Faster on 5 of 7 draws, slower at 10-11
experts, for reasons not profiled. The step averages 60 layers' draws: BEST in session 21
until triton_v26, which keeps these tiles on the EP8 step but not at T 3 on 384 experts
(call 8: 192.5 vs v24's 185.2 µs; T 2 won, 136.6 vs 148.6).
Bits: a row's K order is the split's tile order whichever BN holds the row (the splits at the
64-row tiles are v13's rule for them, one split at hints 9-24 on an EP8 rank as in v24), so
the tiles change the grid, not a row's arithmetic; the GPU test checks v24's bits.
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v19 import decode_tiles
from .triton_v24 import _router
from .triton_v24 import tiles as _tiles_v24

DECODE_ACTIVE = 3  # x K: the most active experts expected that take the 64-row tiles


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v24's tiles; at most DECODE_ACTIVE K active experts expected (min(E, expected slots)):
    BN 64 at 128 registers and v13's splits for it. Shapes only (graph-safe)."""
    c = _tiles_v24(T, K, E, D, I, slots)
    if min(E, c["S_EXP"]) <= DECODE_ACTIVE * K:
        return decode_tiles(c, T, K, E, D, I, slots)
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v24's contract and launches on v25's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot, router=_router)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v25's launcher):

        python -m workbench.kernels.int4_moe.triton_v25 [--ep 8] [--T 1,9,17] [--cfgs "v=24;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=24;base")


if __name__ == "__main__":
    raise SystemExit(_main())
