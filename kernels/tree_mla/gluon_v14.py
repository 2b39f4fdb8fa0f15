"""tree_mla gluon_v14: gluon_v13 with nothing computed crossing the warp-specialization fork:
each partition computes its own geometry (request, part, prefix range, tile count, ...) from
the kernel's arguments (`gluon_v11._own` / `_geometry`), and the default warps pass a partition
barrier after their barrier inits and first TMA issues, before the fork (the `OWN` constexpr).

Why (session 14, traces/gpu/session14/README.md): what racecheck still reports on gluon_v13 is
Triton's fork. For a partition's arguments that are not kernel arguments, Triton's lowering has
the default warps store them to shared memory (29 bytes there: `STS.128` / `STS.64` / `STS` /
`STS.U8` by all 128 threads) with the partition state word, then `BAR.SYNC 0x1`; the worker
loads them after its own `BAR.SYNC 0x1`; racecheck reported those pairs (and 5 against the
pre-fork mbarrier writes). The probe with no computed argument (`--fork`: the state word
only) came out clean twice (call 4). Kernel arguments are read by each partition from the
constant bank, so recomputing the geometry leaves only the state word at the fork. The cost:
the worker loads P and repeats ~30 integer instructions once per program.

Everything else is gluon_v13 (OWN = False leaves v11's / v12's / v13's SASS unchanged, checked
with nvdisasm); the arithmetic is v13's, so the outputs should be its bits
(`test_gpu_gluon_bitwise_predecessor`, not yet reached on the GPU).

H200 (session 14 call 5): the captures' and the mbarriers' racecheck reports are gone; what is
left is Triton's state word alone, stored by the default warps at the fork and at the join and
loaded by the worker after `BAR.SYNC 0x1` (`sanitize_kernels.py --no-real`: 8 errors, v13 27).
32 GPU tests passed, none failed, before the step's time limit. Not timed; not BEST.
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch, policy_long
from .triton_v4 import V4


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); v4's split policy and combine. No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   V4, publish=True, own=True)


def tree_mla_gluon_long(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                        anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                        validate: bool = False):
    """gluon_v14 under gluon_v11's `policy_long(q)` (>= 1024-key splits past P = 2048 at >= 32
    heads)."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_long(q), publish=True, own=True)
