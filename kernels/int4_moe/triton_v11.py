"""int4_moe triton_v11: v10 with its tiles sized for the slots the caller expects to be routed
here (the op's `expected_slots` hint), and a SiLU launch over the routed positions only
(grid-strided from a grid sized by the hint).

Why (H200, session 10, `python -m workbench.dist.emulate ... --ep-dispatch local`, C 8 x
DDTree-16): with EP on the replicated stream each rank passes all T = 136 tokens x K = 8 slots
to the op, -1 on the ~7/8 that name another rank's experts. v10 sizes its tiles for S = T K =
1088 slots over the rank's 48 experts (BM1 32 past 16 E, BM2 16 past 4 E, K splits for ~23
slots an expert) where ~136 are routed (~3 an expert): its two GEMMs took 22.6 ms a step there
against 18.1 ms under all-to-all dispatch (which hands the op just its ~136 received rows), and
the SiLU 450 vs 143 µs (one program a position, all 1088 of them). v11's tiles are v10's at
ceil(expected_slots / K) tokens; without the hint they are v10's (and so are the bits).

The hint never changes what is computed, only the partition (tiles and K splits): outputs
are within the harness tolerance of the reference at any hint, and equal v10's without it.
The SiLU reads the routed count from the routing metadata on the device (the last active
expert's start + count): no host sync, graph-capturable; its grid (one program row a position
expected, all S without a hint) strides over however many were routed.

Dimension legend: v5's (S = T K slots, E experts, I FFN width, Ip = I padded to KT).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, _split_bf16, pdl_launch, pdl_start
from .triton_v3 import KT
from .triton_v5 import _src
from .triton_v7 import grid_gemm, launch
from .triton_v9 import _router
from .triton_v10 import tiles as _tiles_v10

_KT = tl.constexpr(KT)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v10's tiles for the routed slots expected (`slots`), i.e. at ceil(slots / K) tokens;
    v10's own without a hint. Shapes only (graph-safe)."""
    if slots is None:
        return _tiles_v10(T, K, E, D, I)
    return _tiles_v10(max(1, triton.cdiv(slots, K)), K, E, D, I)


@triton.jit
def _silu_routed_kernel(g_ptr, s_gk, I, Ip, h_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                        KS: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
                        EARLY: tl.constexpr = False):
    """v5's `_silu_kernel` (h = SiLU(sum_ks gate) * sum_ks up, bf16 hi + lo) over the routed
    positions only, grid-strided: program p takes positions p, p + P, ... below the routed
    count (read on the device), so a grid sized by the hint covers any count, and positions
    past it (g rows never written) are never read. PDL, EARLY: `_common.pdl_start` (v14, v15)."""
    pdl_start(PDL, EARLY)
    n = tl.load(n_act_ptr)
    last = tl.maximum(n - 1, 0)
    routed = tl.where(n > 0, tl.load(act_start_ptr + last) + tl.load(act_cnt_ptr + last), 0)
    o = tl.program_id(1) * _KT + tl.arange(0, _KT)
    src = _src(o)
    m = src < I
    for pos in tl.range(tl.program_id(0), routed, tl.num_programs(0)):
        p64 = tl.cast(pos, tl.int64)  # (the interpreter hands range values as Python ints)
        silu_position(g_ptr, s_gk, I, Ip, h_ptr, p64, o, src, m, KS, INTERPRET)


@triton.jit
def silu_position(g_ptr, s_gk, I, Ip, h_ptr, p64, o, src, m, KS: tl.constexpr,
                  INTERPRET: tl.constexpr, CG: tl.constexpr = False):
    """Position p64's permuted columns o (sources src, mask m) of h: `_silu_routed_kernel`'s
    arithmetic, for it and for triton_v17's gate/up GEMM epilogue. CG: read g past L1 (".cg":
    v17 reads partials other programs wrote during the same launch)."""
    g = tl.zeros(o.shape, tl.float32)
    u = tl.zeros(o.shape, tl.float32)
    for ks in tl.static_range(KS):
        row = g_ptr + ks * s_gk + p64 * (2 * I)
        if CG:
            g += tl.load(row + src, mask=m, other=0.0, cache_modifier=".cg")
            u += tl.load(row + I + src, mask=m, other=0.0, cache_modifier=".cg")
        else:
            g += tl.load(row + src, mask=m, other=0.0)
            u += tl.load(row + I + src, mask=m, other=0.0)
    h = g / (1.0 + tl.exp(-g)) * u
    hi, lo = _split_bf16(h, INTERPRET)
    tl.store(h_ptr + p64 * (2 * Ip) + o, hi.to(tl.bfloat16))
    tl.store(h_ptr + p64 * (2 * Ip) + Ip + o, lo.to(tl.bfloat16))


def _silu(g: Tensor, h: Tensor, r, c: dict, slots: int | None, pdl: bool = False,
          early: bool = False) -> None:
    """g [KS1, S, 2I] fp32 -> h [S, 2, Ip] bf16 hi / lo at the routed positions; one program
    row a position expected (all S without a hint, as v10's grid); pdl: v14's dependent
    launch (early: v15's, the next launch let in before the wait)."""
    S, I, Ip = g.shape[1], g.shape[2] // 2, h.shape[2]
    P = S if slots is None else max(1, min(S, slots))
    _silu_routed_kernel[(P, Ip // KT)](g, g.stride(0), I, Ip, h, r.act_start, r.act_cnt,
                                       r.n_act, KS=c["KS1"], INTERPRET=INTERPRET, num_warps=2,
                                       **pdl_launch(pdl, early))


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (sizes the tiles);
    cfg: tile overrides (keys of `tiles`), for sweeps and tests."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles)


def launch_hinted(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate, cfg,
                  expected_slots, tiles_of, pdl: bool = False, early: bool = False,
                  gemm=grid_gemm, router=_router) -> Tensor:
    """v11's launches (v7's program, v9's router, the hinted SiLU) with the tiles
    tiles_of(T, K, E, D, I, slots=expected_slots) (v13: other K splits); pdl: v14's chain
    (early: v15's SiLU lets the down GEMM in before its wait); gemm: v7's hook (v15's);
    router: v9's (v24's: the one-launch sorted router for small verifies)."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg,
                  functools.partial(tiles_of, slots=expected_slots), down_select=True,
                  router=router, expected_slots=expected_slots,
                  silu=functools.partial(_silu, slots=expected_slots, early=early), pdl=pdl,
                  gemm=gemm)
