"""tree_mla triton_v16: triton_v15's transposed attention kernel (64 keys on the MMA's M, 16
query rows on its N) with more, shorter parts below 32 heads (triton_v7's policy by head count)
and triton_v8's chunked combine.

Why (H200, session 15, `scripts/sweep_tree_mla_policy.py --version triton_v15`, call 3): at 8
heads the transposed kernel's attention time falls with its parts' length, not with fewer
padded rows: ~2 µs a 64-key tile on one SM whatever the tile's MMA work, so N 1 P 4096 takes
20.5 µs of attention under v4's 512-key parts and 7.7 µs under v7's 128-key ones (33 parts).
v4's combine then walks those 33 parts one load after another (~0.35 µs a part: the busy time
rose to 18.9 µs). triton_v8's combine loads 16 parts at a time (3 rounds for 33).

    launch 1  triton_v15._attn_kernel under triton_v7.policy_of(q): below 32 heads 128-key
              splits up to P = 2048, past it >= 128 keys and <= 64 splits (the tree in a part
              of its own); v4's policy at 32 heads or more
    launch 2  triton_v8._combine_kernel (PDL): all lse at once, 16 parts a chunk, 32 columns

A row's partition is fixed by its request's P and the model's head count, never by N or B
(v7's argument); the row blocks are v15's fixed 16 rows. Numerics: within the tolerances of the
reference (v8's merge tree, v15's tiles), not v15's bits where the policy differs.
Measured (H200, session 15 call 4; README.md "Design (v15, v16)"): faster than gluon_v13 at
8-head decode (N 1 P 1024 18.4 vs 20.6 µs, P 8192 26.0 vs 30.2) and slower from N 9 at long
contexts and at large batch (B 32 N 9 P 4096 414.8 vs 118.0); in the EP8 emulation at C 1 the
AR step's kernels 6.91 vs 7.49 ms, DDTree-16's 16.74 vs 16.02. Not BEST.
Legend: _common.py.
"""

from __future__ import annotations

import torch

# the kernels are imported for sm90.py, which compiles (and swaps) a version's kernels by module
from .triton_v7 import policy_of
from .triton_v8 import _combine_kernel  # noqa: F401
from .triton_v8 import _launch_combine as _combine_v8
from .triton_v15 import (
    _attn_kernel,  # noqa: F401
    _launch,
)


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; triton_v15's
    attention under triton_v7's policy, triton_v8's combine. No host sync unless
    validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q), combine=_combine_v8)
