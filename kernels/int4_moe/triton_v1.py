"""int4_moe triton_v1: routed experts of one MoE layer, W4A16 (INT4 g32 weights, bf16 activations),
on the checkpoint's layout as loaded (no repack), four launches, no host sync.

    route      one program: per-expert slot lists, active experts, bad-token flags (_common.py)
    gate_up    program (N tile, active expert a): gate and up rows of the tile, INT4 dequant in
               the K loop, fp32 accumulators, SiLU(gate) * up in fp32 -> act [S, I] (rows in
               sorted-slot order, so an expert's rows are contiguous)
    down       program (N tile, active expert a): act rows @ dequant(down)^T -> fp32 y [S, D]
               (rows in slot order t*K + j); act enters the bf16 MMA as hi + lo bf16 halves
    combine    program (token, D tile): sum_j w[t, j] * y[t*K + j] for j = 0..K-1 (_common.py)

Weight streaming: every (expert, N tile) program reads its weight tile once per BM slots of that
expert (one pass whenever an expert has <= BM slots; BM grows with T up to 64). Tiles are
computed "swap AB": the dequantised weight tile [BN, BK] is the MMA's A operand (from
registers) and the gathered activations [BK, BM] its B operand, so slot rows sit on the MMA's
N dimension. Grids are sized to the worst case min(E, T*K) active experts; programs past the
device-side count exit at once (no `.item()`, CUDA-graph capturable).

Dimension legend: T tokens, K slots per token, S = T*K, E experts, A active experts, D hidden,
I expert FFN width; BN output rows, BK reduction columns, BM slot rows per tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    INTERPRET,
    _dequant,
    _split_bf16,
    block_k,
    check_inputs,
    combine,
    next_pow2,
    route,
)

# ------------------------------------------------------------------------------------- kernels


@triton.jit
def _gate_up_kernel(x_ptr, s_xt, s_xd,
                    gp_ptr, gs_ptr, up_ptr, us_ptr, s_pe, s_pn, s_se, s_sn,
                    slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, act_ptr,
                    D, I,
                    K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
                    INTERPRET: tl.constexpr):
    a = tl.program_id(1)
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    e = tl.load(act_e_ptr + a).to(tl.int64)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    n = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN] rows of gate and of up (I)
    nm = (n < I)[:, None]
    kw = tl.arange(0, BK // 8)
    kg = tl.arange(0, BK // 32)
    kk = tl.arange(0, BK)
    p_off = e * s_pe + n[:, None] * s_pn + kw[None, :]  # [BN, BK/8] words of the first K tile
    s_off = e * s_se + n[:, None] * s_sn + kg[None, :]  # [BN, BK/32] scales
    DOT = tl.float32 if INTERPRET else tl.bfloat16  # interpreter: bf16 tl.dot is wrong
    for m0 in range(0, cnt, BM):
        r = m0 + tl.arange(0, BM)  # [BM] this expert's slots
        rm = r < cnt
        tok = tl.load(slots_ptr + start + r, mask=rm, other=0) // K
        x_off = tok[None, :].to(tl.int64) * s_xt + kk[:, None] * s_xd  # [BK, BM]
        acc_g = tl.zeros([BN, BM], tl.float32)
        acc_u = tl.zeros([BN, BM], tl.float32)
        for k0 in range(0, D, BK):
            xt = tl.load(x_ptr + x_off + k0 * s_xd, mask=rm[None, :], other=0.0).to(DOT)
            wg = _dequant(tl.load(gp_ptr + p_off + k0 // 8, mask=nm),
                          tl.load(gs_ptr + s_off + k0 // 32, mask=nm), BN, BK, INTERPRET)
            wu = _dequant(tl.load(up_ptr + p_off + k0 // 8, mask=nm),
                          tl.load(us_ptr + s_off + k0 // 32, mask=nm), BN, BK, INTERPRET)
            acc_g = tl.dot(wg, xt, acc_g)  # [BN, BM]
            acc_u = tl.dot(wu, xt, acc_u)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # SiLU(gate) * up, kept fp32 (see down)
        out = act_ptr + (start + r)[None, :].to(tl.int64) * I + n[:, None]
        tl.store(out, h, mask=rm[None, :] & nm)


@triton.jit
def _down_kernel(act_ptr, dp_ptr, ds_ptr, s_pe, s_pn, s_se, s_sn,
                 slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, y_ptr,
                 D, I,
                 BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, INTERPRET: tl.constexpr):
    a = tl.program_id(1)
    if a >= tl.load(n_act_ptr):
        return
    e = tl.load(act_e_ptr + a).to(tl.int64)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    n = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN] output features (D)
    nm = (n < D)[:, None]
    kw = tl.arange(0, BK // 8)
    kg = tl.arange(0, BK // 32)
    kk = tl.arange(0, BK)
    p_off = e * s_pe + n[:, None] * s_pn + kw[None, :]
    s_off = e * s_se + n[:, None] * s_sn + kg[None, :]
    for m0 in range(0, cnt, BM):
        r = m0 + tl.arange(0, BM)
        rm = r < cnt
        slot = tl.load(slots_ptr + start + r, mask=rm, other=0)
        h_off = (start + r)[None, :].to(tl.int64) * I + kk[:, None]  # [BK, BM]
        acc = tl.zeros([BN, BM], tl.float32)
        for k0 in range(0, I, BK):
            ht = tl.load(act_ptr + h_off + k0, mask=rm[None, :], other=0.0)  # fp32
            # fp32 activations as two bf16 MMAs: hi + lo carries 16 significant bits (error
            # <= 2^-18 |act|, the fp32 accumulation's order), not a bf16 rounding (2^-9) that
            # would flip the output's bf16 roundings and, through routing, tokens
            hi, lo = _split_bf16(ht, INTERPRET)
            w = _dequant(tl.load(dp_ptr + p_off + k0 // 8, mask=nm),
                         tl.load(ds_ptr + s_off + k0 // 32, mask=nm), BN, BK, INTERPRET)
            acc = tl.dot(w, hi, acc)
            acc = tl.dot(w, lo, acc)
        tl.store(y_ptr + slot[None, :].to(tl.int64) * D + n[:, None], acc,
                 mask=rm[None, :] & nm)


# ------------------------------------------------------------------------------------ launcher


def tiles(T: int, D: int, I: int) -> dict:
    """Tile sizes: BM covers every slot of an expert in one pass up to T = 64 (an expert gets at
    most T slots); BN small enough that 8 experts at T = 1 fill 132 SMs (I / 32 * 8 = 512
    gate/up programs, D / 64 * 8 = 896 down programs at Kimi shapes)."""
    return dict(BM=min(64, max(16, next_pow2(T))), BN1=32, BK1=block_k(D), BN2=64,
                BK2=block_k(I), warps=4, stages=3)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout) -> [T, D] bf16. Same contract as
    `workbench.reference.int4_moe.int4_moe`; `validate` see `_common.check_inputs`."""
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots)
    gp, gs, up, us, dp, ds = experts
    T, D = x.shape
    K = topk_ids.shape[1]
    E, I = gp.shape[0], gp.shape[1]
    if T == 0:
        return torch.empty(0, D, dtype=x.dtype, device=x.device)
    _require_same_strides(gp, up, "up_packed")
    _require_same_strides(gs, us, "up_scale")
    cfg = tiles(T, D, I)
    r = route(topk_ids, E)
    act = torch.empty(T * K, I, dtype=torch.float32, device=x.device)  # [S, I] sorted order
    y = torch.empty(T * K, D, dtype=torch.float32, device=x.device)  # [S, D] slot order
    run = dict(num_warps=cfg["warps"], num_stages=cfg["stages"])
    _gate_up_kernel[(triton.cdiv(I, cfg["BN1"]), r.max_active)](
        x, x.stride(0), x.stride(1), gp, gs, up, us, gp.stride(0), gp.stride(1), gs.stride(0),
        gs.stride(1), r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, act, D, I,
        K=K, BN=cfg["BN1"], BK=cfg["BK1"], BM=cfg["BM"], INTERPRET=INTERPRET, **run)
    _down_kernel[(triton.cdiv(D, cfg["BN2"]), r.max_active)](
        act, dp, ds, dp.stride(0), dp.stride(1), ds.stride(0), ds.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, y, D, I,
        BN=cfg["BN2"], BK=cfg["BK2"], BM=cfg["BM"], INTERPRET=INTERPRET, **run)
    return combine(y, topk_ids, topk_weights, r, T, D)


def _require_same_strides(a: Tensor, b: Tensor, name: str) -> None:
    # gate and up share one offset computation in the kernel
    if a.stride() != b.stride():
        raise ValueError(f"experts.{name}: expected the strides of its gate twin {a.stride()}, "
                         f"got {b.stride()}")
