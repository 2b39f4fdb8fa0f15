"""Routed experts across ranks: MoE-TP (width split, all-reduce) and EP / EP x TP (all-to-all,
or on the engine path local experts + all-reduce: `ep_dispatch`).

The residual stream is replicated (attention is TP), and so is the router, so every rank
routes all T = B*N tokens identically. From that routing each rank derives the whole exchange
plan by itself, with no count exchange:

  EP (and EP x TP): token t is owned by rank t // ceil(T/world). An owner sends each of its
  (token, slot) pairs to the tp ranks of the expert's group (all_to_all_single, uneven splits,
  bf16 rows); they run their experts (their width slice) and send ACC results back; the owner
  sums the tp partials in rank order and combines the K slots in slot order exactly as
  reference/int4_moe.py does, then the owners' slices are all-gathered. With tp = 1 the
  combine is the reference's own arithmetic on the reference's own values. On bf16 rows (the
  engine emulation, `op_activations`) the owner instead adds its slice into its shared-expert
  partial and one all-reduce sums both (model.py `_moe`): one collective a layer fewer.
  MoE-TP: every rank runs all tokens through all experts' width slices and the ACC partial
  is all-reduced with the shared expert's (one collective a layer).

Results come back in ACC (float64: 4x the bf16 a DeepEP-style combine sends) to keep the slot-order
combine exact; emulate.py's communication model counts the bf16 bytes engines send.
Legend: T tokens (B*N rows), K experts per token, D hidden, E experts, I expert width.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench import ops
from workbench.ep_routes import owned
from workbench.reference import layers as _layers
from workbench.reference.ep_plan import ep_combine as ep_combine_ref
from workbench.reference.int4_moe import Int4Experts

from .comm import Comm
from .layout import Layout

# The reference's accumulation dtype: float64 since reference/layers.py made its reductions
# batch-invariant (float32 before). Every sum this package does itself uses it, so a sum split
# across ranks rounds to bf16 like the single-process one (and the fixed-order combines are the
# reference's own arithmetic).
ACC = getattr(_layers, "ACC", torch.float32)

# What the engine path (Layout.exact False) hands the ops for partials that cross ranks: ACC by
# default (unrounded partials, the CPU proof against the single-process loop), bf16 under
# `op_activations(torch.bfloat16)` (what a serving engine sends and what the optimized kernels
# take: the full-size emulation runs so). Exact mode always keeps ACC.
_OP_DTYPE = [ACC]


@contextmanager
def op_activations(dtype: torch.dtype):
    """Within the block, engine-path ops get (and return) `dtype` activations."""
    _OP_DTYPE.append(dtype)
    try:
        yield
    finally:
        _OP_DTYPE.pop()


def op_dtype() -> torch.dtype:
    return _OP_DTYPE[-1]


# How the EP engine path on bf16 rows (the full-size emulation) moves tokens to experts:
#   "all_to_all"  DeepEP-style: owners send their (token, slot) rows to the experts' ranks and
#                 get the results back (two all-to-alls and a host sync for the split lists)
#   "local"       the stream is replicated (attention is TP), so each rank runs its own experts
#                 on the slots that name them (`moe_ep_local`, -1 elsewhere) and the ranks'
#                 partials join the shared expert's all-reduce: no all-to-all, no host sync
# The default is "local": the EP8 emulation of Kimi K2.6 measured it faster at C 1 / 8 / 32,
# AR and DDTree-16, once int4_moe sizes its tiles for the slots expected here (session 10,
# traces/gpu/session10/README.md: x floor 2.22 vs 2.47 at C 1, budget 16).
EP_DISPATCH = ("all_to_all", "local")
_EP_DISPATCH = ["local"]


@contextmanager
def ep_dispatch(mode: str):
    """Within the block, the EP engine path on bf16 rows dispatches by `mode` (EP_DISPATCH)."""
    if mode not in EP_DISPATCH:
        raise ValueError(f"ep_dispatch: expected one of {EP_DISPATCH}, got {mode!r}")
    _EP_DISPATCH.append(mode)
    try:
        yield
    finally:
        _EP_DISPATCH.pop()


def ep_dispatch_mode() -> str:
    return _EP_DISPATCH[-1]


class LocalExperts(nn.Module):
    """This rank's routed experts: E/ep experts, I/tp of each one's width (checkpoint layout);
    in exact MoE-TP down_proj holds D/tp output rows over the whole width instead."""

    def __init__(self, n_experts: int, hidden: int, width: int, group_size: int,
                 down_rows: int | None = None, down_in: int | None = None):
        super().__init__()
        down = (down_rows or hidden, down_in or width)  # exact MoE-TP: [D/tp, I]
        for proj, (o, i) in (("gate", (width, hidden)), ("up", (width, hidden)), ("down", down)):
            self.register_buffer(f"{proj}_packed",
                                 torch.empty(n_experts, o, i // 8, dtype=torch.int32))
            self.register_buffer(f"{proj}_scale",
                                 torch.empty(n_experts, o, i // group_size, dtype=torch.bfloat16))

    def stacked(self) -> Int4Experts:
        return Int4Experts(self.gate_packed, self.gate_scale, self.up_packed, self.up_scale,
                           self.down_packed, self.down_scale)


def moe_tp_partial(h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                   experts: Int4Experts) -> torch.Tensor:
    """h [T, D] bf16 -> ACC partial [T, D] over this rank's width slice (caller all-reduces).

    The op gets ACC activations (exact upcast of the bf16 rows) so it returns an unrounded
    partial: rounding to bf16 happens once, after the sum, as in the single-process op
    (under `op_activations(bf16)` each rank rounds its partial, as engines do)."""
    return ops.get("int4_moe")(h.to(op_dtype()), ids, w, experts)


@dataclass
class EPPlan:
    """One rank's side of the exchange, derived from the replicated routing."""

    lo: int  # owned token slice [lo, hi)
    hi: int
    chunk: int  # ceil(T / world): owned rows per rank (the all-gather pads to it)
    send_t: torch.Tensor  # [S] token index of each sent row, in send order (by destination)
    order: torch.Tensor  # [S] send position of each (pair, tp member) in (t, j, i) order
    send_splits: list[int]  # rows to each rank
    recv_t: torch.Tensor  # [R] token index of each received row, in receive order
    recv_e: torch.Tensor  # [R] local expert index of each received row
    recv_splits: list[int]  # rows from each rank


