"""tree_mla gluon_v11: the seesaw. v10's cascade (v4's policy, parts and PDL combine) with an
attention kernel whose two warpgroups no longer run the same phases at the same time
(README.md, "Design (v11)"; the schedule FlashMLA's sm90 decode kernel uses, written here in
Gluon with warp specialization).

    launch 1  _attn_kernel (Gluon)  grid (G, ceil(M / 64), B), 2 partitions of 4 warps
              part t of request b as v9 (same `_parts`, same shifted last prefix tile, the same
              64-key masked tiles at j = 0, 64, ..), every tile by TMA. Tiles are taken in pairs
              (i, i + 1); warpgroup 0 scores even tiles, warpgroup 1 odd ones, each a whole
              m64n64 S over all 576 dims:
                WG0: softmax(i), publish m_i and P_i     WG1: wait m_i, P_i; O_R to m_i;
                     (p0_s)                                   issue P_i V_R (P from p0_s)
                     O_L to m_i, P_i V_L (registers)         softmax(i + 1) under that PV,
                     wait m_{i+1}: O_L to it                  publish m_{i+1}, the factor and
                     sP1 V_L (P from qr_s)                    P_{i+1} (qr_s); O_R to m_{i+1},
                     QK^T of i + 2                            P_{i+1} V_R (registers)
                                                              QK^T of i + 3
              so one warpgroup's softmax runs under the other's QK^T / PV. Warpgroup w owns O's
              value columns [w C/2, (w + 1) C/2) and reads only that half of every tile's V.
              m, the factor, P and l cross through shared memory at named-barrier rendezvous.
    launch 2  v4's _combine_kernel (Triton, PDL) when G > 1.

Shared memory (C 512): Q halves 2 x 32 KB + rope 8 KB, two K slots each split as left half /
right half / rope (2 x 72 KB), P0 8 KB: 230 KB. P1 lives in Q's rope buffer: both warpgroups
hold Q's rope columns in registers (the rope QK^T is a register-A wgmma), so that buffer is
free once they have loaded it. The rope box is always 64 wide (TMA zero-fills past D), so P1
fits whatever R <= 64 is.

The K slot's halves are refilled by the warpgroup that last reads them (V_L by WG0 after its
two PVs, V_R and rope by WG1 after its two PVs), each under its own mbarrier, and each
warpgroup's QK^T consumes first the half that was refilled first.

Masked tiles are read by TMA like prefix tiles; rows a tile must not see (j >= N, x < 0, x >= T:
past the request, the previous or next request's slots, NaN allowed) are masked to -inf in S,
and each warpgroup zeroes them in its own V half before its PV (0 x NaN would otherwise reach
O); the zeroing happens after the tile's QK^T has completed, so it never races with a reader.

Numerics: the running max starts at -1e30 (finite), masked scores are -inf, so exp2 never sees
inf - inf and no SAFE variant is needed; a row that sees no key keeps l = 0: out 0, lse -inf.
Both column halves multiply the same bf16 P of a tile (O is rescaled between the two tiles of
a pair instead of P, unlike FlashMLA); each warpgroup sums its own tiles' fp32 p into l and
warpgroup 0 adds the two once at the end. Not v10's bits; the same partition and merge as v4
(batch invariance by P only).

Inputs: gluon_v9's (a ValueError naming the argument otherwise). Gluon has no interpreter: on
CPU the kernel is compiled (`sm90_gluon --version 11`), run on the H200. Legend: _common.py.
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

from .gluon_v9 import BLOCK_M, BLOCK_N, _check, _combine, _parts, _plan
from .triton_v4 import LOG2E, V4, Policy

RP = 64  # the rope box: zero-filled past D, and wide enough to hold P1 [64, 64]
M_INIT: gl.constexpr = gl.constexpr(-1.0e30)  # running max before any key: finite
NEG_INF: gl.constexpr = gl.constexpr(float("-inf"))
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
# TMA mbarriers (one arrival each, the expect): Q, then each K slot's halves in NCH column
# chunks (gluon_v11: one chunk a half; gluon_v12: 64-column chunks), the rope with the right
# half's last chunk. Index 1 + slot * NCH + c: left chunk c; 1 + 2 NCH + slot * NCH + c: right
B_Q = gl.constexpr(0)  # Q
# the exchanges between the warpgroups: hardware named barriers over both (256 threads; ids
# clear of the ones Gluon's warp specialization uses, 0-2), a bar.sync on each side. Not
# mbarriers: an mbarrier arrive is one elected thread after a warpgroup bar.sync, and
# compute-sanitizer's racecheck does not follow that chain (session 13 call 3: 92 hazards on
# sm_s / sc_s / sl_s); bar.sync orders every participating thread's shared-memory accesses
NB_M0 = gl.constexpr(10)  # WG0 -> WG1: m_i and P_i (p0_s) published
NB_M1 = gl.constexpr(11)  # WG1 -> WG0: m_{i+1} and P_i's factor to it published
NB_P1 = gl.constexpr(12)  # WG1 -> WG0: P_{i+1} in qr_s, and p0_s read
NB_LW1 = gl.constexpr(13)  # WG1 -> WG0: WG1's l at the end
NB_LSUM = gl.constexpr(14)  # WG0 -> WG1: the summed l


@gluon.jit
def _bar(op: gl.constexpr):
    gl.inline_asm_elementwise(op, "=r,~{memory}", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _handoff(bar_id: gl.constexpr):
    """Both warpgroups meet at named barrier `bar_id` (bar.sync over 256 threads): what one
    stored to shared memory before it, the other may read after it, and the reverse. A
    rendezvous, not a one-way bar.arrive: racecheck takes bar.arrive -> bar.sync as unordered
    (session 13 call 4: 32 hazards left on the m and l vectors). Immediate ids (ptxas crashes
    on register ids here)."""
    if bar_id == 10:
        _bar("bar.sync 10, 256; mov.u32 $0, 0;")
    elif bar_id == 11:
        _bar("bar.sync 11, 256; mov.u32 $0, 0;")
    elif bar_id == 12:
        _bar("bar.sync 12, 256; mov.u32 $0, 0;")
    elif bar_id == 13:
        _bar("bar.sync 13, 256; mov.u32 $0, 0;")
    else:
        _bar("bar.sync 14, 256; mov.u32 $0, 0;")


@gluon.jit
def _publish(bar_id: gl.constexpr, PUB: gl.constexpr):
    """The publishing side of `_handoff`. PUB (gluon_v13): a partition barrier first, so every
    lane's shared-memory stores are ordered inside its own warpgroup before the rendezvous.
    Not needed by the hardware (bar.sync orders them for all 256 threads); needed by
    compute-sanitizer's racecheck, which reports the rendezvous as a RAW hazard on vectors
    stored from the wgmma row layout without it, and not with it
    (scripts/racecheck_named_barrier_probe.py --mma [--sync], session 14 call 1)."""
    if PUB:
        gl.thread_barrier()
    _handoff(bar_id)


@gluon.jit
def _row(i, n_pf, start, end, P, j_lo, kv_row, BLOCK_N: gl.constexpr):
    """Cache row (of kv viewed [B * T, D]) where tile i starts: prefix tiles as v9 (the last
    shifted back to end at the split's end), masked tiles at slot P + j0 (may be < 0: TMA
    zero-fills rows before the tensor, other rows are zeroed by _zero_rows)."""
    k_ld = gl.minimum(start + i * BLOCK_N, end - BLOCK_N)
    return kv_row + gl.where(i < n_pf, k_ld, P + j_lo + (i - n_pf) * BLOCK_N)


@gluon.jit
def _geometry(plen_ptr, s_plen, T, N, SHORT_UPTO: gl.constexpr, SHORT_LEN: gl.constexpr,
              LONG_MIN: gl.constexpr, MAX_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr):
    """This program's part t of row block mb of request b: (t, mb, b, P, parts, live, its
    prefix keys [start, end), prefix tiles n_pf, first masked slot j_lo, tiles n, cache row of
    the request kv_row), from the kernel's arguments only."""
    t = gl.program_id(0)
    mb = gl.program_id(1)
    b = gl.program_id(2).to(gl.int64)
    P = gl.minimum(gl.maximum(gl.load(plen_ptr + b * s_plen).to(gl.int32), 0), T)
    length, n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    live = t < n_parts  # the grid covers parts_grid(T); the rest load and store nothing
    start = t * length
    end = gl.where(t < n_pre, gl.minimum(start + length, P), start)
    n_pf = gl.cdiv(end - start, BLOCK_N)  # prefix tiles of part t
    j_lo = gl.where(P >= BLOCK_N, 0, -gl.cdiv(P, BLOCK_N) * BLOCK_N)
    n_msk = gl.where(t == n_parts - 1, gl.cdiv(N - j_lo, BLOCK_N), 0)  # tree (+ P < 64) tiles
    n = gl.where(live, n_pf + n_msk, 0)
    kv_row = (b * T).to(gl.int32)
    return t, mb, b, P, n_parts, live, start, end, n_pf, j_lo, n, kv_row


