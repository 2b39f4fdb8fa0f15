"""int4_moe triton_v9: v8 with the routing metadata built by per-block programs
(`_common.route_parallel`: count, scan, scatter) above one block of tokens, instead of v8's
one-program `_route_kernel`.

Why (H200, session 6, `python -m workbench.kernels.int4_moe.triton_v8 --by-kernel`): the
one-program routing kernel walks its blocks of 8 tokens one after the other, twice: 3.0 / 7.6 /
11.3 µs at T = 1 / 9 / 17, ~4 µs a block, so ~65 µs at T = 128 and ~250 µs at T = 512 (v8 was
37 µs and 323 µs slower than Humming there), and ~1 ms per layer at the loop's C = 32 x budget
64 verify (T = 2080). route_parallel's two passes are grids over the blocks; only the per-expert
prefix over the blocks is one program, on [BB, EP] tiles. At T <= ROUTE1 (one block: 8 tokens
at K = 8) the one-program kernel stays: one launch instead of three.

Outputs: bitwise v8's (= v7's): the routing metadata is identical (the sorted slot list is
stable by slot within an expert either way; tests compare the two routers), and everything
after it is v8's launch (`triton_v7.launch`).

Dimension legend: v5's; NB = ceil(T / 8) blocks of 8 tokens (64 slots at K = 8), EP = E rounded
up to a power of two, BB blocks per scan tile.
"""

from __future__ import annotations

from torch import Tensor

from ._common import block_tokens, route, route_parallel
from .triton_v7 import launch
from .triton_v8 import tiles as _tiles_v8


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """v8's tiles, plus ROUTE1: the largest T routed by the one-program kernel."""
    return _tiles_v8(T, K, E, D, I) | dict(ROUTE1=block_tokens(K))  # one block: one program


def _router(topk_ids: Tensor, E: int, c: dict):
    return route(topk_ids, E) if topk_ids.shape[0] <= c["ROUTE1"] else \
        route_parallel(topk_ids, E)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is; weight words 16-byte aligned) -> [T, D] bf16;
    the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: tile overrides (keys of `tiles`; ROUTE1=0 routes every T
    with the per-block programs), for sweeps and tests."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, tiles, down_select=True,
                  router=_router, expected_slots=expected_slots)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v9's launcher):

        python -m workbench.kernels.int4_moe.triton_v9 [--T 1,9,33,128,512] [--by-kernel]
            [--cfgs "base;ROUTE1=0;ROUTE1=64"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base;ROUTE1=0")


if __name__ == "__main__":
    raise SystemExit(_main())
