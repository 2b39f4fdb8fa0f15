"""tree_mla gluon_v9: v4's cascade (policy, parts, combine) with the attention kernel written in
Gluon, so the two warpgroups split the score tile by keys instead of both computing all of it
(README.md, "Design (v9)"; the premise: "Next: Gluon" and scripts/gluon_mla_tile_probe.py).

    launch 1  _attn_kernel (Gluon)  grid (G, ceil(M / 64), B), 8 warps = 2 warpgroups
              part t of request b as v4 (same `_parts`, same shifted last prefix tile, same
              masked tiles for the tree and for P < 64; tree tiles of 64 keys here, aligned at
              j = 0, so each is one ancestor word). A tile:
                S [64, 64]   = Qc Kc^T + Qr Kr^T      warpgroup w: keys 32w .. 32w + 31, all
                                                       576 dims (36 x m64n32k16, no duplicate)
                m, l          row max / sum over both halves (the compiler's smem exchange)
                O [64, 512] += P V                      warpgroup w: columns 256w .. 256w + 255
                                                       (P [64, 64] bf16 exchanged via smem)
              prefix tiles by TMA into a 2-slot ring (tile i + 1 in flight while tile i
              computes), Q by TMA once; masked tiles by pointer loads into slot 0.
    launch 2  v4's _combine_kernel (Triton, PDL) when G > 1.

Inputs it takes (else a ValueError naming the argument): CUDA sm_90, bf16 or fp16, C a power
of two in [32, 512] (O's instruction is m64n{C/2}k16 a warpgroup), R <= 64, kv_cache viewable
as [B * T, C + R] rows (stride(0) = T * stride(1), 16-byte aligned; the harness's gappy slot
stride qualifies; B = 1 ignores stride(0)). A q that TMA cannot read as [B * M, C + R]
(heads-major, a row slice) is copied contiguous first: one [B, N, H, C + R] copy, said here
rather than hidden. The kernel's P_SMEM constexpr is gluon_v10 (P through a buffer of its own).
Gluon has no interpreter: on CPU it is compiled (tests, `sm90.py`-style), run on the H200.
Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import _common
from ._common import _require
from .triton_v4 import LOG2E, V4, Policy, _launch_combine, parts_grid

BLOCK_M = 64  # query rows (heads x nodes) a program: one wgmma M tile
BLOCK_N = 64  # keys a tile, prefix and masked
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
NEG_INF: gl.constexpr = gl.constexpr(float("-inf"))
# masked tiles are staged through registers 32 rows at a time (64 latent values a thread)
STAGE_ROWS = gl.constexpr(32)


@gluon.jit
def _parts(P, SHORT_UPTO: gl.constexpr, SHORT_LEN: gl.constexpr, LONG_MIN: gl.constexpr,
           MAX_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr):
    """triton_v4._parts in Gluon: (split length, prefix splits, parts) from P only."""
    long = gl.maximum(gl.cdiv(gl.cdiv(P, MAX_SPLITS), BLOCK_N) * BLOCK_N, LONG_MIN)
    short = (P <= SHORT_UPTO).to(gl.int32)
    length = short * SHORT_LEN + (1 - short) * long
    n_pre = (P >= BLOCK_N).to(gl.int32) * gl.cdiv(P, length)  # P < 64: all in the masked loop
    n_parts = gl.maximum(n_pre + (P > SHORT_UPTO).to(gl.int32), 1)
    return length, n_pre, n_parts


@gluon.jit
def _scores(qc_s, qr_s, kc, kr, S_L: gl.constexpr):
    """S [64, 64] fp32 = Qc Kc^T + Qr Kr^T (shared memory operands), in S_L: each warpgroup
    the 32 keys of its half of S's columns."""
    BM: gl.constexpr = qc_s.shape[0]
    BN: gl.constexpr = kc.shape[0]
    s = warpgroup_mma(qc_s, kc.permute((1, 0)), gl.zeros([BM, BN], gl.float32, S_L),
                      use_acc=False, is_async=True)
    s = warpgroup_mma(qr_s, kr.permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def _softmax_pv(s, m_i, l_i, acc, kc, p_s, SAFE: gl.constexpr, P_SMEM: gl.constexpr,
                O_L: gl.constexpr):
    """One tile's base-2 online softmax and P V on masked, scaled scores s [64, 64] (S_L, each
    warpgroup half the keys: the row max and sum cross the warpgroups). P reaches the PV wgmma
    (which needs all 64 keys of a row in each warpgroup) either as a register A operand through
    the compiler's layout conversion (v9: 4 CTA barriers, two rounds through its scratch) or,
    P_SMEM (v10), stored by each warpgroup into p_s [64, 64] (its 32 columns) and read by the
    wgmma from shared memory (one barrier). SAFE: a tile may hide every key from a row (masked
    tiles): keep the subtracted max finite."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = m_new
    if SAFE:
        m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
    if P_SMEM:
        # p_s's last readers (the previous tile's PV wgmmas) have retired: every warpgroup
        # waited on them before the CTA barrier inside this tile's row max
        p_s.store(p.to(kc.dtype))
        fence_async_shared()  # generic-proxy stores, then wgmma's async-proxy reads
        gl.thread_barrier()
        pa = p_s
    else:  # both warpgroups get all 64 keys of their rows
        pa = gl.convert_layout(p.to(kc.dtype), gl.DotOperandLayout(operand_index=0, parent=O_L,
                                                                   k_width=2))
    # V = the tile's first C columns, each warpgroup its C / 2 of them
    acc = warpgroup_mma(pa, kc, acc, is_async=True)
    return m_new, l_i, warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _stage(kv_b, x, ok, skt, dst_c, dst_r, C: gl.constexpr, R: gl.constexpr,
           RP: gl.constexpr, LD: gl.constexpr):
    """Latent rows x [STAGE_ROWS] (slot indices; rows with ok False read 0, so NaN past a
    request's length never reaches P V) into dst_c [STAGE_ROWS, C] / dst_r [.., RP]."""
    xr = gl.convert_layout(x, gl.SliceLayout(1, LD)).to(gl.int64)
    okr = gl.convert_layout(ok, gl.SliceLayout(1, LD))
    cc = gl.arange(0, C, layout=gl.SliceLayout(0, LD))
    cr = gl.arange(0, RP, layout=gl.SliceLayout(0, LD))
    base = kv_b + xr[:, None] * skt
    dst_c.store(gl.load(base + cc[None, :], mask=okr[:, None] & (cc < C)[None, :], other=0.0))
    dst_r.store(gl.load(base + C + cr[None, :], mask=okr[:, None] & (cr < R)[None, :],
                        other=0.0))


@gluon.jit
def _attn_kernel(qc_desc, qr_desc, kc_desc, kr_desc, kv_ptr, plen_ptr, anc_ptr, o_ptr, lse_ptr,
                 opart_ptr, lpart_ptr, skb, skt, s_plen, sab, san, saw, T, N, H, M, S_GRID,
                 qk_scale, C: gl.constexpr, R: gl.constexpr, RP: gl.constexpr,
                 SHORT_UPTO: gl.constexpr, SHORT_LEN: gl.constexpr, LONG_MIN: gl.constexpr,
                 MAX_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, USE_PDL: gl.constexpr,
                 P_SMEM: gl.constexpr):
    BLOCK_M: gl.constexpr = 64
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, C // 2, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])  # 16 B a thread
    if USE_PDL:  # the combine may launch now and wait in griddepcontrol.wait (v4)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    t = gl.program_id(0)
    mb = gl.program_id(1)
    b = gl.program_id(2).to(gl.int64)
    P = gl.minimum(gl.maximum(gl.load(plen_ptr + b * s_plen).to(gl.int32), 0), T)
    length, n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if t < n_parts:  # the grid covers parts_grid(T); the rest exit before any load
        dtype: gl.constexpr = kc_desc.dtype
        qc_s = gl.allocate_shared_memory(dtype, [BLOCK_M, C], qc_desc.layout)
        qr_s = gl.allocate_shared_memory(dtype, [BLOCK_M, RP], qr_desc.layout)
        kc_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, C], kc_desc.layout)
        kr_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, RP], kr_desc.layout)
        p_s = None
        if P_SMEM:  # v10: P [64, 64] as the PV wgmma's shared-memory A operand
            p_s = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], kc_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(3):  # 0, 1: the K ring's slots; 2: Q
            mbarrier.init(bars.index(i), count=1)
        # Q: rows b * M + mb * 64 .. of q viewed [B * M, C + R]; rows past M are the next
        # request's (or TMA's zero fill): row-local, never stored
        q_row = (b * M + mb * BLOCK_M).to(gl.int32)
        mbarrier.expect(bars.index(2), qc_desc.block_type.nbytes + qr_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(qc_desc, [q_row, 0], bars.index(2), qc_s)
        tma.async_copy_global_to_shared(qr_desc, [q_row, C], bars.index(2), qr_s)
        # prefix split t (t < n_pre, so P >= 64): 64-key tiles, the last shifted back to end
        # at the split's end (v3); keys before a tile's nominal start get p = 0
        start = t * length
        end = gl.where(t < n_pre, gl.minimum(start + length, P), start)
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        kv_row = (b * T).to(gl.int32)  # request b's slot 0 in kv viewed [B * T, C + R]
        k_bytes: gl.constexpr = kc_desc.block_type.nbytes + kr_desc.block_type.nbytes
        first = n_tiles > 0
        k_ld = gl.maximum(gl.minimum(start, end - BLOCK_N), 0)
        mbarrier.expect(bars.index(0), k_bytes, pred=first)
        tma.async_copy_global_to_shared(kc_desc, [kv_row + k_ld, 0], bars.index(0),
                                        kc_s.index(0), pred=first)
        tma.async_copy_global_to_shared(kr_desc, [kv_row + k_ld, C], bars.index(0),
                                        kr_s.index(0), pred=first)
        m_i = gl.full([BLOCK_M], NEG_INF, gl.float32, ROW_S)  # running max (log2 units)
        l_i = gl.zeros([BLOCK_M], gl.float32, ROW_S)  # running sum of exp2(s - m_i)
        acc = gl.zeros([BLOCK_M, C], gl.float32, O_L)  # sum of p * V
        mbarrier.wait(bars.index(2), 0)
        for i in range(n_tiles):
            slot = i % 2
            k0 = start + i * BLOCK_N
            k_ld = gl.minimum(k0, end - BLOCK_N)
            # tile i + 1 into the other slot: it held tile i - 1, which both warpgroups have
            # finished (their PV waits retired before this barrier)
            gl.thread_barrier()
            more = i + 1 < n_tiles
            k_nx = gl.minimum(k0 + BLOCK_N, end - BLOCK_N)
            mbarrier.expect(bars.index(1 - slot), k_bytes, pred=more)
            tma.async_copy_global_to_shared(kc_desc, [kv_row + k_nx, 0], bars.index(1 - slot),
                                            kc_s.index(1 - slot), pred=more)
            tma.async_copy_global_to_shared(kr_desc, [kv_row + k_nx, C], bars.index(1 - slot),
                                            kr_s.index(1 - slot), pred=more)
            mbarrier.wait(bars.index(slot), (i // 2) & 1)
            kc = kc_s.index(slot)
            s = _scores(qc_s, qr_s, kc, kr_s.index(slot), S_L)
            slots = k_ld + gl.arange(0, BLOCK_N, layout=COL_S)
            s = gl.where((slots >= k0)[None, :], s * qk_scale, NEG_INF)  # >= 1 key live
            m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, kc, p_s, False, P_SMEM, O_L)
        rows = mb * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)  # query rows of request b
        if t == n_parts - 1:
            # masked tiles over j = x - P in [j_lo, N): slot x visible to node i iff j < 0
            # (prefix, only when P < 64) or bit j of anc_bits[b, i]; tiles start at multiples
            # of 64 in j, so a tree tile reads one ancestor word a row
            j_lo = gl.where(P >= BLOCK_N, 0, -gl.cdiv(P, BLOCK_N) * BLOCK_N)
            anc_rows = anc_ptr + b * sab + (rows // H) * san  # [64]
            kv_b = kv_ptr + b * skb
            kc = kc_s.index(0)
            kr = kr_s.index(0)
            for j0 in range(j_lo, N, BLOCK_N):
                gl.thread_barrier()  # both warpgroups are done with slot 0's last tile
                for h in gl.static_range(BLOCK_N // STAGE_ROWS):
                    jh = j0 + h * STAGE_ROWS + gl.arange(0, STAGE_ROWS,
                                                         layout=gl.SliceLayout(1, LD))
                    xh = P + jh
                    _stage(kv_b, xh, (xh >= 0) & (jh < N) & (xh < T), skt,
                           kc.slice(h * STAGE_ROWS, STAGE_ROWS, dim=0),
                           kr.slice(h * STAGE_ROWS, STAGE_ROWS, dim=0), C, R, RP, LD)
                fence_async_shared()  # generic-proxy stores, then wgmma's async-proxy reads
                gl.thread_barrier()
                s = _scores(qc_s, qr_s, kc, kr, S_L)
                j = j0 + gl.arange(0, BLOCK_N, layout=COL_S)
                x = P + j
                ok = (x >= 0) & (j < N) & (x < T)  # x < T: memory safety, bad prefix_lens
                word = gl.load(anc_rows + (gl.maximum(j0, 0) // 64) * saw,
                               mask=(rows < M) & (j0 >= 0), other=0)  # [64]
                sh = (gl.maximum(j, 0) % 64).to(gl.int64)
                vis = (((word[:, None] >> sh[None, :]) & 1) != 0) | (j < 0)[None, :]
                s = gl.where(vis & ok[None, :], s * qk_scale, NEG_INF)
                # a tile may hide every key from a row (the tree's own part starts at
                # m_i = -inf): SAFE keeps exp2 away from -inf - -inf
                m_i, l_i, acc = _softmax_pv(s, m_i, l_i, acc, kc, p_s, True, P_SMEM, O_L)
        for i in gl.static_range(3):
            mbarrier.invalidate(bars.index(i))
        # l_i = 0 only for rows past M or an empty ancestor word (malformed input): out = 0,
        # lse = -inf there, weight 0 in the merge (v4)
        row_ok = rows < M
        l_i = gl.where(row_ok & (l_i > 0), l_i, 1.0)
        lse2 = m_i + gl.log2(l_i)
        out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, O_L))[:, None]
        rows_o = mb * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_L))
        cols = gl.arange(0, C, layout=gl.SliceLayout(0, O_L))
        keep = (rows_o < M)[:, None] & (cols < C)[None, :]
        if n_parts == 1:  # the whole answer: no partial round trip, no combine
            o_rows = b * M + rows_o  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
            gl.store(o_ptr + o_rows[:, None] * C + cols[None, :],
                     out.to(o_ptr.dtype.element_ty), mask=keep)
            gl.store(lse_ptr + b * M + rows, lse2 * LN2, mask=row_ok)
        else:
            part = (b * S_GRID + t) * M  # partial slot t of request b: [M, C] rows
            gl.store(opart_ptr + (part + rows_o)[:, None] * C + cols[None, :], out, mask=keep)
            gl.store(lpart_ptr + part + rows, lse2, mask=row_ok)


