"""int4_moe cuda_v22: cuda_v21 with the Triton hot launch's programs (the down GEMM's, after
the cold down launch) taking (hot expert, BM-slot chunk) items in turn instead of whole hot
experts.

Why (session 49 call 5, H100 80GB, traces/gpu/session49, by kernel): at skewed T 512 (74 % of
copy, the one REAL shape under the bar's 85) the down phase is the cold `_gemm_kernel` 1113 µs
and then `_gemm_hot_kernel` 287 µs alone at the end, for 11 hot experts holding 2018 of the
4096 slots (73-457 each, this draw: 39 chunks of BM2_HOT 64). triton_v16's hot program h walks
the hot experts of rank h, h + H, ... (H = HOT_GRID 8 an N tile), ranked by expert id, each
over all its chunks: walks of 2 to ~14 chunks. At one CTA an SM (the down build's 116.8 KB of
shared memory, sm_90 compile) the 112 x 8 programs are ~7 waves of ~33 chunk tiles an SM, so
the block scheduler bounds the launch by that average plus the longest walk; dealing chunks
one at a time (program h takes items h, h + HI, ... in (expert, chunk) order) cuts the longest
to ceil(39 / HI) = 3 at HI 16: a tail of up to ~10 chunk tiles in ~33 (how much of it the
launch shows is the GPU's to say). HS 1 goes further: the items (MMA-bound: ~206 TFLOP/s over
the 2018 slots) beside the cold down launch (streaming at ~2.5 TB/s), each filling what the
other leaves, instead of after it.

What: cuda_v21's tiles, dispatch and launches, with the down GEMM's launch hook
`grid_gemm_items` (cuda_v4's tail through cuda_v17's `tail_for`): where triton_v16 makes a hot
launch (`hot_mode`), the cold launch as before and `_gemm_hot_items_kernel` (grid: N tiles of
BN_HOT, H = min(HI, the most items the expected slots allow)) instead of `_gemm_hot_kernel`;
elsewhere triton_v29's `grid_gemm_idle_last` as cuda_v21. An item is triton_v7's
`expert_tile` on one chunk (its ONE_CHUNK): the same tiles and the same fp32 chain per output
as the whole-expert walk, so the bits are cuda_v21's (CPU test on the Triton op; GPU test).
Knobs: HI (hot item programs an N tile, default 16); HS (1: the hot items on cuda_v10's
high-priority side stream beside the cold launch instead of after it; 2: on that stream
behind the hot gate/up launches, not forked again, so they may run beside the cold gate/up
launch's tail too (`tail_items`; y allocated before the first fork, cuda_v13's
`bands_with_partials`; HS 1's fork where the hot gate/up does not run on the side stream);
0 by default: neither measured faster, below). HS 2 is cuda_v13's DS 1 for the hot launch
only (DS 1 moved every past-WT expert's down there and measured no gain on the H200 in
session 36). Numerics, graph safety (the grid from shapes only; the items from the counts on
the device), load step: cuda_v21's. GPU only (cupy). Dimension legend: cuda_v1.cu's, cuda_v10.cu's
and triton_v16's.

Measured (H100 80GB, traces/gpu/session50-51): cuda_v21's bits (GPU tests, HS 0 / 1 / 2). In
process (session 51 call 3, medians of 3) skewed T 128 / 512: cuda_v21 2057.0 / 3878.3 µs, HS 0
2061.4 / 3930.6, HS 1 2057.7 / 3870.4, HS 2 2055.0 / 3895.2: within the rounds' spread, no HS
pays. By kernel the items alone are 15 µs slower than the walk (316.7 vs 301.4 µs) and stretch
the launch they run beside (the cold down +157 µs at HS 1, the cold gate/up +248 at HS 2). A
measured negative, not BEST.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from torch import Tensor

from workbench.streams import Side

from . import cuda_v4, cuda_v10, cuda_v12, cuda_v13, cuda_v17, cuda_v21
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)
from .triton_v7 import _KT, combine_partials, down_gemm, expert_tile, grid_gemm
from .triton_v16 import hot_launch, hot_mode
from .triton_v29 import grid_gemm_idle_last

ITEMS = {"HI": 16, "HS": 0}  # hot item programs an N tile; the items beside the cold launch


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v21's tiles with ITEMS."""
    return cuda_v21.tiles(T, K, E, D, I, slots) | ITEMS


