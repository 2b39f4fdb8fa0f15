"""int4_moe triton_v18: v16 with its hot launches' grid capped at HOT_GRID = 8 programs an N
tile (v16: one per hot expert the expected slots allow, S_EXP / (HOT + 1)).

Why (H200, session 16 calls 3 and 7, traces/gpu/session16/README.md): where no expert is hot
(uniform routing) v16's hot launches still run their whole grid, every program loading the
counts and leaving: 63 programs an N tile at T 512 (~11,000 in all), 256 at T 2080 (~45,000).
Measured cost: T 128 16 µs (`--by-kernel`), T 2080 +118 µs against v13 (in-process A/B), T 512
uniform 3299 against v13's 3211 µs (interleaved REAL bench). Programs already stride over the
hot ranks (h, h + H, ...), so fewer of them cover any hot count: 8 an N tile is 512 gate/up
and 896 down programs, 4-7 waves of the hot kernel's one CTA an SM, and the empty launches
cost 1408 programs at every T.
Numerics: which program computes a hot expert's tile changes, not how: v16's bits (a test
asserts it on the CPU with the cap at 1).

Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v16 import tiles as _tiles_v16

HOT_GRID = 8  # hot programs an N tile, at most


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v16's tiles with HOT_GRID. Shapes only (graph-safe)."""
    return _tiles_v16(T, K, E, D, I, slots) | dict(HOT_GRID=HOT_GRID)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v16's contract and launches (`triton_v16.int4_moe_triton`), the hot grid capped at
    HOT_GRID programs an N tile; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v18's launcher):

        python -m workbench.kernels.int4_moe.triton_v18 [--T 512,2080] [--cfgs "v=16;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=16;base;HOT_GRID=4")


if __name__ == "__main__":
    raise SystemExit(_main())
