"""int4_moe cuda_v8: cuda_v5 with a one-token call (decode) as two launches instead of four:
one GEMM launch whose CTAs each compute a 128-input slice of h for one of the token's experts
and that slice's partial of the down GEMM, then a combine over the slices.

Why (H200, session 27 calls 3-5 and session 28 call 1, traces/gpu/session27-28): T 1 on 384
experts takes 72.7-73.7 µs under cuda_v5 (the #6 bar: 60) as routing 2.8 + gate/up 38.0 (85 %
of copy) + down 25.0 (64 %) + combine 1.8 + ~6 µs between the four launches. No knob moved
the down GEMM (maxnreg, stages, K split, tile width, the CUDA down, an L2 prefetch), folding
the launches into one persistent kernel lost (cuda_v3: its CTAs wait on each other's h and
one register budget serves both GEMMs), and running halves of the experts concurrently lost
(cuda_v7: one wave of gate/up already holds every SM). What is left is the dependency: the
down GEMM needs all of an expert's h. It does not need it in one place: y = sum over slices
of W_down[:, slice] h[slice], so the CTA that computed h[slice] takes that slice's partial
itself and no CTA ever waits for another (cuda_v8.cu's header).

How: grid (I / 128 slices, K slots), 16 warps a CTA (one an SM at 128 registers: 128 CTAs,
one wave at Kimi's I 2048, K 8). Phase 1 is cuda_v1's gate/up unit_block at KW 2 x RW 8 with
cuda_v2's dequant (the instance family cuda_v5 runs, POST 1), its epilogue writing fp32 h to
shared memory (cuda_v1.cu's HOUT 2). Phase 2 reads the down experts in the checkpoint layout
(a row's slice: 64 contiguous bytes of words, 8 of scales) on the CUDA cores, one 32-input
scale group a lane, and writes part [I / 128, K, D] fp32. The combine sums it in (slot,
slice) order. No routing launch: one token's ids are its experts (the kernel skips -1; the
combine writes NaN for an id outside [-1, E) or an expert twice: the router's rule).

Where: x on CUDA, T = 1, no EP hint (`fused_here`; cfg F8 1 takes a hinted T 1 call too, to
measure an EP rank's decode), I a multiple of 128, KW 2 dividing gate/up's chunk pairs, the
down words' rows 16-byte aligned. Everything else is cuda_v5, launch for launch.
Numerics: h is cuda_v5's fp32 h (same gate/up instance arithmetic) kept in fp32 (cuda_v5 splits
it into bf16 hi + lo); the down partial is sum_j (128 + q_j) h_j - 136 sum h, times the group's
scale (cuda_v2's association), four groups, 16 slices, then K slots: tolerance against the
reference, deterministic (no atomics).
Measured (H200, session 28, traces/gpu/session28/README.md): T 1 on 384 experts 71.6-72.4 µs
against cuda_v5's 72.7-73.8 in process (calls 5-7), REAL bench 71.4 / 72.1 µs uniform / skewed
(1.27x / 1.24x Humming, 67 % of the floor; the #6 bar is 60). The phases alone (AB): gate/up
38.6 µs, the down partial 28.3 for 66 MB, in every form (DN 0 / 1 / 2, CL 2; ncu: 47.5 % of
DRAM peak, 1.1 eligible warps a scheduler). An EP8 rank's hint 1 on this path (F8): 56 against
29 µs. Session 30 (traces/gpu/session30/README.md): the down partial's loads alone (AB 3)
stream its 66 MB in 16.8 µs, with DN 0's math 28-30: the slice-major copy (LY 1) took 2.4 µs
off the op (71.3 vs 73.7), the tensor-core form with it and evict-first copies (DN 2, EF 1)
another ~0.6; the bulk-copy rings (DN 3 / 4 / 6 / 7), a register double buffer (DN 5) and four
FMA chains (IL) did not close the gap (ncu: issue-bound math, not loads in flight). Sessions
31-32 (traces/gpu/session31-32/README.md): DN 8 on LY 3 67.8 µs, + GB 1 (phase 1 by TMA bulk
copies: 35.2 µs alone) 64.6, + FC 1 (the combine in the tail) 62.2, one kernel 59.2-59.7 µs,
+ EA 1 (the down ring's first stages early) 61.7 (the kernel 59.2 vs 60.6 in that call);
GB 2, GU 4 / 5 and DN 9 no faster; a CTA past 164,992 bytes of shared memory loses ~5 µs in
phase 1. Not BEST; the engine preset's calls are hinted (cuda_v5 here); every knob is off by
default (cuda_v9 is this module with the best form as defaults; LY's copy doubles the down
experts' memory).
Load step: gate / up repacked in place (REPACKED, cuda_v4's), down in the checkpoint layout.
Dimension legend: cuda_v1.cu's and cuda_v8.cu's.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from . import cuda_v1, cuda_v5, mma_layout
from ._common import _require, check_inputs
from .cuda_v4 import REPACKED, h_column  # noqa: F401  (the load step reads REPACKED)
from .mma_layout import GATE_UP

SLICE = 128  # intermediate inputs a CTA (cuda_v8.cu's V8_SLICE: 8 gate/up units)
KW, RW = 2, 8  # the gate/up instance's K parts x units a CTA (V8_KW, V8_RW)
THREADS = 32 * KW * RW
COMBINE_SLOTS = 8  # the combine's threads a column (cuda_v8.cu's V8_CK)
RING = KW * RW * cuda_v1.STAGES * 6 * 32 * 16  # the gate/up ring: [warp][stage][6][32] uint4


def ring_bytes(gu: int = 3, gb: int = 0) -> int:
    """Phase 1's ring (cuda_v8.cu's GU / GB): 16 warps x GU stages of a chunk pair, 3 KB by
    cp.async (every lane's words and scales) or 2.25 KB by bulk copies (2 KB words, 256 B
    scales)."""
    return KW * RW * gu * (2048 + 256 if gb else 6 * 32 * 16)
# F8 1: the fused path for a hinted one-token call too (an EP rank's decode); DN: how the down
# partial streams its rows (cuda_v8.cu's DN: 0 registers, 1 a cp.async ring, 2 tensor cores,
# 3 / 4 DN 0 / 2 on TMA bulk copies of the slice-major copy, LY 1, asked for before phase 1;
# 5 DN 0 with each batch's loads issued before the previous batch's math; 6 / 7 DN 4 / 3 with
# the bulk ring in the gate/up ring's shared memory, asked for after phase 1; 8 DN 6 on LY 3;
# 9 DN 8 with a 6-stage ring: 36 KB less shared memory with GB 1 / 2)
# CL: CTAs a cluster sharing their slices of h through DSMEM (cuda_v8.cu's int4_moe_decode_cl;
# 1: none, DN's single-CTA form)
# AB: an ablation for timing only (the output is garbage): 1 the gate/up phase alone, 2 the
# down partial alone (h = 0), 3 the down partial's loads alone (DN 0 / 3 / 7: no math);
# single-CTA forms (CL 1). RO 1 (DN 0): each slice's CTA sweeps the down rows from its own
# offset. LY 1 (CL 1): the down experts read from a slice-major copy
# ([E, NSL, D, 16] words, [E, NSL, D, 4] scales: a CTA's down stream one contiguous block),
# made once on first use and cached beside the checkpoint tensors (their size again); LY 2 (DN
# 2 / 4 / 6): that copy with each row's four 16-byte groups swizzled (`by_slice`); LY 3 (DN 8
# / 9 only): its nibbles in the lane-major order of cuda_v8.cu's tile_mma_lanes (`_lanes`)
# IL 1 (DN 0 / 3): a row's four words as four independent FMA chains (cuda_v8.cu's opts & 8)
# EF 1 (DN 2, 4, 6, 8, 9): the down weights' copies evict-first in L2 (cuda_v8.cu's opts & 16)
# GU / GB (DN 8; DN 9: GB 1 / 2 at GU 3, RINGS_OF): phase 1's weight ring, GU stages a warp
# (3, 4 or 5) filled by cp.async (GB
# 0; GU 5 does not fit) or by TMA bulk copies, one lane a warp issuing a pair's words and scales
# (GB 1, cuda_v1.cu's unit_block BK); GB 2: GB 1 with each 32-input group's correction
# computed once a CTA instead of in every warp (unit_block's CORR; the same bits; session 32
# call 2: slower, phase 1 alone 35.5 vs 35.0 µs: what it saves is not what binds)
# FC 1 (CL 1): the combine in the fused launch's tail (cuda_v8.cu's combine_tail: the last CTAs
# to finish combine, after a ticket count; one launch instead of two, the same bits)
# EA 1 (DN 8 with GB 1 at GU 3): the down ring's first two stages asked for at the CTA's start,
# in the 36 KB phase 1's bulk ring leaves free (cuda_v8.cu's opts & 128; the same bits)
KNOBS = {"F8": 0, "DN": 0, "CL": 1, "AB": 0, "RO": 0, "LY": 0, "IL": 0, "EF": 0, "GU": 3, "GB": 0,
         "FC": 0, "EA": 0}
FC_COLS = 64  # columns a combine block of the tail (cuda_v8.cu's 4 V8_FC)
DOWN_FORMS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
GATE_RINGS = ((4, 0), (3, 1), (4, 1), (5, 1), (3, 2))  # the (GU, GB) past the default (3, 0)
RINGS_OF = {8: GATE_RINGS, 9: ((3, 1), (3, 2))}  # the down forms built with them
DOWN9 = 6 * 256 * 72  # DN 9's ring (cuda_v8.cu's BulkRing<9>: 6 stages of 256 rows)
CORR_GROUPS = 512  # GB 2's corrections a CTA at most (cuda_v8.cu's V8_CORR: 2 C, D <= 16384)
EA_FORM = (8, 3, 1)  # EA's (DN, GU, GB): DN 8 on GB 1's 3-stage ring (its free 36 KB)
SYNC_WORDS = 64  # FC's [cnt, ..., gen at 32, ...] u32 (cuda_v8.cu's V8_GEN: two 128-byte lines)
# the bulk forms (LY 1) and the shared memory their ring takes past the gate/up ring (cuda_v8.cu's
# BulkRing<DN>::BYTES: stages x rows x (64 bytes of words + 8 of scales); DN 6 / 7: none, the
# ring is the gate/up ring's once phase 1 is done)
BULK = {3: 7 * 128 * 72, 4: 3 * 256 * 72, 6: 0, 7: 0, 8: 0, 9: 0}
CLUSTERS = (2, 4, 8)
KMAX = 256  # slots a token (cuda_v8.cu's V8_KMAX: the combine's ids in shared memory)
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v8.cu")


@functools.cache
def _module():
    """cuda_v1.cu + cuda_v8.cu through NVRTC (cached): int4_moe_decode at each KPAD and DN,
    int4_moe_decode_cl at each KPAD and CL, and the combine."""
    import cupy

    keys = [(kpad, dn, 1, 3, 0) for kpad in (0, 1) for dn in DOWN_FORMS]
    keys += [(kpad, dn, 1, gu, gb) for kpad in (0, 1) for dn, rings in RINGS_OF.items()
             for gu, gb in rings]
    keys += [(kpad, 0, cl, 3, 0) for kpad in (0, 1) for cl in CLUSTERS]
    names = [(f"int4_moe_decode<{kpad}, {dn}>" if (gu, gb) == (3, 0)
              else f"int4_moe_decode<{kpad}, {dn}, {gu}, {gb}>") if cl == 1
             else f"int4_moe_decode_cl<{kpad}, {cl}>" for kpad, dn, cl, gu, gb in keys]
    code = "".join(open(p).read() + "\n" for p in (cuda_v1._SRC, _SRC))
    mod = cupy.RawModule(code=code, options=("-std=c++17",),
                         name_expressions=[*names, "int4_moe_decode_combine"])
    fused = {key: mod.get_function(name) for key, name in zip(keys, names)}
    for (_, dn, _, gu, gb), fn in fused.items():  # past 48 KB with the static part: opt in
        fn.max_dynamic_shared_size_bytes = shared_bytes(dn, gu, gb)
    return fused, mod.get_function("int4_moe_decode_combine")


def shared_bytes(dn: int = 0, gu: int = 3, gb: int = 0) -> int:
    """The fused kernel's dynamic shared memory: phase 1's ring (GB 2: and its corrections past
    it), at least the later rings that reuse it (144 KB: DN 1 / 2 / 6 / 7 / 8; DN 9's 108 KB),
    plus DN 3 / 4's ring past it."""
    later = DOWN9 if dn == 9 else RING
    return max(later, ring_bytes(gu, gb) + 16 * CORR_GROUPS * (gb == 2)) + BULK.get(dn, 0)


def fused_here(x: Tensor, topk_ids: Tensor, experts, expected_slots: int | None,
               force: bool = False) -> bool:
    """The rule (shapes, strides and pointers only: graph-safe): one token, no EP hint unless
    forced, at most KMAX slots, and the layout the kernel reads (I a multiple of SLICE, KW
    parts dividing the gate/up chunk pairs, D a multiple of 4 (the combine's 16-byte part
    loads), each down row's words 16-byte and its scales 4-byte aligned: the down ring's
    cp.async sizes)."""
    T, D = x.shape
    dp = experts[4]
    I = experts[0].shape[1]
    pairs = mma_layout.dims(I, D, True)[1] // 2
    ds = experts[5]
    return (T == 1 and (expected_slots is None or force) and topk_ids.shape[1] <= KMAX
            and I % SLICE == 0 and pairs % KW == 0
            and D % 4 == 0 and dp.data_ptr() % 16 == 0 and dp.stride(0) % 4 == 0
            and dp.stride(1) % 4 == 0 and ds.data_ptr() % 4 == 0 and ds.stride(0) % 2 == 0
            and ds.stride(1) % 2 == 0)


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v5's op (its contract and checks); a one-token call as cuda_v8's two launches
    (module docstring)."""
    cfg = dict(cfg or {})
    knobs = {k: cfg.pop(k, v) for k, v in KNOBS.items()}
    _require(knobs["F8"] in (0, 1), "cfg['F8']", "0 or 1", knobs["F8"])
    _require(knobs["DN"] in DOWN_FORMS, "cfg['DN']", f"one of {DOWN_FORMS}", knobs["DN"])
    _require(knobs["CL"] in (1, *CLUSTERS), "cfg['CL']", f"one of {(1, *CLUSTERS)}", knobs["CL"])
    _require(knobs["AB"] in (0, 1, 2, 3) and not (knobs["AB"] and knobs["CL"] > 1)
             and not (knobs["AB"] == 3 and knobs["DN"] not in (0, 3, 7)), "cfg['AB']",
             "0, 1, 2 or 3, 0 with CL > 1, 3 only with DN 0, 3 or 7", knobs["AB"])
    _require(knobs["RO"] in (0, 1) and not (knobs["RO"] and (knobs["CL"] > 1 or knobs["DN"])),
             "cfg['RO']", "0 or 1, and 0 unless DN 0 and CL 1", knobs["RO"])
    _require(knobs["LY"] in (0, 1, 2, 3) and not (knobs["LY"] and knobs["CL"] > 1)
             and not (knobs["LY"] == 2 and knobs["DN"] not in (2, 4, 6))
             and (knobs["LY"] == 3) == (knobs["DN"] in (8, 9)), "cfg['LY']",
             "0, 1, 2 or 3, 0 with CL > 1, 2 only with DN 2, 4 or 6, 3 exactly with DN 8 or 9",
             knobs["LY"])
    _require(knobs["LY"] >= 1 or knobs["DN"] not in BULK, "cfg['LY']",
             f"1 or 2 with DN {knobs['DN']} (its bulk copies read the slice-major copy)",
             knobs["LY"])
    _require(knobs["IL"] in (0, 1) and not (knobs["IL"] and (knobs["CL"] > 1 or knobs["DN"]
                                                             not in (0, 3, 5, 7))),
             "cfg['IL']", "0 or 1, and 0 unless DN 0, 3, 5 or 7 and CL 1", knobs["IL"])
    _require(knobs["EF"] in (0, 1) and not (knobs["EF"] and (knobs["CL"] > 1 or knobs["DN"]
                                                             not in (2, 4, 6, 8, 9))),
             "cfg['EF']", "0 or 1, and 0 unless DN 2, 4, 6, 8 or 9 and CL 1", knobs["EF"])
    ring = (knobs["GU"], knobs["GB"])
    _require((ring == (3, 0) or ring in RINGS_OF.get(knobs["DN"], ())) and (
        ring == (3, 0) or knobs["CL"] == 1), "cfg['GU'], cfg['GB']",
        f"(3, 0), or one of {GATE_RINGS} with DN 8, or of {RINGS_OF[9]} with DN 9", ring)
    _require(knobs["FC"] in (0, 1) and not (knobs["FC"] and knobs["CL"] > 1), "cfg['FC']",
             "0 or 1, and 0 with CL > 1", knobs["FC"])
    _require(knobs["EA"] in (0, 1) and not (knobs["EA"] and (knobs["DN"], *ring) != EA_FORM),
             "cfg['EA']", "0 or 1, and 0 unless DN 8 with GU 3 and GB 1", knobs["EA"])
    if x.device.type != "cuda" or x.dim() != 2 or not fused_here(
            x, topk_ids, experts, expected_slots, bool(knobs["F8"])):
        return cuda_v5.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                     cfg=cfg or None, expected_slots=expected_slots)
    if knobs["GB"] == 2:
        # 32-input groups of gate/up's K: two a 64-deep chunk
        groups = 2 * mma_layout.dims(experts[0].shape[1], x.shape[1], True)[1]
        _require(groups <= CORR_GROUPS, "x.shape[1]",
                 f"at most {32 * CORR_GROUPS} with cfg['GB'] 2 (its corrections table)",
                 x.shape[1])
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots, mma_ok=GATE_UP)
    return decode(x, topk_ids, topk_weights, experts, knobs["DN"], knobs["CL"],
                  knobs["AB"] | 4 * knobs["RO"] | 8 * knobs["IL"] | 16 * knobs["EF"]
                  | 64 * knobs["FC"] | 128 * knobs["EA"], knobs["LY"], ring)


_SYNC: dict = {}  # (device, stream) -> FC's SYNC_WORDS int32 (cuda_v8.cu's combine_tail)


def sync_words(device: torch.device) -> Tensor:
    """FC's ticket counter and generation word for the current stream: zero when made, and
    back to a zero count after every launch (the last ticket wraps it), so one pair serves
    every launch of one stream in order; streams that may run launches concurrently each get
    their own."""
    stream = torch.cuda.current_stream(device)
    key = (stream.device_index, stream.cuda_stream)
    if key not in _SYNC:
        _SYNC[key] = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    return _SYNC[key]


def fc_combiners(D: int, grid: int) -> int:
    """CTAs that combine in FC's tail: one a 64-column block, at most the grid's."""
    return min(grid, -(-D // FC_COLS))


_BY_SLICE: dict = {}  # (words ptr, scales ptr, shapes, swizzle) -> the slice-major copy (LY)


def by_slice(dp: Tensor, ds: Tensor, ly: int = 1) -> tuple[Tensor, Tensor]:
    """The down experts slice-major: words [E, NSL, D, SLICE / 8] int32 and scales [E, NSL, D,
    SLICE / 32] bf16 from the checkpoint's [E, D, I / 8] / [E, D, I / 32] (a copy, exact: the
    same words reordered), so that CTA (slice, slot) streams its down rows as one block.
    ly 2: row n's four 4-word groups (one 32-input scale group each) stored at positions
    g ^ ((n >> 1) & 3) (cuda_v8.cu's `tile_mma`: conflict-free shared-memory reads). ly 3: the
    lane-major nibble order of cuda_v8.cu's `tile_mma_lanes` (`_lanes`)."""
    _require(ly in (1, 2, 3), "ly", "1, 2 or 3", ly)
    key = (dp.data_ptr(), ds.data_ptr(), tuple(dp.shape), tuple(ds.shape), ly)
    if key not in _BY_SLICE:
        E, D, IW = dp.shape
        NSL = IW * 8 // SLICE
        w = dp.reshape(E, D, NSL, SLICE // 8).permute(0, 2, 1, 3).contiguous()
        if ly == 3:
            w = _lanes(w)
        if ly == 2:  # position p of row n holds group p ^ s(n) (XOR: its own inverse)
            n = torch.arange(D, device=dp.device)
            src = torch.arange(4, device=dp.device)[None, :] ^ ((n[:, None] >> 1) & 3)  # [D, 4]
            w = w.reshape(E, NSL, D, 4, 4).gather(
                3, src[None, None, :, :, None].expand(E, NSL, D, 4, 4)).reshape(E, NSL, D, 16)
        s = ds.reshape(E, D, NSL, SLICE // 32).permute(0, 2, 1, 3).contiguous()
        _BY_SLICE[key] = (w, s)
    return _BY_SLICE[key]


def _lanes(w: Tensor) -> Tensor:
    """LY 3 from the slice-major words w [E, NSL, D, 16] (int32): row n's u32 4 t + c holds,
    for word j of group c (words 4 c + j), nibble t at bits 4 j and nibble t + 4 at bits
    16 + 4 j: lane t's 16 bytes of a row are its nibble pairs of all four groups. One expert at
    a time (the nibbles as int64 are 32x the words)."""
    E, NSL, D, W = w.shape
    out = torch.empty_like(w)
    sh = 4 * torch.arange(8, device=w.device)
    j4 = 4 * torch.arange(4, device=w.device)
    for e in range(E):
        u = w[e].long() & 0xFFFFFFFF  # [NSL, D, 16] as unsigned
        nib = (u[..., None] >> sh) & 15  # [NSL, D, 16 words, 8 nibbles]
        nib = nib.reshape(NSL, D, 4, 4, 8)  # [.., group c, word j, nibble]
        lo = (nib[..., :4] << j4[:, None]).sum(3)  # [.., c, t]: nibble t of word j at 4 j
        hi = (nib[..., 4:] << (16 + j4)[:, None]).sum(3)  # nibble t + 4 at 16 + 4 j
        U = (lo + hi).transpose(-1, -2).reshape(NSL, D, W)  # [.., t, c] -> u32 4 t + c
        out[e] = (U - (U >= 2 ** 31).long() * 2 ** 32).int()
    return out


def decode(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, dn: int = 0,
           cl: int = 1, opts: int = 0, ly: int = 0, ring: tuple[int, int] = (3, 0)) -> Tensor:
    """The two launches for x [1, D] (checked inputs, `fused_here`): out [1, D] bf16 (one
    launch under opts & 64, FC 1: its tail combines). opts: cuda_v8.cu's (the AB ablation |
    4 RO | 8 IL | 16 EF | 64 FC | 128 EA); ly 1 / 2: the down experts from
    `by_slice` (2: swizzled, cuda_v8.cu's opts & 32); ring: phase 1's (GU, GB)."""
    import cupy
    import numpy as np

    D = x.shape[1]
    K = topk_ids.shape[1]
    E, I = experts[0].shape[:2]
    xq, (w1, s1, NU1, C1) = cuda_v1.operands_gate_up(x, experts, {"KW1": KW})
    dp, ds = experts[4], experts[5]
    # (expert, slice, row) strides of the down words / scales, in elements
    strides = ((dp.stride(0), SLICE // 8, dp.stride(1)), (ds.stride(0), SLICE // 32, ds.stride(1)))
    if ly:
        dp, ds = by_slice(dp, ds, ly)
        opts |= 32 * (ly == 2)
        strides = ((dp.stride(0), dp.stride(1), dp.stride(2)), (ds.stride(0), ds.stride(1), ds.stride(2)))
        assert strides[0][2] == SLICE // 8 and strides[1][2] == SLICE // 32  # rows back to back
    (se_w, sx_w, sn_w), (se_s, sx_s, sn_s) = strides
    wts = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    NSL = I // SLICE
    _require(NSL % cl == 0, "cfg['CL']", f"a divisor of the {NSL} slices of I", cl)
    NP = NSL // cl  # partial slices: one a cluster
    part = torch.empty(NP, K, D, dtype=torch.float32, device=x.device)  # [part, slot, D]
    out = torch.empty(1, D, dtype=torch.bfloat16, device=x.device)
    ids64 = int(topk_ids.dtype == torch.int64)
    fc = bool(opts & 64)
    if fc:  # the tail's combiners wait for the rest: some SM must stay free for a CTA not yet
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count  # running
        _require(cl == 1 and fc_combiners(D, NSL * K) < sms, "cfg['FC']",
                 f"0 here (CL 1 and fewer combiners than the {sms} SMs)", 1)
        sync = sync_words(x.device)
    p, i32 = (lambda t: np.uint64(t.data_ptr())), np.int32
    fused, comb = _module()
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        key = (int(D % mma_layout.KALIGN != 0), dn if cl == 1 else 0, cl,
               *(ring if cl == 1 else (3, 0)))
        fused[key](
            (NSL, K), (THREADS,),
            (p(w1), p(s1), p(xq), p(topk_ids), i32(ids64), i32(topk_ids.stride(1)), i32(E),
             i32(NU1), i32(C1), i32(xq.stride(0)), i32(D), i32(I), p(dp), p(ds),
             np.int64(se_w), i32(sn_w), np.int64(se_s), i32(sn_s), p(part),
             *((i32(opts), np.int64(sx_w), np.int64(sx_s), p(wts), i32(wts.stride(1)), p(out),
                np.uint64(sync.data_ptr() if fc else 0)) if cl == 1 else ())),
            shared_mem=shared_bytes(dn, *ring) if cl == 1 else RING)
        if fc:
            return out
        comb((-(-D // 128),), (32 * COMBINE_SLOTS,),
             (p(part), i32(NP), p(topk_ids), i32(ids64), i32(topk_ids.stride(1)), p(wts),
              i32(wts.stride(1)), i32(K), i32(E), i32(D), p(out)))
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v8's launcher):

        python -m workbench.kernels.int4_moe.cuda_v8 [--ep 8] [--T 1] [--cfgs "v=cuda_v5;base;F8=1"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v5;base")


if __name__ == "__main__":
    raise SystemExit(_main())