@triton.jit
def _gemm_hot_items_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                           w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr,
                           act_cnt_ptr, n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, HOT,
                           K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                           NH: tl.constexpr, TWO: tl.constexpr, S_TMA: tl.constexpr,
                           BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
                           ABLATE: tl.constexpr, INTERPRET: tl.constexpr,
                           BLOCK_A: tl.constexpr):
    """Program (N tile, h): items h, h + H, ... (H programs on this axis) of the hot experts'
    (active, > HOT slots) BM-slot chunks in (active position, chunk) order, each over all of
    K. Position a's chunks are items end[a] - chunks[a] .. end[a] - 1 (end: the inclusive
    prefix sum of the chunk counts), so item j's position is the count of positions whose end
    is <= j (`chunk_table`, `chunk_at`)."""
    idx, chunks, end = chunk_table(act_cnt_ptr, n_act_ptr, HOT, BM, BLOCK_A, True)
    for j in tl.range(tl.program_id(1), tl.sum(chunks, 0), tl.num_programs(1)):
        a, m0 = chunk_at(idx, chunks, end, j, BM)
        expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                    w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                    out_ptr, s_ok, s_or, NOUT, NT1, IN, a, tl.program_id(0), 0,
                    tl.cdiv(IN, _KT), 0, 0, K, BN, BM, NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT,
                    False, ABLATE, INTERPRET, True, m0)


@triton.jit
def chunk_table(act_cnt_ptr, n_act_ptr, HOT, BM: tl.constexpr, BLOCK_A: tl.constexpr,
                HOT_SIDE: tl.constexpr):
    """The BM-slot chunks of the active positions on one side of HOT: ([BLOCK_A] positions
    (BLOCK_A >= the grid's A), [BLOCK_A] chunks of each (HOT_SIDE: of the positions of more
    than HOT slots; else of at most HOT, every position where HOT < 0), [BLOCK_A] their
    inclusive prefix sum). The items kernel's and cuda_v23's flat kernel's."""
    idx = tl.arange(0, BLOCK_A)
    cnt = tl.load(act_cnt_ptr + idx, mask=idx < tl.load(n_act_ptr), other=0)
    if HOT_SIDE:
        take = cnt > HOT
    else:
        take = (cnt <= HOT) | (HOT < 0)
    chunks = tl.where(take, tl.cdiv(cnt, BM), 0)
    return idx, chunks, tl.cumsum(chunks, 0)


@triton.jit
def chunk_at(idx, chunks, end, j, BM: tl.constexpr):
    """Chunk j of `chunk_table`'s chunks in (position, chunk) order -> (its position a, its
    first slot m0): a is the count of positions whose end is <= j."""
    a = tl.sum((end <= j).to(tl.int32), 0)
    first = tl.sum(tl.where(idx == a, end - chunks, 0), 0)  # a's first chunk
    return a, (j - first) * BM


