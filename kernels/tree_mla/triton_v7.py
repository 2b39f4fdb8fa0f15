"""tree_mla v7: v4's kernels (attention + PDL combine) under a split policy chosen by the head
count as well as the context length: few heads get short splits, so a small verify fills the GPU.

Why (H200, session 6, `scripts/ncu_kernel.sh` on `scripts/run_case.py tree_mla triton_v4`):
at H = 8, N = 9, P = 8192 v4 runs 36 attention programs (18 parts x 2 row blocks of M = 72) on
132 SMs (0.27 waves): 37 µs for 512 keys a program, DRAM at 5 %, issue slots 6 % busy, plus a
13.5 µs combine; the floor there is ~2 µs. v4's policy (256-key splits up to P = 2048, 512-key
splits and at most 32 past it) was tuned at H = 64, where M = 64 N rows make hundreds of
programs anyway (H 64 N 65 P 8192: 1170 programs, 8.9 waves) and more splits only add partial
traffic. The head count is the model's (per rank: 64 at TP1, 8 at TP8), not the batch's, so a
policy by (H, P) is still fixed per request: a row's partition never depends on which rows share
the launch (the issue's contract; v4's CPU invariance tests apply unchanged).

    H >= 32: v4's policy
    H <  32: 128-key splits up to P = 2048 (8 at P = 1024); past it >= 128 keys, <= 64 splits
             (64 of 128 at P = 8192, 64 of 512 at P = 32768), the tree in its own part

Costs: partials o [B, G, M, 512] fp32 grow with G (H 8 N 129 P 8192: 65 parts, 137 MB against
v4's 38 MB): the policy helps small verifies (N <= 33) and may lose at N = 129.
Legend: _common.py.
"""

from __future__ import annotations

import torch

from .triton_v4 import V4, Policy, _launch

FEW_HEADS = Policy(short_upto=2048, short_len=128, long_min=128, max_splits=64)


def policy_for(H: int) -> Policy:
    """v7's split policy for a model with H query heads (per rank)."""
    return V4 if H >= 32 else FEW_HEADS


def policy_of(q: torch.Tensor) -> Policy:
    """policy_for(q's head count): q [B, N, H, C+R]; a q of another rank gets v4's policy
    here and is reported by the launcher's input checks."""
    return policy_for(q.shape[2] if q.dim() == 4 else 0)


def tree_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                    anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                    validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla; v4's kernels
    under policy_for(H). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q))
