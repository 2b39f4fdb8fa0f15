"""tree_mla triton_v17: triton_v7 (v4's attention kernel under the split policy by head count)
with an LSE merge that reads every part in one round: triton_v8's combine kernel with 128
parts a chunk (`ONE_ROUND`: no separate lse pass when the grid's parts fit one chunk) over
8 rows x 8 columns a program.

Why (H200, session 15, `scripts/sweep_tree_mla_policy.py`, calls 2-4): at 8 heads the
attention kernel's time follows the length of its parts (one CTA's chain of ~2 µs a 64-key
tile), so v7's 128-key parts (33 at P 4096) take gluon_v13's attention from ~19 to 10.1 µs at
N 1; the merge then gives it back. v4's combine walks the parts one after another (~0.35 µs a
part), v8's takes 16 a round over 16 x 32 tiles in 16 programs at M 8: busy 18.5 µs of which
10.1 attention. A merge's floor is one dependent load round after the attention's flush: here
every part's [8, 8] lse / o tile is one load each, issued together, in 64 programs at M 8
(576 at N 17), and m comes from the same lse load.

    launch 1  triton_v4._attn_kernel under triton_v7.policy_of(q) (unchanged)
    launch 2  below 32 heads: triton_v8._combine_kernel, BLOCK_R 8, BLOCK_C 8, CH 128,
              ONE_ROUND where the grid's part count G <= 128 (v7's policy: <= 65), PDL as v4's;
              at 32 heads or more v4's combine and policy (v7's there): 64-head rows fill the GPU
              with attention programs, and v8's many-program merge lost to v4's (session 7)

Merge order: the reduction over the chunk axis is fixed by CH, BLOCK_R, BLOCK_C and the 4
warps (never by B, M or T), parts past n_parts add an exact +0: batch invariant as v8, and
the one-round path gives the two-pass path's bits (same m, sums started from zeros).
Legend: _common.py.
"""

from __future__ import annotations

import torch
import triton

from . import _common

# the kernels are imported for sm90.py, which compiles (and swaps) a version's kernels by module
from .triton_v4 import _attn_kernel, _launch  # noqa: F401
from .triton_v7 import policy_of
from .triton_v8 import _combine_kernel

COMBINE_ROWS = 8  # rows a merge program (an 8-head node)
COMBINE_COLS = 8  # columns a merge program: 64 programs a row block at C 512
CHUNK = 128  # parts a load round: every policy in use (<= 65 parts) in one
# COMBINE_ROWS, COMBINE_COLS, CHUNK and the 4 warps fix the reduction tree: never from B or M


def launch_merge(R: int, BC: int, CH: int, prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C,
                 CP, consts, use_pdl, pdl):
    """triton_v8's merge kernel on R rows x BC columns a program, CH parts a round (one round
    where the grid's G parts fit CH): v17's merge at (8, 8, 128), gluon_v22's at (8, 32, 64),
    the policy sweep's `--merges`."""
    _combine_kernel[(triton.cdiv(M, R), CP // BC, o_part.shape[0])](
        prefix_lens, o_part, l_part, o_lat, lse, prefix_lens.stride(0), T, M, G, C=C, CP=CP,
        BLOCK_R=R, BLOCK_C=BC, NP=_common.next_pow2(G), CH=CH, **consts, USE_PDL=use_pdl,
        ONE_ROUND=G <= CH, num_warps=4, **pdl)


def _launch_combine(prefix_lens, o_part, l_part, o_lat, lse, T, M, G, C, CP, consts, use_pdl,
                    pdl):
    """v17's merge launch (the `combine` hook of triton_v4._launch and gluon_v11._launch)."""
    launch_merge(COMBINE_ROWS, COMBINE_COLS, CHUNK, prefix_lens, o_part, l_part, o_lat, lse, T,
                 M, G, C, CP, consts, use_pdl, pdl)


def combine_for(H: int):
    """The merge launcher for a model with H query heads (per rank): v17's below 32 heads,
    None (the launcher's own, v4's) at 32 or more. Fixed per model, as the policy."""
    return _launch_combine if H < 32 else None


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; triton_v7's
    attention and policy, the one-round merge above below 32 heads (v4's at 32 or more). No
    host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q), combine=combine_for(q.shape[2] if q.dim() == 4 else 0))
