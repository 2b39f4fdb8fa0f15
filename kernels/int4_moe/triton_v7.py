"""int4_moe triton_v7: v5 with the weight words (and, where their rows are 16-byte aligned, the
scales) brought in by TMA bulk copies from host-built descriptors over the checkpoint layout,
instead of per-thread cp.async.

Why (H200, session 4, README.md "Session 4"): with the dequant ablated v5 streams only
3.35-3.50 TB/s (79-82 % of copy): its load pipeline (3 CTAs / SM, 4 stages, one [64, 256] int4
tile = 8 KB + 1 KB of scales a step, each thread computing 64-bit addresses and issuing 16 B
cp.async per row chunk) is below the 85 % bar before any dequant work. A TMA copy is issued by
one thread per tile (coordinates only; the descriptor holds base, shape and strides), completes
on an mbarrier, and frees the registers that held the per-row weight / scale addresses.

v7 changes (everything else is v5's: the packed bf16x2 dequant, the 64-deep wgmma slabs in the
pairs' K order, routing, split-K, SiLU hi + lo, combine order, so the output is v5's bit for bit):
* one 3-D descriptor per weight matrix over the checkpoint tensor as is, [E, N, IN/8] int32,
  block [1, BN, 32] (8 KB at BN 64): the expert is a coordinate (any expert stride that is a
  multiple of 16 B; no [E*N] flattening, so an N tail reads zeros, never the next expert);
* scales [E, N, IN/32] bf16, block [1, BN, 8] (16 B a row, TMA's minimum box width) when the
  scale rows are 16-byte aligned (IN % 256 == 0: every Kimi matrix), else v5's masked loads;
* no peeled tail tile: TMA zero-fills words and scales past IN (and rows past N) exactly where
  v5's masks gave `other=0`, so a padded lane is p = 0, s = 0: (0 - 8) * 0 = -0 in both, times a
  zero-padded activation; the main loop is one loop (v5 needed the peel to keep its cp.async
  loads mask-free);
* gate and up: the program picks one of two descriptors before its K loop (as v5 picks a base
  pointer); the activation slabs stay per-thread gathers (cp.async: rows are slots).
Eviction hints: Triton 3.6's descriptor load takes none (v5 used evict_first on weights).
Interpreter: host TensorDescriptors run under TRITON_INTERPRET=1 (masked pointer loads with
zero padding); the dequant's fp32 twin is v5's.

Dimension legend: v5's (T tokens, K slots, S = T*K, E experts, A active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile = 32 words; BN weight rows, BM slot rows per MMA,
NH halves, R = NH * BM MMA columns; KS1 / KS2 K splits; Dp, Ip = D, I rounded up to KT).
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import (
    INTERPRET,
    _require,
    check_inputs,
    next_pow2,
    pdl_launch,
    pdl_start,
    route,
    with_cfg,
)
from .mma_layout import GATE_UP
from .triton_v3 import KT, _combine_kernel
from .triton_v5 import _ablate, _pairs, _permute_kernel, _silu_kernel, _slab
from .triton_v5 import tiles as _tiles_v5

_KT = tl.constexpr(KT)


@triton.jit
def _k_tile(acc, w_desc, s_desc, s_row, e, n0, in_ptr, in_off, rm, nm, kt, words,
            S_TMA: tl.constexpr, BN: tl.constexpr, ABLATE: tl.constexpr,
            INTERPRET: tl.constexpr):
    """acc [BN, R] += W[:, tile kt] @ in[rows, tile kt]^T: v5's tile with the words (and the
    scales if S_TMA) from TMA; a tile past IN (the tail) reads zeros there. BN 64 (v7) or 128
    (v8)."""
    p = tl.reshape(w_desc.load([e, n0, kt * 32]), (BN, 32))  # [BN, 32] words
    if S_TMA:
        s8 = tl.reshape(s_desc.load([e, n0, kt * 8]), (BN, 8))  # [BN, 8] scale groups
    else:  # rows not 16-byte aligned (IN % 256 != 0): v5's masked load, as its tail tile
        g8 = kt * 8 + tl.arange(0, 8)
        s8 = tl.load(s_row + g8[None, :], mask=nm[:, None] & (g8 < words // 4)[None, :],
                     other=0.0, eviction_policy="evict_first")
    pd, sd = _pairs(p, s8, BN)
    DOT = tl.float32 if INTERPRET else tl.bfloat16
    x = in_ptr + in_off + kt * _KT
    for j in tl.static_range(4):  # 4 slabs of K 64 (v5: one dot per slab, register A; v8's
        # BN 128: two m64 row blocks a k16)
        xj = tl.load(x + 64 * j, mask=rm[:, None], other=0.0).to(DOT)
        acc = _dot(_slab(pd, sd, j, ABLATE, INTERPRET), tl.trans(xj), acc, BN, INTERPRET)
    return acc


@triton.jit
def _dot(w, xt, acc, BN: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + w @ xt, w [BN, 64], xt [64, R]. On the GPU one dot: at BN 128 two m64 wgmma row
    blocks per k16, each row's chain v7's. Under the interpreter tl.dot is numpy's matmul, and
    OpenBLAS picks another sgemm kernel (another fp32 summation order per row) for 128 rows
    against the transposed xt than for 64: there the 128 rows are two 64-row dots (v7's),
    their operands made contiguous (* 1.0: exact, -0 kept) as v7's are."""
    if INTERPRET and BN == 128:
        R: tl.constexpr = xt.shape[1]
        w0, w1 = tl.split(tl.permute(tl.reshape(w, (2, 64, 64)), (1, 2, 0)))
        a0, a1 = tl.split(tl.permute(tl.reshape(acc, (2, 64, R)), (1, 2, 0)))
        c0 = tl.dot(w0 * 1.0, xt, a0 * 1.0)
        c1 = tl.dot(w1 * 1.0, xt, a1 * 1.0)
        return tl.reshape(tl.permute(tl.join(c0, c1), (2, 0, 1)), (BN, R))
    else:
        return tl.dot(w, xt, acc)


