"""int4_moe cuda_v23: cuda_v22 with the cold down launch as a persistent grid whose programs
walk (slot chunk, N tile) items in one flattened, pipelined loop, so a program's weight stream
runs on from one item into the next instead of starting again at every item.

Why (session 49, H100 80GB, traces/gpu/session49, by kernel): the down GEMM streams below the
gate/up GEMM wherever its experts hold few slots: uniform T 9 192.6 µs for ~485 MB (2.5 TB/s,
85 % of this card's copy, where the gate/up launch reads at ~100 %); skewed T 512's cold down
1113 µs at ~2.2 TB/s over 336 experts of median 3 slots; an EP8 rank's hint-17 call (#12's bar
configuration) 40.7 µs a call on the H200 (session 42) for ~14 experts. Its program (triton_v7's
`_gemm_kernel`, one a (N tile, active expert)) streams BN 64 weight rows over K = I = 2048: 8
K tiles of 256, three in flight (stages 3), then the epilogue; at 3 CTAs an SM (168 registers)
each of the ~30-60 programs an SM has in turn starts its stream from nothing (prologue: three
tile loads, then the first one's full latency) and ends it with the pipeline draining. Session
22's fit put that per-program cost at the launch's ramp and tail plus ~2.4 µs an expert on the
EP rank. Triton's `tl.range(..., flatten=True)` (the persistent-matmul tutorial's form) fuses
the item loop and the K loop into one loop the pipeliner runs across item boundaries: the next
item's first tiles load while this item's last ones multiply.

What: cuda_v22's tiles, dispatch, launches and hot items, with the down launch hook
`grid_gemm_flat`: where the down GEMM is unsplit (KS2 1), `_gemm_flat_kernel` over P = SMs x FP
programs (FP 3: the 168-register build's CTAs an SM) instead of triton_v7's (N tile, active
expert) grid; its items are every cold expert's (at most HOT slots where triton_v16 makes a
hot launch, else every expert's) BM-slot chunks x the N tiles, chunk-major, program p taking
items p, p + P, ...; each item is `expert_tile` on one chunk (triton_v7's ONE_CHUNK, cuda_v22's
hot items' form) over all K tiles: the same tiles and fp32 chains as the grid's programs, so
cuda_v22's bits (CPU test under the interpreter; GPU test). Split down GEMMs (an EP rank's
hints 1-2) keep cuda_v22's launches.
Knobs: FP (flat programs an SM, default 3), FL (1: the flattened loop; 0: the same persistent
programs with the K loop restarting at each item, to tell the two effects apart), FS (the
flattened loop's stages, default 4: `_gemm_flat_kernel`). Numerics,
graph safety (the grid from shapes and the device's SM count; the items from the counts on
the device), load step: cuda_v22's. GPU only (cupy). Dimension legend: cuda_v1.cu's,
cuda_v10.cu's and triton_v16's.

Measured (session 51 call 1, H100 80GB, traces/gpu/session51): GPU tests pass (cuda_v22's bits
eager and graph-replayed); in process, medians of 3, **30 % slower** than cuda_v22 at every
shape (uniform T 9 741-790 vs 566-611 µs over four draws, T 17 1302 vs 978, skewed T 128 / 512
2750 / 4373 vs 2062 / 3888), more programs slower still (FP 4 +24 %, FP 2 +10 %: an issue- or
latency-bound loop), FS 3 within 1 %; FL 0 (the persistent grid without the fusion) 1.5-2 %
slower: the block scheduler already hides the per-program ramp. A measured negative, not BEST.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import cuda_v17, cuda_v22
from ._common import INTERPRET, _require, next_pow2, sm_count
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)
from .cuda_v22 import chunk_at, chunk_table
from .triton_v7 import _KT, chunk_tile, tile_rows

FLAT = {"FP": 3, "FL": 1, "FS": 4}  # flat programs an SM; the flattened loop; its stages
INTERPRET_SMS = 2  # the interpreter's "SMs": few programs, so each walks several items


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v22's tiles with FLAT."""
    return cuda_v22.tiles(T, K, E, D, I, slots) | FLAT


