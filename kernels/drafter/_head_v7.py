"""The vocab-parallel draft head in four Triton launches (triton_v7's HEAD): `dist_head` has
`workbench.dist.vocab.dist_topk_logprobs`' contract and its two collectives, with everything
between them in kernels.

Contract: dist_head(local [B, L, V/w] fp32 (this rank's logits shard), vocab_start, k, comm)
-> (log-probs fp32 [B, L, kk], global ids int64 [B, L, kk]), kk = min(k, w * min(k, V/w)),
sorted descending, equal log-probs in id order. Engine numerics: each row's max and exp-sum
are Triton's (an online pass, `tl.exp`), not torch's, so the log-probs are within a few fp32
ulps of the reference head's and the ids are its ids wherever no two log-probs sit within
those ulps (equal logits stay equal: M and log S are one constant a row).

Why (H100, session 60 call 1, traces/gpu/session60: triton_v6's op-kernel table at C 1
DDTree-16): the head's range was 64 µs in ~25 launches, of which triton_v6's shard top-k was
23 µs in 4; the rest are torch's: the shard max and exp-sum (amax, sub, exp, sum: 14 µs), the
global M and log S from the gathered stats (amax, sub, exp, mul, sum, log), the candidates'
stacking (two casts, an add, a stack) and the final merge's plumbing (a cast copy, a fill, a
gather, a cast): ~1.5-3.6 µs each.

    launch 1  _stats_kernel      grid (R,): the row's max m and sum exp(x - m) in one online
                                 pass -> [B, L, 1, 2] (the all-gather's layout)
    collective                   all-gather -> [B, L, w, 2]
    launch 2  _chunk_kernel      grid (R, chunks): M = max m_r, S = sum s_r exp(m_r - M) (each
                                 program, w pairs), then triton_v6's chunk top-k on
                                 (x - M) - log S
    launch 3  _cand_kernel       grid (R,): v6's merge of the chunks' best, each candidate
                                 written as the all-gather wants it, (log-prob, global id) f64
    collective                   all-gather -> [B, L, w k, 2] (rank order = id order)
    launch 4  _final_kernel      grid (R,): the candidates' top kk by (log-prob, then position)

k past MAX_K (v6's rounds grow with k) or a vocab shard under k: `dist_topk_logprobs` with v6's
shard top-k (documented dispatch; DDTree budgets past 128 are not the decode loop's).
Legend: B requests, L draft depth, R = B L rows, V vocab, w ranks, k candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import _require, next_pow2
from ._shard_topk import (
    CHUNK,
    INT64_MIN,
    MAX_K,
    keys_at,
    pop_best,
    shard_topk,
    store_best,
    value_key,
)

STATS_BLOCK = 4096  # logits a stats step (5 steps a K2.6 shard row of 20480)


@triton.jit
def _stats_kernel(x_ptr, out_ptr, V, s_xr, BLOCK: tl.constexpr):
    """out[r] = (m, sum exp(x - m)) of row r, m its max: one pass, the sum rescaled as m grows."""
    r = tl.program_id(0).to(tl.int64)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane, merged at the end
    s = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + r * s_xr + offs, mask=offs < V, other=float("-inf"))
        m_new = tl.maximum(m, x)
        base = tl.where(m_new > float("-inf"), m_new, 0.0)  # no -inf - -inf: a lane with no
        s = s * tl.exp(m - base) + tl.exp(x - base)  # finite logit yet keeps s = 0
        m = m_new
    row_m = tl.max(m, 0)
    s = s * tl.exp(m - tl.where(row_m > float("-inf"), row_m, 0.0))
    row_s = tl.sum(s, 0)
    tl.store(out_ptr + r * 2, row_m)
    tl.store(out_ptr + r * 2 + 1, row_s)


@triton.jit
def _row_norm(ms_ptr, r, W, WP: tl.constexpr):
    """(M, log S) of row r from the gathered [W, 2] (max, exp-sum) pairs."""
    w = tl.arange(0, WP)
    mr = tl.load(ms_ptr + (r * W + w) * 2, mask=w < W, other=float("-inf"))
    sr = tl.load(ms_ptr + (r * W + w) * 2 + 1, mask=w < W, other=0.0)
    M = tl.max(mr, 0)
    return M, tl.log(tl.sum(tl.where(w < W, sr * tl.exp(mr - M), 0.0), 0))


@triton.jit
def _chunk_kernel(x_ptr, ms_ptr, cand_ptr, V, s_xr, NCH, W, WP: tl.constexpr,
                  CHUNK: tl.constexpr, KP: tl.constexpr, PAD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    M, log_s = _row_norm(ms_ptr, r, W, WP)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    key = tl.where(ok, keys_at(x_ptr, M, log_s, r, s_xr, offs, ok, V), PAD)
    store_best(key, cand_ptr + (r * NCH + c) * KP, KP, PAD)  # v6's rounds


@triton.jit
def _cand_kernel(cand_ptr, x_ptr, ms_ptr, out_ptr, V, s_xr, NC, K, vocab_start, W,
                 WP: tl.constexpr, NCP: tl.constexpr, PAD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    M, log_s = _row_norm(ms_ptr, r, W, WP)
    j = tl.arange(0, NCP)
    cand = tl.load(cand_ptr + r * NC + j, mask=j < NC, other=PAD)
    for i in range(K):  # v6's merge: the row's i-th key, its id, its log-prob recomputed
        cand, idx = pop_best(cand, PAD, V)
        lp = (tl.load(x_ptr + r * s_xr + idx) - M) - log_s
        tl.store(out_ptr + (r * K + i) * 2, lp.to(tl.float64))
        tl.store(out_ptr + (r * K + i) * 2 + 1, (idx + vocab_start).to(tl.float64))


@triton.jit
def _final_kernel(allc_ptr, val_ptr, ids_ptr, N, K, NP: tl.constexpr, PAD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NP)
    ok = j < N
    v = tl.load(allc_ptr + (r * N + j) * 2, mask=ok, other=0.0).to(tl.float32)  # exact: fp32s
    key = tl.where(ok, value_key(v, (N - 1) - j), PAD)
    for i in range(K):
        key, pos = pop_best(key, PAD, N)
        tl.store(val_ptr + r * K + i, tl.load(allc_ptr + (r * N + pos) * 2).to(tl.float32))
        tl.store(ids_ptr + r * K + i, tl.load(allc_ptr + (r * N + pos) * 2 + 1).to(tl.int64))


def dist_head(local: Tensor, vocab_start: int, k: int, comm) -> tuple[Tensor, Tensor]:
    """The vocab-parallel log-softmax top-k of this rank's shard (module docstring): local
    [B, L, V/w] -> (log-probs fp32 [B, L, kk], global ids int64 [B, L, kk])."""
    from workbench.dist.vocab import dist_topk_logprobs

    _require(local.dim() == 3 and local.is_floating_point(), "local",
             "a float [B, L, V/world] logits shard", (tuple(local.shape), local.dtype))
    _require(isinstance(k, int) and k >= 1, "k", "an int >= 1", k)
    local = local.float()
    B, L, Vl = local.shape
    kl = min(k, Vl)
    if kl > MAX_K or kl < k:  # the rounds' range, and every rank holding k candidates
        return dist_topk_logprobs(local, vocab_start, k, comm, shard_topk)
    dev, R = local.device, B * L
    x = local.reshape(R, Vl)  # rows r = b L + l (a copy only for a strided shard)
    if x.stride(-1) != 1:
        x = x.contiguous()
    ms = torch.empty(B, L, 1, 2, dtype=torch.float32, device=dev)
    if R:
        _stats_kernel[(R,)](x, ms, Vl, x.stride(0), BLOCK=STATS_BLOCK, num_warps=8)
    allms = comm.all_gather_cat(ms, -2).contiguous()  # [B, L, w, 2]
    W = allms.shape[-2]
    KP = next_pow2(kl)
    chunk = max(CHUNK, KP)
    nch = triton.cdiv(Vl, chunk)
    cand = torch.empty(B, L, kl, 2, dtype=torch.float64, device=dev)
    if R:
        keys = torch.empty(R, nch * KP, dtype=torch.int64, device=dev)
        _chunk_kernel[(R, nch)](x, allms, keys, Vl, x.stride(0), nch, W,
                                WP=next_pow2(W), CHUNK=chunk, KP=KP, PAD=INT64_MIN, num_warps=4)
        _cand_kernel[(R,)](keys, x, allms, cand, Vl, x.stride(0), nch * KP, kl,
                           vocab_start, W, WP=next_pow2(W), NCP=next_pow2(nch * KP),
                           PAD=INT64_MIN, num_warps=4)
    allc = comm.all_gather_cat(cand, -2).contiguous()  # [B, L, w kl, 2], rank order = id order
    n = allc.shape[-2]
    kk = min(k, n)
    vals = torch.empty(B, L, kk, dtype=torch.float32, device=dev)
    ids = torch.empty(B, L, kk, dtype=torch.int64, device=dev)
    if R:
        _final_kernel[(R,)](allc, vals, ids, n, kk, NP=next_pow2(n), PAD=INT64_MIN, num_warps=4)
    return vals, ids
