"""LM head fused with log-softmax and top-k over the vocabulary; no [M, V] tensor in HBM.

    tile kernel   grid (M tiles, V / BLOCK_V): logits of BLOCK_V vocab rows for BLOCK_M block
                  rows (the [V, D] weight streams once; the M tiles of one vocab tile run next
                  to each other and share it through L2). Writes per (row, tile) the softmax
                  partial (max, sum exp(x - max)) and the tile's top-KC candidates as keys.
    merge kernel  groups of GN candidate keys -> their top-KP; repeated until KP remain.
    final kernel  lse from the partials, log-probs of the KP survivors, the first k of them in
                  the reference's order (log-prob descending, then lower token id first).

A key packs (logit, id) into one int64 that sorts like the pair: the fp32 bits made
order-preserving as a signed int32 in the high word, 0x7FFFFFFF - id in the low word (ids < 2^31), so one
descending `tl.topk` gives value descending with the lower id first on equal values. Padding
(vocab past V, rows past M) is the smallest key. The final order is re-sorted on (log-prob,
id) keys: logit - lse rounds in fp32, so two different logits can become one log-prob, and the
reference (a stable sort of fp32 log-probs) then puts the lower id first.

Legend: M = B*L rows, D hidden, V vocab, k top-k, KP = next_pow2(k), KC = min(KP, BLOCK_V).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, next_pow2

_PAD_KEY = tl.constexpr(-(2**63))  # below every key of a real logit, -inf included


class Tiles(NamedTuple):
    """The tile kernel's launch: BLOCK_M block rows x BLOCK_V vocab rows a program."""

    block_m: int
    block_v: int
    warps: int
    stages: int


@triton.jit
def _key(x, ids):
    """fp32 values, int ids -> int64 keys sorting as (value desc, id asc) under a desc sort."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids.to(tl.int64))


@triton.jit
def _unkey(key):
    """int64 keys -> (fp32 values, int64 ids)."""
    ordered = (key >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _topk(keys, K: tl.constexpr, SORT: tl.constexpr):
    """[R, N] keys -> their top K [R, K], descending. SORT: bitonic `tl.topk` (the GPU path);
    else K rounds of max-and-remove (keys are distinct; used under the interpreter for small K,
    where each bitonic stage is a slow Python step)."""
    if SORT:
        out = tl.topk(keys, K, dim=1)
    else:
        out = tl.full([keys.shape[0], K], _PAD_KEY, tl.int64)
        cols = tl.arange(0, K)[None, :]
        for i in tl.static_range(K):
            mx = tl.max(keys, 1)
            out = tl.where(cols == i, mx[:, None], out)
            keys = tl.where(keys == mx[:, None], _PAD_KEY, keys)
    return out


@triton.jit
def _lm_head_tile_kernel(z_ptr, w_ptr, key_ptr, pm_ptr, ps_ptr, M, V, D, sz, sw, NVT,
                         BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                         KC: tl.constexpr, DOT_BF16: tl.constexpr,
                         SORT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_v = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_ok = rm < M
    v_ok = rv < V
    dk = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_V, BLOCK_M], tl.float32)  # vocab on the MMA's M side (64+ rows)
    for d0 in range(0, D, BLOCK_D):
        d_ok = (d0 + dk) < D
        w = tl.load(w_ptr + rv[:, None].to(tl.int64) * sw + d0 + dk[None, :],
                    mask=v_ok[:, None] & d_ok[None, :], other=0.0)
        z = tl.load(z_ptr + rm[:, None].to(tl.int64) * sz + d0 + dk[None, :],
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_BF16:
            acc = tl.dot(w, tl.trans(z), acc)
        else:
            acc = tl.dot(w.to(tl.float32), tl.trans(z.to(tl.float32)), acc)
    x = tl.trans(acc)  # [BLOCK_M, BLOCK_V] logits
    x = tl.where(v_ok[None, :], x, float("-inf"))
    mx = tl.max(x, 1)
    se = tl.sum(tl.exp(x - mx[:, None]), 1)
    part = rm.to(tl.int64) * NVT + pid_v
    tl.store(pm_ptr + part, mx, mask=m_ok)
    tl.store(ps_ptr + part, se, mask=m_ok)
    keys = tl.where(v_ok[None, :], _key(x, rv[None, :]), _PAD_KEY)
    top = _topk(keys, KC, SORT)  # [BLOCK_M, KC], descending
    kc = tl.arange(0, KC)
    tl.store(key_ptr + (rm.to(tl.int64) * NVT + pid_v)[:, None] * KC + kc[None, :], top,
             mask=m_ok[:, None])


@triton.jit
def _merge_kernel(src_ptr, dst_ptr, C, NG, GN: tl.constexpr, KP: tl.constexpr,
                  SORT: tl.constexpr):
    # row r's C keys in groups of GN -> each group's top KP into dst [r, g, :]
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    c = g * GN + tl.arange(0, GN)[None, :]  # [1, GN]: tl.topk works on a minor dim of 2-d
    keys = tl.load(src_ptr + r * C + c, mask=c < C, other=_PAD_KEY)
    top = _topk(keys, KP, SORT)
    tl.store(dst_ptr + (r * NG + g) * KP + tl.arange(0, KP)[None, :], top)


@triton.jit
def _final_kernel(key_ptr, pm_ptr, ps_ptr, lp_ptr, id_ptr, NVT, k,
                  KP: tl.constexpr, BLOCK_T: tl.constexpr, SORT: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    # log-sum-exp over the tiles' partials (two passes: global max, then the rescaled sums)
    t = tl.arange(0, BLOCK_T)
    gmax = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for t0 in range(0, NVT, BLOCK_T):
        gmax = tl.maximum(gmax, tl.load(pm_ptr + r * NVT + t0 + t, mask=t0 + t < NVT,
                                        other=float("-inf")))
    mx = tl.max(gmax, 0)
    tot = tl.zeros([BLOCK_T], tl.float32)
    for t0 in range(0, NVT, BLOCK_T):
        ok = t0 + t < NVT
        pm = tl.load(pm_ptr + r * NVT + t0 + t, mask=ok, other=float("-inf"))
        ps = tl.load(ps_ptr + r * NVT + t0 + t, mask=ok, other=0.0)
        tot += ps * tl.exp(pm - mx)
    lse = mx + tl.log(tl.sum(tot, 0))
    c = tl.arange(0, KP)[None, :]  # [1, KP]
    logit, ids = _unkey(tl.load(key_ptr + r * KP + c))
    lp = logit - lse
    valid = c < k
    top = _topk(tl.where(valid, _key(lp, ids), _PAD_KEY), KP, SORT)  # (log-prob, id) order
    lp, ids = _unkey(top)
    tl.store(lp_ptr + r * k + c, lp, mask=valid)
    tl.store(id_ptr + r * k + c, ids, mask=valid)


def tiles_v1(M: int) -> Tiles:
    """triton_v1's tile: 128 vocab rows, row tile 16 / 32 / 64, 8 warps, 4 stages."""
    return Tiles(16 if M <= 16 else (32 if M <= 32 else 64), 128, 8, 4)