def item_programs(c: dict, n: int, max_active: int) -> int:
    """H, the items programs an N tile of GEMM n's hot launch: HI, at most the items the
    expected slots allow (each hot expert > HOT slots: at most S_EXP // (HOT + 1) of them,
    S_EXP // BM + that many chunks). Shapes only."""
    hi = c.get("HI", ITEMS["HI"])
    _require(isinstance(hi, int) and hi >= 1, "cfg['HI']", "an int >= 1 (hot item programs "
             "an N tile)", hi)
    bm = c["BM1_HOT"] if n == 1 else c["BM2_HOT"]
    n_hot = min(max_active, c["S_EXP"] // (c["HOT"] + 1))
    return max(1, min(hi, c["S_EXP"] // bm + n_hot))


def hot_items_launch(n: int, c: dict, r, args: tuple, kw: dict) -> None:
    """GEMM n's hot launch as items: triton_v16's `hot_launch` on `_gemm_hot_items_kernel`
    with `item_programs` programs an N tile."""
    hot_launch(n, c, r, args, kw, kernel=_gemm_hot_items_kernel,
               programs=item_programs(c, n, r.max_active))


def check_hs(c: dict) -> int:
    """HS, refused by name unless the int 0, 1 or 2."""
    hs = c.get("HS", ITEMS["HS"])
    _require(hs in (0, 1, 2) and type(hs) is int, "cfg['HS']", "0, 1 or 2 (the hot items after "
             "the cold launch, beside it, or behind the hot gate/up launches)", hs)
    return hs


def grid_gemm_items(n: int, c: dict, r, NT: int, args: tuple, kw: dict, *,
                    fork: bool = True, cold=None, whole=None) -> None:
    """A GEMM launch hook (triton_v7's `gemm` signature): where triton_v16 splits GEMM n
    into cold and hot launches (`hot_mode`), the cold one and the hot items launch (HS 1 / 2:
    the items on cuda_v10's side stream beside the cold launch, joined after it; fork False:
    queued on that stream as it stands, behind the hot gate/up launches, by `tail_items` at HS
    2); else triton_v29's `grid_gemm_idle_last` (cuda_v21's). cold, whole: a later version's
    cold launch and its launch where nothing is hot (the hook's signature; cuda_v23's flat
    grid), instead of triton_v7's grid and the idle-last one."""
    if not hot_mode(c, r.bad.shape[0]):  # (hot_mode: both GEMMs unsplit along K)
        return (whole or grid_gemm_idle_last)(n, c, r, NT, args, kw)
    hs = check_hs(c)
    # HS 1: the cold down streams weights at ~2.5 TB/s and the hot items are MMA-bound (session
    # 49: 1113 then 287 µs in series at skewed T 512); side by side each may fill what the
    # other leaves. Everything the items read or write (h, y, the routing) was made on the
    # current stream before the fork (or, fork False, before the hot launches' fork and by
    # them), and the join comes before the combine reads y.
    cold_kw = dict(kw, HOT=c["HOT"])  # the cold launch takes counts <= HOT
    cold = cold or grid_gemm
    if not hs:  # cuda_v21's order: the cold launch, then the hot one
        cold(n, c, r, NT, args, cold_kw)
        return hot_items_launch(n, c, r, args, kw)
    side = Side(args[0].device, True, key=cuda_v10.SIDE_KEY, priority=-100)
    if fork:
        side.fork()
    side.run(lambda: hot_items_launch(n, c, r, args, kw))  # queued first: its CTAs go first
    cold(n, c, r, NT, args, cold_kw)
    side.join()


def launch_bands_items(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                       h: Tensor) -> tuple:
    """cuda_v4's `hot` hook: cuda_v12's bands (cuda_v21's); at HS 2, where they run on the
    side stream (WS 1) and the down GEMM makes a hot launch, y first (cuda_v13's
    `bands_with_partials`: its join carries y to `tail_items`)."""
    if check_hs(c) == 2 and c.get("WS", 0) and hot_mode(c, p.r.bad.shape[0]):
        return cuda_v13.bands_with_partials(c, p, xq, w1, s1, NU1, C1, h)
    return cuda_v12.launch_bands(c, p, xq, w1, s1, NU1, C1, h)


def tail_items(p, h: Tensor, join, topk_ids: Tensor, topk_weights: Tensor, experts, *,
               gemm=None) -> Tensor:
    """cuda_v4's `tail` on this file's down launch hook. At HS 2 (a `cuda_v13.SplitJoin` from
    `launch_bands_items`): the join (the cold down reads rows of the experts of WT + 1 .. HOT
    slots, which the hot gate/up launches wrote), then the down GEMM with the hot items
    queued on the side stream behind the hot gate/up launches, not forked again: they need
    only those launches' rows of h and the routing made before the first fork, so they may
    start while the cold gate/up launch still runs. Elsewhere (HS 0 / 1, or no side stream)
    cuda_v4's `down_tail`, where HS 2 takes HS 1's fork. gemm: a later version's hook with
    `grid_gemm_items`' signature (cuda_v23's)."""
    gemm = gemm or grid_gemm_items
    if not isinstance(join, cuda_v13.SplitJoin):
        return cuda_v4.down_tail(p, h, join, topk_ids, topk_weights, experts, gemm=gemm)
    join()
    down_gemm(p, h, join.y, experts[5], functools.partial(gemm, fork=False), True, {})
    return combine_partials(p, join.y, topk_ids, topk_weights, {})


# the op and its CLI: cuda_v17's dispatch on this file's tiles, hot hook and tail
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v21;base", hot_for=launch_bands_items,
                                         tail_for=tail_items)


if __name__ == "__main__":
    raise SystemExit(_main())
