"""The vocab-parallel draft head's top-k of one rank's shard in two Triton launches: each
chunk of a row keeps its best keys, one program a row keeps the best of those.

Contract: `shard_topk(local [R, V] fp32, M [R], log_s [R], k)` -> (values fp32 [R, k], ids
int64 [R, k]) with the bits of `workbench.dist.vocab.stable_topk((local - M) - log_s, k)`:
the log-probs computed as torch computes them there (two fp32 subtractions), the first k of a
descending stable sort (equal values: the lower index first).

Why (H100, session 59 call 1's op-kernel table, the EP8 step at C 1 DDTree-16): the head's
"(draft head top-k)" took 152 µs (213 at C 8), most of it `torch.topk` on stable_topk's int64
keys, a radix select of 8 digit passes x 3 launches, plus the keys' elementwise building and
the [R, V] log-prob tensor; here the log-probs and keys live in registers.

How: keys (the log-prob's fp32 bits as an order-preserving int32) * 2^32 + (V - 1 - index),
stable_topk's order (its keys pack the same two fields as uint32 << 31), unique a row, so the
largest k keys ARE the stable order's first k:
1. `_chunk_topk_kernel`, grid (R, ceil(V / CHUNK)): a chunk's keys in registers, its best
   KP = next_pow2(k) taken by KP rounds of (max, drop it) into [R, chunks, KP] (padding keys:
   INT64_MIN, never chosen while a row has k real keys);
2. `_merge_topk_kernel`, grid (R,): k rounds over the row's chunks' candidates, each id
   decoded from its key and its value recomputed from local (the same two subtractions).
Rounds, not `tl.topk`'s bitonic network: Triton 3.6's interpreter fails inside tl.topk's
reshape (the CPU tests need the interpreter). k past MAX_K: the caller's stable_topk
(documented dispatch by k: the rounds grow with k; DDTree budgets above 128 are not the decode
loop's).
Legend: R rows (B x L), V the shard's vocab, k candidates a row, KP = next_pow2(k).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import _require, next_pow2

MAX_K = 128
CHUNK = 1024  # keys a chunk program holds (8 a thread at 4 warps); 20 chunks a K2.6 shard row
INT64_MIN = -(2**63)  # the padding key: no real key is smaller (a -NaN at the last id equals it)


@triton.jit
def value_key(v, rev):
    """The int64 key of fp32 values v: larger value, larger key; equal values ordered by rev
    (V - 1 - index: the lower index larger), unique where rev is. -0.0 keys as +0.0."""
    b = (v + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 -> +0.0 (the sort's equal zeros)
    ordered = tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.int64)  # float order as int order
    return ordered * 4294967296 + rev.to(tl.int64)


@triton.jit
def keys_at(x_ptr, M, log_s, r, s_xr, offs, ok, V):
    """The unique descending-order keys of the log-probs (x - M) - log S at offs of row r
    (M, log_s: the row's fp32 scalars)."""
    x = tl.load(x_ptr + r * s_xr + offs, mask=ok, other=0.0)
    return value_key((x - M) - log_s, (V - 1) - offs)


@triton.jit
def pop_best(keys, PAD, V):
    """(keys without their largest, that key's index): the index decoded from the key's low
    word as `value_key` packed it (rev = V - 1 - index); PAD takes the popped key's place."""
    best = tl.max(keys, 0)
    return tl.where(keys == best, PAD, keys), (V - 1) - (best & 0xFFFFFFFF)


@triton.jit
def store_best(key, out, KP: tl.constexpr, PAD):
    """out[0 .. KP) = the KP largest of the unique keys, descending (PAD where fewer)."""
    for i in range(KP):  # the keys are unique: each round takes exactly one (padding: PAD)
        best = tl.max(key, 0)
        tl.store(out + i, best)
        key = tl.where(key == best, PAD, key)


@triton.jit
def _keys(x_ptr, m_ptr, ls_ptr, r, s_xr, offs, ok, V):
    """`keys_at` with the row's M and log S read from m_ptr / ls_ptr."""
    return keys_at(x_ptr, tl.load(m_ptr + r), tl.load(ls_ptr + r), r, s_xr, offs, ok, V)


@triton.jit
def _chunk_topk_kernel(x_ptr, m_ptr, ls_ptr, cand_ptr, V, s_xr, NCH,
                       CHUNK: tl.constexpr, KP: tl.constexpr, PAD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    key = _keys(x_ptr, m_ptr, ls_ptr, r, s_xr, offs, ok, V)
    key = tl.where(ok, key, PAD)
    out = cand_ptr + (r * NCH + c) * KP
    store_best(key, out, KP, PAD)


@triton.jit
def _merge_topk_kernel(cand_ptr, x_ptr, m_ptr, ls_ptr, val_ptr, idx_ptr, V, s_xr, NC, K,
                       NCP: tl.constexpr, PAD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NCP)
    cand = tl.load(cand_ptr + r * NC + j, mask=j < NC, other=PAD)
    for i in range(K):  # descending: the row's i-th key, its id, its log-prob recomputed
        cand, idx = pop_best(cand, PAD, V)
        x = tl.load(x_ptr + r * s_xr + idx)
        tl.store(val_ptr + r * K + i, (x - tl.load(m_ptr + r)) - tl.load(ls_ptr + r))
        tl.store(idx_ptr + r * K + i, idx)


def shard_topk(local: Tensor, M: Tensor, log_s: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """local [R, V] fp32 (unit stride along V), M / log_s [R] fp32 (the row's global max and
    log of its global exp-sum) -> (values [R, k] fp32, ids [R, k] int64): module docstring.
    1 <= k <= min(V, MAX_K); shapes and dtypes only are checked (no sync: graph-capturable)."""
    _require(local.dim() == 2 and local.dtype == torch.float32 and local.stride(-1) == 1,
             "local", "a [R, V] fp32 tensor with unit stride along V",
             (tuple(local.shape), local.dtype, local.stride()))
    R, V = local.shape
    for name, t in (("M", M), ("log_s", log_s)):
        _require(t.shape == (R,) and t.dtype == torch.float32 and t.device == local.device,
                 name, f"[{R}] fp32 on {local.device}", (tuple(t.shape), t.dtype, t.device))
    _require(isinstance(k, int) and 1 <= k <= min(V, MAX_K), "k",
             f"an int in 1..{min(V, MAX_K)} (min(V, MAX_K))", k)
    KP = next_pow2(k)
    chunk = max(CHUNK, KP)
    nch = triton.cdiv(V, chunk)
    vals = torch.empty(R, k, dtype=torch.float32, device=local.device)
    ids = torch.empty(R, k, dtype=torch.int64, device=local.device)
    if R == 0:
        return vals, ids
    M, log_s = M.contiguous(), log_s.contiguous()
    cand = torch.empty(R, nch * KP, dtype=torch.int64, device=local.device)
    _chunk_topk_kernel[(R, nch)](local, M, log_s, cand, V, local.stride(0), nch, CHUNK=chunk,
                                 KP=KP, PAD=INT64_MIN, num_warps=4)
    _merge_topk_kernel[(R,)](cand, local, M, log_s, vals, ids, V, local.stride(0), nch * KP, k,
                             NCP=next_pow2(nch * KP), PAD=INT64_MIN, num_warps=4)
    return vals, ids


shard_topk.MAX_K = MAX_K  # dist_topk_logprobs reads the kernel's k range off the function
