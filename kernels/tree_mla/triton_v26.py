"""tree_mla triton_v26: triton_v4 with the LSE merge inside the attention launch: each part of a
row block takes a ticket on the block's counter once its partial is stored, and the part that
draws the last ticket merges the block's partials (triton_v4's `_merge_last`, the MERGE
constexpr of its kernel). One launch instead of two, and the partials read back from L2 moments
after they were written instead of from HBM by a second grid.

    launch 1  _attn_kernel (MERGE)  grid (G, ceil(M / BLOCK_M), B), triton_v4's parts; a request
              with n_parts > 1: part t stores partial slot t, takes ticket k on counter
              (b, row block); k = n_parts - 1 merges parts 0, 1, ..., n_parts - 1 in that
              order (whatever order they finished in), writes o_lat / lse and resets the
              counter to 0. n_parts == 1: o_lat / lse directly, no ticket (as v4).

Why: at large M the combine is a second pass over every partial. N 129 x 64 heads at P 1024
(v4's 4 parts of 256 keys) writes and re-reads 4 x [8256, 512] fp32 = 68 MB; at P 8192 (17
parts) 287 MB, more than L2 holds, so the combine reads them from HBM after the attention grid
has finished (session 13 call 3; session 14's policy sweep: the short splits lose 1.6x to one
part at N 129 P 1024). With the merge in the last part's program, a row block's partials are
read while they are still in L2 (at most a wave of programs' partials are in flight: 132 x 128
KB), and the combine's launch, ramp and tail go. At decode (N H <= 64, few parts) what goes is
the second launch (v4 launches it with PDL, so mostly its tail).
Numerics: the merge is `_combine_kernel`'s arithmetic value for value (the same loads, max,
exp2, sums and division in part order), in 128-column chunks as the combine's program: v4's
bits (CPU test: bitwise triton_v4; `gpu` test the same). Batch-invariant by P as v4.
Counters: one int32 buffer per device for tree_mla (linear_triton_v2.counters, zeroed once,
grown outside graph capture, reset by the kernel), so two launches may not run concurrently on
different streams (the model issues attention on one stream).
Legend: _common.py.
"""

from __future__ import annotations

import torch

from .triton_v4 import V4, _attn_kernel, _launch  # noqa: F401  (sm90.py captures _attn_kernel)


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v4's split
    policy with the merge in the attention launch. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, merge=True)
