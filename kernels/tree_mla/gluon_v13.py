"""tree_mla gluon_v13: gluon_v11 with a partition barrier before each rendezvous that publishes
shared-memory stores to the other warpgroup (the `PUB` constexpr of gluon_v11's kernel).

Why: compute-sanitizer's racecheck reports gluon_v11's named-barrier handoffs as RAW hazards
(session 13: 4390 on the small diag shapes; session 14 call 1: 4198, every one printed the m or
l vector, written by lane 3 of a quad in one warpgroup before `bar.sync 1x, 256` and read by
lane 0 of the other after it). The 30-line probe `scripts/racecheck_named_barrier_probe.py`,
whose handoff is correct by construction and whose output is checked, reproduces them in the
wgmma row layout (`--mma`: 228 errors, `--mma --reverse`: 128) and loses them when the writer
passes a partition barrier between its store and the rendezvous (`--mma --sync`,
`--mma --reverse --sync`: none on the vector). bar.sync over both warpgroups already orders the
stores for the hardware (PTX: memory accesses before the barrier are performed relative to all
participating threads); the extra `bar.sync` over the writer's 128 threads is the price of a
checker that can follow the handoff. Three a pair (M0, M1, P1) and two at the end (LW1,
LSUM).

Everything else is gluon_v11 (PUB = False leaves its SASS unchanged, checked with nvdisasm).
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch, policy_long
from .triton_v4 import V4


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); v4's split policy and combine. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, publish=True)


def tree_mla_gluon_long(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                        anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                        validate: bool = False):
    """gluon_v13 under gluon_v11's `policy_long(q)` (>= 1024-key splits past P = 2048 at >= 32
    heads)."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_long(q), publish=True)
