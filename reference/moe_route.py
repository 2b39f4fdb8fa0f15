"""Kimi K2 router: sigmoid + e_score_correction_bias top-k, no group limit (n_group = 1).

1. logits = h @ W_gate^T, float64-accumulated (layers.ACC), sigmoid rounded to fp32  [T, E]
2. s = sigmoid(logits); choice = s + bias (fp32)       the bias only selects
3. ids = top-k of choice. Tie rule: the lower expert index wins (a stable descending sort), so
   the routing is deterministic; ids come out in descending choice order.
4. weights = s[ids] / (sum + 1e-20) * routed_scaling_factor  (unbiased, renormalised)
5. local_experts = (first, n) (expert parallelism: the n experts one rank holds) adds a third
   output, the ids as that rank's int4_moe takes them: id - first where first <= id < first + n,
   else -1 ("this slot's expert is not here"). The router picks it for free as it stores the ids;
   the model's separate gather cost a launch a MoE layer (~2-3 µs, session 21's EP8 step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import ACC


def moe_route(h: torch.Tensor, gate_weight: torch.Tensor, bias: torch.Tensor, top_k: int,
              scaling: float, local_experts: tuple[int, int] | None = None) -> tuple:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K]), and with local_experts = (first, n)
    the local ids int64 [T, K] (rule 5) as a third output."""
    s = torch.sigmoid(F.linear(h.to(ACC), gate_weight.to(ACC))).float()  # [T, E] fp32
    choice = s + bias.float()
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scaling
    if local_experts is None:
        return ids, w
    return ids, w, local_ids(ids, local_experts)


def local_ids(ids: torch.Tensor, local_experts: tuple[int, int]) -> torch.Tensor:
    """Rule 5: ids [T, K] global -> id - first inside [first, first + n), -1 elsewhere."""
    first, n = local_experts
    return torch.where((ids >= first) & (ids < first + n), ids - first, torch.full_like(ids, -1))
