"""int4_moe triton_v8: v7 with 128 weight rows per program on one warpgroup (two m64 wgmma row
blocks sharing each activation slab), so the per-tile fixed work of v7's K loop is paid once per
256 weights a thread instead of once per 128.

Why (H200, README.md "v7 measured"): with the dequant ablated v7 streams at 94-96 % of copy, with
it 75-81 %: the K loop is issue-bound. Of v7's 401 (gate/up) / 417 (down) SASS per K tile and
thread (128 weights), 240 are the dequant; the other ~160 are per tile and per CTA whatever the
tile's height: the mbarrier waits and arrivals, the TMA issue (elect, vote, coordinates), three
CTA barriers and the proxy fence, the cp.async of the activation slabs, the wgmma descriptor
arithmetic (4 slabs x ~7 uniform ops), the stage / phase counters. A program of BN = 128 rows
on the same 4 warps gives every thread 2 x 128 weights a tile: the dequant doubles (480), the
fixed part stays (~180: + 16 HGMMA for the second row block, + 2 LDSM / 2 LDS for the extra
words / scales): 663 / 679 SASS a tile, **2.59 / 2.65 per weight (v7 3.13 / 3.26)**.
(BN = 128 on 8 warps, two warpgroups of 64 rows each, leaves every thread v7's 128 weights
and v7's 401 / 417: no gain per instruction; README.md "v8" has the compile table.)

Arithmetic = v7's = v5's, bit for bit: a weight row's K chain does not depend on the rows
beside it (each m64 block is its own m64n16k16 chain over the same K tiles, the same 64-deep
slabs in the same order, the same B operand); the dequant, hi + lo, split-K (the K split table
is v5's, computed for BN = 64 so that the split count, and with it the fp32 association, is
v7's) and combine are v7's. The per-program change: the grid has half the N tiles.
Costs: 168 registers (maxnreg; 3 CTAs / SM instead of v7's 4: 12 warps), 61.5 KB smem at
3 stages (2 K tiles of 16 KB words + 2 KB scales + 8 KB activations in flight per CTA: 3 x 2 x
18 KB = 108 KB of HBM loads in flight an SM, v7 72 KB).

Launch knobs (`tiles`, `cfg`): BN (64 gives v7's kernel shape, v8's code), warps, stages,
maxnreg, KS1 / TPS1, KS2 / TPS2 (v7's split table by default: same bits as v7; other splits
change the fp32 association), BM1 / BM2.

Dimension legend: v5's (T tokens, K slots, S = T*K, E experts, A active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile = 32 words; BN weight rows, BM slot rows per MMA,
NH halves, R = NH * BM MMA columns; KS1 / KS2 K splits; Dp, Ip = D, I rounded up to KT).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .triton_v3 import KT
from .triton_v5 import _pairs, _slab
from .triton_v7 import launch
from .triton_v7 import tiles as _tiles_v7

_KT = tl.constexpr(KT)


@triton.jit
def _k_tile(acc, w_desc, s_desc, s_row, e, n0, in_ptr, in_off, rm, nm, kt, words,
            S_TMA: tl.constexpr, BN: tl.constexpr, ABLATE: tl.constexpr,
            INTERPRET: tl.constexpr):
    """acc [BN, R] += W[:, tile kt] @ in[rows, tile kt]^T: v7's tile (words, and scales if
    S_TMA, by TMA; a tile past IN reads zeros there) for BN = 64 or 128 rows."""
    p = tl.reshape(w_desc.load([e, n0, kt * 32]), (BN, 32))  # [BN, 32] words
    if S_TMA:
        s8 = tl.reshape(s_desc.load([e, n0, kt * 8]), (BN, 8))  # [BN, 8] scale groups
    else:  # rows not 16-byte aligned (IN % 256 != 0): v5's masked load
        g8 = kt * 8 + tl.arange(0, 8)
        s8 = tl.load(s_row + g8[None, :], mask=nm[:, None] & (g8 < words // 4)[None, :],
                     other=0.0, eviction_policy="evict_first")
    pd, sd = _pairs(p, s8, BN)
    DOT = tl.float32 if INTERPRET else tl.bfloat16
    x = in_ptr + in_off + kt * _KT
    for j in tl.static_range(4):  # 4 slabs of K 64, one dot each (BN 128: 2 x m64 per k16)
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
                 S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
                 ABLATE: tl.constexpr, INTERPRET: tl.constexpr):
    """v7's program (N tile, active expert, K split): tiles >= NT1 take the second projection
    (w2_desc, col += NOUT). Unlike v7 the select is always compiled (the down launch passes
    its descriptors twice and NT1 = its tile count, so it is never taken): with a select the
    descriptor addresses stay uniform registers; v7's down GEMM, without it, moved them from
    per-thread registers (R2UR, IMAD) at every TMA issue (+16 SASS a tile)."""
    a = tl.program_id(1)
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    pid_n = tl.program_id(0)
    ks = tl.program_id(2)
    e = tl.load(act_e_ptr + a)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    n0 = pid_n * BN
    col0 = n0
    w_desc = w1_desc
    s_desc = s1_desc
    wsc = w1s_ptr
    if pid_n >= NT1:
        n0 = (pid_n - NT1) * BN
        col0 = n0 + NOUT
        w_desc = w2_desc
        s_desc = s2_desc
        wsc = w2s_ptr
    n = n0 + tl.arange(0, BN)  # [BN] weight rows
    nm = n < NOUT
    s_row = wsc + e.to(tl.int64) * s_se + n[:, None].to(tl.int64) * s_sn  # unused if S_TMA
    words = IN // 8
    kt0 = ks * TPS
    kt1 = tl.minimum(kt0 + TPS, tl.cdiv(IN, _KT))
    i = tl.arange(0, NH * BM)  # [R] MMA columns: slot i % BM, half i // BM
    for m0 in range(0, cnt, BM):
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


# ------------------------------------------------------------------------------------ launcher


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe): v7's table (v5's BM1 / BM2 and K splits, computed for BN 64:
    v7's fp32 association) with BN 128 on 4 warps; 168 registers (no spill in the K loops),
    3 stages (61.5 KB smem): 3 CTAs / SM."""
    return _tiles_v7(T, K, E, D, I) | dict(BN=128, warps=4, stages=3, maxnreg=168)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is; weight words 16-byte aligned) -> [T, D] bf16;
    the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: tile overrides (keys of `tiles`; KSn with TPSn), for sweeps.
    v7's six launches (`triton_v7.launch`) around v8's GEMM program."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, _gemm_kernel, tiles,
                  two_flag=False)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v8's launcher):

        python -m workbench.kernels.int4_moe.triton_v8 [--T 1,9,33,128,512]
            [--cfgs "base;nodequant;BN=64;maxnreg=192"]

    `nodequant` is v5's ablation (INT4_MOE_V5_ABLATE, read by v8's launcher too)."""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton)


if __name__ == "__main__":
    raise SystemExit(_main())
