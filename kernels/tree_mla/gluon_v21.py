"""tree_mla gluon_v21 (ENGINE-ONLY): gluon_v20 with a third launch for 8-head decode: where a
request's query rows fit one 16-row block (N H <= 16) and the launch's programs under 64-key
parts fit one wave, triton_v15's transposed attention (64 keys on the MMA's M, the rows on its
N: 8 real rows no longer padded to 64) under 64-key parts, merged by triton_v17's one-round
merge; otherwise gluon_v20's two launches (its one-wave short parts, else gluon_v19).

Why (H200, session 19 call 3, `scripts/sweep_tree_mla_policy.py --batch`, H 8, P 4096, busy
µs of one call): at B 1 N 1 triton_v15's attention with 64-key parts and v17's merge takes
**8.8 µs** against gluon_v20's short parts' 12.1 (gluon_v18's attention under 64-key parts:
10.7); at B 2 N 1 11.5 against 12.9. From N 9 its 16-row blocks re-read every key tile once a
block (session 15's finding; B 1 N 9: 22.4 against 17.6) and gluon_v20's launches stay.

NOT batch-invariant (as gluon_v20): the engine preset's, never a token-exact preset's. Each
path is bitwise the launch it names (tests/test_tree_mla_kernel.py).
Legend: _common.py.
"""

from __future__ import annotations

import torch

from . import gluon_v20, triton_v15
from .triton_v4 import Policy, num_parts
from .triton_v17 import _launch_combine

# 64-key parts (one key tile each) up to P 2048 and past it, at most 128 (+ the tree part)
DECODE = Policy(short_upto=2048, short_len=64, long_min=64, max_splits=128)


def decode_parts(B: int, N: int, H: int, T: int, sms: int) -> bool:
    """Does a launch of B requests x N rows at H heads over a cache of T slots take the
    transposed 64-key-part decode? Its rows fit one block of triton_v15 (N H <= 16) and its
    working programs (B x the parts of the longest prefix the cache allows, T - N) one wave of
    `sms` one-CTA-an-SM programs (186 KB of shared memory a program)."""
    return N * H <= triton_v15.ROWS and B * num_parts(max(T - N, 0), policy=DECODE)[1] <= sms


def decode_launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                  combine=_launch_combine):
    """The third launch: triton_v15's attention under DECODE merged by `combine` (triton_v17's
    merge; gluon_v23 passes its own)."""
    return triton_v15._launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                              validate, DECODE, combine=combine)


def launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
           combine=_launch_combine, decode_combine=_launch_combine):
    """`decode_launch` merged by `decode_combine` where `decode_parts`, else gluon_v20's
    launches with its short parts merged by `combine` (gluon_v22 / v23 pass their own)."""
    if gluon_v20.shapes_decide(q, kv_cache, kv_lora_rank) and decode_parts(
            *q.shape[:3], kv_cache.shape[1], gluon_v20.sm_count(q.device)):
        return decode_launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                             validate, decode_combine)
    return gluon_v20.launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                            validate, combine)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (the launched
    version's inputs and errors); `decode_parts`: triton_v15's attention under DECODE with
    triton_v17's merge, else gluon_v20. No host sync unless validate=True."""
    return launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate)
