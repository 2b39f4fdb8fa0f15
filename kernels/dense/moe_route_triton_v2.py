"""MoE router in ONE launch (op moe_route, variant triton_v2): the router GEMM split over K and
the experts, its partials summed and the top-k picked by the programs that finish last.

Why (H200, session 18 call 11, the emulated EP8 rank at C 1 AR): triton_v1's router is three
launches a MoE layer, cuBLAS's split-K GEMM (5.2 µs), its splitKreduce (1.6) and the top-k
kernel (3.7): 10.5 µs for a 5.5 MB weight (1.3 µs at copy speed), 0.63 ms of a 7.24 ms step.
Each launch is mostly fixed cost (the step is 1703 kernels, most of them 1-3 µs).

One launch, grid (expert tiles, K slices), linear_triton_v2's split-K scheme twice:
1. each program multiplies its [BM >= T rows, KS] slice of h by its [BN experts, KS] slice of
   the weight (fp32 accumulate) and writes the fp32 partial to a workspace;
2. it takes a ticket on its expert tile's counter; the last of the SPLIT slices to arrive sums
   the partials in slice order 0..SPLIT-1 (deterministic whatever the arrival order) into the
   fp32 logits [T, E] and takes a ticket on the tiles' counter;
3. the last expert tile to arrive picks every row's top-k, RB rows at a time: triton_v1's rule
   on [RB, E] tiles (sigmoid, + bias, K rounds of "max, then the lowest index holding it", NaN
   as +inf; the unbiased scores renormalised), and resets the counters so the next launch (or
   CUDA-graph replay) finds them zero.

Rows beyond MAX_T (32: decode and the C 1 verify; the top-k runs in one program) and inputs
that are not bf16/fp16 run triton_v1 (documented dispatch by shape, as cuBLAS switches kernels
by row count). The counters live in one int32 buffer per device, so two launches may not run
concurrently on different streams (the engine issues them on one).
Numerics: fp32 logits in a fixed K order (not cuBLAS's bits): engine-only, like triton_v1; ids
equal the reference's wherever the choices at the K / K+1 boundary are more than a few fp32
ulps apart.
Measured (H200, session 19, traces/gpu/session19): a NEGATIVE. Kernel µs at T 1 / 9 / 17: 13.4
/ 27.3 / 36.5 against triton_v1's 9.9 / 10.3 / 10.3. The GEMM phases alone are 5.3-5.9 µs
(`scripts/probe_moe_route_phases.py`, TOPK off), the one-program top-k ~5-6 µs a step of RB
rows: kept registered as the measured negative, not in the engine preset.
Legend: T rows (tokens), D hidden, E experts, K top-k, SPLIT K slices of KS, BM / BN tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, next_pow2
from . import moe_route_triton_v1
from .linear_triton_v1 import SMS, fit_smem
from .linear_triton_v2 import counters, slice_tile, sum_slices

MAX_T = 32  # rows a launch takes here: the top-k of all rows runs in one program
RB = 8  # rows a top-k step: a [RB, BLOCK_E] tile, two rows a warp


@triton.jit
def _topk_rows(logit_ptr, bias_ptr, ids_ptr, w_ptr, loc_ptr, row0, T, E, K, scaling, FIRST,
               N_LOC, RB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
               LOCAL: tl.constexpr):
    """triton_v1's selection on the rows row0..row0+RB-1 (< T) of the fp32 logits [T, E]."""
    r = row0 + tl.arange(0, RB)
    e = tl.arange(0, BLOCK_E)
    kk = tl.arange(0, BLOCK_K)
    r_ok, e_ok = r < T, e < E
    rows = logit_ptr + r.to(tl.int64)[:, None] * E
    # .cg: other programs wrote these logits; read them from L2, never a stale L1 line
    x = tl.load(rows + e[None, :], mask=r_ok[:, None] & e_ok[None, :], other=0.0,
                cache_modifier=".cg")
    s = tl.sigmoid(x)
    choice = s + tl.load(bias_ptr + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    choice = tl.where(choice != choice, float("inf"), choice)  # NaN first, as torch's sort
    avail = e_ok[None, :] & r_ok[:, None]
    ids = tl.zeros((RB, BLOCK_K), dtype=tl.int32)
    for j in range(K):
        m = tl.max(tl.where(avail, choice, float("-inf")), axis=1)
        win = tl.min(tl.where(avail & (choice == m[:, None]), e[None, :], BLOCK_E), axis=1)
        avail = avail & (e[None, :] != win[:, None])
        ids = tl.where(kk[None, :] == j, win[:, None], ids)
    ok = r_ok[:, None] & (kk < K)[None, :]
    w = tl.sigmoid(tl.load(rows + ids, mask=ok, other=0.0, cache_modifier=".cg"))
    w = tl.where(ok, w, 0.0)
    w = w / (tl.sum(w, axis=1)[:, None] + 1e-20) * scaling
    out = r.to(tl.int64)[:, None] * K + kk[None, :]
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=ok)
    tl.store(w_ptr + out, w, mask=ok)
    if LOCAL:  # the reference's rule 5 (triton_v1's store)
        here = (ids >= FIRST) & (ids < FIRST + N_LOC)
        tl.store(loc_ptr + out, tl.where(here, ids - FIRST, -1).to(tl.int64), mask=ok)


