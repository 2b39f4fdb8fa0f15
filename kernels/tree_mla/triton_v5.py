"""tree_mla v5: position-invariant. A row's arithmetic is a function of its own ordered key
sequence only, so a token verified at depth d of a DDTree tree and the same token decoded
plainly (AR) at position P + d give the same o_lat and lse bits (README.md, "Design (v5)").

Virtual sequence of a row (node i of request b, len = P_b + popcount(anc_bits[b, i] below N)):
    v < P_b   -> slot v                       (the committed prefix)
    v >= P_b  -> slot P_b + j, j the (v - P_b)-th set bit of the row's mask (increasing j)
In a DDTree tree the ancestors of a node at depth d, in slot order, are its depth-0..d chain,
so after the accepted path is compacted into slots P..P+d this is exactly the slot sequence
0 .. P + d that AR decode of that token reads.

    launch 1  _attn_kernel     grid (S, N * ceil(H / 64), B)
              program (s, node * HB + hb, b): heads hb*64 .. hb*64+63 of one node (all share
              the node's mask) x split s of the node's virtual sequence, in tiles of 64
              virtual positions through ONE loop: a per-key slot vector (identity below P;
              from P on, read from the program's own part of a u -> j slot map that it
              writes first), gathered K rows, S = Qc Kc^T + Qr Kr^T, -inf past len, base-2
              online softmax, acc += P V. n = splits(len)
              (_common's policy applied to len, not P); n == 1: o_lat / lse written
              directly, else fp32 partial slot s. Programs with s >= n exit at once.
    launch 2  _combine_kernel  grid (N * ceil(H / 16), CP / 128, B)   (only if S > 1)
              rows of nodes with n > 1: LSE merge of parts 0, 1, ..., n - 1 in that order.

Every launch constant (BLOCK_M, BLOCK_N, warps, stages, the split policy) is fixed or derived
from C and the dtype only; shape integers and strides are not specialised on
(do_not_specialize), so AR (N = 1) and DDTree (N = 129) run the same binary.
Legend: _common.py. Softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common
from ._common import BLOCK_N, MAX_SPLITS, MIN_SPLIT
from .triton_v1 import _load_k

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # log2 units -> natural log
BLOCK_M = 64  # heads of ONE node per program (rows >= H masked): one wgmma M tile
WORD = 64  # bits per anc_bits word
COMBINE_ROWS = 16  # heads per combine program (x 128 columns)
# integer arguments that vary between AR and DDTree calls of the same token: never
# specialised (no ==1 / %16 variants), so both take the same compiled kernel
_NO_SPEC = ("sqb", "sqn", "sqh", "skb", "skt", "s_plen", "sab", "san", "saw", "T", "N", "H",
            "M", "S_GRID")


def row_len(P: int, n_anc: int, T: int) -> int:
    """Host twin of _row_len: keys of a row with prefix P and n_anc ancestors-or-self."""
    return min(max(P, 0) + n_anc, T)


def split_len(L: int) -> int:
    """Host twin of _split: keys per split of a row with L keys (_common's policy on L)."""
    return _common.split_len(L)


def num_splits(L: int) -> int:
    """Parts of a row with L keys (>= 1: an empty row still writes its 0 / -inf)."""
    return max(1, _common.num_splits(L))


def splits_grid(T: int) -> int:
    """Split programs per node in the grid, from T only: >= num_splits(L) for every L <= T."""
    return max(1, _common.splits_grid(T))


@triton.jit
def _popcount(x):
    """Set bits of int64 x (scalar or tensor) -> int32: SWAR on 64-bit words (every mask
    has bit 63 clear, so arithmetic shifts are harmless; the multiply wraps as unsigned)."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x & 0x0F0F0F0F0F0F0F0F) + ((x >> 4) & 0x0F0F0F0F0F0F0F0F)
    return ((x * 0x0101010101010101) >> 56).to(tl.int32) & 0xFF


@triton.jit
def _word(anc_row, saw, w, N):
    """Ancestor word w of the row, bits j >= N cleared (the reference reads j < N only)."""
    word = tl.load(anc_row + w * saw)
    nb = N - w * 64  # >= 1 for w < ceil(N / 64)
    one = tl.full([], 1, tl.int64)
    keep = tl.where(nb >= 64, -one, (one << tl.minimum(nb, 63).to(tl.int64)) - 1)
    return word & keep


@triton.jit
def _row_len(anc_row, saw, P, N, T):
    """Keys of the row: P + its ancestors-or-self, clamped to T (memory safety for a malformed
    P; never binding when P + N <= T). Integer only."""
    cnt = P
    for w in range(0, tl.cdiv(N, 64)):
        cnt += _popcount(_word(anc_row, saw, w, N))
    return tl.minimum(cnt, T)


@triton.jit
def _split(L, MIN_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(split length, parts) of a row with L keys (host twins split_len / num_splits)."""
    per = tl.cdiv(L, MAX_SPLITS)
    length = tl.maximum(tl.cdiv(per, BLOCK_N) * BLOCK_N, MIN_SPLIT)
    return length, tl.maximum(tl.cdiv(L, length), 1)


@triton.jit
def _tree_slots(anc_row, saw, u, N, BLOCK_N: tl.constexpr):
    """j [BLOCK_N]: the u-th set bit (0-based, increasing j) of the row's mask below N, for
    each u of the tile (unspecified where u < 0 or u >= the count: the caller masks those).
    The word holding rank u from the words' popcounts, then a 6-step binary search for the
    largest j with popcount(word & (2^j - 1)) <= r, which is the r-th set bit. [BLOCK_N]
    vectors only: a [keys, bits] match tile costs ~1 KB of spills beside the [64, 512] fp32
    accumulator on sm_90."""
    wk = tl.zeros([BLOCK_N], tl.int64)  # each key's word
    rk = u  # each key's rank inside that word
    jb = tl.zeros([BLOCK_N], tl.int32)  # 64 * the word's index
    base = tl.zeros([], tl.int32)
    for w in range(0, tl.cdiv(N, 64)):
        word = _word(anc_row, saw, w, N)
        c = _popcount(word)
        inw = (u >= base) & (u < base + c)
        wk = tl.where(inw, word, wk)
        rk = tl.where(inw, u - base, rk)
        jb = tl.where(inw, w * 64, jb)
        base += c
    pos = tl.zeros([BLOCK_N], tl.int32)
    one = tl.full([], 1, tl.int64)
    for i in tl.static_range(6):
        k = pos + (32 >> i)  # <= 63
        below = _popcount(wk & ((one << k.to(tl.int64)) - 1))
        pos = tl.where(below <= rk, k, pos)
    return jb + pos


@triton.jit
def _tile(qc, qr, kc, kr, ok, m_i, l_i, acc, qk_scale, DOT_PREC: tl.constexpr):
    """One 64-key tile of the online softmax: the only float code on K/V, called from the
    TMA loop and from the gather loop alike in v6 (keys not `ok`: score -inf, loaded as 0)."""
    s = tl.dot(qc, tl.trans(kc), input_precision=DOT_PREC)
    s = tl.dot(qr, tl.trans(kr), s, input_precision=DOT_PREC) * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))  # [BLOCK_M, BLOCK_N]
    # every tile holds >= 1 key of the row, but keep the subtracted max finite anyway (rows
    # past H see q = 0: finite scores too)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(kc.dtype), kc, acc * alpha[:, None], input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _load_q(q_node, heads, head_ok, cc, rr, sqh, sqd, C: tl.constexpr, R: tl.constexpr,
            UPCAST: tl.constexpr):
    """One node's query rows (heads) as the C part [BLOCK_M, CP] and the rope part [BLOCK_M,
    RP], zero past C / R and past H; fp32 under the interpreter (bf16 tl.dot is wrong there)."""
    q_row = q_node + heads * sqh  # [BLOCK_M] pointers
    qc = tl.load(q_row[:, None] + cc[None, :] * sqd,
                 mask=head_ok[:, None] & (cc < C)[None, :], other=0.0)
    qr = tl.load(q_row[:, None] + (C + rr)[None, :] * sqd,
                 mask=head_ok[:, None] & (rr < R)[None, :], other=0.0)
    if UPCAST:
        qc = qc.to(tl.float32)
        qr = qr.to(tl.float32)
    return qc, qr


