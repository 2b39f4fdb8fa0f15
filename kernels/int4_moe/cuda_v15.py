"""int4_moe cuda_v15: cuda_v14 where a call has no expert-parallel hint or expects at least 3 E
routed slots on its E experts (the hint); cuda_v5 exactly on an EP rank's hinted calls below
that (its tiles, launches and bits).

Why (H200, EP8 emulation `python -m workbench.dist.emulate --preset kimi-k2.6 --layouts ep8
--tau 3.59 --graph --kernels engine` against `engine,int4_moe=cuda_v14`, graph-replayed ms a
step on rank 0's 48 experts; a rank's slots are C (budget + 1)): cuda_v14 against cuda_v5 at
17 slots 14.67 / 14.40, 65 23.79 / 23.34 (session 37 call 3), 72 25.61 / 25.01 (session 38
call 1), 104 27.91 / 27.41, 136 29.80 / 29.51, **168 31.26 / 31.52, 200 34.30 / 35.54** (call
2), 264 35.90 / 38.76, 288 41.00 / 43.81, 520 45.83 / 52.31, 1056 78.98 / 90.28, 2080 131.27 /
155.44 (call 1; session 37: 544 55.14 / 60.03): the crossing lies between 136 and 168 slots,
~3 an expert. Under it cuda_v14's side-stream hot launch finds few experts past 8 slots (60
launches of ~3.8 µs a step) and the cold launch beside it runs slower; over it the hot bands
pay, and from 8 E the bf16 h. Unhinted calls keep cuda_v14 at every T: its REAL bench (session
37 call 2) is at or over cuda_v5's there (skewed T 9-128 1.00-1.06x Humming; cuda_v5 0.86x at
skewed T 128 in session 33): the hot launch pays on skewed routing even at a fraction of a
slot an expert, where the emulation's per-rank routing is near-uniform.

What: the choice from the hint and the experts' count only (host ints: graph-safe; the same
call always takes the same path). Numerics: the chosen version's (cuda_v5's on small hinted
calls; cuda_v14's elsewhere). Not batch invariant (the path follows the hint). GPU only (cupy).
Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v5, cuda_v14
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

SLOTS_PER_EXPERT = 3  # a hinted call below this many slots an expert expected: cuda_v5


def small_hinted(expected_slots: int | None, E: int | None) -> bool:
    """Whether a call takes cuda_v5: an EP hint of fewer than SLOTS_PER_EXPERT E slots (a hint
    that is not an int, or experts whose count cannot be read, go to cuda_v14, whose checks
    name them)."""
    return (isinstance(expected_slots, int) and not isinstance(expected_slots, bool)
            and E is not None and expected_slots < SLOTS_PER_EXPERT * E)


def num_experts(experts) -> int | None:
    """E from the experts' first tensor [E, ...] (an Int4Experts or the plain 6-tuple the
    versions take alike); None where it is not one (the chosen version's checks name it)."""
    try:
        return int(experts[0].shape[0])
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """The contract of `workbench.reference.int4_moe.int4_moe` (the chosen version's checks);
    cfg goes to the chosen version."""
    version = cuda_v5 if small_hinted(expected_slots, num_experts(experts)) else cuda_v14
    return version.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                 cfg=cfg, expected_slots=expected_slots)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v15's op):

        python -m workbench.kernels.int4_moe.cuda_v15 [--T 128,512] [--skew 1.2]
            [--cfgs "v=cuda_v14;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v14;v=cuda_v5;base")


if __name__ == "__main__":
    raise SystemExit(_main())
