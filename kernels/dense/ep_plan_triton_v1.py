"""The EP exchange plan (op `ep_plan`, reference/ep_plan.py) as one Triton program.

The torch plan launches ~20 kernels a MoE layer (group ids, the destination of each sent
element, a stable radix argsort, its inverse scatter, two bincount-like reductions, a
nonzero with its host sync, the compaction gathers) and syncs twice; in the emulated EP8 rank
of kimi-k2.6 that was ~1.8 ms of a 21.8 ms step at C 1 (traces/gpu/session7). One program
does it all with counting sorts, since there are only W destinations:

  pass 1  histogram of the sent elements' destinations -> exclusive base per destination;
          the received pairs compacted in row-major order (cumsum of the mask) with their
          per-owner counts
  pass 2  each element's send position = base[dest] + its rank among earlier elements with the
          same destination (a running count per destination + an in-block cumsum of the
          one-hot [BLOCK, W]): the stable order argsort gives, no sort; then the -1 tail.
Index math is int32 with the experts per group a compile-time constant (first version: int64
divisions by runtime values, 9.1 µs a call at T 17 on the H200; session 8).

Discrete outputs, bitwise the reference's. No host sync (the caller syncs once for the split
lists). Ids outside [0, groups * experts_per_group) are a caller bug: their elements are left
out of every destination (no write outside the outputs); `validate=True` checks on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from workbench.ep_routes import EPRoutes, owned

from ..drafter._common import INTERPRET, _require, next_pow2


@triton.jit
def _ep_plan_kernel(ids_ptr, send_t_ptr, order_ptr, splits_ptr, recv_t_ptr, recv_e_ptr,
                    T, lo, hi, chunk, W, group, s_t, s_k,
                    K: tl.constexpr, TP: tl.constexpr, EPG: tl.constexpr, WP: tl.constexpr,
                    BLOCK: tl.constexpr):
    # int32 index math and constexpr divisors: int64 division is a ~100-instruction sequence
    w = tl.arange(0, WP)
    lanes = tl.arange(0, BLOCK)
    S = (hi - lo) * K * TP
    # pass 1: rows to each destination; and (same ids) the pairs routed to my group, compacted
    # in row-major order, with how many each owner sends me
    counts = tl.zeros([WP], tl.int32)
    for s0 in range(0, S, BLOCK):
        e = s0 + lanes  # element (t - lo, j, i), row-major
        pair = e // TP
        t, j = lo + pair // K, pair % K
        ok = e < S
        x = tl.load(ids_ptr + t.to(tl.int64) * s_t + j * s_k, mask=ok, other=-1).to(tl.int32)
        dest = tl.where(x >= 0, (x // EPG) * TP + e % TP, -1)
        hot = (dest[:, None] == w[None, :]) & ok[:, None]
        counts += tl.sum(hot.to(tl.int32), 0)
    n = tl.full([], 0, tl.int32)
    per_owner = tl.zeros([WP], tl.int32)
    for p0 in range(0, T * K, BLOCK):
        p = p0 + lanes
        t, j = p // K, p % K
        ok = p < T * K
        x = tl.load(ids_ptr + t.to(tl.int64) * s_t + j * s_k, mask=ok, other=-1).to(tl.int32)
        mine = ok & (x >= 0) & (x // EPG == group)
        m = mine.to(tl.int32)
        idx = n + tl.cumsum(m, 0) - 1
        tl.store(recv_t_ptr + idx, t.to(tl.int64), mask=mine)
        tl.store(recv_e_ptr + idx, (x - group * EPG).to(tl.int64), mask=mine)
        hot = ((t // chunk)[:, None] == w[None, :]) & mine[:, None]
        per_owner += tl.sum(hot.to(tl.int32), 0)
        n += tl.sum(m, 0)
    tl.store(splits_ptr + w, counts.to(tl.int64), mask=w < W)
    tl.store(splits_ptr + WP + w, per_owner.to(tl.int64), mask=w < W)
    # pass 2: send positions (stable within a destination) from the exclusive bases
    base = tl.cumsum(counts, 0) - counts
    run = tl.zeros([WP], tl.int32)
    for s0 in range(0, S, BLOCK):
        e = s0 + lanes
        pair = e // TP
        t, j = lo + pair // K, pair % K
        ok = e < S
        x = tl.load(ids_ptr + t.to(tl.int64) * s_t + j * s_k, mask=ok, other=-1).to(tl.int32)
        dest = tl.where(x >= 0, (x // EPG) * TP + e % TP, -1)
        hot = ((dest[:, None] == w[None, :]) & ok[:, None]).to(tl.int32)
        rank_in = tl.cumsum(hot, 0) - 1 + run[None, :] + base[None, :]
        pos = tl.sum(tl.where(hot > 0, rank_in, 0), 1)
        valid = ok & (tl.sum(hot, 1) > 0)
        tl.store(send_t_ptr + pos, t.to(tl.int64), mask=valid)
        tl.store(order_ptr + e, pos.to(tl.int64), mask=valid)
        run += tl.sum(hot, 0)
    # the -1 tail of the received rows
    for p0 in range(0, T * K, BLOCK):
        p = p0 + lanes
        tail = (p >= n) & (p < T * K)
        tl.store(recv_t_ptr + p, tl.full([BLOCK], -1, tl.int64), mask=tail)
        tl.store(recv_e_ptr + p, tl.full([BLOCK], -1, tl.int64), mask=tail)


def ep_plan(ids: Tensor, rank: int, world: int, tp: int, experts_per_group: int,
            validate: bool = False) -> EPRoutes:
    """ids [T, K] int32/int64 routing -> rank's EPRoutes (reference/ep_plan.py), one launch."""
    _require(isinstance(ids, Tensor) and ids.dim() == 2, "ids", "a [T, K] tensor",
             getattr(ids, "shape", type(ids)))
    _require(ids.dtype in (torch.int32, torch.int64), "ids", "int32 or int64", ids.dtype)
    for name, v in (("world", world), ("tp", tp), ("experts_per_group", experts_per_group)):
        _require(isinstance(v, int) and v >= 1, name, "an int >= 1", v)
    _require(world % tp == 0, "tp", f"a divisor of world {world}", tp)
    _require(isinstance(rank, int) and 0 <= rank < world, "rank", f"an int in [0, {world})", rank)
    _require(ids.is_cuda or INTERPRET, "ids", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             ids.device)
    T, K = ids.shape
    if validate and ids.numel():
        lo_id, hi_id = int(ids.min()), int(ids.max())  # host sync
        n_e = world // tp * experts_per_group
        _require(lo_id >= 0 and hi_id < n_e, "ids", f"experts in [0, {n_e})",
                 f"[{lo_id}, {hi_id}]")
    chunk, lo, hi = owned(T, rank, world)
    S = (hi - lo) * K * tp
    dev = ids.device
    send_t = torch.empty(S, dtype=torch.int64, device=dev)
    order = torch.empty(S, dtype=torch.int64, device=dev)
    WP = next_pow2(world)
    splits = torch.empty(2, WP, dtype=torch.int64, device=dev)  # [:, :W] is the answer
    recv_t = torch.empty(T * K, dtype=torch.int64, device=dev)
    recv_e = torch.empty(T * K, dtype=torch.int64, device=dev)
    if T * K:
        block = max(16, min(1024, 4096 // WP))
        _ep_plan_kernel[(1,)](
            ids, send_t, order, splits, recv_t, recv_e, T, lo, hi, chunk, world, rank // tp,
            ids.stride(0), ids.stride(1), K=K, TP=tp, EPG=experts_per_group, WP=WP,
            BLOCK=block, num_warps=4)
    else:
        splits.zero_()
    return EPRoutes(send_t, order, splits[:, :world], recv_t, recv_e)
