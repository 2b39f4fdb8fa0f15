"""int4_moe triton_v26: v25 with its 64-row tile rule on the experts expected to be active,
E (1 - (1 - 1/E)^S) for S expected slots spread over E experts, at most DECODE_ACTIVE = 2 K
(v25: min(E, S) <= 3 K); v24's 128-row tiles above, everything else v25's (= v24's).

Why (H200, session 21, traces/gpu/session21/README.md): v25's bound took the 64-row tiles
where they lose. Medians of 3 interleaved rounds, v24's 128-row tiles against the 64-row
ones, by the experts active (expected for the shape; the draw's own count in brackets):
- win: T 2 on 384 experts (15.7 expected) 148.6 -> 136.6 µs uniform, 128.7 -> 121.1 skewed
  (call 8); an EP8 rank's hint 17 (14.4; the step's C 1 DDTree-16 verify): the step's int4
  GEMMs 7279 -> 7147 µs (call 3), single draws with 14-16 on the rank 3-12 µs faster (calls
  2, 5), with 10-11 on the rank 6-7 µs slower (calls 3, 5: not explained);
- lose: T 3 on 384 experts (23.3) 185.2 -> 192.5 uniform, 153.7 -> 159.5 skewed (call 8); an
  EP8 rank's hint 24 (19.0) 183.6 -> 188.0 (call 3; a draw with 15 on the rank won, call 5),
  hint 33 (24.0) 186.4 -> 193.8 (call 2).
The expected count, not min(E, S), is what a grid of that many experts' tiles holds on
average (an EP8 rank's 17 slots land on ~14.4 of its 48 experts); the bound 2 K = 16 sits
between the wins (<= 15.7) and the losses (>= 19.0). Shapes only: the count is a float of
E and the hint, graph-safe. Bits: v24's (BN changes the grid, not a row's K order).
Measured (session 21 call 9): GPU tests 18 passed (v24's bits on 384 experts and on a hinted
EP8 rank, REAL shapes, graph replay); `--T 2,3 --cfgs "v=24;v=25;base" --rounds 3`: T 2 137.4
µs (v25 137.8, v24 151.5), T 3 187.6 (v24 187.6, v25 193.8). BEST from session 21.
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v19 import decode_tiles
from .triton_v24 import _router
from .triton_v24 import tiles as _tiles_v24

DECODE_ACTIVE = 2  # x K: the most experts expected active that take the 64-row tiles


def expected_active(E: int, slots: int) -> float:
    """Experts expected to hold at least one of `slots` slots spread uniformly over E."""
    return E * (1.0 - (1.0 - 1.0 / E) ** slots) if E > 0 else 0.0


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v24's tiles; at most DECODE_ACTIVE K experts expected active (`expected_active` of the
    expected slots): BN 64 at 128 registers and v13's splits for it. Shapes only."""
    c = _tiles_v24(T, K, E, D, I, slots)
    if expected_active(E, c["S_EXP"]) <= DECODE_ACTIVE * K:
        return decode_tiles(c, T, K, E, D, I, slots)
    return c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v24's contract and launches on v26's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot, router=_router)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v26's launcher):

        python -m workbench.kernels.int4_moe.triton_v26 [--ep 8] [--T 2,3,17] [--cfgs "v=25;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=25;base")


if __name__ == "__main__":
    raise SystemExit(_main())
