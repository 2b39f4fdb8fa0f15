"""int4_moe triton_v5: v4 with the dequant cut from ~5 scalar ops per weight to ~1.9 (packed
bf16x2 math in inline PTX), K tiles that feed the MMA in 64-deep slabs, and the activations
permuted to the order that math produces.

Why (H200, git 91356d0): v4 streams a flat ~1.7 TB/s (41 % of copy) at every T >= 9: a per-byte
throughput limit. Its K loop (`sm90.py --sass`) issues 843 SASS instructions per thread per
256-input tile (128 weights a thread): 129 LOP3 + 96 SHF + 96 SGXT + 128 FADD + 128 FMUL +
64 F2FP of fp32 magic-number dequant (one weight per op) + ~200 others = 6.6 per weight.
Streaming 4.26 TB/s is 33-37 INT4 weights / clk / SM (1.98-1.755 GHz): 6.7-7.6 warp
instructions / clk / SM against the 4 the schedulers issue, i.e. v4 cannot pass ~53-60 % of
copy bandwidth whatever the memory does (README.md, "v5", has the issue model).

v5 changes (the numerics contract of README.md is unchanged: W = bf16((q - 8) s) bitwise):
* packed dequant, Marlin-style, on bf16x2 pairs of one int32 word: for j = 0..3,
  t = lop3(p >> 4j, 0x000F000F, 0x43004300) puts nibbles j and j + 4 in the low and high
  halves as bf16 0x4300 | q = 128 + q (exact); sub.rn.bf16x2 with 136 gives q - 8 (exact, a
  small integer); mul.rn.bf16x2 with the scale pair rounds the exact product (q - 8) s
  (<= 12 significant bits) once to bf16: the reference's exact fp32 product rounded once.
  Per word (8 weights): 3 SHF + 4 LOP3 + 4 HADD2 + 4 HMUL2 = 1.9 instructions per weight;
  the K loop is 388 instructions per tile, 3.0 per weight (v4: 6.6);
* MMA K order of a 256-input tile = what the pairs give: slab j (0..3) is 64 deep, slab
  position 2w + h is input 8w + j + 4h of the tile (w = word 0..31, h = high half). Each
  slab's [BN, 64] operand comes straight out of the asm in the wgmma register-A layout (one
  32-bit A register = the bf16x2 pair of one word: the LLVM IR passes the same word as both
  pack-2 elements); the activations are permuted to match (`_src`: x by the permute kernel,
  h by the SiLU kernel, as v3/v4 did for their order);
* 4 MMAs of K 64 per tile instead of 8 of K 32 (Triton 3.6 waits for each register-A wgmma
  before the next: half the waits). One K-256 dot was tried: Triton splits it into 16 K-16
  dots with a wait each (and LDS/PRMT shuffles): worse.
The asm cannot run in the interpreter: under TRITON_INTERPRET=1 `_slab` computes the same
slabs with v3's fp32 path (same values bit for bit; scales read through their bits, the
interpreter's bf16 -> fp32 cast mangles subnormals). tests/test_int4_moe_kernel.py emulates
the bf16x2 arithmetic in numpy against the reference for every bf16 scale; its GPU test runs
the asm itself over every nibble x every bf16 scale.
Ablation (GPU timing only, wrong numbers): INT4_MOE_V5_ABLATE=nodequant makes the asm pass the
raw words to the MMA (loads, MMA and pipeline unchanged, no dequant ALU work); read at launch.

Dimension legend: T tokens, K slots, S = T*K, E experts, A <= min(E, S) active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile (32 words), KS = 64 MMA depth per slab; BN
weight rows, BM slot rows per MMA, NH = 2 (hi, lo) or 1 halves, R = NH * BM MMA columns;
KS1 / KS2 K splits; Dp, Ip = D, I rounded up to KT.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    INTERPRET,
    _check_runnable,
    _require,
    _round_bf16,
    _split_bf16,
    check_inputs,
    next_pow2,
    pdl_start,
    route,
    with_cfg,
)
from ._knobs import knobs_read, version_name
from .triton_v3 import KT, _combine_kernel, _splits

_KT = tl.constexpr(KT)
_MAGIC = tl.constexpr(8388616.0)  # 2^23 + 8 (interpreter path, as v3)

# slab j of one word: one instance = the int32 word ($1; $2 is the same word, the pair's
# second element) and its scale pair ($3, bf16x2 (s, s)) -> bf16x2 $0 = (nibble j, nibble j + 4).
# lop3 0xEA = (a & b) | c. .rn on sub and mul: no contraction, one IEEE rounding each. One asm
# per slab (not one with 4 outputs): ptxas then computes each slab right before its MMA.
_SUB_MUL = """
lop3.b32 t, u, 0x000F000F, 0x43004300, 0xEA;
mov.b32 k, 0x43084308;
sub.rn.bf16x2 t, t, k;
mul.rn.bf16x2 $0, t, $3;
}"""
_ASM0 = tl.constexpr("{\n.reg .b32 u, t, k;\nmov.b32 u, $1;" + _SUB_MUL)
_ASM1 = tl.constexpr("{\n.reg .b32 u, t, k;\nshr.u32 u, $1, 4;" + _SUB_MUL)
_ASM2 = tl.constexpr("{\n.reg .b32 u, t, k;\nshr.u32 u, $1, 8;" + _SUB_MUL)
_ASM3 = tl.constexpr("{\n.reg .b32 u, t, k;\nshr.u32 u, $1, 12;" + _SUB_MUL)
# ablation: the word itself as the operand (no dequant work; numbers are garbage)
_ASM_RAW = tl.constexpr("mov.b32 $0, $1;")


@triton.jit
def _src(o):
    """Permuted position o -> source input: tile o // KT, slab j = (o % KT) // 64, position
    r = o % 64 = 2w + h in the slab -> input 8w + j + 4h of the tile."""
    r = o % _KT
    return (o // _KT) * _KT + 8 * ((r % 64) // 2) + r // 64 + 4 * (r % 2)


@triton.jit
def _permute_kernel(x_ptr, s_xt, s_xd, xp_ptr, D, Dp, PDL: tl.constexpr = False):
    """xp[t, o] = x[t, _src(o)] (0 past D): slab j's activations are 64 contiguous values.
    PDL: launched as a programmatic dependent (triton_v14, `_common.pdl_start`)."""
    pdl_start(PDL)
    t = tl.program_id(0)
    o = tl.program_id(1) * _KT + tl.arange(0, _KT)
    src = _src(o)
    v = tl.load(x_ptr + t.to(tl.int64) * s_xt + src * s_xd, mask=src < D, other=0.0)
    tl.store(xp_ptr + t.to(tl.int64) * Dp + o, v)


@triton.jit
def _pairs(p, s8, BN: tl.constexpr):
    """words p int32 [BN, 32], scales s8 bf16 [BN, 8] -> pd int32 [BN, 64], pd[n, 2w + h] =
    p[n, w], and sd bf16 [BN, 64], sd[n, k] = s8[n, k // 8]: one asm instance (pack 2) sees its
    word and the scale pair in one 32-bit register."""
    pd = tl.reshape(tl.join(p, p), (BN, 64))
    sd = tl.reshape(tl.broadcast_to(s8[:, :, None], (BN, 8, 8)), (BN, 64))
    return pd, sd


@triton.jit
def _slab(pd, sd, j: tl.constexpr, ABLATE: tl.constexpr, INTERPRET: tl.constexpr):
    """slab j [BN, 64] of a tile: (n, 2w + h) = bf16((nibble j + 4h of word w - 8) * s8[n, w // 4])
    (interpreter: fp32 holding that bf16 value, computed as v3 does)."""
    if INTERPRET:
        h16 = (tl.arange(0, 64) % 2)[None, :] * 16
        # bf16 -> fp32 through the bits: the interpreter's cast flushes subnormal scales
        s = (sd.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        q = ((pd >> (4 * j + h16)) & 0xF) | 0x4B000000
        return _round_bf16((q.to(tl.float32, bitcast=True) - _MAGIC) * s)
    else:
        if ABLATE:
            return _asm(pd, sd, _ASM_RAW)
        elif j == 0:
            return _asm(pd, sd, _ASM0)
        elif j == 1:
            return _asm(pd, sd, _ASM1)
        elif j == 2:
            return _asm(pd, sd, _ASM2)
        else:
            return _asm(pd, sd, _ASM3)


@triton.jit
def _asm(pd, sd, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r,r,r", [pd, sd], dtype=tl.bfloat16, is_pure=True,
                                     pack=2)


@triton.jit
def _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kt, words,
            MASKED: tl.constexpr, BN: tl.constexpr, ABLATE: tl.constexpr,
            INTERPRET: tl.constexpr):
    """acc [BN, R] += W[:, tile kt] @ in[rows, tile kt]^T over the 4 slabs of one 256-input
    tile. MASKED only for the tail tile (word index < words); elsewhere row masks only, so the
    loads stay cp.async (as v4)."""
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
    s8 = tl.load(s_row + g8[None, :], mask=sm, other=0.0, eviction_policy="evict_first")
    pd, sd = _pairs(p, s8, BN)
    DOT = tl.float32 if INTERPRET else tl.bfloat16
    x = in_ptr + in_off + kt * _KT
    # one dot per slab (K 64, 4 wgmma k16): joining the slabs into one K-256 operand made
    # Triton 3.6 split it into 16 K-16 dots, each with its own wait (sm90.py SASS).
    # [R, 64] rows of 128 contiguous bytes (cp.async), used transposed: slot rows on MMA N
    for j in tl.static_range(4):
        xj = tl.load(x + 64 * j, mask=rm[:, None], other=0.0).to(DOT)
        acc = tl.dot(_slab(pd, sd, j, ABLATE, INTERPRET), tl.trans(xj), acc)
    return acc


@triton.jit
def _gemm_kernel(in_ptr, s_in, s_half,
                 w1p_ptr, w1s_ptr, w2p_ptr, w2s_ptr, s_pe, s_pn, s_se, s_sn,
                 slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS,
                 K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                 BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """v4's program (N tile, active expert, K split) with v5's K tile; see triton_v4."""
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
        in_off = (row * s_in + (i // BM) * s_half)[:, None] + tl.arange(0, 64)[None, :]
        acc = tl.zeros([BN, NH * BM], tl.float32)
        for kt in range(kt0, kf):
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kt, words, False, BN, ABLATE,
                          INTERPRET)
        if kf < kt1:  # the tail tile, outside the pipelined loop
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kf, words, True, BN, ABLATE,
                          INTERPRET)
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


@triton.jit
def _silu_kernel(g_ptr, s_gk, I, Ip, h_ptr, KS: tl.constexpr, INTERPRET: tl.constexpr):
    """As v4 (h = SiLU(sum_ks gate) * sum_ks up in fp32, written as bf16 hi + lo into
    h_ptr [S, 2, Ip]), in v5's permuted order `_src`."""
    pos = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * _KT + tl.arange(0, _KT)
    src = _src(o)
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


@triton.jit
def _bf16(w, INTERPRET: tl.constexpr):
    """bf16 values -> bf16; under the interpreter w is fp32 holding bf16 values, converted
    through the bits (the interpreter's fp32 -> bf16 cast mangles subnormals)."""
    if INTERPRET:
        return (w.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return w


@triton.jit
def _dequant_kernel(p_ptr, s_ptr, w_ptr, O, IN, s_po, s_so, ABLATE: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """The GEMMs' K-tile dequant on its own (tests compare it bitwise; on the GPU it runs the
    asm): 64 rows x one 256-input tile -> W [O, IN] in input order (IN a multiple of 256)."""
    BN: tl.constexpr = 64
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    kt = tl.program_id(1)
    nm = (n < O)[:, None]
    p = tl.load(p_ptr + n[:, None] * s_po + kt * 32 + tl.arange(0, 32)[None, :], mask=nm)
    s8 = tl.load(s_ptr + n[:, None] * s_so + kt * 8 + tl.arange(0, 8)[None, :], mask=nm)
    pd, sd = _pairs(p, s8, BN)
    r = tl.arange(0, 64)  # slab position 2w + h -> input 8w + 4h (+ j for slab j)
    out = w_ptr + n[:, None] * IN + (kt * _KT + 8 * (r // 2) + 4 * (r % 2))[None, :]
    for j in tl.static_range(4):
        tl.store(out + j, _bf16(_slab(pd, sd, j, ABLATE, INTERPRET), INTERPRET), mask=nm)


def dequant(packed: Tensor, scale: Tensor) -> Tensor:
    """packed int32 [O, IN/8], scale bf16 [O, IN/32] -> W bf16 [O, IN] through v5's K-tile
    dequant (the asm on CUDA, its fp32 twin under the interpreter); IN a multiple of 256."""
    O, words = packed.shape
    IN = words * 8
    if IN % KT or tuple(scale.shape) != (O, IN // 32):
        raise ValueError(f"packed/scale: expected [O, IN/8] / [O, IN/32] with IN % {KT} == 0, "
                         f"got {tuple(packed.shape)} / {tuple(scale.shape)}")
    _check_runnable(packed.device)
    w = torch.empty(O, IN, dtype=torch.bfloat16, device=packed.device)
    _dequant_kernel[(triton.cdiv(O, 64), IN // KT)](
        packed, scale, w, O, IN, packed.stride(0), scale.stride(0), ABLATE=_ablate(),
        INTERPRET=INTERPRET, num_warps=4)
    return w


# ------------------------------------------------------------------------------------ launcher


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe); v4's table (BN 64, BM 16 / 8-16, split-K at small T)."""
    S = T * K
    A = min(E, S)
    BN = 64
    ks1, tps1 = _splits(triton.cdiv(D, KT), 2 * triton.cdiv(I, BN) * A, S * 2 * I * 4)
    ks2, tps2 = _splits(triton.cdiv(I, KT), triton.cdiv(D, BN) * A, S * D * 4)
    return dict(BN=BN, BM1=16, BM2=8 if S <= 4 * E else 16, KS1=ks1, TPS1=tps1, KS2=ks2,
                TPS2=tps2, warps=4, stages=4, maxnreg=168)


def _ablate() -> bool:
    ablate = os.environ.get("INT4_MOE_V5_ABLATE", "")
    if ablate not in ("", "nodequant"):
        raise ValueError(f"INT4_MOE_V5_ABLATE: expected '' or 'nodequant', got {ablate!r}")
    return ablate == "nodequant"


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
    ablate = _ablate()
    r = route(topk_ids, E)
    xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)  # [T, Dp] permuted x
    _permute_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, num_warps=4)
    g = torch.empty(c["KS1"], S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    nt1 = triton.cdiv(I, c["BN"])
    _gemm_kernel[(2 * nt1, r.max_active, c["KS1"])](
        xp, Dp, 0, gp, gs, up, us, gp.stride(0), gp.stride(1), gs.stride(0), gs.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, g, g.stride(0), g.stride(1),
        I, nt1, D, c["TPS1"], K=K, BN=c["BN"], BM=c["BM1"], NH=1, BY_TOKEN=True,
        OUT_BY_SLOT=False, ABLATE=ablate, INTERPRET=INTERPRET, **run)
    h = torch.empty(S, 2, Ip, dtype=torch.bfloat16, device=dev)  # [S, 2, Ip] permuted hi, lo
    _silu_kernel[(S, Ip // KT)](g, g.stride(0), I, Ip, h, KS=c["KS1"], INTERPRET=INTERPRET,
                                num_warps=2)
    y = torch.empty(c["KS2"], S, D, dtype=torch.float32, device=dev)  # [KS2, S, D] slot order
    nt2 = triton.cdiv(D, c["BN"])
    _gemm_kernel[(nt2, r.max_active, c["KS2"])](
        h, 2 * Ip, Ip, dp, ds, dp, ds, dp.stride(0), dp.stride(1), ds.stride(0), ds.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, y, y.stride(0), y.stride(1),
        D, nt2, I, c["TPS2"], K=K, BN=c["BN"], BM=c["BM2"], NH=2, BY_TOKEN=False,
        OUT_BY_SLOT=True, ABLATE=ablate, INTERPRET=INTERPRET, **run)
    out = torch.empty(T, D, dtype=torch.bfloat16, device=dev)
    BD = min(1024, next_pow2(D))
    _combine_kernel[(T, triton.cdiv(D, BD))](
        y, y.stride(0), topk_weights, topk_weights.stride(0), topk_weights.stride(1),
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), r.bad, out,
        D, K=K, KS=c["KS2"], BD=BD, INTERPRET=INTERPRET, num_warps=4)
    return out


# cuda_v4's family: the gate/up GEMM in CUDA (the cold launch and the hot ones beside it), the
# down GEMM in Triton (`_gemm_kernel`, the hot `_gemm_hot_kernel`; cuda_v13: two launches)
GATE_UP_CUDA = ("int4_moe_mma", "int4_moe_hot")
DOWN_TRITON = ("_gemm_kernel", "_gemm_hot_kernel")


def phase_rates(by: dict, at: dict, gate_up_bytes: float, down_bytes: float) -> str | None:
    """The line `_print_by_kernel` adds for cuda_v4's family: each GEMM phase's span, from its
    first kernel's mean start (`at`, µs) to its last one's mean end (+ `by`, µs), and its
    touched bytes over that span in TB/s (session 47 did this by hand: the hot launch runs
    beside the cold one, so their sum is not the phase). None where the names are not that
    family's (the Triton versions run `_gemm_kernel` for both GEMMs; cuda_v8 / v9 fuse them)."""
    def phase(key: str):
        name = key.removeprefix("void ")
        if name.startswith(GATE_UP_CUDA):
            return "gate/up"
        return "down" if name.split("#")[0] in DOWN_TRITON else None

    spans: dict[str, tuple[float, float]] = {}
    for key, us in by.items():
        p = phase(key)
        if p is not None:
            lo, hi = spans.get(p, (float("inf"), float("-inf")))
            spans[p] = (min(lo, at[key]), max(hi, at[key] + us))
    if set(spans) != {"gate/up", "down"}:
        return None
    out = []
    for p, nbytes in (("gate/up", gate_up_bytes), ("down", down_bytes)):
        span = spans[p][1] - spans[p][0]
        out.append(f"{p} {span:.1f} µs, {nbytes / span / 1e6:.2f} TB/s" if span > 0
                   else f"{p} {span:.1f} µs")
    return "      phases: " + "; ".join(out)


def _print_by_kernel(call, n: int = 20, phase_bytes: tuple[float, float] | None = None) -> None:
    """Mean GPU µs per launch name over n eager calls (CUPTI records via the profiler; a name's
    second launch in a call, e.g. the down GEMM after gate/up, as name#2) with its mean start
    after the call's first kernel start (`@`), and the mean span from a call's first kernel
    start to its last kernel end: where the time of one call goes (ramp, tail, the small
    launches, and which launches overlap on side streams, which the graph-replayed total
    hides). phase_bytes: (gate/up, down) touched bytes, for `phase_rates`' line."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
            torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    per = len(ev) // n
    by: dict[str, float] = {}
    at: dict[str, float] = {}
    for i, e in enumerate(ev):  # a name's k-th launch in a call as name#k (gate/up, down)
        call_ev = ev[i - i % per : i] if per else []
        k = sum(c.name == e.name for c in call_ev)
        key = e.name[:40] + (f"#{k + 1}" if k else "")
        by[key] = by.get(key, 0.0) + e.time_range.elapsed_us() / n
        t0 = ev[i - i % per].time_range.start if per else e.time_range.start
        at[key] = at.get(key, 0.0) + (e.time_range.start - t0) / n
    spans = [ev[i * per + per - 1].time_range.end - ev[i * per].time_range.start
             for i in range(n)] if per else [0]
    print("      " + "  ".join(f"{k} {v:.1f}@{at[k]:.0f}" for k, v in by.items())
          + f"  | sum {sum(by.values()):.1f}, span {sum(spans) / len(spans):.1f}", flush=True)
    line = phase_rates(by, at, *phase_bytes) if phase_bytes else None
    if line:
        print(line, flush=True)


def _main(argv=None, launcher=None, default_cfgs: str = "base;nodequant",
          pdl: bool = False) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA, for sweeps and the ablation:

        python -m workbench.kernels.int4_moe.triton_v5 [--T 1,9,33,128,512]
            [--cfgs "base;nodequant;stages=3;BM1=8,BM2=8"]

    a config is `base`, `nodequant` (INT4_MOE_V5_ABLATE: no dequant, wrong outputs) or
    comma-separated `tiles` overrides, where `v=N` times version triton_vN's launcher instead
    (e.g. "v=13;base": v13 against this CLI's version in one process). `--rounds R` runs the
    config list R times in turn and ends with each config's median: an A/B in one process,
    interleaved, so clock and thermal drift fall on every config alike (session 16: two
    processes disagreed by 10 % on the same code). No correctness check (the bench and the
    tests do that);
    warm L2 is fine here: every T touches >= 198 MB of experts, 4x the H200's L2.
    launcher: another version's int4_moe_triton (same `cfg` keyword) timed by this CLI; pdl:
    its launches are a PDL chain (v14, v15), which `--by-kernel` cannot split.
    --ep N times one expert-parallel rank as the EP8 emulation runs it (`dist.moe.moe_ep_local`):
    E / N local experts, the T tokens routed over all E, slots naming another rank's expert
    passed as -1, and the hint expected_slots = ceil(T K / N) (every version takes the op's
    hint; those before v11 ignore it)."""
    import argparse
    import functools

    from workbench.bench import time_calls
    from workbench.ops.cases import _experts, _Rand

    p = argparse.ArgumentParser(description=_main.__doc__.splitlines()[0])
    p.add_argument("--T", default="1,9,33,128,512")
    p.add_argument("--cfgs", default=default_cfgs)
    p.add_argument("--seconds", type=float, default=1.0, help="timing budget per row")
    p.add_argument("--skew", type=float, default=0.0,
                   help="Zipf exponent of expert popularity (the bench's skewed cases: 1.2; "
                        "0: uniform distinct ids)")
    p.add_argument("--rounds", type=int, default=1,
                   help="times to run the config list, interleaved; > 1 adds each config's "
                        "median (an in-process A/B)")
    p.add_argument("--by-kernel", action="store_true",
                   help="also print each launch's mean GPU time (profiler, 20 eager calls); "
                        "with PDL (v14, v15) a dependent's time includes its wait")
    p.add_argument("--ep", type=int, default=1,
                   help="time one expert-parallel rank of N: E / N local experts, -1 slots "
                        "elsewhere, the expected_slots hint (the EP8 emulation's MoE call)")
    a = p.parse_args(argv)
    if a.rounds < 1:
        raise ValueError(f"--rounds: expected >= 1, got {a.rounds}")
    if a.ep < 1 or 384 % a.ep:
        raise ValueError(f"--ep: expected a divisor of the 384 experts, got {a.ep}")
    if a.by_kernel and pdl:
        # session 15: under PDL a dependent launch starts early and waits inside
        # (griddepcontrol.wait), so its profiled duration overlaps its predecessor's
        print("note: PDL launches: each dependent's time includes its wait for the launch "
              "before it; read the graph-replayed total, not the sum")
    E, D, I, K = 384, 7168, 2048, 8
    r = _Rand(0, "cuda")
    E_loc = E // a.ep
    ex = _experts(r, E_loc, D, I)  # 9.5 GB at --ep 1
    per_expert = sum(t[0].numel() * t.element_size() for t in ex)
    fns = {name: _cli_config(name, launcher or int4_moe_triton) for name in a.cfgs.split(";")}
    # experts: the draw's active experts (session 57: at uniform T 9 the time followed them
    # through the cold launch's waves, 66 vs 67-68, which the TB/s column alone hid)
    print("T     config                 us      TB/s (touched experts)  graph  experts")
    refused = 0  # rows whose config the op refused (`refused_or`)
    for T in map(int, a.T.split(",")):
        ids = r.distinct(E, K, T)
        if a.skew > 0:  # the int4_moe cases' skewed routing
            ids = r.zipf(E, K, T, a.skew)
        w = r.uniform(T, K) + 0.05
        x = r.normal(T, D)
        extra = {}
        if a.ep > 1:  # rank 0 of a.ep: its experts keep their local id, the rest are -1
            ids = torch.where(ids < E_loc, ids, -1)
            extra = dict(expected_slots=-(-T * K // a.ep))
        n_act = ids[ids >= 0].unique().numel()
        touched = n_act * per_expert
        gu = n_act * sum(t[0].numel() * t.element_size() for t in ex[:4])
        if a.by_kernel:  # each GEMM's bytes, for its kernels' µs below (GB / µs * 1e3 = TB/s)
            print(f"{T:<5} touched: {n_act} experts, gate/up {gu / 1e9:.3f} GB, down "
                  f"{(touched - gu) / 1e9:.3f} GB", flush=True)
        seen = {name: [] for name in fns}
        for _ in range(a.rounds):
            for name, fn in fns.items():
                os.environ["INT4_MOE_V5_ABLATE"] = "nodequant" if name == "nodequant" else ""
                t = refused_or(functools.partial(time_calls, fn, [((x, ids, w, ex), extra)],
                                                 "cuda", a.seconds, "on"), T, name)
                if t is None:
                    refused += 1
                    continue
                seen[name].append(t.us)
                print(f"{T:<5} {name:<20} {t.us:9.1f} {touched / t.us / 1e6:8.2f}  {t.graph!s:<5}  "
                      f"{n_act}", flush=True)
                if a.by_kernel:
                    _print_by_kernel(functools.partial(fn, x, ids, w, ex, **extra),
                                     phase_bytes=(gu, touched - gu))
        if a.rounds > 1:
            for name, us in seen.items():
                if not us:
                    continue
                med = sorted(us)[(len(us) - 1) // 2]  # the lower middle, as bench --rounds
                print(f"{T:<5} {name:<20} {med:9.1f} {touched / med / 1e6:8.2f}  median of "
                      f"{a.rounds} ({n_act} experts): " + " ".join(f"{u:.1f}" for u in us),
                      flush=True)
    os.environ.pop("INT4_MOE_V5_ABLATE", None)
    return 1 if refused else 0  # every other row timed; the refused ones said why


def refused_or(run, T: int, name: str):
    """run() (one row of `_main`'s sweep), or None where the op refuses the config's knobs (a
    ValueError naming them: a knob out of range, a build the GPU cannot hold, a misspelt key):
    the row prints the refusal as an error and the sweep goes on, so one bad config of a GPU
    plan's list does not lose the others' rows."""
    try:
        return run()
    except ValueError as e:
        print(f"{T:<5} {name:<20} error (refused; the sweep goes on): {e}", flush=True)
        return None


def _cli_config(name: str, launcher):
    """`_main`'s config `name` as a callable (x, ids, w, experts) -> out: `base` / `nodequant`
    (the launcher as is) or comma-separated int overrides, `v=N` naming triton_vN's launcher
    (its int4_moe_triton) for this config, `v=cuda_vN` / `v=gluon_vN` that version's op. A knob
    no code of the launcher's version reads (`_knobs.knobs_read`) makes a callable that
    raises, naming it."""
    import functools

    version, cfg = cli_knobs(name)
    if version is not None:
        launcher = version_op(version)
    unread = sorted(set(cfg) - knobs_read(launcher.__module__)) if cfg else []
    if unread:  # refused when the row runs (`refused_or`), not when the list is read
        return functools.partial(_refuse, f"cfg: expected knobs that "
                                 f"{version_name(launcher.__module__)}'s code reads, got "
                                 f"{unread} (another version's; the row would time the "
                                 f"defaults under their names)")
    return functools.partial(launcher, cfg=cfg)


def cli_knobs(name: str) -> tuple[str | None, dict]:
    """A `--cfgs` entry as (the version its `v=` names, or None: v=34 is triton_v34, v=cuda_v2
    cuda_v2; its int knob overrides); `base` / `nodequant`: (None, {})."""
    cfg = {} if name in ("base", "nodequant") else {
        k.strip(): v.strip() for k, v in (kv.split("=") for kv in name.split(","))}
    v = cfg.pop("v", None)
    version = None if v is None else "triton_v" + v if v.isdigit() else v
    return version, {k: int(x) for k, x in cfg.items()}


def version_op(version: str):
    """int4_moe version `version`'s op, by the registry's table (`VARIANTS`: <impl>_vN's
    int4_moe_<impl>)."""
    import importlib

    from . import VARIANTS

    _require(version in VARIANTS["int4_moe"], "v", "an int4_moe version (triton_vN, gluon_vN, "
             "cuda_vN)", version)
    module, attr = VARIANTS["int4_moe"][version].split(":")
    return getattr(importlib.import_module(module), attr)


def _refuse(message: str, *args, **kwargs):
    """A sweep row's op for a config `_cli_config` refuses: raises the ValueError it names."""
    raise ValueError(message)


if __name__ == "__main__":
    raise SystemExit(_main())
