"""tree_mla gluon_v20 (ENGINE-ONLY): gluon_v19's kernel with the split policy chosen per launch
by its shape, as a serving engine picks its splits by batch: below 32 heads a launch whose
short-part programs fit one wave (B x row blocks x triton_v7's parts <= the GPU's SMs: one CTA
an SM at 230 KB of shared memory) runs triton_v7's 128-key parts with triton_v17's one-round
merge (gluon_v18's launch with gluon_v19's reciprocal epilogue); every other launch is
gluon_v19.

Why (H200): the 8-head decode attention is the emulated EP8 AR step's largest kernel after the
int4 GEMMs, 21.9 µs a layer at P 4096 (1.33 ms of 7.24, session 18 call 11). v4's policy gives
it 8 parts of 512 keys, and a part costs ~2 µs a 64-key tile whatever its rows (session 15).
gluon_v18's 128-key parts took the C 1 AR step from 7.46 to 6.88 ms (session 16), but lose
2.6x at B 32 N 9 and from N 17 (their partials and CTAs multiply with the rows). No policy by P
and H alone serves both (the issue's batch-invariance contract), so BEST stays gluon_v19.

The rule (session 19 call 1, `scripts/sweep_tree_mla_policy.py --batch`, H 8, P 4096, busy µs
of gluon_v19 / short parts): every launch of one wave or less was faster short (B 1 N 1 22.9 /
12.2, B 1 N 17 25.2 / 22.0, B 2 N 9 25.2 / 23.0, B 4 N 4 24.2 / 21.3), every larger one slower
(B 8 N 1 24.8 / 27.7, B 4 N 9 26.0 / 42.2, B 2 N 17 25.9 / 37.8, B 16 N 17 91.5 / 254.8).

NOT batch-invariant: a row's partition (hence its bits) depends on the launch's shape (and the
GPU's SM count), like cuBLAS's split-K by row count in the engine preset's projections. So it
is an "engine" preset's tree_mla only (`ENGINE` in this package: gluon_v21 / v22 build on it),
never "optimized" or "invariant".
Each of its two paths is bitwise the launch it names (tests/test_tree_mla_kernel.py, GPU).
Legend: _common.py.
"""

from __future__ import annotations

import functools

import torch

from . import gluon_v19
from .gluon_v9 import BLOCK_M
from .gluon_v11 import _launch
from .triton_v4 import num_parts
from .triton_v7 import FEW_HEADS
from .triton_v17 import _launch_combine


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SMs (host-side properties: no sync, capture-safe)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def short_parts(B: int, N: int, H: int, T: int, sms: int) -> bool:
    """Does a launch of B requests x N rows at H heads over a cache of T slots take the short
    parts? Below 32 heads, when their working programs (row blocks x the parts of the longest
    prefix the cache allows, T - N: the grid's other programs exit at once) fit one wave of
    `sms` one-CTA-an-SM programs."""
    rows = -(-N * H // BLOCK_M)
    return H < 32 and B * rows * num_parts(max(T - N, 0), policy=FEW_HEADS)[1] <= sms


def shapes_decide(q, kv_cache, kv_lora_rank) -> bool:
    """May a shape rule pick the launch? Inputs the Gluon launches refuse (fp32, C not a power
    of two, not CUDA, ...) go to gluon_v19's launch, which names them: one contract whichever
    launch a shape picks (gluon_v21 / v22 too)."""
    ok = isinstance(q, torch.Tensor) and q.dim() == 4 and q.is_cuda
    ok = ok and q.dtype in (torch.bfloat16, torch.float16) and isinstance(kv_lora_rank, int)
    ok = ok and kv_lora_rank > 0 and kv_lora_rank & (kv_lora_rank - 1) == 0
    return ok and isinstance(kv_cache, torch.Tensor) and kv_cache.dim() == 3


def launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
           combine=_launch_combine):
    """The short parts (gluon_v18's with gluon_v19's epilogue, merged by `combine`: v17's, or
    gluon_v22's) where `short_parts`, else gluon_v19."""
    if shapes_decide(q, kv_cache, kv_lora_rank) and short_parts(
            *q.shape[:3], kv_cache.shape[1], sm_count(q.device)):
        return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank,
                       validate, FEW_HEADS, publish=True, rcp=True, combine=combine)
    return gluon_v19.tree_mla_gluon(q, kv_cache, prefix_lens, anc_bits, softmax_scale,
                                    kv_lora_rank, validate=validate)


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); gluon_v18's parts and merge where `short_parts`, else gluon_v19's,
    both with the reciprocal epilogue. No host sync unless validate=True."""
    return launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate)