def tiles_v2(M: int) -> Tiles:
    """triton_v2's tile, the fastest of a sweep on the H200 at V 163840, D 7168 (session 9,
    scripts/profile_drafter.py; µs of the tile kernel alone, v1's tile in brackets):
    M 7: 16 x 64, 4 stages, 530 [551]; M 56: 64 x 64, 6 stages, 662 [716]; M 224: 128 x 64,
    4 stages, 1897 [2305]. 64 vocab rows: twice the programs (2560), so more of them stream
    the weight at once; at M 224 one row tile of 128 re-reads each weight tile twice, not 4x."""
    if M <= 16:
        return Tiles(16, 64, 4, 4)
    return Tiles(64, 64, 4, 6) if M <= 64 else Tiles(128, 64, 4, 4)


def lm_head_topk(z: Tensor, w: Tensor, k: int, sort: bool | None = None,
                 tiles=tiles_v1) -> tuple[Tensor, Tensor]:
    """z [M, D] (normed hidden rows), w [V, D] bf16 -> (log-probs fp32 [M, k], ids int64 [M, k])
    of log_softmax(z @ w^T) over the full vocabulary, in the reference's order. `sort`: the
    bitonic top-k everywhere (default: on a GPU, and under the interpreter for K > 16).
    `tiles`: M -> the tile kernel's `Tiles` (the result does not depend on it beyond fp32
    summation order)."""
    sort = (not INTERPRET) if sort is None else sort
    M, D = z.shape
    V = w.shape[0]
    dev = z.device
    lp = torch.empty(M, k, dtype=torch.float32, device=dev)
    ids = torch.empty(M, k, dtype=torch.int64, device=dev)
    if M == 0:
        return lp, ids
    KP = max(2, next_pow2(k))  # tl.topk needs k >= 2
    BLOCK_M, BLOCK_V, warps, stages = tiles(M)
    BLOCK_D = 64 if INTERPRET else 128
    KC = min(KP, BLOCK_V)
    NVT = triton.cdiv(V, BLOCK_V)
    keys = torch.empty(M, NVT * KC, dtype=torch.int64, device=dev)
    pm = torch.empty(M, NVT, dtype=torch.float32, device=dev)
    ps = torch.empty_like(pm)
    _lm_head_tile_kernel[(triton.cdiv(M, BLOCK_M), NVT)](
        z, w, keys, pm, ps, M, V, D, z.stride(0), w.stride(0), NVT, BLOCK_M=BLOCK_M,
        BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D, KC=KC, DOT_BF16=not INTERPRET,
        SORT=sort or KC > 16, num_warps=warps, num_stages=stages)
    C = NVT * KC
    # group size: 2048 keys per program on a GPU; just what is there under the interpreter
    GN = max(2 * KP, 2048 if sort else min(2048, next_pow2(C)))
    while C > KP:  # static number of rounds: depends on shapes only (graph capturable)
        NG = triton.cdiv(C, GN)
        nxt = torch.empty(M, NG * KP, dtype=torch.int64, device=dev)
        _merge_kernel[(M, NG)](keys, nxt, C, NG, GN=GN, KP=KP, SORT=sort or KP > 16,
                               num_warps=8)
        keys, C = nxt, NG * KP
    if C < KP:  # fewer candidates than KP (k > V is clamped, so only when V < KP): pad
        keys = torch.cat([keys, torch.full((M, KP - C), -(2**63), dtype=torch.int64,
                                           device=dev)], 1)
    _final_kernel[(M,)](keys, pm, ps, lp, ids, NVT, k, KP=KP, BLOCK_T=1024,
                        SORT=sort or KP > 16, num_warps=4)
    return lp, ids
