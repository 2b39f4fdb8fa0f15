"""int4_moe triton_v24: v22 with the routing metadata of 9-64 tokens in ONE launch (a sort)
instead of v9's three (count, scan, scatter); v22's everywhere else (the one-program router up
to 8 tokens, the three launches past 64), the same metadata bit for bit.

Why (H200, session 20 call 3, the EP8 step's kernels, `traces/gpu/session20/call3_emulate_
kernels_graph_engine.csv`): at C 1 DDTree-16 (17 tokens a MoE layer) the three routing
launches took 1.3 + 1.5 + 2.1 = 4.8 µs a layer (count 77, scan 90, scatter 125 µs a step),
for metadata of 136 slots. `_route_sort_kernel` is one program over every slot of the call
(T x KP <= 512): the bad-token flags and the per-expert histogram as `_common._route_kernel`
computes them for one block, the active-expert lists from the histogram
(`_common._route_active`), and the slot list by sorting the keys expert x SB + slot of the
routed slots: ascending expert, then ascending slot id within an expert, which is exactly the
stable order `route` / `route_parallel` produce (their blocks are consecutive tokens), so the
GEMMs see identical metadata (tests/test_int4_moe_kernel.py). Measured (session 20 call 5,
EP8 step graph-replayed): 165 µs a C 1 DDTree-16 step (2.75 µs a layer) against the three
launches' 300; v22's bits in 18 GPU tests; BEST from session 20.
Dimension legend: v16's.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    Routing,
    _route_active,
    _route_bad,
    _route_block,
    launch_router,
    next_pow2,
)
from .triton_v9 import _router as _router_v9
from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v22 import tiles as _tiles_v22

SORT_SLOTS = 512  # the most (padded) slots the sorted router takes: T 64 at K 8


@triton.jit
def _route_sort_kernel(ids_ptr, s_it, s_ik, T, E, slots_ptr, act_e_ptr, act_start_ptr,
                       act_cnt_ptr, n_act_ptr, bad_ptr, K: tl.constexpr, KP: tl.constexpr,
                       EP: tl.constexpr, TP: tl.constexpr):
    """One program, every slot of the call as one block of TP tokens: bad flags, active
    experts, and the slots grouped by expert in slot order (a sort of expert x SB + slot)."""
    SB: tl.constexpr = TP * KP
    ef, ok, slot, m, e, in_range, t = _route_block(ids_ptr, s_it, s_ik, T, E, 0, K, KP, TP)
    tl.store(bad_ptr + t, _route_bad(m, e, in_range, tl.arange(0, KP)).to(tl.int8), mask=t < T)
    _route_active(tl.histogram(ef, EP, mask=ok), act_e_ptr, act_start_ptr, act_cnt_ptr,
                  n_act_ptr, EP)
    key = tl.sort(tl.where(ok, ef * SB + slot, EP * SB), 0)  # not routed: past every key
    idx = tl.arange(0, SB)
    tl.store(slots_ptr + idx, key % SB, mask=idx < tl.sum(ok.to(tl.int32), 0))


def route_sorted(topk_ids: Tensor, E: int) -> Routing:
    """`_common.route`'s outputs (bitwise) from one `_route_sort_kernel` program; T x
    next_pow2(K) <= SORT_SLOTS."""
    return launch_router(_route_sort_kernel, topk_ids, E, TP=next_pow2(topk_ids.shape[0]))


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v22's tiles, plus ROUTE_SORT: the most tokens the sorted router takes (above v9's
    one-program ROUTE1). Shapes only (graph-safe)."""
    return _tiles_v22(T, K, E, D, I, slots) | dict(ROUTE_SORT=SORT_SLOTS // next_pow2(K))


def _router(topk_ids: Tensor, E: int, c: dict):
    T = topk_ids.shape[0]
    if c["ROUTE1"] < T <= c["ROUTE_SORT"]:
        return route_sorted(topk_ids, E)
    return _router_v9(topk_ids, E, c)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v22's contract and launches with `_router`'s metadata; cfg: tile overrides (keys of
    `tiles`; ROUTE_SORT=0 routes as v22)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot, router=_router)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v24's launcher):

        python -m workbench.kernels.int4_moe.triton_v24 [--T 1,9,17] [--cfgs "v=22;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=22;base")


if __name__ == "__main__":
    raise SystemExit(_main())