@triton.jit
def _store_out(o_ptr, lse_ptr, opart_ptr, lpart_ptr, out, lse2, b, node, heads, head_ok, cc, n,
               s_id, N, H, M, S_GRID, C: tl.constexpr, CP: tl.constexpr):
    """A program's normalised rows: the answer when the row has one split (o_lat in its dtype,
    lse in ln), else partial s_id (fp32 o, lse in log2 units) for the combine."""
    rows = (b * N + node) * H + heads  # o_lat / lse are contiguous [B, N, H, C] / [B, N, H]
    if n == 1:  # the whole answer: no partial round trip, no combine
        tl.store(o_ptr + rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=head_ok[:, None] & (cc < C)[None, :])
        tl.store(lse_ptr + rows, lse2 * LN2, mask=head_ok)
    else:
        part = (b * S_GRID + s_id) * M + node * H + heads  # [BLOCK_M] rows of slot s
        tl.store(opart_ptr + part[:, None] * CP + cc[None, :], out, mask=head_ok[:, None])
        tl.store(lpart_ptr + part, lse2, mask=head_ok)


@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_kernel(q_ptr, kv_ptr, plen_ptr, anc_ptr, o_ptr, lse_ptr, opart_ptr, lpart_ptr, map_ptr,
                 sqb, sqn, sqh, sqd, skb, skt, skd, s_plen, sab, san, saw,
                 T, N, H, M, S_GRID, qk_scale,
                 C: tl.constexpr, R: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr,
                 MAX_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr):
    s_id = tl.program_id(0)
    HB = tl.cdiv(H, BLOCK_M)
    node = tl.program_id(1) // HB
    hb = tl.program_id(1) % HB
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    anc_row = anc_ptr + b * sab + node * san
    L = _row_len(anc_row, saw, P, N, T)
    length, n = _split(L, MIN_SPLIT, MAX_SPLITS, BLOCK_N)
    if s_id < n:  # the grid covers splits_grid(T); the rest exit before any load
        start = s_id * length  # a multiple of BLOCK_N: tiles sit at v = 64 k in every mode
        end = tl.minimum(start + length, L)
        # this program's part of the row's tree-slot map, u = v - P for v in [max(start, P),
        # end): written and read by this program only (splits cover disjoint u, head blocks
        # have their own copy), so the loop below gathers slots with one int32 load a key
        map_row = map_ptr + ((b * N + node) * HB + hb) * N
        u_hi = end - P
        for u0 in range(tl.maximum(start - P, 0), u_hi, BLOCK_N):
            u = u0 + tl.arange(0, BLOCK_N)
            tl.store(map_row + u, _tree_slots(anc_row, saw, u, N, BLOCK_N), mask=u < u_hi)
        tl.debug_barrier()  # the loop's threads read what other threads of the CTA wrote
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
        for v0 in range(start, end, BLOCK_N):
            v = v0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] virtual positions
            # slot: v below P, P + (the map's bit) from P on; a prefix-only tile's map load is
            # fully masked (no memory traffic). Integers only: the float path is one code
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