@triton.jit
def _gemm_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                 s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS,
                 K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                 TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                 OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr, INTERPRET: tl.constexpr,
                 PDL: tl.constexpr = False, HOT: tl.constexpr = -1,
                 IDLE_LAST: tl.constexpr = False, A_STRIDE: tl.constexpr = 0,
                 LO: tl.constexpr = -1):
    """v5's program (N tile, active expert, K split): `expert_tile` over the split's K tiles.
    PDL: launched as a programmatic dependent (v14, `_common.pdl_start`). HOT >= 0 (v16's
    cold launch): experts with more than HOT slots are left to another launch. IDLE_LAST
    (v29): the grid is (N tile, K split, active expert), the expert the slowest axis, so the
    worst case's idle programs come last in launch order (same programs, same work).
    A_STRIDE > 0 (v30, with IDLE_LAST's axes; HOT unused): A_STRIDE programs an (N tile, K
    split) take the active experts in turn, a, a + A_STRIDE, ... (each expert's tile the work
    of v7's program for it). LO >= 0 (cuda_v13's down launch of the hot experts; not with
    A_STRIDE): experts with at most LO slots are left to another launch."""
    pdl_start(PDL)
    if A_STRIDE > 0:
        for a in range(tl.program_id(2), tl.load(n_act_ptr), A_STRIDE):
            split_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                       w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                       out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS, a, tl.program_id(1), K, BN,
                       BM, NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT, ABLATE, INTERPRET)
        return
    if IDLE_LAST:
        a = tl.program_id(2)
        ks = tl.program_id(1)
    else:
        a = tl.program_id(1)
        ks = tl.program_id(2)
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    if HOT >= 0:
        if tl.load(act_cnt_ptr + a) > HOT:
            return
    if LO >= 0:
        if tl.load(act_cnt_ptr + a) <= LO:
            return
    split_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
               s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr, s_ok,
               s_or, NOUT, NT1, IN, TPS, a, ks, K, BN, BM, NH, TWO, S_TMA, BY_TOKEN,
               OUT_BY_SLOT, ABLATE, INTERPRET)


