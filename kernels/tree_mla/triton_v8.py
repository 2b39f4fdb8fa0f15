"""tree_mla v8: triton_v7 (v4's attention kernel under the split policy by head count) with an
LSE merge that is not a chain of one load per part.

Why (H200, session 7, emulated EP8 rank of K2.6: H = 8, B = 1, N = 17, P = 4096): v7's
attention runs in 16 µs (v4: 35) but v4's `_combine_kernel` then takes ~12 µs (v4's own: ~4):
v7 gives that request 33 parts, and each combine program walks them one after another
(`for t in range(0, n_parts)`: a [16] lse load, a layout conversion of the weight through shared
memory, whose barrier waits for that load, then the [16, 128] fp32 tile load and the FMAs: the
next part's loads cannot move above the barrier), ~0.35 µs of latency a part for ~9 MB of
partials, on 36 programs (9 row blocks x 4 column blocks) of 132 SMs.

    launch 1  v4's _attn_kernel, v7's policy_of(q) (imported, unchanged)
    launch 2  _combine_kernel (below), grid (ceil(M / 16), CP / 32, B), PDL as v4's:
              1. every part's lse of the 16 rows in one [NP, 16] load (NP = next_pow2(G)):
                 m = their max (exact in any order: NP and the load's shape never change it)
              2. parts in chunks of CH = 16: one [16, 16] lse load and one [16, 16, 32] fp32 o
                 load a chunk (16 LDG.128 a thread, issued back to back before the chunk's one
                 barrier; sm_90 build), w = exp2(lse - m), l += sum(w), acc += sum(w * o) over
                 the chunk's axis (33 parts = 3 dependent rounds, not 33)
              3. 32-column blocks at every batch (v4: 128): 4x the programs (B = 1, M = 136:
                 144), each loading a quarter of the columns (lse loads repeat per block: tiny)

**Merge order: fixed, not v4's.** Within a chunk the 16 parts are summed by Triton's reduction
of the [CH, 16, 32] tile over axis 0 (a tree that depends only on the constexprs CH = 16,
BLOCK_R = 16, BLOCK_C = 32 and num_warps = 4: on sm_90 in-thread adds then lane shuffles),
chunk sums are added to the accumulator in order 0, 16, 32, ...; parts past n_parts add an
exact +0. All of it depends on the request's P (its part count) and the policy only, never on
B, M or T: batch invariant as v4, but not v7's bits (within the same tolerances).
Legend: _common.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from . import _common

# _attn_kernel is imported for sm90.py, which compiles a version's kernels by module
from .triton_v4 import COMBINE_ROWS, LN2, _attn_kernel, _launch, _parts  # noqa: F401
from .triton_v7 import policy_of

COMBINE_COLS = 32  # columns a combine program (v4: 128): 4x the programs, 16 B a thread a part
CHUNK = 16  # parts a loop iteration: 16 independent 16 B loads a thread in flight
# COMBINE_COLS, CHUNK and the 4 warps fix the reduction tree: never choose them from B or M


@triton.jit
def _combine_kernel(plen_ptr, opart_ptr, lpart_ptr, o_ptr, lse_ptr, s_plen, T, M, S_GRID,
                    C: tl.constexpr, CP: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr, NP: tl.constexpr, CH: tl.constexpr,
                    SHORT_UPTO: tl.constexpr, SHORT_LEN: tl.constexpr, LONG_MIN: tl.constexpr,
                    MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr,
                    ONE_ROUND: tl.constexpr = False):
    """LSE merge of request b's n_parts > 1 partials, CH parts a loop iteration (a fixed
    reduction tree within a chunk, chunks in order); BLOCK_R rows x BLOCK_C columns.
    ONE_ROUND (triton_v17; the launcher's promise that CH >= the grid's parts): the one chunk's
    loads only, m from its lse (the same max, so the same bits as the two-pass path)."""
    if USE_PDL:  # launched early (PDL): wait until _attn_kernel's writes are visible
        gdc_wait()
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = tl.minimum(tl.maximum(tl.load(plen_ptr + b * s_plen).to(tl.int32), 0), T)
    _len, _n_pre, n_parts = _parts(P, SHORT_UPTO, SHORT_LEN, LONG_MIN, MAX_SPLITS, BLOCK_N)
    if n_parts > 1:
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < M
        cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        first = b * S_GRID * M + rows  # part 0's rows; part t adds t * M
        if ONE_ROUND:
            kk = tl.arange(0, CH)
            part = first[None, :] + (kk * M)[:, None]  # [CH, BLOCK_R] partial rows
            ok = (kk < n_parts)[:, None] & row_ok[None, :]
            lt = tl.load(lpart_ptr + part, mask=ok, other=float("-inf"))
            o_t = tl.load(opart_ptr + part[:, :, None] * CP + cc[None, None, :],
                          mask=ok[:, :, None], other=0.0)  # [CH, BLOCK_R, BLOCK_C]
            m = tl.where(row_ok, tl.max(lt, 0), 0.0)  # as the two-pass path's m
            w = tl.exp2(lt - m[None, :])  # [CH, BLOCK_R]
            # from zeros as the two-pass path (0 + -0 = +0: its bits, signed zeros included)
            l_sum = tl.zeros([BLOCK_R], tl.float32) + tl.sum(w, 0)
            acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32) + tl.sum(o_t * w[:, :, None], 0)
        else:
            m, l_sum, acc = _two_pass(opart_ptr, lpart_ptr, first, row_ok, cc, n_parts, M, CP,
                                      BLOCK_R, BLOCK_C, NP, CH)
        l_sum = tl.where(row_ok, l_sum, 1.0)  # rows past M (never stored): no 0 / 0
        out = acc / l_sum[:, None]
        o_rows = b * M + rows
        tl.store(o_ptr + o_rows[:, None] * C + cc[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cc < C)[None, :])
        tl.store(lse_ptr + o_rows, (m + tl.log2(l_sum)) * LN2, mask=row_ok & (cb == 0))


@triton.jit
def _two_pass(opart_ptr, lpart_ptr, first, row_ok, cc, n_parts, M, CP: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NP: tl.constexpr,
              CH: tl.constexpr):
    """v8's merge: (m, l_sum, acc) of the rows `first` over n_parts parts."""
    # every part's lse at once: m = their max, exact in any order (so NP, the load's shape,
    # never changes it). Part 0 is a prefix split: finite; the tree's part may be -inf for
    # an empty ancestor word (weight 0); rows past M: v4's m = 0
    tt = tl.arange(0, NP)
    lp = tl.load(lpart_ptr + first[None, :] + (tt * M)[:, None],
                 mask=(tt < n_parts)[:, None] & row_ok[None, :], other=float("-inf"))
    m = tl.where(row_ok, tl.max(lp, 0), 0.0)  # [BLOCK_R]
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for c0 in range(0, n_parts, CH):
        # CH parts in two loads ([CH, BLOCK_R] lse, [CH, BLOCK_R, BLOCK_C] o), issued before
        # the one layout conversion (a barrier) the weights' broadcast needs; parts past
        # n_parts load lse = -inf and o = 0: w = 0, an exact +0 in the sums
        kk = c0 + tl.arange(0, CH)
        part = first[None, :] + (kk * M)[:, None]  # [CH, BLOCK_R] partial rows
        ok = (kk < n_parts)[:, None] & row_ok[None, :]
        lt = tl.load(lpart_ptr + part, mask=ok, other=float("-inf"))
        o_t = tl.load(opart_ptr + part[:, :, None] * CP + cc[None, None, :],
                      mask=ok[:, :, None], other=0.0)  # [CH, BLOCK_R, BLOCK_C]
        w = tl.exp2(lt - m[None, :])  # [CH, BLOCK_R]
        l_sum += tl.sum(w, 0)
        acc += tl.sum(o_t * w[:, :, None], 0)
    return m, l_sum, acc


def _launch_combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl,
                    pdl):
    """v8's combine launch (v4's _launch calls it in place of its own)."""
    block_c = min(CP, COMBINE_COLS)
    _combine_kernel[(triton.cdiv(M, COMBINE_ROWS), CP // block_c, o_part.shape[0])](
        prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, G, C=C, CP=CP,
        BLOCK_R=COMBINE_ROWS, BLOCK_C=block_c, NP=_common.next_pow2(G), CH=CHUNK, **consts,
        USE_PDL=use_pdl, num_warps=4, **pdl)


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; triton_v7's
    attention and policy, the chunked combine above. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q), combine=_launch_combine)