@gluon.jit
def _kbar(bars, RIGHT: gl.constexpr, slot: gl.constexpr, c: gl.constexpr, NCH: gl.constexpr):
    """The mbarrier of chunk c of slot `slot`'s left (RIGHT False) or right half."""
    return bars.index(1 + (2 * RIGHT + slot) * NCH + c)


@gluon.jit
def _load_half(desc, bars, RIGHT: gl.constexpr, slot: gl.constexpr, dst, row, col0, pred,
               NCH: gl.constexpr, TAIL_BYTES: gl.constexpr = 0):
    """Columns col0 .. col0 + dst.shape[1] of K rows row..row + 63 into dst (one half of slot
    `slot`), NCH chunks each under its own mbarrier (desc's box is a chunk); the last chunk's
    barrier also expects TAIL_BYTES (the rope, copied after it by _load_right)."""
    CW: gl.constexpr = dst.shape[1] // NCH
    for c in gl.static_range(NCH):
        bar = _kbar(bars, RIGHT, slot, c, NCH)
        if c == NCH - 1:
            mbarrier.expect(bar, desc.block_type.nbytes + TAIL_BYTES, pred=pred)
        else:
            mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
        if NCH == 1:
            tma.async_copy_global_to_shared(desc, [row, col0], bar, dst, pred=pred)
        else:
            tma.async_copy_global_to_shared(desc, [row, col0 + c * CW], bar,
                                            dst.slice(c * CW, CW, dim=1), pred=pred)


