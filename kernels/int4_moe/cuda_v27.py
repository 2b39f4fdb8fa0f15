"""int4_moe cuda_v27: cuda_v26 with the down GEMM's middle experts (MID < slots <= HOT) on a
launch of their own whose BM2_MID-slot chunks stream an expert's down weights once, instead of
the cold down launch's BM2-slot chunks streaming them once a chunk.

Why (session 52 call 2, H100 80GB, ncu of cuda_v21's launches at skewed T 512,
traces/gpu/session52/call2/ncu_s512.csv.gz; the slot counts from the bench's Zipf draws):
`expert_tile` (triton_v7) runs a program's N tile over the whole K once per BM-slot chunk of
its expert. The cold down launch takes the experts of at most HOT (64) slots at BM2 16, so an
expert of 17-64 slots streams its 128-row x 2048-input weight tile 2-4 times. By the launch's
ncu row (21504 programs, 54.3 waves in 1088 µs: ~20 µs a program, ~3 resident an SM, ~50 MB
of tiles in flight against the H100's 50 MB L2) the second pass finds its lines gone: an
estimate the bytes bear out: the cold down read **2.99 GB** from DRAM in 1088 µs where
its ~330 experts hold ~2.7 GB (Zipf 1.2 draws of T 512 on 384 experts: 26-28 experts of 17-64
slots, 1-3 extra passes each, ~0.3 GB). BM2 8 (twice the passes) was 6 % slower (call 2).
A launch of BM2_MID (64) slot chunks reads each of those experts once; the cold launch keeps
BM2 16 for the 1-16-slot experts, whose MMA work a 64-slot tile would quadruple.

What: cuda_v26's op (tiles, dispatch, gate/up launches) with the down GEMM's launch hook
`grid_gemm_mid`: where triton_v16 splits the down GEMM into cold and hot launches
(`hot_mode`) and MID > 0, three launches on the current stream: the cold one on experts of at
most MID slots (triton_v7's grid, BM2), `_gemm_band_kernel` on the experts of MID + 1 .. HOT
slots (triton_v16's `hot_launch` on it: BN_HOT N tiles x min(MID_GRID, the experts of > MID
slots the expected slots allow) programs, program h taking the band's experts of rank h,
h + H, ... by position, each `expert_tile` at BM2_MID over all of K), then triton_v16's hot
launch; elsewhere (MID 0, no hot launch, a split K) cuda_v26's hook (triton_v29's
`grid_gemm_idle_last`). Knobs: MID (16; 0: cuda_v26's launches and bits), BM2_MID (64),
MID_GRID (32). Numerics: the same tiles and fp32 chain a slot as the cold launch's (within the
reference's tolerance; at BM2_MID = BM2 the cold launch's bits: CPU test). Unmeasured: the
defaults are the reading above, not a sweep's. GPU only (cupy). Dimension legend: cuda_v1.cu's,
cuda_v10.cu's and triton_v16's.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from workbench.streams import Side

from . import cuda_v4, cuda_v17, cuda_v26
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)
from .triton_v7 import _KT, expert_tile, grid_gemm
from .triton_v16 import hot_launch, hot_mode
from .triton_v29 import grid_gemm_idle_last

MIDDLE = {"MID": 16, "BM2_MID": 64, "MID_GRID": 32}  # band floor, its slot tile, its programs


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v26's tiles with MIDDLE."""
    return cuda_v26.tiles(T, K, E, D, I, slots) | MIDDLE


