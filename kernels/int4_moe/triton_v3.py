"""int4_moe triton_v3: weight-streaming rework. Each (expert, N tile, K split) program reads its
weight slice from HBM once and applies it to all of the expert's slots; split-K fills the GPU
when few experts are active; cheap exact dequant (no int->float conversion).

Why v1/v2 were 4-10x off the floor (read from their code and the sm_90 compile, README.md):
* dequant `(q - 8).to(f32)` is an I2F conversion per weight: conversions issue at 16 / clk / SM
  on sm_90, the floor needs ~33 weights / clk / SM, so I2F alone caps them near half of HBM;
* BM = clamp(next_pow2(T), 16, 64) pads every expert to 64 rows from T = 64 on, although an
  expert gets ~T*K/E slots (10.7 at T = 512): up to 4x useless MMA + gather work per weight;
* 196-255 registers (spills at BM 64): one CTA per SM, few bytes in flight;
* gate/up at BN 32 x 2 rows compiled to mma.sync, not wgmma; K = 32 MMAs (v2).
v3 changes:
* exact magic-number dequant: q | 0x4B000000 read as fp32 is 2^23 + q, minus (2^23 + 8) gives
  q - 8 exactly (FADD), times the scale (FMUL, exact in fp32), one bf16 rounding: bitwise the
  reference's bf16((q - 8) * s), no I2F;
* checkpoint layout, no repack and no second copy of the experts: nibble j of a [BN, 32] word
  tile is the inputs k0 + 8w + j (w = 0..31), a 32-deep MMA slab whose scale is s[n, w // 4];
  the *activations* are permuted instead (tiny: T x D), so slab j's activations are contiguous;
* BM = 16 slot rows per MMA whatever T (experts with more slots loop; the re-streamed tile is
  the program's own L2-resident slice), BN = 64 weight rows (wgmma M = 64 with 4 warps);
* split-K over (expert, N tile, K split) programs, sized from the worst-case active-expert
  count so 8 experts at T = 1 still give ~2000 programs; partial sums go to an fp32 workspace
  and are reduced in fixed split order by the next kernel (SiLU kernel, combine): deterministic,
  no atomics;
* gate and up in one launch (tile index picks the projection), SiLU*up in its own small kernel
  that also writes the down GEMM's input as exact bf16 hi + lo halves, already permuted;
* evict_first on weight and scale loads; num_stages 4.
Launches: route, x permute, gate+up, SiLU, down, combine (6, all sync-free, graph-capturable).

Dimension legend: T tokens, K slots, S = T*K, E experts, A <= min(E, S) active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile (32 words); BN weight rows, BM slot rows per MMA;
KS1 / KS2 K splits of the gate/up and down GEMMs; Dp, Ip = D, I rounded up to KT.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    INTERPRET,
    _split_bf16,
    _to_bf16,
    check_inputs,
    next_pow2,
    pdl_start,
    route,
    with_cfg,
)

KT = 256  # inputs per K tile: 32 words x 8 nibbles
_KT = tl.constexpr(KT)
_MAGIC = tl.constexpr(8388616.0)  # 2^23 + 8: (q | 0x4B000000) read as fp32, minus this = q - 8


@triton.jit
def _permute_kernel(x_ptr, s_xt, s_xd, xp_ptr, D, Dp):
    """xp[t, k0 + 32 j + w] = x[t, k0 + 8 w + j] per 256-wide tile (0 past D): slab j of the
    checkpoint's nibble planes reads 32 contiguous activations."""
    t = tl.program_id(0)
    o = tl.program_id(1) * _KT + tl.arange(0, _KT)
    src = (o // _KT) * _KT + 8 * (o % 32) + (o % _KT) // 32
    v = tl.load(x_ptr + t.to(tl.int64) * s_xt + src * s_xd, mask=src < D, other=0.0)
    tl.store(xp_ptr + t.to(tl.int64) * Dp + o, v)


@triton.jit
def _dequant_slab(p, s, j: tl.constexpr, INTERPRET: tl.constexpr):
    """words p int32 [BN, 32], scales s fp32 [BN, 32] -> nibble j as bf16 weights [BN, 32]:
    bf16((q - 8) * s) exactly, without an int->float conversion (under the interpreter: fp32
    holding the bf16 value)."""
    q = ((p >> (4 * j)) & 0xF) | 0x4B000000
    w = (q.to(tl.float32, bitcast=True) - _MAGIC) * s
    hi, _ = _split_bf16(w, INTERPRET)
    return hi


@triton.jit
def _gemm_kernel(in_ptr, lo_ptr, s_in,
                 w1p_ptr, w1s_ptr, w2p_ptr, w2s_ptr, s_pe, s_pn, s_se, s_sn,
                 slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS,
                 K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr, HILO: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """out[ks, row, col] = sum over this split's inputs of W[n, k] * in[row, k] for the BN
    weight rows of tile pid_n (tiles >= NT1 take the second projection, col += NOUT) of active
    expert a, for every slot of that expert in chunks of BM. in: permuted bf16 activations,
    indexed by token (gate/up) or sorted position (down, with its lo half when HILO)."""
    a = tl.program_id(1)
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    pid_n = tl.program_id(0)
    ks = tl.program_id(2)
    e = tl.load(act_e_ptr + a).to(tl.int64)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    if pid_n < NT1:
        wp = w1p_ptr
        wsc = w1s_ptr
        n0 = pid_n * BN
        col0 = n0
    else:
        wp = w2p_ptr
        wsc = w2s_ptr
        n0 = (pid_n - NT1) * BN
        col0 = n0 + NOUT
    n = n0 + tl.arange(0, BN)  # [BN] weight rows
    nm = n < NOUT
    w = tl.arange(0, 32)  # word in tile / input in slab
    p_row = wp + e * s_pe + n[:, None].to(tl.int64) * s_pn  # [BN, 1]
    s_row = wsc + e * s_se + n[:, None].to(tl.int64) * s_sn
    words = IN // 8
    kt0 = ks * TPS
    kt1 = tl.minimum(kt0 + TPS, tl.cdiv(IN, _KT))
    DOT = tl.float32 if INTERPRET else tl.bfloat16
    for m0 in range(0, cnt, BM):
        r = m0 + tl.arange(0, BM)
        rm = r < cnt
        slot = tl.load(slots_ptr + start + r, mask=rm, other=0)
        if BY_TOKEN:
            row = slot // K
        else:
            row = start + r
        in_off = row[:, None].to(tl.int64) * s_in + w[None, :]  # [BM, 32]: rows contiguous
        acc = tl.zeros([BN, BM], tl.float32)
        for kt in range(kt0, kt1):
            widx = kt * 32 + w
            wm = nm[:, None] & (widx < words)[None, :]
            p = tl.load(p_row + widx[None, :], mask=wm, other=0, eviction_policy="evict_first")
            g8 = kt * 8 + tl.arange(0, 8)  # the tile's 8 scale groups: 16 B per row
            s8 = tl.load(s_row + g8[None, :], mask=nm[:, None] & (g8 < words // 4)[None, :],
                         other=0.0, eviction_policy="evict_first").to(tl.float32)  # [BN, 8]
            s = tl.reshape(tl.broadcast_to(s8[:, :, None], (BN, 8, 4)), (BN, 32))  # s[n, w // 4]
            for j in tl.static_range(8):
                wj = _dequant_slab(p, s, j, INTERPRET)  # [BN, 32]
                off = in_off + kt * _KT + 32 * j
                # [BM, 32] loads (16 B vectors, so the pipeliner makes them cp.async), used
                # transposed: slot rows on the MMA N dim
                xj = tl.load(in_ptr + off, mask=rm[:, None], other=0.0).to(DOT)
                acc = tl.dot(wj, tl.trans(xj), acc)
                if HILO:
                    lj = tl.load(lo_ptr + off, mask=rm[:, None], other=0.0).to(DOT)
                    acc = tl.dot(wj, tl.trans(lj), acc)
        if OUT_BY_SLOT:
            orow = slot
        else:
            orow = start + r
        out = out_ptr + ks * s_ok + orow[None, :].to(tl.int64) * s_or + (col0 + tl.arange(0, BN))[:, None]
        tl.store(out, acc, mask=rm[None, :] & nm[:, None])


@triton.jit
def _silu_kernel(g_ptr, s_gk, I, Ip, hp_ptr, lp_ptr, KS: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """h = SiLU(sum_ks gate) * sum_ks up (fp32, splits summed in order 0..KS-1) for sorted
    position `pos`, written as bf16 hi + lo (h = hi + lo to 16 bits) in the permuted order."""
    pos = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * _KT + tl.arange(0, _KT)
    src = (o // _KT) * _KT + 8 * (o % 32) + (o % _KT) // 32
    m = src < I
    g = tl.zeros([_KT], tl.float32)
    u = tl.zeros([_KT], tl.float32)
    for ks in tl.static_range(KS):
        row = g_ptr + ks * s_gk + pos * (2 * I)
        g += tl.load(row + src, mask=m, other=0.0)
        u += tl.load(row + I + src, mask=m, other=0.0)
    h = g / (1.0 + tl.exp(-g)) * u
    hi, lo = _split_bf16(h, INTERPRET)
    tl.store(hp_ptr + pos * Ip + o, hi.to(tl.bfloat16))
    tl.store(lp_ptr + pos * Ip + o, lo.to(tl.bfloat16))


@triton.jit
def _combine_kernel(y_ptr, s_yk, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr, out_ptr, D,
                    K: tl.constexpr, KS: tl.constexpr, BD: tl.constexpr,
                    INTERPRET: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, d] = sum_{j = 0..K-1} w[t, j] * (sum_{ks} y[ks, t*K + j, d]), fixed order, fp32,
    one bf16 rounding; slots with id -1 (not routed here) add nothing (their y rows were never
    written); NaN for a token the routing kernel flagged. PDL: `_common.pdl_start` (v14)."""
    pdl_start(PDL)
    t = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    dm = d < D
    acc = combine_cols(y_ptr, s_yk, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr, D, t, d,
                       dm, K, KS)
    tl.store(out_ptr + t.to(tl.int64) * D + d, _to_bf16(acc, INTERPRET), mask=dm)


@triton.jit
def combine_cols(y_ptr, s_yk, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr, D, t, d, dm,
                 K: tl.constexpr, KS: tl.constexpr, CG: tl.constexpr = False):
    """Token t's combined fp32 row at columns d (mask dm): `_combine_kernel`'s arithmetic, for
    it and for triton_v17's down GEMM epilogue. CG: read y past L1 (".cg": v17 reads rows
    other programs wrote during the same launch)."""
    acc = tl.zeros(d.shape, tl.float32)
    for j in tl.static_range(K):
        here = tl.load(ids_ptr + t * s_it + j * s_ik) != -1
        wj = tl.load(w_ptr + t * s_wt + j * s_wk).to(tl.float32)
        yj = tl.zeros(d.shape, tl.float32)
        for ks in tl.static_range(KS):
            yp = y_ptr + ks * s_yk + (t * K + j).to(tl.int64) * D + d
            if CG:
                yj += tl.load(yp, mask=dm & here, other=0.0, cache_modifier=".cg")
            else:
                yj += tl.load(yp, mask=dm & here, other=0.0)
        acc += tl.where(here, wj * yj, 0.0)
    return tl.where(tl.load(bad_ptr + t) != 0, float("nan"), acc)


# ------------------------------------------------------------------------------------ launcher

PROGRAMS = 2048  # split-K target: ~16 programs per SM on 132 SMs, for few active experts
WS_BYTES = 1 << 28  # workspace cap that bounds the K splits (fp32 partial sums)


def _splits(n_tiles_k: int, programs: int, ws_per_split: int) -> tuple[int, int]:
    """(splits, K tiles per split): enough programs for PROGRAMS, workspace <= WS_BYTES."""
    ks = max(1, min(n_tiles_k, -(-PROGRAMS // programs), WS_BYTES // max(ws_per_split, 1)))
    return normalised_split(n_tiles_k, ks)


def normalised_split(n_tiles_k: int, ks: int) -> tuple[int, int]:
    """(splits, K tiles per split) for about ks splits of n_tiles_k K tiles: equal splits of
    ceil(n / ks) tiles, the last one shorter, and no empty split (28 tiles in 8: 7 of 4)."""
    tps = -(-n_tiles_k // ks)
    return -(-n_tiles_k // tps), tps


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe). Splits from the worst-case active-expert count min(E, T*K)."""
    S = T * K
    A = min(E, S)
    BN, BM = 64, 16
    ks1, tps1 = _splits(triton.cdiv(D, KT), 2 * triton.cdiv(I, BN) * A, S * 2 * I * 4)
    ks2, tps2 = _splits(triton.cdiv(I, KT), triton.cdiv(D, BN) * A, S * D * 4)
    return dict(BN=BN, BM=BM, KS1=ks1, TPS1=tps1, KS2=ks2, TPS2=tps2, warps=4, stages=4)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is) -> [T, D] bf16; the contract of
    `workbench.reference.int4_moe.int4_moe`; `validate` see `_common.check_inputs`.
    cfg: tile overrides (keys of `tiles`; KSn with TPSn), for sweeps."""
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots)
    gp, gs, up, us, dp, ds = experts
    T, D = x.shape
    K = topk_ids.shape[1]
    E, I = gp.shape[0], gp.shape[1]
    if T == 0:
        return torch.empty(0, D, dtype=x.dtype, device=x.device)
    for a, b, name in ((gp, up, "up_packed"), (gs, us, "up_scale")):
        if a.stride() != b.stride():  # gate and up share one offset computation
            raise ValueError(f"experts.{name}: expected the strides of its gate twin "
                             f"{a.stride()}, got {b.stride()}")
    c = with_cfg(tiles(T, K, E, D, I), cfg)
    S, Dp, Ip = T * K, triton.cdiv(D, KT) * KT, triton.cdiv(I, KT) * KT
    dev = x.device
    run = dict(num_warps=c["warps"], num_stages=c["stages"])
    r = route(topk_ids, E)
    xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)  # [T, Dp] permuted x
    _permute_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, num_warps=4)
    g = torch.empty(c["KS1"], S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    nt1 = triton.cdiv(I, c["BN"])
    _gemm_kernel[(2 * nt1, r.max_active, c["KS1"])](
        xp, xp, Dp, gp, gs, up, us, gp.stride(0), gp.stride(1), gs.stride(0), gs.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, g, g.stride(0), g.stride(1),
        I, nt1, D, c["TPS1"], K=K, BN=c["BN"], BM=c["BM"], BY_TOKEN=True, OUT_BY_SLOT=False,
        HILO=False, INTERPRET=INTERPRET, **run)
    hp = torch.empty(S, Ip, dtype=torch.bfloat16, device=dev)  # [S, Ip] permuted, hi half
    lp = torch.empty(S, Ip, dtype=torch.bfloat16, device=dev)  # lo half
    _silu_kernel[(S, Ip // KT)](g, g.stride(0), I, Ip, hp, lp, KS=c["KS1"],
                                INTERPRET=INTERPRET, num_warps=2)
    y = torch.empty(c["KS2"], S, D, dtype=torch.float32, device=dev)  # [KS2, S, D] slot order
    nt2 = triton.cdiv(D, c["BN"])
    _gemm_kernel[(nt2, r.max_active, c["KS2"])](
        hp, lp, Ip, dp, ds, dp, ds, dp.stride(0), dp.stride(1), ds.stride(0), ds.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, y, y.stride(0), y.stride(1),
        D, nt2, I, c["TPS2"], K=K, BN=c["BN"], BM=c["BM"], BY_TOKEN=False, OUT_BY_SLOT=True,
        HILO=True, INTERPRET=INTERPRET, **run)
    out = torch.empty(T, D, dtype=torch.bfloat16, device=dev)
    BD = min(1024, next_pow2(D))
    _combine_kernel[(T, triton.cdiv(D, BD))](
        y, y.stride(0), topk_weights, topk_weights.stride(0), topk_weights.stride(1),
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), r.bad, out,
        D, K=K, KS=c["KS2"], BD=BD, INTERPRET=INTERPRET, num_warps=4)
    return out
