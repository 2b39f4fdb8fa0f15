"""The expert-parallel exchange plan of one rank, from the replicated routing (plain PyTorch).

Every rank routes all T tokens identically (the router is replicated), so each derives its own
side of the all-to-all with no count exchange (workbench/dist/moe.py runs it):

  token t is owned by rank t // chunk, chunk = ceil(T / world); an owner sends each of its
  (token, slot j) pairs to the tp members of the expert's group (group = expert // experts per
  group; member i of group g is rank g * tp + i), rows ordered by destination and, within one
  destination, in (t, j, i) order. A rank receives the pairs routed to its group, from their
  owners in source-rank order and from one source in (t, j) order: row-major order over all
  T x K pairs is exactly that.

The outputs are tensors only (no host sync needed to produce them): the received rows are
padded to T*K with -1, their count is splits[1].sum(). The caller syncs once, for the split
lists an all_to_all takes.
Legend: T tokens, K experts per token, W world, S = (hi - lo) K tp sent rows, R received rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.ep_routes import EPRoutes, owned


def ep_plan(ids: torch.Tensor, rank: int, world: int, tp: int,
            experts_per_group: int) -> EPRoutes:
    """ids [T, K] int (experts in [0, world / tp * experts_per_group)) -> rank's EPRoutes."""
    T, K = ids.shape
    dev = ids.device
    chunk, lo, hi = owned(T, rank, world)
    ids = ids.long()
    grp = ids // experts_per_group  # [T, K] expert group of each pair
    dest = (grp[lo:hi, :, None] * tp + torch.arange(tp, device=dev)).flatten()  # [S] (t, j, i)
    by_dest = torch.argsort(dest, stable=True)  # keeps (t, j, i) order per destination
    send_t = lo + by_dest // (K * tp)  # element e belongs to token lo + e // (K tp)
    order = torch.empty_like(by_dest)
    order[by_dest] = torch.arange(by_dest.numel(), device=dev)
    mine = grp == rank // tp  # [T, K] pairs routed to my group
    per_owner = F.pad(mine.sum(1), (0, world * chunk - T)).view(world, chunk).sum(1)  # [W]
    sent = (dest[:, None] == torch.arange(world, device=dev)).sum(0)  # [W]
    rt, rj = mine.nonzero(as_tuple=True)  # [R] row-major
    recv_t = torch.full((T * K,), -1, dtype=torch.int64, device=dev)
    recv_e = torch.full((T * K,), -1, dtype=torch.int64, device=dev)
    recv_t[: rt.numel()] = rt
    recv_e[: rt.numel()] = ids[rt, rj] - (rank // tp) * experts_per_group
    return EPRoutes(send_t, order, torch.stack([sent, per_owner]), recv_t, recv_e)


def ep_combine(back: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, chunk: int,
               tp: int, out_dtype: torch.dtype) -> torch.Tensor:
    """The owner's side of the EP combine: the expert outputs that came back, in send order,
    to its padded slice of the routed output.

    back [S, D] (S = Tm K tp rows, as sent), order [S] (EPRoutes.order: the send position of
    each (t, j, i)), weights [Tm, K] the owned tokens' routing weights -> [chunk, D] out_dtype:
    row t < Tm = sum_j w[t, j] * (sum_i back[order[(t K + j) tp + i]]), the tp width-slice
    partials summed in rank order, then the slots in slot order, in float64, rounded once;
    rows Tm..chunk-1 (the all-gather's padding) are zero."""
    from workbench.reference.layers import ACC

    Tm, K = weights.shape
    parts = back[order].to(ACC).view(Tm, K, tp, back.shape[-1])
    y = parts[:, :, 0]
    for i in range(1, tp):  # width-slice partials in rank order
        y = y + parts[:, :, i]
    out = torch.zeros(chunk, back.shape[-1], dtype=ACC, device=back.device)
    for j in range(K):  # the reference MoE's fixed slot order
        out[:Tm] += weights[:, j : j + 1].to(ACC) * y[:, j]
    return out.to(out_dtype)
