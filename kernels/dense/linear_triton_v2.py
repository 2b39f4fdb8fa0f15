"""Split-K skinny linear (op linear, variant triton_v2) for decode row counts, one launch.

Why: at decode widths the EP8 rank's projections are small weights (q_b/8 4.7 MB, o/8 15 MB,
q_a | kv_a 30 MB: 1-7 µs at 4.26 TB/s) against 17 rows, and a GEMM of that size is latency,
not bandwidth. linear_triton_v1 walks all of K in each program (28 serial 256-wide steps on
q_a | kv_a: 15.6 µs vs cuBLAS's 12.5, session 8); cuBLAS splits K but pays a second launch
(splitKreduce, ~1.9 µs each, 135 a step in the emulated rank). Here the grid is (N tiles,
SPLIT K slices): each program writes its fp32 partial [BM, BN] to a workspace, then takes a
ticket on its N tile's counter; the program that draws the last ticket sums the SPLIT partials
in slice order 0..SPLIT-1 (whatever order they arrived in: deterministic), rounds once, writes
the output and resets the counter to 0 (the next launch, or CUDA-graph replay, finds it zero).

Counters live in one int32 buffer per device (zeroed once, reset by the kernel), so two
launches may not run concurrently on different streams; the engine issues them on one stream.
Rows > MAX_ROWS (64) and non-bf16/fp16 inputs take torch_bf16's cuBLAS GEMM (as triton_v1).
Numerics: fp32 accumulation, a fixed K split and a fixed sum order; one rounding to x.dtype.
Engine-only (not the float64 reference; not bitwise cuBLAS).
Legend: M rows, K in features, N out features, SPLIT K slices, KS = K per slice.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, next_pow2
from .linear_triton_v1 import MAX_ROWS, SMS, fit_smem, run, widest_bn

_COUNTERS: dict[tuple[torch.device, str], Tensor] = {}


@triton.jit
def slice_tile(x_ptr, w_ptr, M, N, K, KS, s_xm, s_xk, s_wn, s_wk, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr,
               TRANS: tl.constexpr = False):
    """This program's fp32 [BM, BN] product of x's rows 0..BM-1 and w's rows (output columns)
    of tile program_id(0) over K slice program_id(1) (KS inputs): (acc, m, n, m_ok, n_ok).
    TRANS: acc is [BN, BM] = w x^T instead (linear_triton_v4: the output columns on the MMA's
    M). Shared with moe_route_triton_v2's router GEMM."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    kk = tl.arange(0, BK)
    n_ok, m_ok = n < N, m < M
    x_rows = x_ptr + m.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * s_wn
    k_lo = pid_k * KS
    k_hi = tl.minimum(k_lo + KS, K)
    if TRANS:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        k_ok = k < k_hi
        x = tl.load(x_rows + k[None, :] * s_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :] * s_wk, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if INTERPRET:  # the interpreter's bf16 dot is wrong (DESIGN.md §10): exact in fp32
            x, w = x.to(tl.float32), w.to(tl.float32)
        if TRANS:
            acc += tl.dot(w, tl.trans(x))
        else:
            acc += tl.dot(x, tl.trans(w))
    return acc, m, n, m_ok, n_ok


@triton.jit
def sum_slices(ws_ptr, tile, stride, SPLIT: tl.constexpr):
    """The SPLIT fp32 partials of `tile` (slice s at ws_ptr + s * stride) summed in slice
    order 0..SPLIT-1. .cg: from L2, never a stale L1 line (an earlier replay's last program on
    this SM may have cached these addresses)."""
    tot = tl.load(ws_ptr + tile, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT):
        tot += tl.load(ws_ptr + s * stride + tile, cache_modifier=".cg")
    return tot


