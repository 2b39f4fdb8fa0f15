"""int4_moe triton_v27: v26 with the routing metadata and the permuted activations from ONE
launch wherever one program routes (T <= 64 at K 8): program 0 runs v26's router body (the
one-program `_common._route_kernel` up to ROUTE1 tokens, v24's `_route_sort_kernel` to
ROUTE_SORT), programs 1.. run v5's permute (one [256] K tile of one token each); the GEMMs read
the router's `xp`. Five launches instead of six; past ROUTE_SORT v26's (v9's three routing
launches, then the permute).

Why (H200, session 22 call 1, the EP8 step's kernel table `traces/gpu/session22/
call1_emulate_kernels_graph_defaults.csv`): the permute is a launch of its own on the step's
critical path, 1.99 / 1.76 µs a MoE layer at C 1 AR / DDTree-16 (120 / 106 µs a step), for
17 x 14 KB of activations; it does not depend on the routing, so its programs can run beside
the routing program in the router's launch, whose one program takes 2.2-2.9 µs alone.
Expected: ~1.5-2 µs a layer (~0.1 ms a C 1 step).

Bits: v26's. The router's program is the same code on the same inputs (a Triton function call
inlines), the permute programs compute v5's `xp[t, o] = x[t, _src(o)]` (0 past D); the GEMMs,
SiLU and combine are v26's launches on those buffers (tests/test_int4_moe_kernel.py).
Dimension legend: v16's (T tokens, K slots, E experts, D hidden; Dp = D rounded up to KT).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import Routing, _route_kernel, block_tokens, next_pow2
from .triton_v3 import KT
from .triton_v5 import _src
from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v24 import _route_sort_kernel
from .triton_v24 import _router as _router_v24
from .triton_v26 import tiles

_KT = tl.constexpr(KT)


@triton.jit
def _route_permute_kernel(ids_ptr, s_it, s_ik, T, E, slots_ptr, act_e_ptr, act_start_ptr,
                          act_cnt_ptr, n_act_ptr, bad_ptr, x_ptr, s_xt, s_xd, xp_ptr, D, Dp,
                          K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr,
                          TB: tl.constexpr, SORT: tl.constexpr):
    """Program 0: the routing metadata (SORT: v24's sort over one block of TB tokens, else
    `_route_kernel`'s two passes over blocks of TB). Program 1 + q: token q // (Dp / KT)'s K
    tile q % (Dp / KT) of the permuted activations (v5's `_permute_kernel`)."""
    pid = tl.program_id(0)
    if pid == 0:
        if SORT:
            _route_sort_kernel(ids_ptr, s_it, s_ik, T, E, slots_ptr, act_e_ptr, act_start_ptr,
                               act_cnt_ptr, n_act_ptr, bad_ptr, K, KP, EP, TB)
        else:
            _route_kernel(ids_ptr, s_it, s_ik, T, E, slots_ptr, act_e_ptr, act_start_ptr,
                          act_cnt_ptr, n_act_ptr, bad_ptr, K, KP, EP, TB)
    else:
        q = pid - 1
        tiles_a_row = Dp // _KT
        t = (q // tiles_a_row).to(tl.int64)
        o = (q % tiles_a_row) * _KT + tl.arange(0, _KT)
        src = _src(o)
        v = tl.load(x_ptr + t * s_xt + src * s_xd, mask=src < D, other=0.0)
        tl.store(xp_ptr + t * Dp + o, v)


def route_permute(x: Tensor, topk_ids: Tensor, E: int, c: dict) -> Routing:
    """v26's routing metadata (`triton_v24._router`), with `xp` [T, Dp] bf16 (the permuted x)
    from the same launch where one program routes (T <= ROUTE_SORT); past it v26's launches
    and no `xp` (the launcher permutes)."""
    T, K = topk_ids.shape
    if T > c["ROUTE_SORT"]:
        return _router_v24(topk_ids, E, c)
    sort = T > c["ROUTE1"]
    r = Routing(T, K, E, topk_ids.device)
    D = x.shape[1]
    Dp = triton.cdiv(D, KT) * KT
    r.xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=x.device)
    _route_permute_kernel[(1 + T * (Dp // KT),)](
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), T, E, r.slots, r.act_e, r.act_start,
        r.act_cnt, r.n_act, r.bad, x, x.stride(0), x.stride(1), r.xp, D, Dp, K=K,
        KP=next_pow2(K), EP=next_pow2(E), TB=next_pow2(T) if sort else block_tokens(K),
        SORT=sort, num_warps=4)
    return r


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v26's contract, tiles and launches, the routing and the permute in one launch up to
    ROUTE_SORT tokens; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot, router=functools.partial(route_permute, x))


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v27's launcher):
        python -m workbench.kernels.int4_moe.triton_v27 [--ep 8] [--T 1,17] [--cfgs "v=26;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=26;base")


if __name__ == "__main__":
    raise SystemExit(_main())
