"""Routed experts of one MoE layer, INT4 W4A16, as a readable loop over experts.

For each token t and slot j < K:  y[t] += w[t, j] * E_{ids[t, j]}(x[t]),
E(x) = down(silu(gate x) * up x), weights dequantised exactly (bf16-rounded W, see int4.py),
all math float64-accumulated (layers.ACC) and rounded once, the combine summed over
j = 0..K-1 in slot order (deterministic). An id of -1 means "this slot's expert is not here"
(expert parallelism with a replicated residual stream: each rank passes the slots of its own
experts and -1 elsewhere, and an all-reduce sums the ranks' partials); it adds nothing.

`expected_slots` (keyword, optional; workbench/moe_slots.py) is how many of the T K slots the
caller expects to name an expert here (EP on a replicated stream: about T K E_local / E).
Kernels size their tiles for it instead of for all T K slots; it is a hint about the data,
never a promise: results do not depend on it (the reference only checks it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from workbench.moe_slots import check_expected_slots

from .int4 import dequant_int4_g32
from .layers import ACC


class Int4Experts(NamedTuple):
    """Stacked checkpoint tensors of one layer's routed experts (E experts, I = FFN width)."""

    gate_packed: torch.Tensor  # int32 [E, I, D/8]
    gate_scale: torch.Tensor  # bf16  [E, I, D/32]
    up_packed: torch.Tensor  # int32 [E, I, D/8]
    up_scale: torch.Tensor  # bf16  [E, I, D/32]
    down_packed: torch.Tensor  # int32 [E, D, I/8]
    down_scale: torch.Tensor  # bf16  [E, D, I/32]

    @property
    def num_experts(self) -> int:
        return self.gate_packed.shape[0]


def expert_ffn(x: torch.Tensor, experts: Int4Experts, e: int) -> torch.Tensor:
    """x [n, D] -> [n, D] (float64) through expert e."""
    wg = dequant_int4_g32(experts.gate_packed[e], experts.gate_scale[e]).to(ACC)
    wu = dequant_int4_g32(experts.up_packed[e], experts.up_scale[e]).to(ACC)
    wd = dequant_int4_g32(experts.down_packed[e], experts.down_scale[e]).to(ACC)
    xf = x.to(ACC)
    return F.linear(F.silu(F.linear(xf, wg)) * F.linear(xf, wu), wd)


def int4_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
             experts: Int4Experts, *, expected_slots: int | None = None) -> torch.Tensor:
    """x [T, D] bf16, topk_ids [T, K] int, topk_weights [T, K] fp32 -> [T, D] in x.dtype;
    expected_slots: a tile-sizing hint for kernels (module docstring), checked, unused."""
    T, K = topk_ids.shape
    check_expected_slots(expected_slots, T, K)
    y = torch.zeros(T, K, x.shape[-1], dtype=ACC, device=x.device)  # [T, K, D]
    for e in torch.unique(topk_ids).tolist():
        if e == -1:  # not routed here
            continue
        t, j = (topk_ids == e).nonzero(as_tuple=True)
        y[t, j] = expert_ffn(x[t], experts, e)
    out = torch.zeros(T, x.shape[-1], dtype=ACC, device=x.device)
    for j in range(K):  # fixed combine order
        out += topk_weights[:, j : j + 1].to(ACC) * y[:, j]
    return out.to(x.dtype)