@triton.jit
def split_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
               s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr, s_ok,
               s_or, NOUT, NT1, IN, TPS, a, ks, K: tl.constexpr, BN: tl.constexpr,
               BM: tl.constexpr, NH: tl.constexpr, TWO: tl.constexpr, S_TMA: tl.constexpr,
               BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Program (N tile, active expert a, K split ks)'s work: `expert_tile` over the split's
    TPS K tiles (`_gemm_kernel`'s and triton_v17's)."""
    kt0 = ks * TPS
    kt1 = tl.minimum(kt0 + TPS, tl.cdiv(IN, _KT))
    expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr, s_ok,
                s_or, NOUT, NT1, IN, a, tl.program_id(0), kt0, kt1, ks, 0, K, BN, BM, NH, TWO,
                S_TMA, BY_TOKEN, OUT_BY_SLOT, False, ABLATE, INTERPRET)


@triton.jit
def expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr, s_ok,
                s_or, NOUT, NT1, IN, a, pid_n, kt0, kt1, ks, zero_to,
                K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                OUT_BY_SLOT: tl.constexpr, ZERO: tl.constexpr, ABLATE: tl.constexpr,
                INTERPRET: tl.constexpr, ONE_CHUNK: tl.constexpr = False, m_one=0):
    """Active expert a's N tile pid_n over K tiles [kt0, kt1), every BM-slot chunk of its
    slots (ONE_CHUNK, cuda_v22's hot items: only the chunk from slot m_one), stored as partial
    ks of out; TWO: tiles >= NT1 take the second projection (w2_desc,
    col += NOUT), else one projection only. v8 compiles the select in its down launch too
    (descriptors passed twice, NT1 = its tile count: never taken): with the select the
    descriptor addresses stay uniform registers; v7's down GEMM, without it, moves them from
    per-thread registers (R2UR, IMAD) at every TMA issue (+16 SASS a tile). ZERO (v12): also
    store zeros as partials ks + 1 .. zero_to - 1 of the same rows."""
    e, start, cnt, n0, col0, w_desc, s_desc, s_row, nm = tile_rows(
        w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr, s_se, s_sn, act_e_ptr,
        act_start_ptr, act_cnt_ptr, NOUT, NT1, a, pid_n, BN, TWO)
    # ONE_CHUNK: one pass, from m_one (a step of cnt ends the loop after it)
    for m0 in range(m_one if ONE_CHUNK else 0, cnt, cnt if ONE_CHUNK else BM):
        chunk_tile(in_ptr, s_in, s_half, w_desc, s_desc, s_row, e, n0, col0, nm, IN,
                   slots_ptr, start, cnt, out_ptr, s_ok, s_or, kt0, kt1, ks, zero_to, m0, K,
                   BN, BM, NH, S_TMA, BY_TOKEN, OUT_BY_SLOT, ZERO, ABLATE, INTERPRET)


@triton.jit
def tile_rows(w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr, s_se, s_sn, act_e_ptr,
              act_start_ptr, act_cnt_ptr, NOUT, NT1, a, pid_n, BN: tl.constexpr,
              TWO: tl.constexpr):
    """Active expert a's N tile pid_n: (expert e, its first sorted slot, its slot count, the
    tile's first weight row n0, its first output column col0, the projection's word and
    scale descriptors, the scale rows' addresses (S_TMA 0), the rows' mask [BN]) as
    `expert_tile` reads them (TWO: tiles >= NT1 the second projection, col0 past NOUT)."""
    e = tl.load(act_e_ptr + a)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    n0 = pid_n * BN
    col0 = n0
    w_desc = w1_desc
    s_desc = s1_desc
    wsc = w1s_ptr
    if TWO:
        if pid_n >= NT1:
            n0 = (pid_n - NT1) * BN
            col0 = n0 + NOUT
            w_desc = w2_desc
            s_desc = s2_desc
            wsc = w2s_ptr
    n = n0 + tl.arange(0, BN)  # [BN] weight rows
    s_row = wsc + e.to(tl.int64) * s_se + n[:, None].to(tl.int64) * s_sn  # unused if S_TMA
    return e, start, cnt, n0, col0, w_desc, s_desc, s_row, n < NOUT


@triton.jit
def chunk_tile(in_ptr, s_in, s_half, w_desc, s_desc, s_row, e, n0, col0, nm, IN, slots_ptr,
               start, cnt, out_ptr, s_ok, s_or, kt0, kt1, ks, zero_to, m0,
               K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
               S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
               ZERO: tl.constexpr, ABLATE: tl.constexpr, INTERPRET: tl.constexpr):
    """The BM-slot chunk from slot m0 of `tile_rows`' tile over K tiles [kt0, kt1), stored as
    partial ks of out (`expert_tile`'s pass; cuda_v23's flat items call it alone)."""
    words = IN // 8
    i = tl.arange(0, NH * BM)  # [R] MMA columns: slot i % BM, half i // BM
    r = m0 + i % BM
    rm = r < cnt
    slot = tl.load(slots_ptr + start + r, mask=rm, other=0)
    if BY_TOKEN:
        row = slot // K
    else:
        row = start + r
    in_off = (row * s_in + (i // BM) * s_half)[:, None] + tl.arange(0, 64)[None, :]
    acc = tl.zeros([BN, NH * BM], tl.float32)
    for kt in range(kt0, kt1):  # tail tile included: TMA zero-fills past IN
        acc = _k_tile(acc, w_desc, s_desc, s_row, e, n0, in_ptr, in_off, rm, nm, kt, words,
                      S_TMA, BN, ABLATE, INTERPRET)
    if NH == 2:  # hi + lo, one fixed-order fp32 add per output
        acc = tl.sum(tl.reshape(acc, (BN, 2, BM)), axis=1)
    rs = m0 + tl.arange(0, BM)
    rsm = rs < cnt
    if OUT_BY_SLOT:
        orow = tl.load(slots_ptr + start + rs, mask=rsm, other=0)
    else:
        orow = start + rs
    out = (out_ptr + ks * s_ok + orow[None, :].to(tl.int64) * s_or
           + (col0 + tl.arange(0, BN))[:, None])
    tl.store(out, acc, mask=rsm[None, :] & nm[:, None])
    if ZERO:
        for j in range(ks + 1, zero_to):
            tl.store(out + (j - ks) * s_ok, tl.zeros_like(acc), mask=rsm[None, :] & nm[:, None])


# ------------------------------------------------------------------------------------ launcher


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe): v5's table (BN 64, BM1 16, BM2 8 / 16, its split-K: the same
    arithmetic) with v7's launch knobs: without per-row weight / scale addresses the K loop fits
    128 registers without a spill (v5: 168), so 3 stages (43 KB smem) run 4 CTAs / SM."""
    return _tiles_v5(T, K, E, D, I) | dict(stages=3, maxnreg=128)