@triton.jit
def _moe_route_fused_kernel(h_ptr, g_ptr, bias_ptr, ws_ptr, logit_ptr, cnt_ptr, ids_ptr,
                            w_ptr, loc_ptr, T, E, D, KS, K, s_h, s_g, scaling, NT, NP, FIRST,
                            N_LOC, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            BK: tl.constexpr, RB: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_K: tl.constexpr, TOPK: tl.constexpr, LOCAL: tl.constexpr,
                            INTERPRET: tl.constexpr):
    # (named apart from int4_moe's `_route_kernel`: the step's kernel tables go by name)
    acc, m, n, m_ok, n_ok = slice_tile(h_ptr, g_ptr, T, E, D, KS, s_h, 1, s_g, 1, BM, BN, BK,
                                       INTERPRET)  # expert tile program_id(0), K slice (1)
    pid_n = tl.program_id(0)
    tile = m[:, None] * NP + n[None, :]  # [BM, BN] inside one slice's [BM, NP] partial
    tl.store(ws_ptr + tl.program_id(1) * BM * NP + tile, acc)
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    # counters: NT per expert tile (its K slices), then one for the tiles
    if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:  # the last K slice
        tl.debug_barrier()
        tot = sum_slices(ws_ptr, tile, BM * NP, SPLIT)
        tl.store(logit_ptr + m.to(tl.int64)[:, None] * E + n[None, :], tot,
                 mask=m_ok[:, None] & n_ok[None, :])
        tl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next launch / graph replay
        tl.debug_barrier()  # the tile's logits are written before the tiles' ticket
        if TOPK:  # (off: the GEMM phases alone, for scripts/probe_moe_route_phases.py)
            if tl.atomic_add(cnt_ptr + NT, 1, sem="acq_rel") == NT - 1:  # the last tile
                tl.debug_barrier()
                for r0 in range(0, T, RB):
                    _topk_rows(logit_ptr, bias_ptr, ids_ptr, w_ptr, loc_ptr, r0, T, E, K,
                               scaling, FIRST, N_LOC, RB, BLOCK_E, BLOCK_K, LOCAL)
                tl.atomic_xchg(cnt_ptr + NT, 0)


def tiles(T: int, E: int, D: int, BN: int = 16, BK: int = 128, RB: int = RB, warps: int = 4,
          max_split: int = 16) -> dict:
    """{BM, BN, BK, SPLIT, RB, warps, stages}: BM covers T (16 / 32); BN 16 (E / 16 expert
    tiles: 24 at Kimi's 384); SPLIT the most K slices (<= max_split) that keep >= 2 BK steps a
    slice and the grid within ~2 programs an SM. The keywords are a probe's overrides."""
    BM = max(16, next_pow2(min(T, MAX_T)))
    BK = max(16, min(BK, next_pow2(D)))
    n_tiles, split = triton.cdiv(E, BN), 1
    while (n_tiles * split * 2 <= 2 * SMS and triton.cdiv(D, 2 * split) >= 2 * BK
           and split < max_split):
        split *= 2
    BK, stages = fit_smem(BM, BN, BK, 4)
    return dict(BM=BM, BN=BN, BK=BK, SPLIT=split, RB=RB, warps=warps, stages=stages)


