"""Peer for tree_mla written here: the SGLang Triton *extend* kernel's schedule (notes/kimi_mla.md
§5.3), what serving stacks verify trees with today.

    grid (B, H, ceil(N / BLOCK_M)): one program per request x head x block of 32 tree rows;
    each loops over the request's whole prefix serially (no split-KV), then over the N tree
    slots under a dense uint8 custom mask [N, N] (skip_prefix_custom_mask=True: the prefix is
    all-visible, only the tail block is read). The same latent K is re-read per head and per
    row block (L2 absorbs part of it); BLOCK_M, BLOCK_N = 32, 64 and 8 warps as SGLang on SM90
    for Lq = 576 (BLOCK_DMODEL 512 + BLOCK_DPE 64).

Written from the description of SGLang's `extend_attention_fwd` (the code is not vendored);
the dense mask is built in prepare, outside the timed region. Returns o_lat [B, N, H, C].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.peers import Peer, positional, register_peer

from . import _common
from .triton_v1 import _load_k

LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(q_ptr, kv_ptr, plen_ptr, mask_ptr, o_ptr,
                   sqb, sqn, sqh, sqd, skb, skt, skd, smb, smi, smj, sob, son, soh,
                   T, N, qk_scale,
                   C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    P = tl.minimum(tl.load(plen_ptr + b), T)
    i = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] tree rows of this head
    i_ok = i < N
    cc = tl.arange(0, CP)
    rr = tl.arange(0, RP)
    qrow = q_ptr + b * sqb + i * sqn + h * sqh
    qc = tl.load(qrow[:, None] + cc[None, :] * sqd, mask=i_ok[:, None] & (cc < C)[None, :],
                 other=0.0)
    qr = tl.load(qrow[:, None] + (C + rr)[None, :] * sqd,
                 mask=i_ok[:, None] & (rr < R)[None, :], other=0.0)
    if UPCAST:
        qc = qc.to(tl.float32)
        qr = qr.to(tl.float32)
    kv_b = kv_ptr + b * skb
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, CP], tl.float32)
    # stage 1: the whole prefix, serially, all-visible
    for k0 in range(0, P, BLOCK_N):
        slots = k0 + tl.arange(0, BLOCK_N)
        ok = slots < P
        kc, kr = _load_k(kv_b, slots, ok, skt, skd, C, R, CP, RP, UPCAST)
        s = (tl.dot(qc, tl.trans(kc)) + tl.dot(qr, tl.trans(kr))) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc)
        m_i = m_new
    # stage 2: the tree slots under the dense custom mask
    for j0 in range(0, N, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        ok = (j < N) & (P + j < T)
        kc, kr = _load_k(kv_b, P + j, ok, skt, skd, C, R, CP, RP, UPCAST)
        s = (tl.dot(qc, tl.trans(kc)) + tl.dot(qr, tl.trans(kr))) * qk_scale
        vis = tl.load(mask_ptr + b * smb + i[:, None] * smi + j[None, :] * smj,
                      mask=i_ok[:, None] & ok[None, :], other=0) != 0
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc)
        m_i = m_new
    l_i = tl.where(i_ok, l_i, 1.0)
    out = acc / l_i[:, None]
    optr = o_ptr + b * sob + i[:, None] * son + h * soh + cc[None, :]
    tl.store(optr, out.to(o_ptr.dtype.element_ty), mask=i_ok[:, None] & (cc < C)[None, :])


def sglang_extend_tree(q, kv_cache, prefix_lens, tail_mask, softmax_scale, kv_lora_rank):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B] int64, tail_mask uint8 [B, N, N]
    -> o_lat [B, N, H, C]."""
    B, N, H, D = q.shape
    C = kv_lora_rank
    o = torch.empty(B, N, H, C, dtype=q.dtype, device=q.device)
    block_m, block_n = 32, 64
    _extend_kernel[(B, H, triton.cdiv(N, block_m))](
        q, kv_cache, prefix_lens, tail_mask, o, *q.stride(), *kv_cache.stride(),
        *tail_mask.stride(), o.stride(0), o.stride(1), o.stride(2), kv_cache.shape[1], N,
        float(softmax_scale) * LOG2E, C=C, R=D - C, CP=_common.next_pow2(C),
        RP=max(16, _common.next_pow2(D - C)), BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=_common.interpreting(), num_warps=8, num_stages=1)
    return o


def _prepare(case):
    from workbench.ops import op_spec
    from workbench.reference.tree_mla import unpack_anc_bits

    q, kv, P, anc, scale, C = positional(op_spec("tree_mla").variant("reference").load(), case)
    N = q.shape[1]
    tail = unpack_anc_bits(anc, N).to(torch.uint8).contiguous()  # [B, N, N] SGLang's mask
    return q, kv, P.to(torch.int64).contiguous(), tail, scale, C


register_peer(Peer("sglang_extend_triton", "tree_mla", lambda: sglang_extend_tree, _prepare,
                   description="SGLang extend-style Triton kernel: program per request x head "
                   "x 32 rows, whole prefix looped serially, dense uint8 tail mask (built in "
                   "prepare)"))