@gluon.jit
def _load_left(desc, bars, slot: gl.constexpr, dst, row, pred, NCH: gl.constexpr):
    """Slot `slot`'s left half (columns [0, C/2))."""
    _load_half(desc, bars, False, slot, dst, row, 0, pred, NCH)


@gluon.jit
def _load_right(kh_desc, kr_desc, bars, slot: gl.constexpr, dst_h, dst_r, row, pred,
                C: gl.constexpr, NCH: gl.constexpr):
    """Slot `slot`'s right half (columns [C/2, C)), the rope (columns C..) with its last
    chunk."""
    _load_half(kh_desc, bars, True, slot, dst_h, row, C // 2, pred, NCH,
               kr_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(kr_desc, [row, C], _kbar(bars, True, slot, NCH - 1, NCH),
                                    dst_r, pred=pred)


@gluon.jit
def _qk_half(q, k, bars, RIGHT: gl.constexpr, slot: gl.constexpr, ph, s, FIRST: gl.constexpr,
             NCH: gl.constexpr, pred=True):
    """Issue S (+)= Q_half K_half^T of slot `slot`'s tile (RIGHT: the right half), chunk by
    chunk as each lands (async)."""
    CW: gl.constexpr = k.shape[1] // NCH
    for c in gl.static_range(NCH):
        mbarrier.wait(_kbar(bars, RIGHT, slot, c, NCH), ph, pred=pred)
        if NCH == 1:
            s = warpgroup_mma(q, k.permute((1, 0)), s, use_acc=not FIRST, is_async=True)
        else:
            s = warpgroup_mma(q.slice(c * CW, CW, dim=1), k.slice(c * CW, CW, dim=1).permute(
                (1, 0)), s, use_acc=not (FIRST and c == 0), is_async=True)
    return s


@gluon.jit
def _qk_right(q, k, qr, kr, bars, slot: gl.constexpr, ph, s, FIRST: gl.constexpr,
              NCH: gl.constexpr, pred=True):
    """Issue S (+)= Q_R K_R^T + Qr Kr^T (Q's rope from registers) of slot `slot`'s tile."""
    s = _qk_half(q, k, bars, True, slot, ph, s, FIRST, NCH, pred)
    return warpgroup_mma(qr, kr.permute((1, 0)), s, is_async=True)


@gluon.jit
def _seen(bars, RIGHT: gl.constexpr, slot: gl.constexpr, ph, NCH: gl.constexpr):
    """Wait for every chunk of a half this warpgroup did not score itself (the TMA's bytes
    become visible to the waiting threads; complete already, the other warpgroup waited)."""
    for c in gl.static_range(NCH):
        mbarrier.wait(_kbar(bars, RIGHT, slot, c, NCH), ph)


@gluon.jit
def _masked_scores(s, i, n_pf, start, end, P, j_lo, N, T, anc_rows, row_ok, saw, qk_scale,
                   S_L: gl.constexpr, BLOCK_N: gl.constexpr):
    """Scaled scores of tile i, -inf where the row must not see the key (v9's two masks)."""
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    if i < n_pf:  # prefix: keys before the tile's nominal start belong to the previous tile
        k0 = start + i * BLOCK_N
        out = gl.where((gl.minimum(k0, end - BLOCK_N) + cols >= k0)[None, :], s * qk_scale,
                       NEG_INF)
    else:  # masked: prefix (j < 0, P < 64 only) or an ancestor bit; x < T for memory safety
        j0 = j_lo + (i - n_pf) * BLOCK_N
        j = j0 + cols
        x = P + j
        ok = (x >= 0) & (j < N) & (x < T)
        word = gl.load(anc_rows + (gl.maximum(j0, 0) // 64) * saw, mask=row_ok & (j0 >= 0),
                       other=0)
        # the bit test in 32-bit halves: an int64 [64, 64] shift would hold 64 registers
        lo = word.to(gl.int32)
        hi = (word >> 32).to(gl.int32)
        sh = gl.maximum(j, 0) % 32
        half = gl.where((gl.maximum(j, 0) % 64 < 32)[None, :], lo[:, None], hi[:, None])
        vis = (((half >> sh[None, :]) & 1) != 0) | (j < 0)[None, :]
        out = gl.where(vis & ok[None, :], s * qk_scale, NEG_INF)
    return out


@gluon.jit
def _zero_rows(v_s, i, n_pf, P, j_lo, N, T, CH: gl.constexpr, PW: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """Masked tile i only: zero the rows of this warpgroup's V half v_s [64, CH] that the tile
    must not see (their P is 0, but 0 x NaN is NaN), PW columns at a time; then fence and a
    warpgroup barrier so the PV wgmma reads the zeros."""
    if i >= n_pf:
        ZL: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (PW // 8), PW // 8], [4, 1], [1, 0])
        j = j_lo + (i - n_pf) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ZL))
        x = P + j
        ok = (x >= 0) & (j < N) & (x < T)
        for c in gl.static_range(CH // PW):
            piece = v_s.slice(c * PW, PW, dim=1)
            v = piece.load(ZL)
            piece.store(gl.where(ok[:, None], v, gl.zeros_like(v)))
        fence_async_shared()  # generic-proxy stores, then wgmma's async-proxy reads
        gl.thread_barrier()


@gluon.jit
def _epilogue(acc, m_i, l_i, W: gl.constexpr, b, mb, M, t, n_parts, S_GRID, live, o_ptr,
              lse_ptr, opart_ptr, lpart_ptr, S_L: gl.constexpr, O_L: gl.constexpr,
              RCP: gl.constexpr = False):
    """Warpgroup W's C/2 columns of the part's answer (v9's stores); WG0 also the lse. RCP
    (gluon_v19): O times one reciprocal of l a row instead of O / l (div.full.f32 a value:
    ~4 SASS each, ~900 in an epilogue run once a CTA, fetched cold; session 16's ncu)."""
    CH: gl.constexpr = acc.shape[1]
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    rows = mb * 64 + gl.arange(0, 64, layout=ROW)
    row_ok = (rows < M) & live
    seen = l_i > 0  # l = 0: rows past M, or a row no key is visible to (malformed input)
    lse2 = gl.where(seen, m_i + gl.log2(gl.where(seen, l_i, 1.0)), NEG_INF)
    if RCP:
        out = acc * gl.convert_layout(1.0 / gl.where(seen, l_i, 1.0),
                                      gl.SliceLayout(1, O_L))[:, None]
    else:
        out = acc / gl.convert_layout(gl.where(seen, l_i, 1.0), gl.SliceLayout(1, O_L))[:, None]
    rows_o = mb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, O_L))
    cols = gl.arange(0, CH, layout=gl.SliceLayout(0, O_L))
    keep = ((rows_o < M) & live)[:, None] & (cols < CH)[None, :]
    C: gl.constexpr = 2 * CH
    if n_parts == 1:  # the whole answer: no partial round trip, no combine
        o_rows = b * M + rows_o
        gl.store(o_ptr + o_rows[:, None] * C + (W * CH + cols)[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=keep)
        if W == 0:
            gl.store(lse_ptr + b * M + rows, lse2 * LN2, mask=row_ok)
    else:
        part = (b * S_GRID + t) * M
        gl.store(opart_ptr + (part + rows_o)[:, None] * C + (W * CH + cols)[None, :], out,
                 mask=keep)
        if W == 0:
            gl.store(lpart_ptr + part + rows, lse2, mask=row_ok)


@gluon.jit
def _start(qr_s, bars, anc_ptr, b, mb, M, H, sab, san, S_L: gl.constexpr, O_L: gl.constexpr,
           CH: gl.constexpr):
    """A warpgroup's start: its rows' validity and ancestor-word pointers, the running max
    (M_INIT, log2 units), l (this warpgroup's tiles' p, scaled to that max) and O at zero, and
    Q's rope columns in registers once Q has landed (the register A operand of every rope
    QK^T; Q's rope buffer then holds P1)."""
    rows = mb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, S_L))
    m_i = gl.full([64], M_INIT, gl.float32, gl.SliceLayout(1, S_L))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, CH], gl.float32, O_L)
    mbarrier.wait(bars.index(B_Q), 0)
    qr = qr_s.load(gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2))
    return rows < M, anc_ptr + b * sab + (rows // H) * san, m_i, l_i, acc, qr


@gluon.jit
def _wg0(q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc, kr_desc,
         anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T, N, H, M, b, mb, t,
         n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live, qk_scale,
         C: gl.constexpr, PW: gl.constexpr, BLOCK_N: gl.constexpr, S_L: gl.constexpr,
         O_L: gl.constexpr, NCH: gl.constexpr, PUB: gl.constexpr, RCP: gl.constexpr = False):
    """Warpgroup 0 (the default partition): even tiles' scores, value columns [0, C/2)."""
    CH: gl.constexpr = C // 2
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    A_O: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    dtype: gl.constexpr = q_s.dtype
    row_ok, anc_rows, m_i, l_i, acc, qr = _start(qr_s, bars, anc_ptr, b, mb, M, H, sab, san,
                                                 S_L, O_L, CH)
    s = gl.zeros([64, 64], gl.float32, S_L)
    if n > 0:  # S_0: tile 0's halves were issued before the fork
        s = _qk_half(q_s.index(0), kl_s.index(0), bars, False, 0, 0, s, True, NCH)
        s = _qk_right(q_s.index(1), kh_s.index(0), qr, kr_s.index(0), bars, 0, 0, s, False, NCH)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    for k in range(gl.cdiv(n, 2)):
        i = 2 * k  # this pair: tile i (slot 0, mine), tile i + 1 (slot 1, WG1's) if i + 1 < n
        ph = k & 1
        # views indexed by a zero the compiler cannot hoist: the wgmma descriptors of Q and
        # the K slots are then formed in the loop instead of kept live across it (spilled)
        z = k >> 30
        ql, qh = q_s.index(z), q_s.index(z + 1)
        kl0, kl1 = kl_s.index(z), kl_s.index(z + 1)
        kh0, kr0 = kh_s.index(z), kr_s.index(z)  # WG0 reads slot 1's left half only
        s = _masked_scores(s, i, n_pf, start, end, P, j_lo, N, T, anc_rows, row_ok, saw,
                           qk_scale, S_L, BLOCK_N)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        pb = p.to(dtype)
        # publish m_i and P_i; p0_s's last reader (WG1's PV of the previous pair) retired
        # before WG1 signalled NB_P1, which this warpgroup waited for in that pair
        p0_s.store(pb)
        sm_s.store(m_new)
        fence_async_shared()  # generic-proxy stores, then WG1's wgmma reads
        _publish(NB_M0, PUB)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        _zero_rows(kl0, i, n_pf, P, j_lo, N, T, CH, PW, BLOCK_N)
        acc = warpgroup_mma(gl.convert_layout(pb, A_O), kl0, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        # slot 0's left half is read by no one else: tile i + 2's left half may land
        _load_left(kh_desc, bars, 0, kl0, _row(i + 2, n_pf, start, end, P, j_lo, kv_row, BLOCK_N),
                   i + 2 < n, NCH)
        # WG1's max m_{i+1} and the factor exp2(m_i - m_{i+1}) (1 without a tile i + 1)
        _handoff(NB_M1)
        sc = sc_s.load(ROW)
        m_i = sm_s.load(ROW)
        l_i = l_i * sc
        acc = acc * gl.convert_layout(sc, ROW_O)[:, None]
        # P_{i+1} in qr_s (if any) and WG1 done with p0_s; every pair, both sides (ptxas
        # 12.8 crashes on a named barrier under a branch here)
        _handoff(NB_P1)
        if i + 1 < n:  # (without a tile i + 1 there is no tile i + 2 either: the last pair)
            _seen(bars, False, 1, ph, NCH)  # the TMA's bytes, seen by this warpgroup
            _zero_rows(kl1, i + 1, n_pf, P, j_lo, N, T, CH, PW, BLOCK_N)
            acc = warpgroup_mma(qr_s, kl1, acc, is_async=True)
            # S_{i+2}, left half first (it was issued first); on the last pair nothing was
            # loaded: the barriers are skipped and the MMAs read slot 0's old tile, unused
            more = i + 2 < n
            s = _qk_half(ql, kl0, bars, False, 0, (k + 1) & 1, s, True, NCH, pred=more)
            # retire sP1 V_L (the oldest group): slot 1's left half is free for tile i + 3
            acc = warpgroup_mma_wait(num_outstanding=NCH, deps=(acc,))
            _load_left(kh_desc, bars, 1, kl1,
                       _row(i + 3, n_pf, start, end, P, j_lo, kv_row, BLOCK_N), i + 3 < n, NCH)
            s = _qk_right(qh, kh0, qr, kr0, bars, 0, (k + 1) & 1, s, False, NCH, pred=more)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    # l = WG0's + WG1's sums, added once here in this order and handed back to WG1
    _handoff(NB_LW1)
    l_i = l_i + sl_s.load(ROW)
    sc_s.store(l_i)
    _publish(NB_LSUM, PUB)
    _epilogue(acc, m_i, l_i, 0, b, mb, M, t, n_parts, S_GRID, live, o_ptr, lse_ptr, opart_ptr,
              lpart_ptr, S_L, O_L, RCP)


@gluon.jit
def _wg1(q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc, kr_desc,
         anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T, N, H, M, b, mb, t,
         n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live, qk_scale,
         C: gl.constexpr, PW: gl.constexpr, BLOCK_N: gl.constexpr, S_L: gl.constexpr,
         O_L: gl.constexpr, NCH: gl.constexpr, PUB: gl.constexpr, RCP: gl.constexpr = False):
    """Warpgroup 1 (the worker partition): odd tiles' scores, value columns [C/2, C)."""
    CH: gl.constexpr = C // 2
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    A_O: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    dtype: gl.constexpr = q_s.dtype
    row_ok, anc_rows, m_i, l_i, acc, qr = _start(qr_s, bars, anc_ptr, b, mb, M, H, sab, san,
                                                 S_L, O_L, CH)
    s = gl.zeros([64, 64], gl.float32, S_L)
    if n > 1:  # S_1, right half and rope first (the order slot 1 is refilled in the loop)
        s = _qk_right(q_s.index(1), kh_s.index(1), qr, kr_s.index(1), bars, 1, 0, s, True, NCH)
        s = _qk_half(q_s.index(0), kl_s.index(1), bars, False, 1, 0, s, False, NCH)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    for k in range(gl.cdiv(n, 2)):
        i = 2 * k
        ph = k & 1
        # views indexed by a zero the compiler cannot hoist: the wgmma descriptors of Q and
        # the K slots are then formed in the loop instead of kept live across it (spilled)
        z = k >> 30
        ql, qh = q_s.index(z), q_s.index(z + 1)
        kl1 = kl_s.index(z + 1)  # WG1 reads slot 0's right half and rope only
        kh0, kh1 = kh_s.index(z), kh_s.index(z + 1)
        kr0, kr1 = kr_s.index(z), kr_s.index(z + 1)
        has1 = i + 1 < n
        _handoff(NB_M0)  # WG0 published m_i and P_i
        m_b = sm_s.load(ROW)
        # O_R to m_i and P_i V_R (WG0's tile i) first: that PV runs under this warpgroup's
        # softmax of tile i + 1, and its retirement frees slot 0's right half early
        acc = acc * gl.convert_layout(gl.exp2(m_i - m_b), ROW_O)[:, None]
        _seen(bars, True, 0, ph, NCH)  # tile i's right half, seen by this warpgroup
        _zero_rows(kh0, i, n_pf, P, j_lo, N, T, CH, PW, BLOCK_N)
        acc = warpgroup_mma(p0_s, kh0, acc, is_async=True)
        m_new = m_b
        if has1:
            s = _masked_scores(s, i + 1, n_pf, start, end, P, j_lo, N, T, anc_rows, row_ok, saw,
                               qk_scale, S_L, BLOCK_N)
            m_new = gl.maximum(m_b, gl.max(s, axis=1))
        p = gl.exp2(s - m_new[:, None])  # unused without a tile i + 1
        sc = gl.exp2(m_b - m_new)  # from m_i to m_{i+1}; 1 without a tile i + 1
        l_i = l_i * gl.exp2(m_i - m_new)
        if has1:
            l_i = l_i + gl.sum(p, axis=1)
            sm_s.store(m_new)
        sc_s.store(sc)
        _publish(NB_M1, PUB)
        pb = p.to(dtype)
        if has1:
            qr_s.store(pb)  # P_{i+1} for WG0 (both hold Q's rope in registers)
            fence_async_shared()
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        # p0_s read and P_{i+1} stored: WG0 may use qr_s and rewrite p0_s
        _publish(NB_P1, PUB)
        # slot 0's right half and rope (the rope was WG0's QK^T's) for tile i + 2
        _load_right(kh_desc, kr_desc, bars, 0, kh0, kr0,
                    _row(i + 2, n_pf, start, end, P, j_lo, kv_row, BLOCK_N), i + 2 < n, C, NCH)
        m_i = m_new
        if has1:
            acc = acc * gl.convert_layout(sc, ROW_O)[:, None]
            _zero_rows(kh1, i + 1, n_pf, P, j_lo, N, T, CH, PW, BLOCK_N)
            acc = warpgroup_mma(gl.convert_layout(pb, A_O), kh1, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            # slot 1's right half and rope for tile i + 3, then S_{i+3} in that order
            more = i + 3 < n
            _load_right(kh_desc, kr_desc, bars, 1, kh1, kr1,
                        _row(i + 3, n_pf, start, end, P, j_lo, kv_row, BLOCK_N), more, C, NCH)
            if more:
                s = _qk_right(qh, kh1, qr, kr1, bars, 1, (k + 1) & 1, s, True, NCH)
                s = _qk_half(ql, kl1, bars, False, 1, (k + 1) & 1, s, False, NCH)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    sl_s.store(l_i)
    _publish(NB_LW1, PUB)
    _handoff(NB_LSUM)
    l_i = sc_s.load(ROW)
    _epilogue(acc, m_i, l_i, 1, b, mb, M, t, n_parts, S_GRID, live, o_ptr, lse_ptr, opart_ptr,
              lpart_ptr, S_L, O_L, RCP)


@gluon.jit
def _own(q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc, kr_desc, anc_ptr,
         o_ptr, lse_ptr, opart_ptr, lpart_ptr, plen_ptr, s_plen, sab, san, saw, T, N, H, M,
         S_GRID, qk_scale, C: gl.constexpr, PW: gl.constexpr, SHORT_UPTO: gl.constexpr,
         SHORT_LEN: gl.constexpr, LONG_MIN: gl.constexpr, MAX_SPLITS: gl.constexpr,
         BLOCK_N: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr, NCH: gl.constexpr,
         PUB: gl.constexpr, WG: gl.constexpr, RCP: gl.constexpr = False):
    """gluon_v14's partitions: warpgroup WG's `_wg0` / `_wg1` on the geometry it computes from
    the kernel's arguments itself, so that no computed scalar is stored for it at the fork."""
    t, mb, b, P, n_parts, live, start, end, n_pf, j_lo, n, kv_row = _geometry(
        plen_ptr, s_plen, T, N, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if WG == 0:
        _wg0(q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc, kr_desc,
             anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T, N, H, M, b, mb,
             t, n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live, qk_scale, C, PW,
             BLOCK_N, S_L, O_L, NCH, PUB, RCP)
    else:
        _wg1(q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc, kr_desc,
             anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T, N, H, M, b, mb,
             t, n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live, qk_scale, C, PW,
             BLOCK_N, S_L, O_L, NCH, PUB, RCP)


@gluon.jit
def _attn_kernel(qh_desc, qr_desc, kh_desc, kr_desc, plen_ptr, anc_ptr, o_ptr, lse_ptr,
                 opart_ptr, lpart_ptr, s_plen, sab, san, saw, T, N, H, M, S_GRID, qk_scale,
                 C: gl.constexpr, PW: gl.constexpr, SHORT_UPTO: gl.constexpr,
                 SHORT_LEN: gl.constexpr, LONG_MIN: gl.constexpr, MAX_SPLITS: gl.constexpr,
                 BLOCK_N: gl.constexpr, USE_PDL: gl.constexpr, NCH: gl.constexpr,
                 PUB: gl.constexpr, OWN: gl.constexpr, RCP: gl.constexpr = False):
    if USE_PDL:  # the combine may launch now and wait in griddepcontrol.wait (v4)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    CH: gl.constexpr = C // 2
    # each partition is one warpgroup: S [64, 64] and O [64, C/2] as single-warpgroup wgmma
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, CH, 16])
    t, mb, b, P, n_parts, live, start, end, n_pf, j_lo, n, kv_row = _geometry(
        plen_ptr, s_plen, T, N, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)

    dtype: gl.constexpr = kh_desc.dtype
    q_s = gl.allocate_shared_memory(dtype, [2, 64, CH], qh_desc.layout)  # Q's two halves
    qr_s = gl.allocate_shared_memory(dtype, [64, 64], qr_desc.layout)  # later P1
    kl_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, CH], kh_desc.layout)
    kh_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, CH], kh_desc.layout)
    kr_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, 64], kr_desc.layout)
    p0_s = gl.allocate_shared_memory(dtype, [64, BLOCK_N], qr_desc.layout)
    VL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sm_s = gl.allocate_shared_memory(gl.float32, [64], VL)  # the running max, published
    sc_s = gl.allocate_shared_memory(gl.float32, [64], VL)  # WG1's factor; at the end l
    sl_s = gl.allocate_shared_memory(gl.float32, [64], VL)  # WG1's l at the end
    bars = gl.allocate_shared_memory(gl.int64, [1 + 4 * NCH, 1], mbarrier.MBarrierLayout())
    for x in gl.static_range(1 + 4 * NCH):
        mbarrier.init(bars.index(x), count=1)
    # Q: rows b * M + mb * 64 .. of q viewed [B * M, D] (rows past M: the next request's or
    # zero fill, row-local, never stored); tiles 0 and 1, each half under its own barrier
    q_row = (b * M + mb * 64).to(gl.int32)
    mbarrier.expect(bars.index(B_Q), 2 * qh_desc.block_type.nbytes + qr_desc.block_type.nbytes,
                    pred=live)
    tma.async_copy_global_to_shared(qh_desc, [q_row, 0], bars.index(B_Q), q_s.index(0),
                                    pred=live)
    tma.async_copy_global_to_shared(qh_desc, [q_row, CH], bars.index(B_Q), q_s.index(1),
                                    pred=live)
    tma.async_copy_global_to_shared(qr_desc, [q_row, C], bars.index(B_Q), qr_s, pred=live)
    if not live:  # nothing will load Q: let both partitions pass the Q barrier
        mbarrier.arrive(bars.index(B_Q), count=1)
    for s in gl.static_range(2):
        row = _row(s, n_pf, start, end, P, j_lo, kv_row, BLOCK_N)
        _load_left(kh_desc, bars, s, kl_s.index(s), row, s < n, NCH)
        _load_right(kh_desc, kr_desc, bars, s, kh_s.index(s), kr_s.index(s), row, s < n, C, NCH)
    if OWN:  # gluon_v14: nothing computed crosses the fork (each partition its _geometry)
        gl.thread_barrier()  # the barrier inits and TMA issues above, before the fork
        gl.warp_specialize([
            (_own, (q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc,
                    kr_desc, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, plen_ptr, s_plen,
                    sab, san, saw, T, N, H, M, S_GRID, qk_scale, C, PW, SHORT_UPTO, SHORT_LEN,
                    LONG_MIN, MAX_SPLITS, BLOCK_N, S_L, O_L, NCH, PUB, 0, RCP)),
            (_own, (q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc,
                    kr_desc, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, plen_ptr, s_plen,
                    sab, san, saw, T, N, H, M, S_GRID, qk_scale, C, PW, SHORT_UPTO, SHORT_LEN,
                    LONG_MIN, MAX_SPLITS, BLOCK_N, S_L, O_L, NCH, PUB, 1, RCP)),
        ], [4], [240])
    else:
        gl.warp_specialize([
            (_wg0, (q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc,
                    kr_desc, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T,
                    N, H, M, b, mb, t, n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live,
                    qk_scale, C, PW, BLOCK_N, S_L, O_L, NCH, PUB, RCP)),
            (_wg1, (q_s, qr_s, kl_s, kh_s, kr_s, p0_s, sm_s, sc_s, sl_s, bars, kh_desc,
                    kr_desc, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, sab, san, saw, P, T,
                    N, H, M, b, mb, t, n_parts, S_GRID, n, n_pf, start, end, j_lo, kv_row, live,
                    qk_scale, C, PW, BLOCK_N, S_L, O_L, NCH, PUB, RCP)),
        ], [4], [240])


