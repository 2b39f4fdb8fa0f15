"""tree_mla gluon_v19: gluon_v13 with an epilogue that multiplies O by one reciprocal of l a
row instead of dividing every value by l (gluon_v11's `RCP` constexpr).

Why (H200, session 16 call 6, traces/gpu/session16/call6_*): ncu of the attention kernel at
N 1 H 8 P 8192 (gluon_v18, 65 CTAs of 2 key tiles) puts 47 % of the stall samples in the two
epilogues, 30 % waiting for instructions (`no_inst`): each warpgroup's epilogue is ~1000
straight-line SASS run once a CTA, fetched cold by every SM. Most of it is the division:
`acc / l` is a div.full.f32 a value (128 a thread), each a range check, a scale by 2^24 for
small divisors and a multiply by the reciprocal (nvdisasm). With one reciprocal a row and a
multiply a value the kernel is 6207 SASS instead of 6959 (`sm90_gluon --version 19`), 4
div.full.f32 instead of 256; registers and spills unchanged. The epilogue runs once a CTA at
every shape, so every head count gets it; it is most of a short part's fixed cost.

Numerics: o = acc * (1 / l) instead of acc / l (div.full.f32 is itself an approximate
division, 2 ulp): within the harness tolerances of the reference, not gluon_v13's bits. The
partition and merge are gluon_v13's (v4's policy): batch invariance by P as before.
Legend: _common.py.
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
    inputs and errors); gluon_v13's policy, merge and kernel with the reciprocal epilogue. No
    host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, publish=True, rcp=True)