def _smem(block, dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if dtype == torch.bfloat16
                                                else gl.float16)


def _check(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
           version: str = "gluon_v9"):
    """The Gluon versions' input contract (a ValueError naming the argument otherwise) ->
    (B, N, H, D, T, C, M, q as TMA reads it, o_lat, lse: the outputs allocated)."""
    B, N, H, D, T, W = _common.check_inputs(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                            kv_lora_rank)
    C, R, M = kv_lora_rank, D - kv_lora_rank, N * H
    _require(q.dtype in (torch.bfloat16, torch.float16), "q", "dtype bfloat16 or float16 "
             "(wgmma operands)", q.dtype)
    _require(32 <= C <= 512 and C & (C - 1) == 0, "kv_lora_rank",
             "a power of two in [32, 512] (O is m64n{C/2}k16 a warpgroup)", C)
    _require(R <= 64, "q", f"at most 64 rope columns past kv_lora_rank {C}", R)
    e = kv_cache.element_size()
    _require(kv_cache.stride(2) == 1 and (B == 1 or kv_cache.stride(0) == T * kv_cache.stride(1))
             and kv_cache.stride(1) * e % 16 == 0 and kv_cache.data_ptr() % 16 == 0,
             "kv_cache", "rows TMA can read as [B * T, C + R] (unit last stride, stride(0) = "
             "T * stride(1), 16-byte aligned rows and base)",
             f"strides {tuple(kv_cache.stride())}, base % 16 = {kv_cache.data_ptr() % 16}")
    _require(q.device.type == "cuda", "q", f"a CUDA tensor ({version} has no interpreter path)",
             q.device)
    cc = torch.cuda.get_device_capability(q.device)
    _require(cc == (9, 0), "q", "a tensor on an sm_90 GPU (wgmma, TMA)", f"sm_{cc[0]}{cc[1]}")
    if validate:
        _common.validate_contents(kv_cache, prefix_lens, N)
    o_lat = torch.empty(B, N, H, C, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, N, H, dtype=torch.float32, device=q.device)
    if B > 0:
        _require(D * e % 16 == 0, "q", "rows of a multiple of 16 bytes (TMA)", f"{D * e} B")
        if not q.is_contiguous() or q.data_ptr() % 16:
            q = q.contiguous()  # the one copy (module docstring): TMA reads q as [B * M, D]
    return B, N, H, D, T, C, M, q, o_lat, lse


