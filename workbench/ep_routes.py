"""The EP exchange plan's record: the contract between the `ep_plan` reference
(reference/ep_plan.py), its kernels (kernels/dense/ep_plan_triton_v1.py) and the distributed
MoE (workbench/dist/moe.py), so a kernel returns the same type without importing reference code
(as workbench/tree.py does for the DDTree). Legend: T tokens, K experts per token, W world,
S sent rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EPRoutes:
    send_t: torch.Tensor  # [S] int64: token of each sent row, in send order (by destination)
    order: torch.Tensor  # [S] int64: send position of each (t, j, i) element, t in [lo, hi)
    splits: torch.Tensor  # [2, W] int64: rows sent to each rank; rows received from each rank
    recv_t: torch.Tensor  # [T*K] int64: token of each received row (row-major order), then -1
    recv_e: torch.Tensor  # [T*K] int64: its local expert (expert - group * per group), then -1


def owned(T: int, rank: int, world: int) -> tuple[int, int, int]:
    """(chunk, lo, hi): rank's owned token slice [lo, hi) and the rows per rank (ceil(T/W))."""
    chunk = max(1, -(-T // world))
    return chunk, min(rank * chunk, T), min((rank + 1) * chunk, T)