@triton.jit
def _gemm_flat_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                      w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                      n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN,
                      K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                      TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                      OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
                      INTERPRET: tl.constexpr, HOT: tl.constexpr, NT: tl.constexpr,
                      BLOCK_A: tl.constexpr, FL: tl.constexpr, FS: tl.constexpr):
    """Program p of P: items p, p + P, ... of (chunk, N tile) in chunk-major order, the chunks
    those of the active positions of at most HOT slots (HOT < 0: all) in (position, chunk)
    order. Position a's chunks are chunks end[a] - chunks[a] .. end[a] - 1 (end: the inclusive
    prefix sum of the chunk counts), so chunk j's position is the count of positions whose end
    is <= j (cuda_v22's `chunk_table` / `chunk_at`). The arguments are `_gemm_kernel`'s but TPS (an unsplit
    GEMM: every K tile an item). FS: the fused loop's stages (sm_90 build at the uniform T 9
    down launch: at 3, the launch's own, a 2-deep TMA ring and the activations loaded in the
    loop, not ahead; at 4, a 3-deep ring and the activations by cp.async ahead, 164
    registers, 29.8 KB of shared memory)."""
    idx, chunks, end = chunk_table(act_cnt_ptr, n_act_ptr, HOT, BM, BLOCK_A, False)
    items = tl.sum(chunks, 0) * NT
    for it in tl.range(tl.program_id(0), items, tl.num_programs(0), num_stages=FS, flatten=FL):
        # the chunk j = it // NT; consecutive items: one chunk's N tiles (its rows stay in L1 / L2)
        a, m0 = chunk_at(idx, chunks, end, it // NT, BM)
        # expert_tile's setup and one pass (no chunk loop: the nest the flattening fuses is
        # this loop and the K loop)
        e, start, n_a, n0, col0, w_desc, s_desc, s_row, nm = tile_rows(
            w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr, s_se, s_sn, act_e_ptr,
            act_start_ptr, act_cnt_ptr, NOUT, NT1, a, it % NT, BN, TWO)
        chunk_tile(in_ptr, s_in, s_half, w_desc, s_desc, s_row, e, n0, col0, nm, IN, slots_ptr,
                   start, n_a, out_ptr, s_ok, s_or, 0, tl.cdiv(IN, _KT), 0, 0, m0, K, BN, BM,
                   NH, S_TMA, BY_TOKEN, OUT_BY_SLOT, False, ABLATE, INTERPRET)


def flat_programs(c: dict, device: torch.device) -> int:
    """P = the device's SMs x FP (the interpreter: INTERPRET_SMS x FP). Shapes and the device
    only: graph-safe."""
    fp = c.get("FP", FLAT["FP"])
    _require(type(fp) is int and 1 <= fp <= 32, "cfg['FP']", "an int in 1..32 (flat programs "
             "an SM)", fp)
    sms = INTERPRET_SMS if INTERPRET or device.type != "cuda" else sm_count(device.index or 0)
    return sms * fp


def flat_launch(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """GEMM n over NT N tiles as `_gemm_flat_kernel` on `flat_programs` programs, the experts
    of at most kw's HOT slots (absent: all). A launch hook (triton_v7's `gemm` signature) for
    an unsplit GEMM."""
    fl, fs = c.get("FL", FLAT["FL"]), c.get("FS", FLAT["FS"])
    _require(fl in (0, 1) and type(fl) is int, "cfg['FL']", "0 or 1 (the flattened loop)", fl)
    _require(type(fs) is int and 2 <= fs <= 6, "cfg['FS']", "an int in 2..6 (the flat loop's "
             "stages)", fs)
    _require(c[f"KS{n}"] == 1, f"cfg['KS{n}']", "1 (the flat launch runs an unsplit GEMM)",
             c[f"KS{n}"])
    kw = dict(kw, HOT=kw.get("HOT", -1))
    _gemm_flat_kernel[(flat_programs(c, args[0].device),)](
        *args, NT=NT, BLOCK_A=next_pow2(r.max_active), FL=bool(fl), FS=fs, **kw)


def grid_gemm_flat(n: int, c: dict, r, NT: int, args: tuple, kw: dict, *,
                   fork: bool = True) -> None:
    """The down GEMM's launch hook: cuda_v22's (`grid_gemm_items`: the hot items, HS), with
    the cold launch, or the one launch where no expert can be hot, as `flat_launch` where
    the GEMM is unsplit; a split GEMM as cuda_v22's (triton_v29's idle-last grid)."""
    if n != 2 or c["KS2"] != 1:
        return cuda_v22.grid_gemm_items(n, c, r, NT, args, kw, fork=fork)
    return cuda_v22.grid_gemm_items(n, c, r, NT, args, kw, fork=fork, cold=flat_launch,
                                    whole=flat_launch)


# cuda_v4's tail (cuda_v22's, HS 2's too) with this file's down launch hook
tail_flat = functools.partial(cuda_v22.tail_items, gemm=grid_gemm_flat)

# the op and its CLI: cuda_v17's dispatch on this file's tiles, cuda_v22's hot hook, this tail
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v22;base",
                                         hot_for=cuda_v22.launch_bands_items,
                                         tail_for=tail_flat)


if __name__ == "__main__":
    raise SystemExit(_main())
