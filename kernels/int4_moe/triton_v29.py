"""int4_moe triton_v29: v28 with the GEMM grids ordered (N tile, K split, active expert) where a
GEMM is split along K, so the worst-case grid's idle programs (a >= the active count) come last
in launch order; v28's launches everywhere else (its grids are (N tile, active expert, 1)
there: the idle programs are last already).

Why (a hypothesis; session 22's ncu of an EP8 rank, traces/gpu/session22/README.md): a grid's
idle programs cost ~2 µs per ~2000 when a launch runs nothing else (a rank with no expert
still takes ~9 µs of launches). The EP8 step's decode (C 1 AR: T 1, hint 1, at most 8 of the
rank's 48 experts, ~1 expected) splits both GEMMs along K (4 and 2 splits by v13's rule on the
64-row tiles), and v7's grid (NT, A, KS) puts the idle experts' programs between the K
splits: with one active expert the gate/up launch's last real split is dispatched after
3 x 7 x 64 = 1344 idle programs, the down launch's after 784. Ordered (NT, KS, A), the real
programs go first and the idle ones are dispatched behind them, while they run. Expected:
~1-2 µs a MoE layer with an expert on the rank (~40 of the step's 60), ~0.05-0.1 ms a C 1 AR
step. The order is the block scheduler's usual linear one, not a CUDA guarantee: the GPU
decides.

Measured (H200, session 23 call 1, traces/gpu/session23/README.md): one active expert on an EP8
rank, gate/up 10.2 vs v28's 12.5 µs and down 6.9 vs 8.4 (`--by-kernel`); the EP8 C 1 AR step
5.469 / 5.474 ms against v28's 5.500 / 5.496 (ABCCBA in one call).

`A_GRID` (a tile key, 0 here) > 0 is triton_v30: A_GRID programs an (N tile, K split) take
the active experts in turn instead of one program an expert of the worst case.

Bits: v28's. The same programs do the same work (the program ids trade axes); A_GRID > 0:
each expert's tile is the work v7's program does for it, in any order (no accumulation
crosses experts).
Dimension legend: v16's (NT N tiles, KS K splits, A active experts of the worst case).
"""

from __future__ import annotations

import functools

from torch import Tensor

from .triton_v7 import _gemm_kernel
from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v26 import tiles as _tiles_v26
from .triton_v28 import route_permute_decode


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v26's tiles, A_GRID 0 (the worst case's programs, idle ones last). Shapes only."""
    return _tiles_v26(T, K, E, D, I, slots) | dict(A_GRID=0)


def grid_gemm_idle_last(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """GEMM n (1 gate/up, 2 down): split along K (c["KSn"] > 1, never v16's hot mode) one
    `_gemm_kernel` launch over (NT, KSn, A), A = the worst case's active experts (A_GRID 0) or
    min(A_GRID, it) programs taking the experts in turn; unsplit, v28's launches."""
    ks = c[f"KS{n}"]
    if ks == 1:
        return grid_gemm_hot(n, c, r, NT, args, kw)
    stride = min(c["A_GRID"], r.max_active)
    _gemm_kernel[(NT, ks, stride or r.max_active)](*args, c[f"TPS{n}"], IDLE_LAST=True,
                                                   A_STRIDE=stride, **kw)


def launch_v29(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate, cfg,
               expected_slots, tiles_of) -> Tensor:
    """v28's launches with `grid_gemm_idle_last` on the tiles tiles_of (v29's, v30's)."""
    if cfg is not None and cfg.get("A_GRID", 0) < 0:
        raise ValueError(f"cfg['A_GRID']: expected >= 0, got {cfg['A_GRID']}")
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles_of, gemm=grid_gemm_idle_last,
                         router=functools.partial(route_permute_decode, x))


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v28's contract, tiles and launches, the K-split GEMMs' idle programs last; cfg: tile
    overrides (keys of `tiles`, A_GRID too)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v29's launcher):

        python -m workbench.kernels.int4_moe.triton_v29 [--ep 8] [--T 1,1,1]
            [--cfgs "v=28;base;A_GRID=2"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=28;base")


if __name__ == "__main__":
    raise SystemExit(_main())
