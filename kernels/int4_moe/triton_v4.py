"""int4_moe triton_v4: v3's weight streaming (each expert's weights read once per call, split-K at
small T, conversion-free exact dequant, wgmma m64n16) with its two compile problems fixed.

What v3's sm_90 report showed and what it really was (README.md, "v4"):
* the report compiled without the launch's specialization (16-byte-aligned pointers, integers
  divisible by 16): every bf16 load looked scalar, too narrow for cp.async, and the registers
  read 241 / 254. Specialised as a CUDA launch does (sm90.py now does), v3 is 165 (gate/up) /
  191 (down) registers, its activation slabs are cp.async, but the [BN, 8] scale load stays a
  synchronous load in the loop: its K mask `g8 < words // 4` has no provable constancy, so the
  load is scalar;
* down stages hi and lo as two [16, 32] slabs per MMA slab: 16 KB of activations per stage
  against 8 KB of weights, 91 KB of smem at 4 stages (2 CTAs / SM) and 191 registers.
v4 changes:
* main K loop without any K mask (full 256-input tiles), the tail tile (IN % 256 != 0, never at
  Kimi shapes) peeled into its own masked copy of the tile body: weight words, the scales
  ([BN, 8] bf16 = 16 B per row) and the activation slabs are all stride-1 tiles with row masks
  only, so all three go through cp.async (checked in the TTGIR: async_copy_global_to_local);
* hi and lo of the down GEMM's input live interleaved in one buffer [S, 2, Ip] and enter the MMA
  as one B operand of 2*BM rows (rows 0..BM-1 hi, BM..2BM-1 lo): one dot per slab, the two
  halves summed once after the K loop (fp32, fixed order); the down GEMM uses BM = 8 slot rows
  (m64n16 like gate/up, same activation bytes per stage) while an expert averages <= 4 slots;
* num_stages 4 at BN 64, 4 warps: <= 168 registers and ~58 KB smem per CTA, 3 CTAs / SM
  (registers: 65536 / (168 * 128) = 3; smem: 3 * 59 KB <= 228 KB), each keeping 3 K tiles of
  weights + scales (3 * 9 KB) in flight: ~81 KB of HBM loads in flight per SM by construction.
Launches as v3: route, x permute, gate+up, SiLU (writes hi/lo interleaved), down, combine.

Dimension legend: T tokens, K slots, S = T*K, E experts, A <= min(E, S) active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile (32 words); BN weight rows, BM slot rows per MMA,
NH = 2 (hi, lo) or 1 halves, R = NH * BM MMA columns; KS1 / KS2 K splits; Dp, Ip = D, I rounded
up to KT.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, _split_bf16, check_inputs, next_pow2, route, with_cfg
from .triton_v3 import KT, _combine_kernel, _dequant_slab, _permute_kernel, _splits

_KT = tl.constexpr(KT)


@triton.jit
def _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kt, words,
            MASKED: tl.constexpr, BN: tl.constexpr, INTERPRET: tl.constexpr):
    """acc [BN, R] += W[:, tile kt] @ in[rows, tile kt]^T over the 8 slabs of one 256-input tile.
    MASKED only for the tail tile: word index < words; elsewhere the loads are stride-1 tiles
    with row masks only (constant along the row), so the pipeliner makes each a cp.async."""
    w = tl.arange(0, 32)
    widx = kt * 32 + w
    g8 = kt * 8 + tl.arange(0, 8)  # the tile's 8 scale groups: 16 B per row
    if MASKED:
        wm = nm[:, None] & (widx < words)[None, :]
        sm = nm[:, None] & (g8 < words // 4)[None, :]
    else:
        wm = nm[:, None]
        sm = nm[:, None]
    p = tl.load(p_row + widx[None, :], mask=wm, other=0, eviction_policy="evict_first")
    s8 = tl.load(s_row + g8[None, :], mask=sm, other=0.0,
                 eviction_policy="evict_first").to(tl.float32)  # [BN, 8]
    s = tl.reshape(tl.broadcast_to(s8[:, :, None], (BN, 8, 4)), (BN, 32))  # s[n, w // 4]
    DOT = tl.float32 if INTERPRET else tl.bfloat16
    for j in tl.static_range(8):
        wj = _dequant_slab(p, s, j, INTERPRET)  # [BN, 32]
        # [R, 32] rows of 64 contiguous bytes (cp.async), used transposed: slot rows on MMA N
        xj = tl.load(in_ptr + in_off + kt * _KT + 32 * j, mask=rm[:, None], other=0.0).to(DOT)
        acc = tl.dot(wj, tl.trans(xj), acc)
    return acc


@triton.jit
def _gemm_kernel(in_ptr, s_in, s_half,
                 w1p_ptr, w1s_ptr, w2p_ptr, w2s_ptr, s_pe, s_pn, s_se, s_sn,
                 slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS,
                 K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                 BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr, INTERPRET: tl.constexpr):
    """out[ks, row, col] = sum over this split's inputs of W[n, k] * in[row, k] for the BN
    weight rows of tile pid_n (tiles >= NT1 take the second projection, col += NOUT) of active
    expert a, for every slot of that expert in chunks of BM. in: permuted bf16 activations,
    indexed by token (gate/up) or sorted position (down); NH = 2: each row has a hi half and a
    lo half s_half apart, both in the one MMA operand, summed after the K loop."""
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
    p_row = wp + e * s_pe + n[:, None].to(tl.int64) * s_pn  # [BN, 1]
    s_row = wsc + e * s_se + n[:, None].to(tl.int64) * s_sn
    words = IN // 8
    kt0 = ks * TPS
    kt1 = tl.minimum(kt0 + TPS, tl.cdiv(IN, _KT))
    kf = tl.minimum(kt1, IN // _KT)  # full tiles end here; [kf, kt1) is the masked tail
    i = tl.arange(0, NH * BM)  # [R] MMA columns: slot i % BM, half i // BM
    for m0 in range(0, cnt, BM):
        r = m0 + i % BM
        rm = r < cnt
        slot = tl.load(slots_ptr + start + r, mask=rm, other=0)
        if BY_TOKEN:
            row = slot // K
        else:
            row = start + r
        # int32 offsets (the launcher bounds the buffers below 2^31 elements): fewer registers
        in_off = (row * s_in + (i // BM) * s_half)[:, None] + tl.arange(0, 32)[None, :]
        acc = tl.zeros([BN, NH * BM], tl.float32)
        for kt in range(kt0, kf):
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kt, words, False, BN,
                          INTERPRET)
        if kf < kt1:  # the tail tile, outside the pipelined loop
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kf, words, True, BN,
                          INTERPRET)
        if NH == 2:  # hi + lo, one fixed-order fp32 add per output
            acc = tl.sum(tl.reshape(acc, (BN, 2, BM)), axis=1)
        rs = m0 + tl.arange(0, BM)
        rsm = rs < cnt
        if OUT_BY_SLOT:
            orow = tl.load(slots_ptr + start + rs, mask=rsm, other=0)
        else:
            orow = start + rs
        out = out_ptr + ks * s_ok + orow[None, :].to(tl.int64) * s_or + (col0 + tl.arange(0, BN))[:, None]
        tl.store(out, acc, mask=rsm[None, :] & nm[:, None])


@triton.jit
def _silu_kernel(g_ptr, s_gk, I, Ip, h_ptr, KS: tl.constexpr, INTERPRET: tl.constexpr):
    """h = SiLU(sum_ks gate) * sum_ks up (fp32, splits summed in order 0..KS-1) for sorted
    position `pos`, written as bf16 hi + lo (h = hi + lo to 16 bits) in the permuted order:
    h_ptr [S, 2, Ip], hi at [pos, 0], lo at [pos, 1]."""
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
    tl.store(h_ptr + pos * (2 * Ip) + o, hi.to(tl.bfloat16))
    tl.store(h_ptr + pos * (2 * Ip) + Ip + o, lo.to(tl.bfloat16))


# ------------------------------------------------------------------------------------ launcher


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe). Splits from the worst-case active-expert count min(E, T*K) as
    v3. Down: BM 8 (hi + lo = 16 MMA columns) while experts average <= 4 slots, else 16."""
    S = T * K
    A = min(E, S)
    BN = 64
    ks1, tps1 = _splits(triton.cdiv(D, KT), 2 * triton.cdiv(I, BN) * A, S * 2 * I * 4)
    ks2, tps2 = _splits(triton.cdiv(I, KT), triton.cdiv(D, BN) * A, S * D * 4)
    return dict(BN=BN, BM1=16, BM2=8 if S <= 4 * E else 16, KS1=ks1, TPS1=tps1, KS2=ks2,
                TPS2=tps2, warps=4, stages=4, maxnreg=168)


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
    if max(T * Dp, S * 2 * Ip) >= 2**31:  # the GEMM's activation offsets are int32
        raise ValueError(f"x: expected T * K * 2 * ceil(I / {KT}) * {KT} < 2^31 activation "
                         f"elements, got T={T}, K={K}, I={I}")
    dev = x.device
    run = dict(num_warps=c["warps"], num_stages=c["stages"], maxnreg=c["maxnreg"])
    r = route(topk_ids, E)
    xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)  # [T, Dp] permuted x
    _permute_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, num_warps=4)
    g = torch.empty(c["KS1"], S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    nt1 = triton.cdiv(I, c["BN"])
    _gemm_kernel[(2 * nt1, r.max_active, c["KS1"])](
        xp, Dp, 0, gp, gs, up, us, gp.stride(0), gp.stride(1), gs.stride(0), gs.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, g, g.stride(0), g.stride(1),
        I, nt1, D, c["TPS1"], K=K, BN=c["BN"], BM=c["BM1"], NH=1, BY_TOKEN=True,
        OUT_BY_SLOT=False, INTERPRET=INTERPRET, **run)
    h = torch.empty(S, 2, Ip, dtype=torch.bfloat16, device=dev)  # [S, 2, Ip] permuted hi, lo
    _silu_kernel[(S, Ip // KT)](g, g.stride(0), I, Ip, h, KS=c["KS1"], INTERPRET=INTERPRET,
                                num_warps=2)
    y = torch.empty(c["KS2"], S, D, dtype=torch.float32, device=dev)  # [KS2, S, D] slot order
    nt2 = triton.cdiv(D, c["BN"])
    _gemm_kernel[(nt2, r.max_active, c["KS2"])](
        h, 2 * Ip, Ip, dp, ds, dp, ds, dp.stride(0), dp.stride(1), ds.stride(0), ds.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, y, y.stride(0), y.stride(1),
        D, nt2, I, c["TPS2"], K=K, BN=c["BN"], BM=c["BM2"], NH=2, BY_TOKEN=False,
        OUT_BY_SLOT=True, INTERPRET=INTERPRET, **run)
    out = torch.empty(T, D, dtype=torch.bfloat16, device=dev)
    BD = min(1024, next_pow2(D))
    _combine_kernel[(T, triton.cdiv(D, BD))](
        y, y.stride(0), topk_weights, topk_weights.stride(0), topk_weights.stride(1),
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), r.bad, out,
        D, K=K, KS=c["KS2"], BD=BD, INTERPRET=INTERPRET, num_warps=4)
    return out
