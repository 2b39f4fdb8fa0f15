"""tree_mla gluon_v24 (ENGINE-ONLY): gluon_v23 with one more launch for the launches it gives to
gluon_v19: below 32 heads, a launch whose short parts do not fit one wave splits every prefix
into at most S parts of whole 64-key tiles, S = SMs // (B x row blocks) - 1, so that its B x
row blocks x (S + 1) programs (the tree part included) fill ONE wave; merged by triton_v17's
one-round merge. Where S < 1 (more than SMs / 2 request row blocks), 32 heads or more, and on
gluon_v23's own shapes: gluon_v23's launches.

Why (H200, session 20 call 3, `scripts/sweep_tree_mla_policy.py --batch 4,8,16 --rows 1
--prefix 4096 --policies v4,w4,w8,w15`, H 8, busy µs of one call): at B 8 N 1 (the EP8 rank's
C 8 AR decode, gluon_v19's launch in gluon_v23) v4's policy gives 9 parts, 72 programs of 8
key tiles each: **24.7 µs**; 14 parts (w15: 320-key parts) on gluon_v18's launch with v17's
merge, 112 programs of 5 tiles: **21.7 µs** (on v4's merge 24.4). At B 4 the same 14 parts
took 19.3 against 23.3 (gluon_v20's short parts serve B 4 in the engine). At B 16, 9 parts
(144 programs, past one wave) 38.5-39.9 µs against 41.6-42.4 for 14 parts (224 programs): the
rule's S there is 7 (8 parts, 128 programs), not in that sweep, hence session 20 call 4's.
As FlashMLA sizes its splits by batch and SM count. A hypothesis for why (not profiled): a
program's time grows with its key tiles (~2-2.5 µs a tile, session 15), so the wave's
longest program sets the launch's time, and one wave of shorter programs beats fewer longer
ones and beats a second wave.

NOT batch-invariant (as gluon_v20-v23): the engine preset's. Each launch is bitwise the
launch it names (tests/test_tree_mla_kernel.py).
Legend: _common.py.
"""

from __future__ import annotations

import functools

import torch

from . import gluon_v20, gluon_v21, gluon_v22, gluon_v23
from .gluon_v9 import BLOCK_M
from .gluon_v11 import _launch
from .triton_v4 import Policy
from .triton_v17 import _launch_combine


@functools.cache
def wave_policy(S: int) -> Policy:
    """At most S prefix parts of whole 64-key tiles at any prefix length, plus the tree part."""
    return Policy(short_upto=0, short_len=64, long_min=64, max_splits=S)


def wave_splits(B: int, N: int, H: int, sms: int) -> int:
    """S for a launch of B requests x N rows at H heads: the most prefix parts with which B x
    row blocks x (S + 1) programs fit `sms` (0: none, or 32 heads and more)."""
    rows = -(-N * H // BLOCK_M)
    return sms // (B * rows) - 1 if H < 32 else 0


def launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate):
    """gluon_v23's transposed decode or short-part launches where they apply; else, where
    `wave_splits` >= 1, gluon_v18's launch (gluon_v19's epilogue) under `wave_policy` merged by
    triton_v17's merge; else gluon_v19."""
    if gluon_v20.shapes_decide(q, kv_cache, kv_lora_rank):
        B, N, H = q.shape[:3]
        shape = (B, N, H, kv_cache.shape[1], gluon_v20.sm_count(q.device))
        S = wave_splits(B, N, H, shape[-1])
        if not (gluon_v21.decode_parts(*shape) or gluon_v20.short_parts(*shape)) and S >= 1:
            return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                           validate, wave_policy(S), publish=True, rcp=True,
                           combine=_launch_combine)
    return gluon_v21.launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                            validate, combine=gluon_v22.merge,
                            decode_combine=gluon_v23.decode_merge)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (the launched
    version's inputs and errors): gluon_v23's launches, and one-wave long parts (`launch`)
    where gluon_v23 runs gluon_v19. No host sync unless validate=True."""
    return launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate)
