"""int4_moe triton_v16: v13 with the experts that hold many slots ("hot": more than HOT) run
by a second launch of each GEMM on wide slot tiles, so a hot expert's weight slice is streamed
a few times instead of once per 16 slots.

Why (H200, session 15 call 2, `bench int4_moe --shapes real`): v13 is weakest where routing is
skewed and T is large: T 512 skewed 4197 µs, 47.7 % of the floor, 0.89x Humming (uniform 70.4
%). A program walks its expert's slots in chunks of BM (16 at T 512) and streams its whole
weight slice (its N tile over all of K) once per chunk (`triton_v7.expert_tile`); with skewed
routing the few hot experts are chosen by most tokens (T 512, skew 1.2: the hottest by nearly
all 512), so their slices are read ~20-32 times while the uniform case reads each once or
twice. Each token names an expert at most once, so a count is at most T: nothing is hot below
T = HOT + 1.

    gate/up, down    (only where both GEMMs run unsplit, KS1 = KS2 = 1, and T > HOT: shapes
                     only, graph-safe; else v13's single launch)
      cold launch    v7's grid (N tile of BN, active expert, 1) and program, experts with
                     count <= HOT only (its HOT constexpr)
      hot launch     grid (N tile of BN_HOT, H = min(A, S_EXP // (HOT + 1)), 1), S_EXP the
                     routed slots expected (the op's hint, else T K): program h takes the hot
                     experts of rank h, h + H, ... (ranks from one load of the counts and an
                     inclusive prefix sum: any hot count, whatever the hint said) and runs
                     v7's `expert_tile` over all of K on
                     BN_HOT x BM_HOT tiles (gate/up BM1_HOT 128: wgmma n128; down BM2_HOT 64:
                     hi + lo, n128), reading descriptors with BN_HOT-row boxes

Both launches write disjoint slot rows of the same partial buffers, so the SiLU, the combine
and the router are v13's. Numerics: a slot's output is still one fp32 dot per element over
K (v7's tile arithmetic); hot experts' slots come from another tile shape: within the
harness tolerances of the reference, not v13's bits where an expert is hot.
Knobs (`tiles`, overridable through cfg): HOT 64, BN_HOT 64, BM1_HOT 128, BM2_HOT 64.

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, A active experts, D hidden, I
expert FFN width; BN weight rows a program; BM slots a tile; KT inputs a K tile).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import next_pow2
from .triton_v3 import KT

# _gemm_kernel is imported for sm90.py, which compiles (and swaps) a version's kernels by module
from .triton_v7 import _gemm_kernel, expert_tile, grid_gemm  # noqa: F401
from .triton_v11 import launch_hinted
from .triton_v13 import tiles as _tiles_v13

_KT = tl.constexpr(KT)
HOT = 64  # slots above which an expert is hot (4 of v13's 16-slot gate/up chunks)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v13's tiles and splits, plus the hot launch's knobs; S_EXP: the routed slots expected
    (the hint, else T K), which sizes the hot grid (its programs stride over any hot count).
    Shapes only (graph-safe)."""
    s_exp = T * K if slots is None else max(1, min(T * K, slots))
    return _tiles_v13(T, K, E, D, I, slots) | dict(HOT=HOT, BN_HOT=64, BM1_HOT=128,
                                                   BM2_HOT=64, S_EXP=s_exp)


@triton.jit
def _gemm_hot_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                     w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                     n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, HOT,
                     K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                     TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                     OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr, INTERPRET: tl.constexpr,
                     BLOCK_A: tl.constexpr):
    """Program (N tile, h): the hot experts (active, > HOT slots, ranked by ascending id) of
    rank h, h + H, h + 2 H, ... (H programs on this axis, any hot count), each over all of K."""
    idx = tl.arange(0, BLOCK_A)  # [BLOCK_A] active positions (BLOCK_A >= the grid's A)
    cnt = tl.load(act_cnt_ptr + idx, mask=idx < tl.load(n_act_ptr), other=0)
    hot = cnt > HOT
    rank = tl.cumsum(hot.to(tl.int32), 0)  # hot experts up to and including each position
    for hh in tl.range(tl.program_id(1), tl.max(rank, 0), tl.num_programs(1)):
        a = tl.sum(tl.where(hot & (rank == hh + 1), idx, 0), 0)  # the one position of rank hh
        expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                    w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                    out_ptr, s_ok, s_or, NOUT, NT1, IN, a, tl.program_id(0), 0,
                    tl.cdiv(IN, _KT), 0, 0, K, BN, BM, NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT,
                    False, ABLATE, INTERPRET)


def _boxes(d, rows: int):
    """A host descriptor `d` with `rows`-row boxes (same tensor, shape and strides)."""
    if not isinstance(d, TensorDescriptor):  # scales not TMA-aligned: the tensor itself
        return d
    return TensorDescriptor(d.base, d.shape, d.strides, [d.block_shape[0], rows,
                                                         d.block_shape[2]])


def hot_mode(c: dict, T: int) -> bool:
    """Whether v16 splits the GEMMs into cold and hot launches: both unsplit along K (the hot
    launch writes partial 0 only) and some expert can hold more than HOT slots (a count is at
    most T). Shapes only."""
    return c["KS1"] == 1 and c["KS2"] == 1 and T > c["HOT"]


def grid_gemm_hot(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """GEMM n (1 gate/up, 2 down) as v16's cold and hot launches where `hot_mode`, else v7's
    one launch (`triton_v7.grid_gemm`)."""
    T = r.bad.shape[0]
    if not hot_mode(c, T):
        return grid_gemm(n, c, r, NT, args, kw)
    grid_gemm(n, c, r, NT, args, dict(kw, HOT=c["HOT"]))  # cold: v7's, counts <= HOT
    hot_launch(n, c, r, args, kw)


def hot_launch(n: int, c: dict, r, args: tuple, kw: dict, kernel=None,
               programs: int | None = None) -> None:
    """GEMM n's hot launch (`_gemm_hot_kernel`) with the cold launch's `args` / `kw`; kernel,
    programs: another kernel of `_gemm_hot_kernel`'s signature and its programs an N tile
    (cuda_v22's items)."""
    bn = c["BN_HOT"]
    nout = args[19]
    nt = triton.cdiv(nout, bn)
    hot_args = list(args)
    hot_args[3:7] = [_boxes(d, bn) for d in args[3:7]]
    hot_args[20] = nt  # NT1: the N tiles of one projection at BN_HOT
    if programs is None:
        # the hot experts the expected slots allow (a count of > HOT slots each); more are
        # taken by the same programs in turn; HOT_GRID (v18): at most that many a tile
        programs = max(1, min(r.max_active, c["S_EXP"] // (c["HOT"] + 1),
                              c.get("HOT_GRID") or 1 << 30))
    hot_kw = dict(kw, BN=bn, BM=c["BM1_HOT"] if n == 1 else c["BM2_HOT"])
    (kernel or _gemm_hot_kernel)[(2 * nt if n == 1 else nt, programs, 1)](
        *hot_args, c["HOT"], BLOCK_A=next_pow2(r.max_active), **hot_kw)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (v13's tiles and splits);
    cfg: tile overrides (keys of `tiles`: HOT, BN_HOT, BM1_HOT, BM2_HOT too)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v16's launcher):

        python -m workbench.kernels.int4_moe.triton_v16 [--T 128,512] [--cfgs "base;HOT=32"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base;HOT=32;HOT=128;HOT=512")


if __name__ == "__main__":
    raise SystemExit(_main())
