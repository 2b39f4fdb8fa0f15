"""tree_mla v6: v5's position invariance (a row's bits are a function of its own ordered key
sequence: prefix, then its ancestors in slot order) at closer to v4's speed (README.md,
"Design (v6)"). What v6 changes is how the bytes arrive and how many programs share a row, not
which values a tile computes on:

1. Tiles wholly inside the committed prefix (virtual positions [v0, v0 + 64) all < P_b, so
   slot = v) come by TMA (host descriptors, as v3/v4), the others (the tile that reaches P_b
   and every tree tile) through v5's gather (slot map + masked row loads). Both loops call ONE
   tile function (_tile): the same S = Qc Kc^T + Qr Kr^T, mask, base-2 online softmax and
   acc += P V on a [64, 576] tile of the same values. A token verified at depth d (its tile at
   v0 may be gathered: it reaches P) and decoded plainly (prefix P + d: that tile is TMA) thus
   compute on equal operands with equal float code; fp fusion is off (enable_fp_fusion=False)
   so that no mul/add pair is contracted into an FMA in one loop and not in the other.
2. Splits from the row's own key count L (the same for AR and DDTree): v4's policy applied to
   L: 256-key splits while L <= 2048, up to 32 splits of >= 512 keys beyond.
3. The combine is a programmatic dependent launch (PDL), as v4.

    launch 1  _attn_kernel     grid (S, N * ceil(H / 64), B)
              program (s, node * HB + hb, b): heads hb*64 .. hb*64+63 of one node x split s
              of the node's virtual sequence; tiles [start, tma_end) by TMA, [tma_end, end)
              gathered; n = splits(L); n == 1 writes o_lat / lse, else fp32 partial slot s.
    launch 2  _combine_kernel  grid (N * ceil(H / 16), CP / 128, B)   (only if S > 1)
              rows of nodes with n > 1: LSE merge of parts 0, 1, ..., n - 1 in that order.

Every launch constant is fixed or derived from C and the dtype; shape integers and strides
are not specialised (do_not_specialize; descriptors carry no shape specialisation), so AR
(N = 1) and DDTree (N = 129) run the same binary. Without TMA (fp32, unaligned cache, the
CPU interpreter's fp32 tests) loop 1 loads its identity-slot tiles with pointer loads.
Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _common
from ._common import BLOCK_N
from .triton_v1 import _load_k
from .triton_v3 import _tma_ok
from .triton_v5 import (
    _buffers,
    _load_q,
    _merge_parts,
    _row_len,
    _store_out,
    _tile,
    _tree_slots,
)

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # log2 units -> natural log
BLOCK_M = 64  # heads of ONE node per program (rows >= H masked): one wgmma M tile
COMBINE_ROWS = 16  # heads per combine program (x 128 columns)
# the policy, on the row's key count L (v4's numbers, v4 applies them to P)
SHORT_UPTO = 2048
SHORT_LEN = 256
LONG_MIN = 512
MAX_SPLITS = 32
_NO_SPEC = ("sqb", "sqn", "sqh", "skb", "skt", "s_plen", "sab", "san", "saw", "T", "N", "H",
            "M", "S_GRID")


def row_len(P: int, n_anc: int, T: int) -> int:
    """Host twin of _row_len: keys of a row with prefix P and n_anc ancestors-or-self."""
    return min(max(P, 0) + n_anc, T)


def split_len(L: int) -> int:
    """Host twin of _split: keys per split of a row with L keys."""
    if L <= SHORT_UPTO:
        return SHORT_LEN
    per = -(-L // MAX_SPLITS)
    return max(LONG_MIN, -(-per // BLOCK_N) * BLOCK_N)


def num_splits(L: int) -> int:
    """Parts of a row with L keys (>= 1: an empty row still writes its 0 / -inf)."""
    return max(1, -(-L // split_len(L)))


def splits_grid(T: int) -> int:
    """Split programs per node in the grid, from T only: max of num_splits(L) over L <= T."""
    short = -(-min(T, SHORT_UPTO) // SHORT_LEN)
    return max(1, short, min(MAX_SPLITS, -(-T // LONG_MIN)) if T > SHORT_UPTO else 1)


@triton.jit
def _split(L, SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr,
           MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(split length, parts) of a row with L keys (host twins split_len / num_splits)."""
    long = tl.maximum(tl.cdiv(tl.cdiv(L, MAX_SPLITS), BLOCK_N) * BLOCK_N, LONG_MIN)
    length = tl.where(L <= SHORT_UPTO, SHORT_LEN, long)
    return length, tl.maximum(tl.cdiv(L, length), 1)