def _aligned(t: Tensor) -> bool:
    """TMA's rules: base and every stride but the last (unit) one multiples of 16 bytes."""
    b = t.element_size()
    return (t.data_ptr() % 16 == 0 and t.stride(-1) == 1
            and all(s * b % 16 == 0 for s in t.stride()[:-1]))


def descriptors(packed: tuple, scales: tuple, BN: int) -> tuple[list, list, bool]:
    """Host-built descriptors (pointer, shape, strides: no sync, graph-capturable) over the
    checkpoint tensors: words [E, N, IN/8] int32 in [1, BN, 32] blocks; scales [E, N, IN/32]
    bf16 in [1, BN, 8] blocks when all of them are 16-byte aligned (S_TMA), else the tensors."""
    for p in packed:
        if not _aligned(p):
            raise ValueError(f"experts packed words: expected 16-byte aligned base and strides (TMA), "
                             f"got data_ptr % 16 = {p.data_ptr() % 16}, strides {p.stride()}")
    wd = [TensorDescriptor(p, list(p.shape), list(p.stride()), [1, BN, 32]) for p in packed]
    s_tma = all(_aligned(s) for s in scales)
    sd = ([TensorDescriptor(s, list(s.shape), list(s.stride()), [1, BN, 8]) for s in scales]
          if s_tma else list(scales))
    return wd, sd, s_tma


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is; weight words 16-byte aligned) -> [T, D] bf16;
    the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: tile overrides (keys of `tiles`; KSn with TPSn), for sweeps."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, tiles, down_select=False,
                  expected_slots=expected_slots)


