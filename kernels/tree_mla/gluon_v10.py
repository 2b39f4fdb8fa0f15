"""tree_mla gluon_v10: gluon_v9 with P handed to the PV wgmma through a shared-memory buffer of
its own instead of the compiler's layout conversion (README.md, "Design (v10)").

v9's prefix tile (sm_90 SASS, session 12) runs 13 CTA barriers: the ring's slot barrier and
the TMA issue (~5), the row max and the row sum across the two warpgroups (2 each: each
warpgroup holds half of every row's 64 scores), and P's conversion to the PV A-operand layout
(4: two rounds through the compiler's 8 KB scratch). In v10 each warpgroup stores its half of
P (bf16 [64, 32]) into p_s [64, 64] and the PV wgmma reads A from shared memory: one fence
and one barrier instead of four; the scratch shrinks to the reductions', so the extra 8 KB
buffer fits (229,912 of 232,448 B). 10 barriers a prefix tile, no spills in the loop.
Everything else is v9's kernel (the `P_SMEM` constexpr of gluon_v9._attn_kernel), v4's
policy and combine. The same bf16 P and V meet the same wgmma shapes in the same order, only
the A operand's source differs, so v10 should reproduce v9 bit for bit: a GPU test asserts it.
"""

from __future__ import annotations

import torch

from .gluon_v9 import _launch
from .triton_v4 import V4
from .triton_v7 import policy_of


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, p_smem=True)


def tree_mla_gluon_by_heads(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                            anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                            validate: bool = False):
    """gluon_v10 under triton_v7's policy (`policy_of(q)`: below 32 heads 128-key splits, up
    to 64 of them): an EP8 rank's 8-head verify on many short programs (session 12's
    emulation: v4's policy made gluon_v9 slower than triton_v7 at C 1)."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q), p_smem=True)
