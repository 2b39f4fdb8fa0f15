"""Kimi K2 router: sigmoid + e_score_correction_bias top-k, no group limit (n_group = 1).

1. logits = h @ W_gate^T, float64-accumulated (layers.ACC), sigmoid rounded to fp32  [T, E]
2. s = sigmoid(logits); choice = s + bias (fp32)       the bias only selects
3. ids = top-k of choice. Tie rule: the lower expert index wins (a stable descending sort), so
   the routing is deterministic; ids come out in descending choice order.
4. weights = s[ids] / (sum + 1e-20) * routed_scaling_factor  (unbiased, renormalised)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import ACC


def moe_route(h: torch.Tensor, gate_weight: torch.Tensor, bias: torch.Tensor, top_k: int,
              scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K])."""
    s = torch.sigmoid(F.linear(h.to(ACC), gate_weight.to(ACC))).float()  # [T, E] fp32
    choice = s + bias.float()
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scaling
    return ids, w