def moe_route(h: Tensor, gate_weight: Tensor, bias: Tensor, top_k: int, scaling: float,
              local_experts: tuple[int, int] | None = None, cfg: dict | None = None,
              topk: bool = True) -> tuple:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K][, local ids int64 [T, K]]);
    gate_weight [E, D], bias [E] (the "moe_route" op's contract and errors: triton_v1's
    checks run first). One launch for bf16 / fp16 h and weight with T <= MAX_T, else
    triton_v1. cfg: `tiles` overrides; topk=False: the GEMM phases only (ids / weights left
    unwritten), both for probes."""
    T, D, E = moe_route_triton_v1.check_args(h, gate_weight, bias, top_k, local_experts)
    if not runs_here(h, gate_weight):
        return moe_route_triton_v1.moe_route(h, gate_weight, bias, top_k, scaling,
                                             local_experts)
    ids, w, _, loc = launch(h, gate_weight, bias, top_k, scaling, cfg, topk, local_experts)
    return (ids, w) if local_experts is None else (ids, w, loc)


def runs_here(h: Tensor, gate_weight: Tensor) -> bool:
    """Does this kernel take the (checked) call? 1 <= T <= MAX_T rows of bf16 / fp16, the
    weight in h's dtype; everything else is triton_v1's (also for moe_route_triton_v3)."""
    return (1 <= h.shape[0] <= MAX_T and h.dtype in (torch.bfloat16, torch.float16)
            and gate_weight.dtype == h.dtype)


def launch(h: Tensor, gate_weight: Tensor, bias: Tensor, top_k: int, scaling: float,
           cfg: dict | None = None, topk: bool = True,
           local_experts: tuple[int, int] | None = None) -> tuple[Tensor, ...]:
    """The one launch on checked bf16 / fp16 inputs with 1 <= T <= MAX_T: (ids, weights,
    logits fp32 [T, E], local ids: ids' own buffer without local_experts); topk=False leaves
    ids / weights unwritten (moe_route_triton_v3 picks them from the logits in a launch of
    its own)."""
    T, D = h.shape
    E = gate_weight.shape[0]
    h = h if h.stride(1) == 1 else h.contiguous()
    gate_weight = gate_weight if gate_weight.stride(1) == 1 else gate_weight.contiguous()
    t = tiles(T, E, D, **(cfg or {}))
    BM, BN, BK = t["BM"], t["BN"], t["BK"]
    KS = triton.cdiv(triton.cdiv(D, t["SPLIT"]), BK) * BK  # whole BK steps a slice
    split = triton.cdiv(D, KS)  # slices that hold any K
    NT = triton.cdiv(E, BN)
    NP = NT * BN
    dev = h.device
    ws = torch.empty(split * BM * NP, dtype=torch.float32, device=dev)
    logits = torch.empty(T, E, dtype=torch.float32, device=dev)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=dev)
    w = torch.empty(T, top_k, dtype=torch.float32, device=dev)
    loc = ids if local_experts is None else torch.empty_like(ids)  # not written unless LOCAL
    first, n_loc = local_experts or (0, 0)
    cnt = counters(dev, NT + 1, pool="moe_route")
    b = bias.float().contiguous()  # a no-op for the model's fp32 bias
    _moe_route_fused_kernel[(NT, split)](
        h, gate_weight, b, ws, logits, cnt, ids, w, loc, T, E, D, KS, top_k, h.stride(0),
        gate_weight.stride(0), float(scaling), NT, NP, first, n_loc, SPLIT=split, BM=BM, BN=BN,
        BK=BK, RB=t["RB"], BLOCK_E=next_pow2(E), BLOCK_K=next_pow2(top_k), TOPK=topk,
        LOCAL=local_experts is not None, INTERPRET=INTERPRET, num_warps=t["warps"],
        num_stages=t["stages"])
    return ids, w, logits, loc


def sm90_report(T: int, E: int, D: int) -> dict:
    """The kernel compiled for sm_90a at these shapes (CPU box, no GPU; run without
    TRITON_INTERPRET): ptxas registers / spills, shared memory, MMA and atomic counts."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .._sm90 import ptxas_stats

    t = tiles(T, E, D)
    names = ("h_ptr g_ptr bias_ptr ws_ptr logit_ptr cnt_ptr ids_ptr w_ptr loc_ptr T E D KS K "
             "s_h s_g scaling NT NP FIRST N_LOC").split()
    types = ["*bf16", "*bf16", "*fp32", "*fp32", "*fp32", "*i32", "*i64", "*fp32", "*i64",
             *["i32"] * 7, "fp32", "i32", "i32", "i32", "i32"]
    consts = dict(SPLIT=t["SPLIT"], BM=t["BM"], BN=t["BN"], BK=t["BK"], RB=t["RB"],
                  BLOCK_E=next_pow2(E), BLOCK_K=8, TOPK=True, LOCAL=False, INTERPRET=False)
    sig = dict(zip(names, types)) | {k: "constexpr" for k in consts}
    src = ASTSource(fn=_moe_route_fused_kernel, signature=sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=t["warps"], num_stages=t["stages"]))
    ptx = k.asm["ptx"]
    regs, spill = ptxas_stats(ptx)
    return dict(regs=regs, spill=spill, smem=k.metadata.shared, split=t["SPLIT"],
                mma=len(re.findall(r"\bw?gmma\.mma_async|\bmma\.sync", ptx)),
                atom=len(re.findall(r"\batom\.", ptx)))
