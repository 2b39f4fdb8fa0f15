"""The DDTree record: the contract between the tree builders, tree-verify attention and the walk.

Shared by the reference (reference/tree_build.py) and every kernel (kernels/tree_build/), so a
kernel returns the same type without importing reference code. Legend: B requests, N = budget
+ 1 rows (row 0 = the root), W = ceil(N / 64) ancestor-mask words.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

WORD_BITS = 64


@dataclass
class DDTree:
    """One best-first tree per request, padded to N = budget + 1 rows (row 0 = the root).

    tokens [B, N] int64        node tokens; row 0 = root token; padding 0
    depths [B, N] int64        root 0; padding 0
    parents [B, N] int64       root -1; padding -1; parents[i] < i
    scores [B, N] float64      prefix log-prob sum; root 0.0; padding -inf
    anc_bits [B, N, W] int64   bit j of word w set iff node 64*w + j is an ancestor-or-self
    positions [B, N] int64     prefix_len + depth
    node_count [B] int64       real rows incl. the root (<= N)
    first_child, next_sibling [B, N] int64   EAGLE left-child/right-sibling, -1 = none
    """

    tokens: Tensor
    depths: Tensor
    parents: Tensor
    scores: Tensor
    anc_bits: Tensor
    positions: Tensor
    node_count: Tensor
    first_child: Tensor
    next_sibling: Tensor

    @property
    def num_rows(self) -> int:
        """N = budget + 1."""
        return self.tokens.shape[1]

    @property
    def budget(self) -> int:
        return self.num_rows - 1

    def visibility(self) -> Tensor:
        """bool [B, N, N]: [b, i, j] is True iff node j is an ancestor-or-self of node i."""
        shifts = torch.arange(WORD_BITS, device=self.anc_bits.device)
        # Arithmetic shift keeps the sign of bit 63, but `& 1` reads it correctly either way.
        bits = (self.anc_bits.unsqueeze(-1) >> shifts) & 1  # [B, N, W, 64]
        return bits.flatten(2)[..., : self.num_rows].bool()

    def to(self, device) -> DDTree:
        return DDTree(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})
