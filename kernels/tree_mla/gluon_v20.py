"""tree_mla gluon_v20 (ENGINE-ONLY): gluon_v19's kernel with the split policy chosen per launch
by its query rows, as a serving engine picks its splits by batch: below 32 heads a launch of at
most SHORT_ROWS query rows (B x N: decode at small batch) runs triton_v7's 128-key parts with
triton_v17's one-round merge (gluon_v18's launch with gluon_v19's reciprocal epilogue); every
other launch is gluon_v19.

Why (H200): the 8-head decode attention is the emulated EP8 AR step's largest kernel after the
int4 GEMMs, 21.9 µs a layer at P 4096 (1.33 ms of 7.24, session 18 call 11). v4's policy gives
it 8 parts of 512 keys, and a part costs ~2 µs a 64-key tile whatever its rows (session 15).
gluon_v18's 128-key parts took the C 1 AR step from 7.46 to 6.88 ms (session 16), but lose
2.6x at B 32 N 9 and from N 17 (their partials and CTAs multiply with the rows). No policy by P
and H alone serves both (the issue's batch-invariance contract), so BEST stays gluon_v19.

NOT batch-invariant: a row's partition (hence its bits) depends on how many rows share the
launch, like cuBLAS's split-K by row count in the engine preset's projections. So it is the
"engine" preset's tree_mla only (`ENGINE` in this package), never "optimized" or "invariant".
Each of its two paths is bitwise the launch it names (tests/test_tree_mla_kernel.py, GPU).
Legend: _common.py.
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch
from .triton_v4 import V4
from .triton_v7 import policy_for
from .triton_v17 import combine_for

# B x N at or below which an 8-head (< 32) launch takes the short parts. A first guess from
# session 16's bench (B 1: N 1 and N 9 from P 8192 faster, N 17 slower, B 32 N 9 2.6x slower);
# `scripts/sweep_tree_mla_policy.py --batch` measures it.
SHORT_ROWS = 8


def short_parts(B: int, N: int, H: int) -> bool:
    """Does a launch of B requests x N rows at H heads take the short parts?"""
    return H < 32 and B * N <= SHORT_ROWS


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); gluon_v18's parts and merge where `short_parts`, else gluon_v19's,
    both with the reciprocal epilogue. No host sync unless validate=True."""
    B, N, H = q.shape[:3] if q.dim() == 4 else (0, 0, 0)  # a bad q: the launcher names it
    if short_parts(B, N, H):
        return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                       validate, policy_for(H), publish=True, rcp=True,
                       combine=combine_for(H))
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, publish=True, rcp=True)
