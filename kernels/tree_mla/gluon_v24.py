"""tree_mla gluon_v24 (ENGINE-ONLY): gluon_v23 with one more launch for 8-head decode of 5-8
requests, which gluon_v23 gives to gluon_v19: where a request's rows are at most 8 (N x H <= 8)
and S = SMs // (B x row blocks) - 1 is at least 15, every prefix is split into at most S parts
of whole 64-key tiles, so the launch's B x (S + 1) programs (the tree part included) fill ONE
wave; merged by triton_v17's one-round merge. Everything else is gluon_v23's.

Why (H200, session 20, `scripts/sweep_tree_mla_policy.py`, H 8, P 4096, busy µs of one call;
traces/gpu/session20/README.md): at B 8 N 1 (the EP8 rank's C 8 AR decode) v4's policy gives 9
parts, 72 programs of 8 key tiles: **24.7 µs**; 14 parts (S 15: 320-key parts), 112 programs of
5 tiles, on gluon_v18's launch with v17's merge: **21.7** (call 3), and in the EP8 step (call
4) the C 8 AR attention kernels took 1339 against 1519 µs. The same one-wave rule LOST
everywhere else it was tried (call 4): B 16 N 1 S 7 40.5 against v4's 38.3, B 32 N 1 S 3 70.1
against 64.4, and with 17 rows (three row blocks) B 2 S 21 30.5 against 25.8, B 4 S 10 48.9
against 30.4, B 8 S 4 92.0 against 53.8 (the C 8 DDTree-16 step +2.2 ms). Hence the rule's
bounds: S >= 15 (programs of <= 5 tiles at P 4096) and one request's rows <= 8, the shapes it
won at. A hypothesis for why (not profiled): a wave's longest program sets the time, so more,
shorter programs in one wave win while the merge stays small; with 17 rows a part's partials
are 17x larger and long parts (S 4-10) leave few programs.

NOT batch-invariant (as gluon_v20-v23): the engine preset's. Each launch is bitwise the
launch it names (tests/test_tree_mla_kernel.py).
Legend: _common.py.
"""

from __future__ import annotations

import functools

import torch

from . import gluon_v20, gluon_v21, gluon_v23
from .gluon_v9 import BLOCK_M
from .gluon_v11 import _launch
from .triton_v4 import Policy
from .triton_v17 import _launch_combine


@functools.cache
def wave_policy(S: int) -> Policy:
    """At most S prefix parts of whole 64-key tiles at any prefix length, plus the tree part."""
    return Policy(short_upto=0, short_len=64, long_min=64, max_splits=S)


MIN_SPLITS = 15  # the fewest prefix parts the one-wave launch takes (measured wins: S 15)
MAX_ROWS = 8  # a request's query rows N x H (8-head decode)


def wave_splits(B: int, N: int, H: int, sms: int) -> int:
    """S for a launch of B requests x N rows at H heads: the most prefix parts with which B x
    row blocks x (S + 1) programs fit `sms`; 0 where the one-wave launch does not apply (N H >
    MAX_ROWS, S < MIN_SPLITS)."""
    S = sms // (B * -(-N * H // BLOCK_M)) - 1
    return S if N * H <= MAX_ROWS and S >= MIN_SPLITS else 0


def launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate):
    """gluon_v18's launch (gluon_v19's epilogue) under `wave_policy` merged by triton_v17's
    merge where `wave_splits` is not 0 and gluon_v23 has neither its transposed decode nor its
    short parts for the shape; gluon_v23's launches otherwise."""
    if gluon_v20.shapes_decide(q, kv_cache, kv_lora_rank):
        B, N, H = q.shape[:3]
        shape = (B, N, H, kv_cache.shape[1], gluon_v20.sm_count(q.device))
        S = wave_splits(B, N, H, shape[-1])
        if S and not (gluon_v21.decode_parts(*shape) or gluon_v20.short_parts(*shape)):
            return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                           validate, wave_policy(S), publish=True, rcp=True,
                           combine=_launch_combine)
    return gluon_v23.tree_mla_gluon(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                    kv_lora_rank, validate=validate)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (the launched
    version's inputs and errors): gluon_v23's launches, and one-wave long parts (`launch`)
    where gluon_v23 runs gluon_v19. No host sync unless validate=True."""
    return launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate)