@triton.jit
def _gemm_band_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                      w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                      n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, HI,
                      K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                      TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                      OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
                      INTERPRET: tl.constexpr, BLOCK_A: tl.constexpr, LO: tl.constexpr):
    """Program (N tile, h): the band's experts (active, LO + 1 .. HI slots, ranked by active
    position) of rank h, h + H, ... (H programs on this axis), each `expert_tile` over all of
    K: triton_v16's hot program on a band instead of a floor, launched as it is (`hot_launch`:
    HI in HOT's place, LO a constexpr: MID takes a few values)."""
    idx = tl.arange(0, BLOCK_A)  # [BLOCK_A] active positions (BLOCK_A >= the grid's A)
    cnt = tl.load(act_cnt_ptr + idx, mask=idx < tl.load(n_act_ptr), other=0)
    band = (cnt > LO) & (cnt <= HI)
    rank = tl.cumsum(band.to(tl.int32), 0)  # band experts up to and including each position
    for hh in tl.range(tl.program_id(1), tl.max(rank, 0), tl.num_programs(1)):
        a = tl.sum(tl.where(band & (rank == hh + 1), idx, 0), 0)  # the one position of rank hh
        expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                    w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                    out_ptr, s_ok, s_or, NOUT, NT1, IN, a, tl.program_id(0), 0,
                    tl.cdiv(IN, _KT), 0, 0, K, BN, BM, NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT,
                    False, ABLATE, INTERPRET)


def check_mid(c: dict) -> int:
    """MID, BM2_MID and MID_GRID refused by name unless an int in [0, HOT), a power of two
    from 8 and an int >= 1; MID, the band's floor (0: no band launch)."""
    mid = c.get("MID", 0)
    _require(type(mid) is int and 0 <= mid < c["HOT"], "cfg['MID']",
             f"an int in [0, HOT = {c['HOT']}) (0: no middle launch)", mid)
    bm = c.get("BM2_MID", MIDDLE["BM2_MID"])
    _require(type(bm) is int and bm >= 8 and bm & (bm - 1) == 0, "cfg['BM2_MID']",
             "a power of two >= 8 (the middle launch's slot chunk, as BM2)", bm)
    grid = c.get("MID_GRID", MIDDLE["MID_GRID"])
    _require(type(grid) is int and grid >= 1, "cfg['MID_GRID']",
             "an int >= 1 (middle programs an N tile)", grid)
    return mid


def mid_programs(c: dict, max_active: int) -> int:
    """H, the middle launch's programs an N tile: MID_GRID, at most the experts of more than MID
    slots the expected slots allow. Shapes only."""
    return max(1, min(c["MID_GRID"], max_active, c["S_EXP"] // (c["MID"] + 1)))


def grid_gemm_mid(n: int, c: dict, r, NT: int, args: tuple, kw: dict, side=None) -> None:
    """A GEMM launch hook (triton_v7's `gemm` signature): the down GEMM (n 2) in three launches
    where triton_v16 splits it (`hot_mode`) and MID > 0 -- the cold one on experts of at most
    MID slots, `_gemm_band_kernel` on MID + 1 .. HOT at BM2_MID, triton_v16's hot launch past
    HOT -- each slot row of y written by exactly one of them; else cuda_v26's hook. side: a
    `workbench.streams.Side` the band launch runs on, forked after the cold launch and joined
    after the hot one (cuda_v29); None: an off Side, all three on the current stream."""
    if n != 2 or not check_mid(c) or not hot_mode(c, r.bad.shape[0]):
        return grid_gemm_idle_last(n, c, r, NT, args, kw)
    grid_gemm(n, c, r, NT, args, dict(kw, HOT=c["MID"]))  # cold: counts <= MID

    def band():
        # the band on the hot launch's N tiles (BN_HOT: its descriptors' boxes; at BN 128 a
        # 64-slot chunk spills at 4 warps, sm_90 build) at BM2_MID-slot chunks
        hot_launch(n, c | {"BM2_HOT": c["BM2_MID"]}, r, args, dict(kw, LO=c["MID"]),
                   kernel=_gemm_band_kernel, programs=mid_programs(c, r.max_active))

    side = side or Side(r.bad.device, False)  # off: fork / join nothing, run on this stream
    side.fork()
    side.run(band)
    hot_launch(n, c, r, args, kw)
    side.join()


# the op and its CLI: cuda_v26's with the middle down launch
int4_moe_cuda, _main = cuda_v17.on_tiles(
    tiles, "v=cuda_v26;base;MID=0;BM2_MID=32", hot_for=cuda_v26.launch_bands_tc,
    tail_for=functools.partial(cuda_v4.down_tail, gemm=grid_gemm_mid))


if __name__ == "__main__":
    raise SystemExit(_main())
