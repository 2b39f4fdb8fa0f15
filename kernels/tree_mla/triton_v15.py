"""tree_mla triton_v15: v4's cascade (split policy, parts, PDL combine) with the attention
kernel's MMAs transposed ("swap AB") for few query rows: keys on the MMA's M dimension (64 a
tile, what wgmma needs), the block's 16 query rows on its N dimension.

Why (H200, session 15, `scripts/sweep_tree_mla_policy.py`, traces/gpu/session15): at 8 heads
(an EP8 / TP8 rank) decode has M = N H = 8 query rows, and every version so far puts them on
the MMA's M dimension, whose smallest tile is 64: 7/8 of each QK^T and PV is padding. A part
of v4's 512-key split then costs ~2 µs of tensor time a 64-key tile on one SM (9.4 MFLOP a
tile: S [64, 64] over 576 columns, O [64, 512] over 64 keys), and the attention kernel alone
takes 14-16 µs at N 1 P 1024-2048 (gluon_v13; the combine's tail 2.4-6 µs more); the emulated
EP8 AR step spends 24 µs a layer there (P 4096) against a < 1 µs floor. Transposed, a tile is
S^T [64 keys, 16 rows] = K [64, 576] Q^T and O^T [512, 16] += V^T [512, 64] P^T: 2.4 MFLOP,
4x less, and the tile's 74 KB of K become the bound.

    launch 1  _attn_kernel  grid (G, ceil(M / ROWS), B), v4's parts (policy: P and, through
              the caller's choice, H only): part t < n_pre is prefix split t (TMA tiles, the
              last one shifted back), the last part also runs the masked loop over the tree
              (and the whole prefix when P < 64). Per tile: S^T = K Q^T (two dots: the latent
              512 and the rope 64 columns), the online softmax down the key axis (axis 0),
              O^T = O^T alpha + V^T P^T. n_parts == 1: o_lat / lse directly; else partial t.
    launch 2  v4's _combine_kernel (PDL), unchanged: the partial layout is v4's.

ROWS = 16 query rows a program (wgmma n16; Triton's dots need >= 16): a row's values never
depend on which rows share its block (each output element is its own dot over the keys, the
softmax is per column), so blocks are a tiling, not a policy. M > 16 re-reads each K tile per
row block (from L2): the variant is for few rows (decode and small verifies at 8 heads); v13
stays the choice where M fills 64-row tiles.
Numerics: v4's math (base-2 softmax, fp32 accumulators, bf16 P), another tile shape: within
the harness tolerances of the reference, not v4's bits.
Measured (H200, session 15 call 3; README.md "Design (v15, v16)"): no faster per tile than
gluon_v13 (~2 µs a 64-key tile: one CTA's chain of waited dots and reductions, not the MMA
work), within 2 µs of it at 8 heads P 1024, slower from P 8192 and 2x at large batch (its
16-row blocks re-read K once per block). Not BEST.
Legend: _common.py (B requests, N rows, H heads, M = N H, T cache, P prefix, C 512, R 64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _common
from ._common import BLOCK_N
from .triton_v1 import _load_k, _load_q
from .triton_v3 import _tma_ok

# _combine_kernel is imported for sm90.py, which compiles (and swaps) a version's kernels by module
from .triton_v4 import (  # noqa: F401
    LN2,
    LOG2E,
    MASKED_BLOCK_N,
    V4,
    Policy,
    _combine_kernel,
    _launch_combine,
    _parts,
    parts_grid,
)

ROWS = 16  # query rows a program: the MMA's N dimension


@triton.jit
def _attn_kernel(q_ptr, kv_ptr, kc_desc, kr_desc, plen_ptr, anc_ptr, o_ptr, lse_ptr,
                 opart_ptr, lpart_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, MASKED_BLOCK_N: tl.constexpr,
                 SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr,
                 MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                 USE_TMA: tl.constexpr, USE_PDL: tl.constexpr):
    # the combine may launch once every program of this grid has started (v4)
    if USE_PDL:
        gdc_launch_dependents()
    t = tl.program_id(0)
    rb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    length, n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if t < n_parts:  # the grid covers parts_grid(T); the rest exit before any load
        rows = rb * ROWS + tl.arange(0, ROWS)  # [ROWS] query rows of request b
        row_ok = rows < M
        qc, qr = _load_q(q_ptr, b, rows, H, M, sqb, sqn, sqh, sqd, C, R, CP, RP, UPCAST)
        qct = tl.trans(qc)  # [CP, ROWS]: the B operand of S^T = K Q^T
        qrt = tl.trans(qr)  # [RP, ROWS]
        kv_b = kv_ptr + b * skb
        m_i = tl.full([ROWS], float("-inf"), tl.float32)  # running max (log2 units)
        l_i = tl.zeros([ROWS], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([CP, ROWS], tl.float32)  # O^T: sum of V^T p
        start = t * length
        end = tl.where(t < n_pre, tl.minimum(start + length, P), start)
        for k0 in range(start, end, BLOCK_N):
            k_ld = tl.minimum(k0, end - BLOCK_N)  # v3's shifted last tile (>= 0 here)
            slots = k_ld + tl.arange(0, BLOCK_N)
            if USE_TMA:
                kc = kc_desc.load([b.to(tl.int32), k_ld, 0]).reshape(BLOCK_N, CP)
                kr = kr_desc.load([b.to(tl.int32), k_ld, C]).reshape(BLOCK_N, RP)
                if UPCAST:  # interpreter: bf16 tl.dot is wrong there
                    kc = kc.to(tl.float32)
                    kr = kr.to(tl.float32)
            else:
                kc, kr = _load_k(kv_b, slots, slots < end, skt, skd, C, R, CP, RP, UPCAST)
            s = tl.dot(kc, qct, input_precision=DOT_PREC)
            s = tl.dot(kr, qrt, s, input_precision=DOT_PREC) * qk_scale  # [BLOCK_N, ROWS]
            # keys before k0 belong to the previous tile (shifted last tile): p = 0 (v3)
            s = tl.where((slots >= k0)[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = tl.dot(tl.trans(kc), p.to(kc.dtype), acc * alpha[None, :],
                         input_precision=DOT_PREC)
            m_i = m_new
        if t == n_parts - 1:
            # v4's masked tiles over j = x - P in [j_lo, N): slot x visible to node i iff
            # j < 0 (prefix) or bit j of anc_bits[b, i]
            j_lo = tl.where(P >= BLOCK_N, 0, -tl.cdiv(P, MASKED_BLOCK_N) * MASKED_BLOCK_N)
            anc_rows = anc_ptr + b * sab + (rows // H) * san  # [ROWS]
            for j0 in range(j_lo, N, MASKED_BLOCK_N):
                j = j0 + tl.arange(0, MASKED_BLOCK_N)
                x = P + j
                ok = (x >= 0) & (j < N) & (x < T)  # x < T: memory safety, bad prefix_lens
                kc, kr = _load_k(kv_b, x, ok, skt, skd, C, R, CP, RP, UPCAST)
                s = tl.dot(kc, qct, input_precision=DOT_PREC)
                s = tl.dot(kr, qrt, s, input_precision=DOT_PREC) * qk_scale
                word = tl.load(anc_rows + (tl.maximum(j0, 0) // 64) * saw,
                               mask=row_ok & (j0 >= 0), other=0)  # [ROWS]
                sh = (tl.maximum(j, 0) % 64).to(tl.int64)
                vis = (((word[None, :] >> sh[:, None]) & 1) != 0) | (j < 0)[:, None]
                s = tl.where(vis & ok[:, None], s, float("-inf"))
                # a tile may hide every key from a row: keep the subtracted max finite (v4)
                m_new = tl.maximum(m_i, tl.max(s, 0))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[None, :])
                l_i = l_i * alpha + tl.sum(p, 0)
                acc = tl.dot(tl.trans(kc), p.to(kc.dtype), acc * alpha[None, :],
                             input_precision=DOT_PREC)
                m_i = m_new
        # v4's guard: l_i = 0 only for rows past M or an empty ancestor word
        l_i = tl.where(row_ok & (l_i > 0), l_i, 1.0)
        out = acc / l_i[None, :]  # [CP, ROWS]
        lse2 = m_i + tl.log2(l_i)
        cc = tl.arange(0, CP)
        if n_parts == 1:  # the whole answer: no partial round trip, no combine
            o_rows = b * M + rows  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
            tl.store(o_ptr + o_rows[None, :] * C + cc[:, None], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[None, :] & (cc < C)[:, None])
            tl.store(lse_ptr + o_rows, lse2 * LN2, mask=row_ok)
        else:
            part = (b * S_GRID + t) * M + rows  # [ROWS] rows of partial slot t
            tl.store(opart_ptr + part[None, :] * CP + cc[:, None], out, mask=row_ok[None, :])
            tl.store(lpart_ptr + part, lse2, mask=row_ok)


def _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
            policy: Policy, combine=None):
    """v4's launcher with this module's attention kernel (ROWS-row blocks, K by TMA where
    the cache allows it, Q by pointer loads); combine: the LSE-merge launcher (v4's by
    default; triton_v16: v8's)."""
    B, N, H, D, T, W = _common.check_inputs(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                            kv_lora_rank)
    if validate:
        _common.validate_contents(kv_cache, prefix_lens, N)
    C, M = kv_lora_rank, N * H
    o_lat = torch.empty(B, N, H, C, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, N, H, dtype=torch.float32, device=q.device)
    if B == 0:
        return o_lat, lse
    CP, RP = _common.next_pow2(C), max(16, _common.next_pow2(D - C))
    G = parts_grid(T, policy=policy)
    o_part = torch.empty(B, G, M, CP, dtype=torch.float32, device=q.device) if G > 1 else lse
    l_part = torch.empty(B, G, M, dtype=torch.float32, device=q.device) if G > 1 else lse
    use_tma = _tma_ok(kv_cache, C)
    if use_tma:  # host-built (pointer, shape, strides only: no sync, graph-capturable)
        shape, strides = list(kv_cache.shape), list(kv_cache.stride())
        kc_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, C])
        kr_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, RP])
    else:
        kc_desc = kr_desc = kv_cache  # unused (USE_TMA=False)
    interp = _common.interpreting()
    use_pdl = not interp and G > 1
    pdl = {} if interp else {"launch_pdl": use_pdl}
    consts = dict(SHORT_UPTO=policy.short_upto, SHORT_LEN=policy.short_len,
                  LONG_MIN=policy.long_min, MAX_SPLITS=policy.max_splits, BLOCK_N=BLOCK_N)
    _attn_kernel[(G, triton.cdiv(M, ROWS), B)](
        q, kv_cache, kc_desc, kr_desc, prefix_lens, anc_bits, o_lat, lse, o_part, l_part,
        *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, G, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, ROWS=ROWS, MASKED_BLOCK_N=MASKED_BLOCK_N,
        UPCAST=interp, DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        USE_TMA=use_tma, USE_PDL=use_pdl, **consts, num_warps=4, num_stages=2)
    if G > 1:
        (combine or _launch_combine)(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP,
                                     consts, use_pdl, pdl)
    return o_lat, lse


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v4's split
    policy, 16-row transposed tiles (module docstring). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate, V4)
