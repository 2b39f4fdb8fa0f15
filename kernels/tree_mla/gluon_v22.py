"""tree_mla gluon_v22 (ENGINE-ONLY): gluon_v21 with the short-part launch's merge on wider
tiles: triton_v8's merge kernel at 8 rows x 32 columns a program, all of a request's parts in
one round where they are at most 64 (v17's: 8 x 8, one round of 128); past 64 parts, and for
the transposed decode launch, v17's merge as in gluon_v21.

Why (H200, session 19 call 6, `scripts/sweep_tree_mla_policy.py --merges`, H 8, P 4096, 33
parts, busy µs of one call, v17's 8x8x128 / 8x32x64): B 1 N 17 21.7 / **17.4**, B 2 N 9 22.9 /
**18.1**, B 1 N 9 17.6 / **16.2**, B 1 N 1 12.1 / 11.9, B 2 N 1 12.9 / 12.7. A hypothesis
for why (not profiled): v17's tile loads each part's rows as 32-byte runs in 64 programs a row
block (1088 at N 17) and sums 128 parts (95 of them masked zeros) a program; 32 columns make
128-byte runs in a quarter of the programs, and 64 parts a round half the summed zeros. Behind
triton_v15's 65 parts (decode) v17's one round stays best (8.8 against 10.9 µs: 8x32x64 takes
two passes there).

NOT batch-invariant (as gluon_v20 / v21): the engine preset's. Each launch is bitwise the
launch it names (tests/test_tree_mla_kernel.py).
Legend: _common.py.
"""

from __future__ import annotations

import torch

from . import gluon_v21
from .triton_v17 import _launch_combine, launch_merge

MERGE_ROWS, MERGE_COLS, MERGE_PARTS = 8, 32, 64  # the merge's tile and parts a round


def merge(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl, pdl):
    """The short-part launch's merge (gluon_v11._launch's `combine` hook): triton_v8's kernel
    on MERGE_ROWS x MERGE_COLS tiles in one round of MERGE_PARTS where G fits it (and CP is
    whole tiles), else v17's."""
    args = (prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl, pdl)
    if G > MERGE_PARTS or CP % MERGE_COLS:
        return _launch_combine(*args)
    launch_merge(MERGE_ROWS, MERGE_COLS, MERGE_PARTS, *args)  # one round: G <= MERGE_PARTS


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (the launched
    version's inputs and errors): gluon_v21's launches with the short parts merged by `merge`.
    No host sync unless validate=True."""
    return gluon_v21.launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                            validate, combine=merge)