def route_one_program(topk_ids: Tensor, E: int, c: dict):
    """v7's and v8's router at every T: the one-program `_common.route` (c: unused knobs)."""
    return route(topk_ids, E)


def grid_gemm(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """v7-v11's GEMM n (1 gate/up, 2 down): one `_gemm_kernel` program per (N tile of NT,
    active expert of the worst case, K split of KSn), TPSn K tiles a split."""
    _gemm_kernel[(NT, r.max_active, c[f"KS{n}"])](*args, c[f"TPS{n}"], **kw)


def run_gemm(gemm, n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """The launch hook gemm(n, c, r, NT, args, kw), with a build the GPU cannot hold (Triton's
    OutOfResources at the first launch of a knob set: shared memory, registers) refused as a
    ValueError naming the tile knobs, what the build needs and the GPU's limit. Why: a sweep's
    cfg (session 35: stages 4 on the hot down launch asked 290 KB of shared memory) must say
    which knob to take back, not end in Triton's compiler."""
    try:
        gemm(n, c, r, NT, args, kw)
    except OutOfResources as e:
        names = ("stages", "warps", "maxnreg", "BN", f"BM{n}", "BN_HOT", f"BM{n}_HOT")
        knobs = ", ".join(f"{k}={c[k]}" for k in names if k in c)
        raise ValueError(f"cfg: expected GEMM {n} ({'gate/up' if n == 1 else 'down'}) tiles "
                         f"within the GPU's {e.name} ({e.limit}), got {e.required} at {knobs} "
                         f"(fewer stages or a smaller BN / BM{n})") from e


def prepare(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate, cfg,
            tiles_of, router=route_one_program, expected_slots=None, gate_up: bool = True):
    """What `launch` sets up before its first kernel: the input checks, the knobs
    tiles_of(T, K, E, D, I) | cfg, the TMA descriptors (wd / sd / st: gate, up, down), the
    launch options and the routing (router(topk_ids, E, knobs)). None for T = 0. Shared with
    v17, whose launches differ after it. gate_up False: the gate / up experts are not read
    here (cuda_v4 streams them in CUDA): they may be in the mma layout, and their
    descriptors are None."""
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots,
                 mma_ok=False if gate_up else GATE_UP)
    gp, gs, up, us, dp, ds = experts
    T, D = x.shape
    K = topk_ids.shape[1]
    E, I = gp.shape[0], gp.shape[1]
    if T == 0:
        return None
    c = with_cfg(tiles_of(T, K, E, D, I), cfg)
    S, Dp, Ip = T * K, triton.cdiv(D, KT) * KT, triton.cdiv(I, KT) * KT
    if max(T * Dp, S * 2 * Ip) >= 2**31:  # the GEMM's activation offsets are int32
        raise ValueError(f"x: expected T * K * 2 * ceil(I / {KT}) * {KT} < 2^31 activation "
                         f"elements, got T={T}, K={K}, I={I}")
    if gs.stride() != us.stride():  # gate and up share one scale offset computation
        raise ValueError(f"experts.up_scale: expected the strides of its gate twin "
                         f"{gs.stride()}, got {us.stride()}")
    (w1, w2), (s1, s2), st1 = (descriptors((gp, up), (gs, us), c["BN"]) if gate_up
                               else ((None, None), (None, None), None))
    (w3,), (s3,), st2 = descriptors((dp,), (ds,), c["BN"])
    run = dict(num_warps=c["warps"], num_stages=c["stages"], maxnreg=c["maxnreg"])
    r = router(topk_ids, E, c)
    return types.SimpleNamespace(
        T=T, D=D, K=K, E=E, I=I, S=S, Dp=Dp, Ip=Ip, c=c, dev=x.device,
        common=dict(K=K, BN=c["BN"], ABLATE=_ablate(), INTERPRET=INTERPRET, **run), r=r,
        meta=(r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act), wd=(w1, w2, w3),
        sd=(s1, s2, s3), st=(st1, st2))


def launch(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate, cfg,
           tiles_of, down_select: bool, router=route_one_program, expected_slots=None,
           silu=None, gemm=grid_gemm, pdl: bool = False) -> Tensor:
    """The six launches (route, permute, gate/up GEMM, SiLU, down GEMM, combine) around
    `_gemm_kernel` with the knobs tiles_of(T, K, E, D, I) (| cfg); down_select: compile the
    gate/up select into the down launch too (v8; never taken there, see `_gemm_kernel`);
    router(topk_ids, E, knobs) -> Routing (v9 picks one by T; a Routing whose `xp` the router
    wrote skips the permute launch: v27's five); expected_slots: the op's hint,
    checked here (v11 folds it into its tiles_of; v7-v10 size for all T K slots);
    silu(g, h, r, c, pdl=): the SiLU launch (v11's skips unrouted positions; default v5's kernel
    over all S positions); gemm(n, c, r, NT, args, kw): the launch of GEMM n over NT N tiles,
    its partials summed as c["KSn"] slices of g / y (v12's is persistent); pdl: every launch
    after the router's as a programmatic dependent of the one before (v14; the silu hook gets
    `pdl=`, the gemm hook the option in its kw)."""
    p = prepare(x, topk_ids, topk_weights, experts, validate, cfg, tiles_of, router,
                expected_slots)
    if p is None:
        return torch.empty(0, x.shape[1], dtype=x.dtype, device=x.device)
    T, D, I, S, Dp, Ip, c, dev, common, r, meta = (
        p.T, p.D, p.I, p.S, p.Dp, p.Ip, p.c, p.dev, p.common, p.r, p.meta)
    (w1, w2, _), (s1, s2, _), (st1, _) = p.wd, p.sd, p.st  # down's: `down_combine`
    gs, us, ds = experts[1], experts[3], experts[5]
    dep = pdl_launch(pdl)  # {} without PDL: the launches (and kernels) of v7-v13
    xp = r.xp  # [T, Dp] permuted x: the router's launch wrote it (v27), or the permute does
    if xp is None:
        xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)
        _permute_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, num_warps=4,
                                       **dep)
    g = torch.empty(c["KS1"], S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    nt1 = triton.cdiv(I, c["BN"])
    run_gemm(gemm, 1, c, r, 2 * nt1,
             (xp, Dp, 0, w1, s1, w2, s2, gs, us, gs.stride(0), gs.stride(1), *meta, g,
              g.stride(0), g.stride(1), I, nt1, D),
             dict(BM=c["BM1"], NH=1, TWO=True, S_TMA=st1, BY_TOKEN=True, OUT_BY_SLOT=False,
                  **common, **dep))
    h = torch.empty(S, 2, Ip, dtype=torch.bfloat16, device=dev)  # [S, 2, Ip] permuted hi, lo
    if silu is None:
        _silu_kernel[(S, Ip // KT)](g, g.stride(0), I, Ip, h, KS=c["KS1"],
                                    INTERPRET=INTERPRET, num_warps=2)
    else:
        silu(g, h, r, c, pdl=pdl)
    return down_combine(p, h, topk_ids, topk_weights, ds, gemm, down_select, dep)


def down_combine(p, h: Tensor, topk_ids: Tensor, topk_weights: Tensor, ds: Tensor, gemm,
                 down_select: bool, dep: dict) -> Tensor:
    """`launch`'s last two launches on `prepare`'s p: the down GEMM over h [S, 2, Ip] (bf16
    hi / lo, permuted rows as `_silu_kernel` writes them) and the combine -> [T, D] bf16.
    Shared with cuda_v4, whose h comes from a CUDA gate/up GEMM."""
    y = down_partials(p)
    down_gemm(p, h, y, ds, gemm, down_select, dep)
    return combine_partials(p, y, topk_ids, topk_weights, dep)


def down_partials(p) -> Tensor:
    """The down GEMM's output y [KS2, S, D] fp32 in slot order, uninitialised: the launch
    that takes a routed slot's expert writes its rows (the combine reads no other)."""
    return torch.empty(p.c["KS2"], p.S, p.D, dtype=torch.float32, device=p.dev)


def down_gemm(p, h: Tensor, y: Tensor, ds: Tensor, gemm, down_select: bool, dep: dict) -> None:
    """The down GEMM over h into y (`down_partials`) through the launch hook gemm(2, c, r, NT,
    args, kw) (cuda_v13 calls this twice, each hook taking its band of experts). cfg NH2 (2
    by default): h's halves the GEMM reads; 1 reads hi only, h rounded to bf16 once (Humming's,
    Marlin's and the Triton fused_moe's down operand; within int4_moe's tolerance of two bf16
    roundings; the error it adds: `scripts/probe_int4_h_precision.py`): cuda_v14's down GEMM
    from 8 E expected slots (session 37: where the down GEMM is MMA- and activation-bound)."""
    D, I, Ip, c, common, r, meta = p.D, p.I, p.Ip, p.c, p.common, p.r, p.meta
    nh = c.get("NH2", 2)
    _require(type(nh) is int and nh in (1, 2), "cfg['NH2']", "1 (h's bf16 hi) or 2 (hi + lo)",
             nh)
    w3, s3, st2 = p.wd[2], p.sd[2], p.st[1]
    nt2 = triton.cdiv(D, c["BN"])
    run_gemm(gemm, 2, c, r, nt2,
             (h, 2 * Ip, Ip, w3, s3, w3, s3, ds, ds, ds.stride(0), ds.stride(1), *meta, y,
              y.stride(0), y.stride(1), D, nt2, I),
             dict(BM=c["BM2"], NH=nh, TWO=down_select, S_TMA=st2, BY_TOKEN=False,
                  OUT_BY_SLOT=True, **common, **dep))


def combine_partials(p, y: Tensor, topk_ids: Tensor, topk_weights: Tensor,
                     dep: dict) -> Tensor:
    """The weighted top-K combine of y's KS2 partials in a fixed order -> [T, D] bf16."""
    T, D, K, c, r = p.T, p.D, p.K, p.c, p.r
    out = torch.empty(T, D, dtype=torch.bfloat16, device=p.dev)
    BD = c.get("BD_COMBINE") or min(1024, next_pow2(D))  # columns a combine program (v22: 256)
    _combine_kernel[(T, triton.cdiv(D, BD))](
        y, y.stride(0), topk_weights, topk_weights.stride(0), topk_weights.stride(1),
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), r.bad, out,
        D, K=K, KS=c["KS2"], BD=BD, INTERPRET=INTERPRET, num_warps=4, **dep)
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v7's launcher):

        python -m workbench.kernels.int4_moe.triton_v7 [--T 1,9,33,128,512]
            [--cfgs "base;nodequant;stages=3;stages=5"]

    `nodequant` is v5's ablation (INT4_MOE_V5_ABLATE, read by v7's launcher too)."""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton)


if __name__ == "__main__":
    raise SystemExit(_main())
