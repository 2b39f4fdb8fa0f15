"""tree_mla gluon_v23 (ENGINE-ONLY): gluon_v22 with the transposed decode launch's merge on 4
rows x 32 columns a program, one round of 128 parts (v17's: 8 x 8 x 128); everything else
gluon_v22's (its short-part merge on 8 x 32 x 64, gluon_v20 / v19 past one wave).

Why (H200, session 20 call 1, `scripts/sweep_tree_mla_policy.py --version triton_v15_c17
--policies s64 --merges 8x8x128,8x16x128,4x32x128`, H 8, busy µs of one call, 8x8x128 /
4x32x128): B 1 N 1 P 1024 / 4096 / 8192 10.7 / 9.0 / 12.3 against **10.3 / 8.4 / 11.3**, B 1 N
2 11.6 / 10.3 / 13.6 against 11.1 / 9.2 / 11.9, B 2 N 1 11.4 / 11.3 / 18.3 against 10.8 / 9.8
/ 17.6, B 2 N 2 12.8 / 14.2 / 22.5 against 11.9 / 11.4 / 18.8: faster at every decode shape
swept (8x16x128 in between). The attention kernel's own time is the same in all three (it
does not depend on the merge), so the gain is the merge's. Why the 4 x 32 tile wins is a
hypothesis (not profiled): 128-byte runs of each part's row instead of 32-byte ones, in half
as many programs as v17's tile, at 186 registers without spills (session 19's compile).

NOT batch-invariant (as gluon_v20-v22): the engine preset's. Each launch is bitwise the
launch it names (tests/test_tree_mla_kernel.py).
Legend: _common.py.
"""

from __future__ import annotations

import torch

from . import gluon_v21, gluon_v22
from .triton_v17 import _launch_combine, launch_merge

DECODE_ROWS, DECODE_COLS, DECODE_PARTS = 4, 32, 128  # the decode merge's tile, parts a round


def decode_merge(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl, pdl):
    """The transposed decode launch's merge (triton_v15._launch's `combine` hook): triton_v8's
    kernel on DECODE_ROWS x DECODE_COLS tiles, DECODE_PARTS parts a round (more parts than that,
    P > 8192, take a second round as v17's); v17's where CP is not whole tiles."""
    args = (prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl, pdl)
    if CP % DECODE_COLS:
        return _launch_combine(*args)
    launch_merge(DECODE_ROWS, DECODE_COLS, DECODE_PARTS, *args)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (the launched
    version's inputs and errors): gluon_v22's launches with the decode launch merged by
    `decode_merge`. No host sync unless validate=True."""
    return gluon_v21.launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                            validate, combine=gluon_v22.merge, decode_combine=decode_merge)