def _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
            policy: Policy, chunks: bool = False, publish: bool = False, own: bool = False,
            combine=None, rcp: bool = False):
    """chunks: gluon_v12's K halves in 64-column chunks under their own mbarriers; publish:
    gluon_v13's partition barrier before each publishing rendezvous (`_publish`); own:
    gluon_v14's partitions computing their own geometry (`_own`); combine: a Triton
    version's LSE-merge launcher in place of v4's (gluon_v18: triton_v17's; sweeps: v8's);
    rcp: gluon_v19's epilogue (O times a reciprocal of l a row, `_epilogue`)."""
    B, N, H, D, T, C, M, q, o_lat, lse = _check(q, kv_cache, prefix_lens, anc_bits,
                                                softmax_scale, kv_lora_rank, validate, "gluon_v11")
    if B == 0:
        return o_lat, lse
    CH = C // 2
    nch = CH // min(64, CH) if chunks else 1  # K half chunks (a box is one)
    G, o_part, l_part, consts, q_desc, kv_desc = _plan(q, kv_cache, lse, B, M, T, C, policy)
    _attn_kernel[(G, triton.cdiv(M, BLOCK_M), B)](
        q_desc([BLOCK_M, CH]), q_desc([BLOCK_M, RP]), kv_desc([BLOCK_N, CH // nch]),
        kv_desc([BLOCK_N, RP]), prefix_lens, anc_bits, o_lat, lse, o_part, l_part,
        prefix_lens.stride(0), *anc_bits.stride(), T, N, H, M, G,
        float(softmax_scale) * LOG2E, C=C, PW=min(64, CH), **consts, USE_PDL=G > 1, NCH=nch,
        PUB=publish, OWN=own, RCP=rcp, num_warps=4)
    return _combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, consts, combine)


# past P = 2048 at 32 heads or more: >= 1024-key splits (<= 8) instead of v4's <= 16 of 512.
# A 64-head verify fills the GPU with its row blocks, and v4's parts cost it their partials:
# N 129 x P 8192 writes and re-reads [17, 8256, 512] fp32 (287 MB) through the combine
# (session 13 call 3, scripts/sweep_tree_mla_policy.py). Still fixed per request (H is the
# model's per-rank head count, as triton_v7's policy); N = 1 pays with fewer programs.
LONG = V4._replace(long_min=1024, max_splits=8)


def policy_long(q: torch.Tensor) -> Policy:
    """LONG at >= 32 heads (q [B, N, H, C+R]), v4's policy below."""
    return LONG if q.dim() == 4 and q.shape[2] >= 32 else V4


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); v4's split policy and combine. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4)


def tree_mla_gluon_long(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                        anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                        validate: bool = False):
    """gluon_v11 under `policy_long(q)`: fewer, longer prefix splits past P = 2048 at >= 32
    heads (less partial traffic for a large verify, fewer programs for N = 1)."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_long(q))