def _plan(q, kv_cache, lse, B, M, T, C, policy: Policy):
    """The Gluon launchers' common setup -> (G parts, o_part, l_part, the policy constexprs,
    q_desc(block), kv_desc(block)). Partials only when G > 1 (else `lse` stands in, never
    written). Descriptors are built from pointer, shape and strides only (no sync,
    graph-capturable) over q viewed [B * M, D] and the cache viewed [B * T, D] rows; boxes
    past column D or rows outside the view are TMA's zero fill."""
    D = q.shape[-1]
    G = parts_grid(T, policy=policy)
    o_part = torch.empty(B, G, M, C, dtype=torch.float32, device=q.device) if G > 1 else lse
    l_part = torch.empty(B, G, M, dtype=torch.float32, device=q.device) if G > 1 else lse
    q2 = q.view(B * M, D)
    sk = kv_cache.stride(1)
    kv2 = kv_cache.as_strided((B * T, D), (sk, 1))
    consts = dict(SHORT_UPTO=policy.short_upto, SHORT_LEN=policy.short_len,
                  LONG_MIN=policy.long_min, MAX_SPLITS=policy.max_splits, BLOCK_N=BLOCK_N)

    def q_desc(block):
        return TensorDescriptor(q2, [B * M, D], [D, 1], block, _smem(block, q.dtype))

    def kv_desc(block):
        return TensorDescriptor(kv2, [B * T, D], [sk, 1], block, _smem(block, q.dtype))

    return G, o_part, l_part, consts, q_desc, kv_desc