@triton.jit
def _merge_parts(opart_ptr, lpart_ptr, o_ptr, lse_ptr, b, node, rb, cb, n, N, H, M, S_GRID,
                 C: tl.constexpr, CP: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    """Heads rb * BLOCK_R.. x columns cb * BLOCK_C.. of node `node`: the LSE merge of its n > 1
    parts in the order 0, 1, ..., n - 1 (row-local); writes o_lat (its dtype) and lse (ln)."""
    heads = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    head_ok = heads < H
    cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    first = b * S_GRID * M + node * H + heads  # part 0's rows; part t adds t * M
    # every part of a row with n > 1 holds >= 1 key: finite lse
    m = tl.load(lpart_ptr + first, mask=head_ok, other=0.0)
    for t in range(1, n):
        m = tl.maximum(m, tl.load(lpart_ptr + first + t * M, mask=head_ok, other=0.0))
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for t in range(0, n):
        w = tl.exp2(tl.load(lpart_ptr + first + t * M, mask=head_ok, other=0.0) - m)
        l_sum += w
        acc += tl.load(opart_ptr + (first + t * M)[:, None] * CP + cc[None, :],
                       mask=head_ok[:, None], other=0.0) * w[:, None]
    out = acc / l_sum[:, None]
    rows = (b * N + node) * H + heads
    tl.store(o_ptr + rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
             mask=head_ok[:, None] & (cc < C)[None, :])
    tl.store(lse_ptr + rows, (m + tl.log2(l_sum)) * LN2, mask=head_ok & (cb == 0))


@triton.jit(do_not_specialize=_NO_SPEC)
def _combine_kernel(plen_ptr, anc_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, sab, san,
                    saw, T, N, H, M, S_GRID, C: tl.constexpr, CP: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MIN_SPLIT: tl.constexpr,
                    MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """LSE merge of one node's n > 1 parts in the order 0, 1, ..., n - 1 (row-local,
    elementwise in columns), BLOCK_R heads x BLOCK_C columns."""
    RB = tl.cdiv(H, BLOCK_R)
    node = tl.program_id(0) // RB
    rb = tl.program_id(0) % RB
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    L = _row_len(anc_ptr + b * sab + node * san, saw, P, N, T)
    _length, n = _split(L, MIN_SPLIT, MAX_SPLITS, BLOCK_N)
    if n > 1:
        _merge_parts(opart_ptr, lpart_ptr, o_ptr, lse_ptr, b, node, rb, cb, n, N, H, M, S_GRID,
                     C, CP, BLOCK_R, BLOCK_C)


def _buffers(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
             grid_fn):
    """Checks and the launch's buffers, from shapes only (graph-safe): (B, N, H, D, T, C, M,
    CP, RP, G = grid_fn(T) split programs per node, HB head blocks, o_lat, lse, slot_map
    [B, N, HB, N] int32 (u -> tree j), o_part [B, G, M, CP] / l_part [B, G, M] fp32 (lse when
    G = 1: never touched))."""
    B, N, H, D, T, _W = _common.check_inputs(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                             kv_lora_rank)
    if validate:
        _common.validate_contents(kv_cache, prefix_lens, N)
    C, M, dev = kv_lora_rank, N * H, q.device
    o_lat = torch.empty(B, N, H, C, dtype=q.dtype, device=dev)
    lse = torch.empty(B, N, H, dtype=torch.float32, device=dev)
    CP, RP = _common.next_pow2(C), max(16, _common.next_pow2(D - C))
    G, HB = grid_fn(T), triton.cdiv(H, BLOCK_M)
    slot_map = torch.empty(B, N, HB, N, dtype=torch.int32, device=dev)
    o_part = torch.empty(B, G, M, CP, dtype=torch.float32, device=dev) if G > 1 else lse
    l_part = torch.empty(B, G, M, dtype=torch.float32, device=dev) if G > 1 else lse
    return B, N, H, D, T, C, M, CP, RP, G, HB, o_lat, lse, slot_map, o_part, l_part


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
    interp = _common.interpreting()
    policy = dict(MIN_SPLIT=MIN_SPLIT, MAX_SPLITS=MAX_SPLITS, BLOCK_N=BLOCK_N)
    _attn_kernel[(G, N * HB, B)](
        q, kv_cache, prefix_lens, anc_bits, o_lat, lse, o_part, l_part, slot_map,
        *q.stride(), *kv_cache.stride(), prefix_lens.stride(0), *anc_bits.stride(),
        T, N, H, M, G, float(softmax_scale) * LOG2E,
        C=C, R=D - C, CP=CP, RP=RP, BLOCK_M=BLOCK_M, UPCAST=interp,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", **policy,
        num_warps=8 if CP >= 256 else 4, num_stages=2)
    if G > 1:
        block_c = min(CP, 128)
        _combine_kernel[(N * triton.cdiv(H, COMBINE_ROWS), CP // block_c, B)](
            prefix_lens, anc_bits, o_part, l_part, o_lat, lse, prefix_lens.stride(0),
            *anc_bits.stride(), T, N, H, M, G, C=C, CP=CP, BLOCK_R=COMBINE_ROWS,
            BLOCK_C=block_c, **policy, num_warps=4)
    return o_lat, lse