@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_kernel(q_ptr, kv_ptr, kc_desc, kr_desc, plen_ptr, anc_ptr, o_ptr, lse_ptr, opart_ptr,
                 lpart_ptr, map_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SHORT_UPTO: tl.constexpr,
                 SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr,
                 UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
                 USE_PDL: tl.constexpr):
    if USE_PDL:  # the combine may launch once every program here has started (v4)
        gdc_launch_dependents()
    s_id = tl.program_id(0)
    HB = tl.cdiv(H, BLOCK_M)
    node = tl.program_id(1) // HB
    hb = tl.program_id(1) % HB
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    anc_row = anc_ptr + b * sab + node * san
    L = _row_len(anc_row, saw, P, N, T)
    length, n = _split(L, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if s_id < n:  # the grid covers splits_grid(T); the rest exit before any load
        start = s_id * length  # a multiple of BLOCK_N: tiles sit at v = 64 k in every mode
        end = tl.minimum(start + length, L)
        # tiles [start, tma_end) lie wholly inside the prefix (v0 + 64 <= P; end is a multiple
        # of 64 whenever end < L, and L >= P): slot = v, no map, loaded by TMA
        tma_end = tl.maximum(start, tl.minimum(end, (P // BLOCK_N) * BLOCK_N))
        # v5's slot map for this program's tree part u = v - P, v in [max(start, P), end)
        map_row = map_ptr + ((b * N + node) * HB + hb) * N
        u_hi = end - P
        for u0 in range(tl.maximum(start - P, 0), u_hi, BLOCK_N):
            u = u0 + tl.arange(0, BLOCK_N)
            tl.store(map_row + u, _tree_slots(anc_row, saw, u, N, BLOCK_N), mask=u < u_hi)
        tl.debug_barrier()  # the gather loop's threads read what other threads wrote
        heads = hb * BLOCK_M + tl.arange(0, BLOCK_M)
        head_ok = heads < H
        cc = tl.arange(0, CP)
        rr = tl.arange(0, RP)
        qc, qr = _load_q(q_ptr + b * sqb + node * sqn, heads, head_ok, cc, rr, sqh, sqd, C, R,
                         UPCAST)
        kv_b = kv_ptr + b * skb
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_M, CP], tl.float32)  # sum of p * V
        for v0 in range(start, tma_end, BLOCK_N):  # loop 1: prefix tiles, no mask, no map
            v = v0 + tl.arange(0, BLOCK_N)
            ok = (v < L) & (v < T)  # all true here; computed as the gather loop does
            if USE_TMA:
                kc = kc_desc.load([b.to(tl.int32), v0, 0]).reshape(BLOCK_N, CP)
                kr = kr_desc.load([b.to(tl.int32), v0, C]).reshape(BLOCK_N, RP)
                if UPCAST:
                    kc = kc.to(tl.float32)
                    kr = kr.to(tl.float32)
            else:
                kc, kr = _load_k(kv_b, v, ok, skt, skd, C, R, CP, RP, UPCAST)
            m_i, l_i, acc = _tile(qc, qr, kc, kr, ok, m_i, l_i, acc, qk_scale, DOT_PREC)
        for v0 in range(tma_end, end, BLOCK_N):  # loop 2: the tile reaching P, tree tiles
            v = v0 + tl.arange(0, BLOCK_N)
            j = tl.load(map_row + (v - P), mask=(v >= P) & (v < end), other=0)
            slot = tl.where(v < P, v, P + j)
            ok = (v < L) & (slot < T)  # keys past the row's sequence: load 0, score -inf
            kc, kr = _load_k(kv_b, slot, ok, skt, skd, C, R, CP, RP, UPCAST)
            m_i, l_i, acc = _tile(qc, qr, kc, kr, ok, m_i, l_i, acc, qk_scale, DOT_PREC)
        # L = 0 (P = 0 and an empty mask word: malformed) leaves l_i = 0: out 0, lse -inf
        l_i = tl.where(head_ok & (l_i > 0), l_i, 1.0)
        out = acc / l_i[:, None]
        lse2 = m_i + tl.log2(l_i)
        _store_out(o_ptr, lse_ptr, opart_ptr, lpart_ptr, out, lse2, b, node, heads, head_ok, cc,
                   n, s_id, N, H, M, S_GRID, C, CP)


@triton.jit(do_not_specialize=_NO_SPEC)
def _combine_kernel(plen_ptr, anc_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, sab, san,
                    saw, T, N, H, M, S_GRID, C: tl.constexpr, CP: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SHORT_UPTO: tl.constexpr,
                    SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr,
                    BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr):
    """LSE merge of one node's n > 1 parts in the order 0, 1, ..., n - 1 (v5's, row-local)."""
    if USE_PDL:  # launched early (PDL): wait until _attn_kernel's writes are visible
        gdc_wait()
    RB = tl.cdiv(H, BLOCK_R)
    node = tl.program_id(0) // RB
    rb = tl.program_id(0) % RB
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    L = _row_len(anc_ptr + b * sab + node * san, saw, P, N, T)
    _length, n = _split(L, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if n > 1:
        _merge_parts(opart_ptr, lpart_ptr, o_ptr, lse_ptr, b, node, rb, cb, n, N, H, M, S_GRID,
                     C, CP, BLOCK_R, BLOCK_C)


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; a row's bits
    depend only on its own key sequence (module docstring). No host sync unless
    validate=True."""
    B, N, H, D, T, C, M, CP, RP, G, HB, o_lat, lse, slot_map, o_part, l_part = _buffers(
        q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate, splits_grid)
    if B == 0:
        return o_lat, lse
    use_tma = _tma_ok(kv_cache, C)
    if use_tma:  # host-built (pointer, shape, strides only: no sync, graph-capturable)
        shape, strides = list(kv_cache.shape), list(kv_cache.stride())
        kc_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, C])
        # RP >= R columns: those past C+R are outside the tensor, TMA fills them with 0 (the
        # gather's mask gives the same 0)
        kr_desc = TensorDescriptor(kv_cache, shape, strides, [1, BLOCK_N, RP])
    else:
        kc_desc = kr_desc = kv_cache  # unused (USE_TMA=False)
    interp = _common.interpreting()
    use_pdl = not interp and G > 1  # griddepcontrol is sm_90 inline PTX: not interpreted
    # no FMA contraction: the two loops' float code cannot differ by a fused mul/add (the
    # interpreter drops the option; PDL is a launch option it does not know)
    fuse = {"enable_fp_fusion": False}
    policy = dict(SHORT_UPTO=SHORT_UPTO, SHORT_LEN=SHORT_LEN, LONG_MIN=LONG_MIN,
                  MAX_SPLITS=MAX_SPLITS, BLOCK_N=BLOCK_N)
    _attn_kernel[(G, N * HB, B)](
        q, kv_cache, kc_desc, kr_desc, prefix_lens, anc_bits, o_lat, lse, o_part, l_part,
        slot_map, *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, G, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, BLOCK_M=BLOCK_M, UPCAST=interp,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=use_tma,
        USE_PDL=use_pdl, **policy, num_warps=8 if CP >= 256 else 4, num_stages=2, **fuse)
    if G > 1:
        block_c = min(CP, 128)
        _combine_kernel[(N * triton.cdiv(H, COMBINE_ROWS), CP // block_c, B)](
            prefix_lens, anc_bits, o_part, l_part, o_lat, lse, prefix_lens.stride(0),
            *anc_bits.stride(), T, N, H, M, G, C=C, CP=CP, BLOCK_R=COMBINE_ROWS,
            BLOCK_C=block_c, **policy, USE_PDL=use_pdl, num_warps=4, **fuse,
            **({} if interp else {"launch_pdl": use_pdl}))
    return o_lat, lse