@triton.jit
def store_or_sum(acc, y, out_ok, tile, ws_ptr, cnt_ptr, BM: tl.constexpr, NP,
                 SPLIT: tl.constexpr):
    """acc (this program's K slice of its column tile) to the outputs y: stored, rounded once,
    where SPLIT is 1; else written to slice program_id(1)'s [BM, NP] partial at `tile`, and the
    last slice of column tile program_id(0) to take its ticket sums all of them in slice order
    (whatever order they arrived in: deterministic), stores and resets the counter to 0 (the
    next launch, or CUDA-graph replay, finds it zero)."""
    if SPLIT == 1:
        tl.store(y, acc.to(y.dtype.element_ty), mask=out_ok)
    else:
        pid_n = tl.program_id(0)
        tl.store(ws_ptr + tl.program_id(1) * BM * NP + tile, acc)
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT - 1:  # the last slice to arrive: sum all of them in slice order
            tl.debug_barrier()
            tot = sum_slices(ws_ptr, tile, BM * NP, SPLIT)
            tl.store(y, tot.to(y.dtype.element_ty), mask=out_ok)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next launch / graph replay


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, KS, s_xm, s_xk, s_wn, s_wk,
                   s_ym, NP, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, INTERPRET: tl.constexpr):
    acc, m, n, m_ok, n_ok = slice_tile(x_ptr, w_ptr, M, N, K, KS, s_xm, s_xk, s_wn, s_wk, BM,
                                       BN, BK, INTERPRET)
    y = y_ptr + m.to(tl.int64)[:, None] * s_ym + n[None, :]
    # tile: [BM, BN] inside one slice's [BM, NP] partial
    store_or_sum(acc, y, m_ok[:, None] & n_ok[None, :], m[:, None] * NP + n[None, :], ws_ptr,
                 cnt_ptr, BM, NP, SPLIT)


class Tiles(NamedTuple):
    BM: int
    BN: int
    BK: int
    SPLIT: int
    warps: int
    stages: int


def tiles(M: int, N: int, K: int) -> Tiles:
    """BM covers M (16 / 32 / 64); BN the widest of 16..64 leaving >= SMS / 2 column tiles;
    SPLIT so that tiles x slices reach ~2 programs an SM with >= 2 BK steps a slice; 4 stages
    where they fit in shared memory (3 at BM = BN = 64)."""
    BM = max(16, next_pow2(min(M, MAX_ROWS)))
    BN = widest_bn(N, max_bn=64, programs=SMS // 2)
    BK = max(16, min(256, next_pow2(K)))
    n_tiles = triton.cdiv(N, BN)
    split = 1
    while (n_tiles * split < 2 * SMS and triton.cdiv(K, 2 * split) >= 2 * BK
           and split < 16):
        split *= 2
    BK, stages = fit_smem(BM, BN, BK, 4)
    return Tiles(BM, BN, BK, split, 4, stages)


def counters(device: torch.device, n: int, pool: str = "linear") -> Tensor:
    """>= n zeroed int32 ticket counters on `device`, one buffer per (device, pool) (each op
    its own pool); the kernels reset what they use, so the buffer stays zero between launches."""
    c = _COUNTERS.get((device, pool))
    if c is None or c.numel() < n:  # grown outside any capture: first eager calls come first
        c = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[(device, pool)] = c
    return c


def linear(x: Tensor, weight: Tensor, tiles_for=tiles) -> Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x.dtype (the "linear" op's contract; checks
    and cuBLAS dispatch as triton_v1). `tiles_for(M, N, K) -> Tiles` (a sweep passes its own)."""
    return run(x, weight, functools.partial(launch, tiles_for=tiles_for))


def launch(x2: Tensor, weight: Tensor, y: Tensor, M: int, N: int, K: int, tiles_for,
           kernel=None) -> None:
    """One launch of `kernel` (this file's _splitk_kernel, or a twin with its arguments:
    linear_triton_v4's) on tiles_for(M, N, K): the workspace, the counters, the grid."""
    kernel = kernel or _splitk_kernel
    t = tiles_for(M, N, K)
    n_tiles = triton.cdiv(N, t.BN)
    NP = n_tiles * t.BN
    KS = triton.cdiv(triton.cdiv(K, t.SPLIT), t.BK) * t.BK  # whole BK steps a slice
    split = triton.cdiv(K, KS)  # slices that hold any K (<= t.SPLIT)
    ws = (torch.empty(split * t.BM * NP, dtype=torch.float32, device=x2.device)
          if split > 1 else y)
    cnt = counters(x2.device, n_tiles)
    kernel[(n_tiles, split)](
        x2, weight, y, ws, cnt, M, N, K, KS, x2.stride(0), x2.stride(1), weight.stride(0),
        weight.stride(1), y.stride(0), NP, SPLIT=split, BM=t.BM, BN=t.BN, BK=t.BK,
        INTERPRET=INTERPRET, num_warps=t.warps, num_stages=t.stages)