def ep_plan(ids: torch.Tensor, lay: Layout, experts_per_group: int) -> EPPlan:
    """This rank's exchange plan from the replicated routing ids [T, K]: the `ep_plan` op
    (reference/ep_plan.py; no host sync) and ONE sync for the split lists the all-to-all takes
    (the received rows' count is their sum)."""
    r = ops.get("ep_plan")(ids, lay.rank, lay.world, lay.tp, experts_per_group)
    send_splits, recv_splits = r.splits.tolist()  # the one sync
    chunk, lo, hi = owned(ids.shape[0], lay.rank, lay.world)
    n = sum(recv_splits)
    return EPPlan(lo, hi, chunk, r.send_t, r.order, send_splits, r.recv_t[:n], r.recv_e[:n],
                  recv_splits)


def moe_ep_local(h: torch.Tensor, here: torch.Tensor, w: torch.Tensor, experts: Int4Experts,
                 lay: Layout) -> torch.Tensor:
    """h [T, D] (replicated), here/w [T, K] -> this rank's partial [T, D] in op_dtype(): its
    group's experts (its width slice of them) on the slots that name them, weighted and summed
    in slot order by the int4_moe op. here: the slots' local expert ids, -1 for the other
    groups' experts (the router stores them: moe_route's `local_experts`); those slots add
    nothing. The caller all-reduces: the groups' partials (and the width slices') sum to the
    routed output.
    The op is told how many slots to expect here (T K / ep under balanced routing): sized for
    all T K slots its tiles would pad ~3 routed slots an expert to 32 (session 10)."""
    expect = -(-here.numel() // lay.ep)
    return ops.get("int4_moe")(h.to(op_dtype()), here, w, experts, expected_slots=expect)


def moe_ep(h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, experts: Int4Experts,
           lay: Layout, comm: Comm, gather: bool = True):
    """h [T, D] bf16 (replicated), ids/w [T, K] -> routed output [T, D] bf16 on every rank;
    gather=False: (this owner's padded slice [chunk, D] bf16, lo, hi) without the all-gather
    (the caller folds it into another collective)."""
    T, K = ids.shape
    D, tp = h.shape[-1], lay.tp
    plan = ep_plan(ids, lay, experts.num_experts)
    # dispatch: bf16 rows to the expert owners (the stand-in knows what would arrive: the rows
    # of the replicated stream)
    x = comm.all_to_all(h[plan.send_t], plan.send_splits, plan.recv_splits,
                        standin=lambda: h[plan.recv_t])
    if lay.moe_exact:  # EP x TP, exact: D/tp whole-dot-product columns per group member
        y = _group_ffn_exact(x, plan.recv_e, experts, lay, comm)  # [R, D/tp] ACC
    else:  # the registered op on ACC rows returns ACC: unrounded, for the exact combine
        ones = torch.ones(x.shape[0], 1, dtype=torch.float32, device=h.device)
        y = ops.get("int4_moe")(x.to(op_dtype()), plan.recv_e.view(-1, 1), ones, experts)  # [R, D']
    # combine: results back to the token owners (a stand-in cannot know remote experts: zeros)
    Tm, Dy = plan.hi - plan.lo, y.shape[-1]
    back = comm.all_to_all(y, plan.recv_splits, plan.send_splits,
                           standin=lambda: y.new_zeros(Tm * K * tp, Dy))
    if lay.moe_exact:  # member i computed output columns [i D/tp, (i+1) D/tp)
        y_pair = back[plan.order].view(Tm, K, D)
        out = torch.zeros(plan.chunk, D, dtype=ACC, device=h.device)  # padded slice
        for j in range(K):  # the reference's fixed slot order
            out[:Tm] += w[plan.lo : plan.hi, j : j + 1].to(ACC) * y_pair[:, j]
    else:  # tp width partials in rank order, then the slots in slot order. ACC partials (the
        # proof path) always take the reference's ACC arithmetic: the single-process combine
        combine = ep_combine_ref if op_dtype() == ACC else ops.get("ep_combine")
        out = combine(back, plan.order, w[plan.lo : plan.hi], plan.chunk, tp, h.dtype)
    if not gather:
        return out.to(h.dtype), plan.lo, plan.hi
    return comm.all_gather_cat(out.to(h.dtype), 0)[:T]


def moe_tp_exact(h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, experts: Int4Experts,
                 comm: Comm) -> torch.Tensor:
    """Exact MoE-TP: reference/int4_moe.py's arithmetic with every dot product whole.

    gate/up hold I/tp rows, down D/tp rows over the whole I. Per expert, the same rows in the
    same order as the reference (nonzero over ids); the ACC SwiGLU activations [T, K, I/tp]
    are all-gathered once, each rank computes its D/tp output columns for all slots, combines
    them in slot order, and the bf16 slices are all-gathered. h [T, D] -> [T, D] bf16."""
    from workbench.reference.int4 import dequant_int4_g32

    T, K = ids.shape
    act = torch.zeros(T, K, experts.gate_packed.shape[1], dtype=ACC, device=h.device)  # [T,K,I/tp]
    hits = [(e, *(ids == e).nonzero(as_tuple=True)) for e in torch.unique(ids).tolist()]
    for e, t, j in hits:
        wg = dequant_int4_g32(experts.gate_packed[e], experts.gate_scale[e]).to(ACC)
        wu = dequant_int4_g32(experts.up_packed[e], experts.up_scale[e]).to(ACC)
        xf = h[t].to(ACC)
        act[t, j] = F.silu(F.linear(xf, wg)) * F.linear(xf, wu)
    act = comm.all_gather_cat(act, -1)  # [T, K, I] in width order
    y = torch.zeros(T, K, experts.down_packed.shape[1], dtype=ACC, device=h.device)  # [T,K,D/tp]
    for e, t, j in hits:
        y[t, j] = F.linear(act[t, j], dequant_int4_g32(experts.down_packed[e],
                                                       experts.down_scale[e]).to(ACC))
    out = torch.zeros(T, y.shape[-1], dtype=ACC, device=h.device)
    for j in range(K):  # fixed combine order
        out += w[:, j : j + 1].to(ACC) * y[:, j]
    return comm.all_gather_cat(out.to(h.dtype), -1)


def _group_ffn_exact(x: torch.Tensor, local_e: torch.Tensor, experts: Int4Experts, lay: Layout,
                     comm: Comm) -> torch.Tensor:
    """x [R, D] received rows (the same rows, same order, on every member of this expert
    group), local_e [R] -> [R, D/tp] ACC: this member's output columns, whole dot products.

    The members swap their ACC SwiGLU slices [R, I/tp] through all_to_all_single with
    splits that are non-zero only inside the group (no sub-group needed)."""
    from workbench.reference.int4 import dequant_int4_g32

    R, tp, g = x.shape[0], lay.tp, lay.group
    act = torch.zeros(R, experts.gate_packed.shape[1], dtype=ACC, device=x.device)  # [R, I/tp]
    rows = [(e, (local_e == e).nonzero(as_tuple=True)[0]) for e in torch.unique(local_e).tolist()]
    for e, r in rows:  # the reference's per-expert rows, in its order
        xf = x[r].to(ACC)
        act[r] = F.silu(F.linear(xf, dequant_int4_g32(experts.gate_packed[e],
                                                      experts.gate_scale[e]).to(ACC))) * \
            F.linear(xf, dequant_int4_g32(experts.up_packed[e], experts.up_scale[e]).to(ACC))
    splits = [R if q // tp == g else 0 for q in range(lay.world)]
    got = comm.all_to_all(act.repeat(tp, 1), splits, splits, standin=lambda: act.repeat(tp, 1))
    w = act.shape[1]
    full = got.view(tp, R, w).permute(1, 0, 2).reshape(R, tp * w)  # [R, I], width order
    y = torch.zeros(R, experts.down_packed.shape[1], dtype=ACC, device=x.device)  # [R, D/tp]
    for e, r in rows:
        y[r] = F.linear(full[r], dequant_int4_g32(experts.down_packed[e],
                                                  experts.down_scale[e]).to(ACC))
    return y