def _combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, consts, launcher=None):
    """The LSE merge (Triton) as a programmatic dependent launch when there are parts to
    merge: v4's, or `launcher` (a Triton version's merge launcher with v4's signature:
    gluon_v18 passes triton_v17's); -> (o_lat, lse)."""
    if G > 1:
        (launcher or _launch_combine)(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, C,
                                      consts, True, {"launch_pdl": True})
    return o_lat, lse


def _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
            policy: Policy, p_smem: bool = False):
    B, N, H, D, T, C, M, q, o_lat, lse = _check(q, kv_cache, prefix_lens, anc_bits,
                                                softmax_scale, kv_lora_rank, validate)
    if B == 0:
        return o_lat, lse
    R = D - C
    RP = max(16, _common.next_pow2(R))
    G, o_part, l_part, consts, q_desc, kv_desc = _plan(q, kv_cache, lse, B, M, T, C, policy)
    _attn_kernel[(G, triton.cdiv(M, BLOCK_M), B)](
        q_desc([BLOCK_M, C]), q_desc([BLOCK_M, RP]), kv_desc([BLOCK_N, C]),
        kv_desc([BLOCK_N, RP]), kv_cache, prefix_lens, anc_bits, o_lat, lse,
        o_part, l_part, kv_cache.stride(0), kv_cache.stride(1), prefix_lens.stride(0),
        *anc_bits.stride(), T, N, H, M, G, float(softmax_scale) * LOG2E, C=C, R=R, RP=RP,
        **consts, USE_PDL=G > 1, P_SMEM=p_smem, num_warps=8)
    return _combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, consts)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v4's split
    policy and combine. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4)
