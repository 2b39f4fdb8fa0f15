"""Peer for int4_moe written here: the vLLM / SGLang Triton `fused_moe_kernel_gptq_awq` design
for int4_w4a16 (notes/moe_int4.md §2), what serving stacks ran Kimi's INT4 experts with before
Marlin-MoE, and the issue's "Triton int4 fused_moe design" peer.

    align   the T K slots sorted by expert, each expert's run padded to BLOCK_M
            (moe_align_block_size; here device-side torch ops, no host sync; EM = S +
            min(E, S) (BLOCK_M - 1) rows at most), -1 slots (not routed here) left out
    GEMM 1  grid (cdiv(EM, BLOCK_M), cdiv(2I, BLOCK_N)): a program per (block of one expert's
            sorted slots, N block), blocks past the padded count exit at once; the K loop
            loads the weights as bytes [BLOCK_K, BLOCK_N] (two nibbles a byte along K: each
            byte loaded twice, L1 absorbs it), `(b >> (k % 2) * 4) & 0xF`, the group-32 scales
            as a [BLOCK_K, BLOCK_N] pointer tile, dequant `(q - 8) * s` in fp32 -> bf16, then
            tl.dot into fp32; out bf16 [S, 2I] in slot order
    act     silu(gate) * up in bf16 (a separate elementwise kernel, as theirs)
    GEMM 2  the same kernel on [S, I] -> [S, D], the router weight multiplied in its epilogue
    sum     over each token's K slots (their moe_sum; fp32 here, -1 slots masked)

Configs: what vLLM picks for int4_w4a16 without a tuned file (none exists for an NVIDIA GPU at
E = 384): BLOCK_M 16 (T <= 20) / 32 (T <= 40) / 64, BLOCK_N 32 and BLOCK_K 64 at T = 1, else
64 and 32, GROUP_SIZE_M 1 (no swizzle), 4 warps (num_stages: ours, 3).
The checkpoint's int32 words [E, N, K/8] are read as their bytes [E, N, K/2] (little-endian:
byte j holds inputs 2j, low nibble, and 2j + 1), the layout the design loads; gate and up are
concatenated into one [E, 2I, D/2] matrix once (their w13), in prepare, outside the timing.
Written from the description; the code is not vendored.

Legend: T tokens, K slots a token, S = T K, E experts, D hidden, I expert FFN width, EM padded
sorted rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from workbench.peers import Peer, _cache, _key, _ref, positional, register_peer

from ._common import INTERPRET, _to_bf16

_GROUP = tl.constexpr(32)  # inputs per scale (INT4 group 32)


@triton.jit
def _fused_moe_int4_kernel(a_ptr, b_ptr, s_ptr, c_ptr, w_ptr, sorted_ptr, expert_ptr, npad_ptr,
                           N, K, S, sa_m, sb_e, sb_n, ss_e, ss_n, sc_m,
                           A_DIV: tl.constexpr, MUL_W: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           UPCAST: tl.constexpr):
    """c[slot, n] = sum_k a[slot // A_DIV, k] W_e[n, k] (x router weight if MUL_W) for the
    slots of one BLOCK_M block of expert e's sorted run; a bf16 [*, K], W as bytes."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    slot = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM], S = padding
    t_ok = slot < S
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    row = (slot // A_DIV).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None] * sa_m + k[None, :]  # [BM, BK]
    b_ptrs = b_ptr + e * sb_e + n[None, :].to(tl.int64) * sb_n + (k[:, None] // 2)  # [BK, BN]
    shift = (k[:, None] % 2) * 4
    s_ptrs = s_ptr + e * ss_e + n[None, :].to(tl.int64) * ss_n  # + group
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + k < K
        a = tl.load(a_ptrs + k0, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        wk = k_ok[:, None] & n_ok[None, :]
        b = tl.load(b_ptrs + k0 // 2, mask=wk, other=0).to(tl.int32)
        q = ((b >> shift) & 0xF).to(tl.float32) - 8.0
        s = tl.load(s_ptrs + (k0 + k[:, None]) // _GROUP, mask=wk, other=0.0).to(tl.float32)
        wt = _to_bf16(q * s, UPCAST)  # = reference/int4.py: the exact product rounded once
        if UPCAST:  # the interpreter's bf16 dot is wrong (DESIGN.md §10): fp32 there
            acc += tl.dot(a.to(tl.float32), wt.to(tl.float32))
        else:
            acc = tl.dot(a, wt, acc)
    if MUL_W:
        acc *= tl.load(w_ptr + slot, mask=t_ok, other=0.0)[:, None]
    c = c_ptr + slot[:, None].to(tl.int64) * sc_m + n[None, :]
    # cvt.rn on the GPU; the interpreter's fp32 -> bf16 cast does not round to nearest
    tl.store(c, _to_bf16(acc, UPCAST), mask=t_ok[:, None] & n_ok[None, :])


def default_config(T: int) -> dict:
    """vLLM's int4_w4a16 defaults without a tuned file (notes/moe_int4.md §2)."""
    bm = 16 if T <= 20 else 32 if T <= 40 else 64
    bn, bk = (32, 64) if T == 1 else (64, 32)
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3)


def align(ids: torch.Tensor, E: int, block_m: int):
    """(sorted slot ids [EM] int32 with S as padding, expert of each BLOCK_M block [EM / BM]
    int32, padded row count [1] int32): moe_align_block_size from device ops, no host sync
    (scatter_add, not bincount: bincount sizes its output from the data), since vLLM times it
    with the GEMMs. -1 slots sort last and are dropped. The first `padded` rows equal
    workbench.peers.moe_align's (host-synced, exact-size: Humming's metadata, built outside
    its timing); the test checks it."""
    S = ids.numel()
    dev = ids.device
    key = torch.where(ids.reshape(-1) >= 0, ids.reshape(-1), E).long()  # [S], E = not here
    order = torch.argsort(key, stable=True)  # [S] slots grouped by expert
    cnt = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(
        0, key, torch.ones_like(key))[:E]  # [E]
    padded = (cnt + block_m - 1) // block_m * block_m
    pend = torch.cumsum(padded, 0)  # [E] end of each expert's padded run
    ks = key[order]  # [S] expert of each sorted slot (E: dropped)
    kc = ks.clamp(max=E - 1)
    rank = torch.arange(S, device=dev) - (torch.cumsum(cnt, 0) - cnt)[kc]
    EM = S + min(E, S) * (block_m - 1)
    pos = torch.where(ks < E, pend[kc] - padded[kc] + rank, EM)  # dropped slots: index EM
    sorted_ids = torch.full((EM + 1,), S, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, pos, order.to(torch.int32))
    nb = triton.cdiv(EM, block_m)
    start = torch.arange(nb, device=dev) * block_m
    expert = torch.searchsorted(pend, start, right=True).clamp(max=E - 1).to(torch.int32)
    return sorted_ids[:EM], expert, pend[-1:].to(torch.int32)


def _gemm(a, a_div, b, s, c, w, sorted_ids, expert, npad, S, cfg, mul_w):
    N, K = b.shape[1], a.shape[1]
    grid = (expert.numel(), triton.cdiv(N, cfg["BLOCK_N"]))
    _fused_moe_int4_kernel[grid](a, b, s, c, w, sorted_ids, expert, npad, N, K, S, a.stride(0),
                                 b.stride(0), b.stride(1), s.stride(0), s.stride(1), c.stride(0),
                                 A_DIV=a_div, MUL_W=mul_w, UPCAST=INTERPRET, **cfg)


def triton_fused_moe(x, ids, w, b13, s13, b2, s2):
    """x [T, D] bf16, ids / w [T, K], b13 bytes [E, 2I, D/2] + s13 [E, 2I, D/32] (gate | up),
    b2 bytes [E, D, I/2] + s2 [E, D, I/32] -> [T, D] bf16."""
    T, K = ids.shape
    E, I2, D = b13.shape[0], b13.shape[1], x.shape[1]
    S = T * K
    cfg = default_config(T)
    x = x.contiguous()  # unit stride along D (a no-op for the harness's x)
    sorted_ids, expert, npad = align(ids, E, cfg["BLOCK_M"])
    wf = w.reshape(-1).float().contiguous()
    h = torch.empty(S, I2, dtype=torch.bfloat16, device=x.device)  # [S, 2I] slot order
    _gemm(x, K, b13, s13, h, wf, sorted_ids, expert, npad, S, cfg, False)
    act = (F.silu(h[:, : I2 // 2]) * h[:, I2 // 2:]).contiguous()  # [S, I] bf16
    y = torch.empty(S, D, dtype=torch.bfloat16, device=x.device)  # [S, D], router-weighted
    _gemm(act, 1, b2, s2, y, wf, sorted_ids, expert, npad, S, cfg, True)
    y = torch.where((ids.reshape(-1) >= 0)[:, None], y.float(), 0.0)
    return y.view(T, K, D).sum(1).to(x.dtype)


def _prepare(case):
    x, ids, w, ex = positional(_ref("int4_moe"), case)[:4]

    def build():  # their w13: gate and up stacked along N; bytes views of the checkpoint words
        b13 = torch.cat([ex.gate_packed, ex.up_packed], 1).view(torch.uint8)
        s13 = torch.cat([ex.gate_scale, ex.up_scale], 1)
        return b13, s13, ex.down_packed.contiguous().view(torch.uint8), ex.down_scale

    return (x, ids, w, *_cache("int4_moe", ("fused_moe", _key(ex.gate_packed)), build))


register_peer(Peer("triton_fused_moe", "int4_moe", lambda: triton_fused_moe, _prepare,
                   description="vLLM/SGLang Triton fused_moe int4_w4a16 design: sorted and "
                   "BLOCK_M-padded slots, program per (expert block, N block), bytes + fp32 "
                   "dequant + tl.dot, separate SiLU and sum, vLLM's untuned default configs"))
