"""tree_mla gluon_v12: gluon_v11 with each K half loaded as 64-column chunks, each under its own
mbarrier (FlashMLA's nine a tile: eight here plus the rope with the last right chunk), so a
warpgroup's QK^T starts on a half's first chunk instead of waiting for all 32 KB of it.

Why: session 13's ncu of gluon_v11 (N 129 H 64 P 8192) puts 3.3 % of the stall samples on
warpgroup 0 waiting for tile i + 2's left half, which it refills itself only one PV earlier,
and more on the other halves' waits; a chunk's 16 k-steps of QK^T take about as long as the
next chunk's 8 KB take to arrive, so only the first chunk's latency is left exposed. The cost:
eight TMA issues a slot-half pair instead of two (Gluon wraps each in a partition barrier: 49
instead of 28 in the pair loop's SASS, 2042 instructions a pair instead of 1814) and 12 more
mbarriers. Everything else is gluon_v11's kernel (its NCH constexpr; NCH = 1 is v11, whose
SASS is unchanged). Compile-checked (`sm90_gluon --version 12`: 44 B spills outside the loops,
230,588 B smem). H200 (session 14 calls 1-3): every GPU test that ran passed (call 1: 239 of
g9-g12's 270 before the step's time limit), and it takes 1.11x gluon_v11's time over the 28
REAL shapes (geomean, 1.04-1.24x): the eight issue barriers a slot pair cost more than the
earlier start saves. A measured negative, kept.
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch
from .triton_v4 import V4


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, chunks=True)
