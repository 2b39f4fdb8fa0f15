"""int4_moe cuda_v17: cuda_v16, with two tile knobs on an expert-parallel rank's small hinted
calls (cuda_v15's cuda_v5 path: a hint under 3 E slots): the down GEMM's 64-column tiles (BN 64,
cuda_v5's 128) from hints over E / 2 slots, and the gate/up CTAs asking L2 for their weight
slice 4 chunk pairs ahead (PF1 4, none) from hints of E slots on.

Why (H100 80GB, session 45 calls 2-3, traces/gpu/session45, `python -m
workbench.kernels.int4_moe.cuda_v16 --ep 8 --T 17,33,65,136,264 --cfgs "base;PF1=4;BN=64;
BN=64,PF1=4"`, medians, graph-replayed µs of rank 0's 48 experts, hint = T slots): cuda_v16
kept cuda_v15's launches on hinted calls because session 44 swept only unhinted ones. Call 2
(2 rounds) / call 3 (3 rounds): hint 33 base 241.1 / 272.5, **BN 64 237.5 / 265.5**, BN 64 +
PF1 4 242.1 / 270.3; hint 65 383.7 / 375.0, BN 64 377.6 / 368.9, **BN 64 + PF1 4 365.2 /
362.9**; hint 136 402.8 / 425.3, BN 64 398.7 / 418.6, **BN 64 + PF1 4 395.0 / 415.3**; at hint
17 (the EP8 C 1 DDTree-16 verify) every knob lost (base 165.5, BN 64 167.2, PF1 4 170.9) and
at hint 264 (cuda_v14's path, 462.1) none moved it past 0.5 %. So BN 64 where a hint expects
more than E / 2 slots (measured at 33 of 48, not at 17), PF1 4 from E (measured at 65 and 136;
it cost 2 % at 33); the cut between them and below 33 is unmeasured. Unhinted calls: cuda_v16's
exactly (its REAL bench and bits).

Measured (calls 4-5): cuda_v16's bits at EP8 hints 17 / 33 / 48 / 65 / 136 / 143 / 264 and
unhinted T 1 / 9 / 128 (`scripts/int4_moe_bitwise.py --ep 8`), GPU tests 26 passed, memcheck
0 errors; A/B against cuda_v16 (3 rounds): hint 17 167.4 / 167.4, 33 237.2 / 241.5, 65 366.2 /
384.0, 136 395.9 / 403.3 µs. (`on_tiles`, cuda_v18's dispatch too, was factored out after those
calls: the same dispatch, its GPU tests rerun by plan session46_b.)

What: cuda_v16's dispatch (`on_tiles`); on small hinted calls cuda_v5's launches on this
file's `tiles` (cuda_v5's with HINTED's knobs where `hinted_knobs` gives them), elsewhere
cuda_v16's launches on cuda_v16's tiles (this file's rule returns them there). The knobs change the down
GEMM's column tiling and where weights are asked for, not any dot product's K order (the K
splits stay cuda_v5's, computed for its 128-column grid). Numerics, graph safety, load step:
cuda_v5's / cuda_v16's (not batch invariant). GPU only (cupy). Dimension legend: cuda_v1.cu's
and cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v4, cuda_v5, cuda_v10, cuda_v12, cuda_v15, cuda_v16
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

HINTED_BN = {"BN": 64}  # small hinted, hint > E / 2: the down GEMM's narrower column tiles
HINTED_PF = {"PF1": 4}  # small hinted, hint >= E: L2 asked 4 chunk pairs ahead


def hinted_knobs(E: int, slots: int | None) -> dict:
    """The knobs a small hinted call takes over cuda_v5's tiles (none unhinted or past 3 E)."""
    if not cuda_v15.small_hinted(slots, E) or 2 * slots <= E:
        return {}
    return HINTED_BN | (HINTED_PF if slots >= E else {})


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v5's tiles with `hinted_knobs` on small hinted calls,
    cuda_v16's elsewhere."""
    if cuda_v15.small_hinted(slots, E):
        return cuda_v5.tiles(T, K, E, D, I, slots) | hinted_knobs(E, slots)
    return cuda_v16.tiles(T, K, E, D, I, slots)


def on_tiles(tiles_of, default_cfgs: str, hot_for=None, tail_for=None):
    """(int4_moe_cuda, _main) of a version that takes cuda_v15's cut on one tile rule
    `tiles_of` (`tiles`' signature) for both sides: small hinted calls run cuda_v5's launches
    (cuda_v4's op, no hot launch), the rest cuda_v14's (cuda_v10's op with cuda_v12's hot
    bands): cuda_v17, cuda_v18. The rule's non-small side is the version's own, so a later
    rule that changes it is not silently left on cuda_v16's tiles. hot_for: a later version's
    hot hook (cuda_v12's `launch_bands` signature: cuda_v19's wgmma pass); tail_for: a later
    version's tail (cuda_v4's `tail` signature, both sides: cuda_v22's hot down items)."""

    def op(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
           validate: bool | None = None, cfg: dict | None = None,
           expected_slots: int | None = None) -> Tensor:
        if cuda_v15.small_hinted(expected_slots, cuda_v15.num_experts(experts)):
            return cuda_v4.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                         cfg=cfg, expected_slots=expected_slots,
                                         tiles_for=tiles_of, tail=tail_for)
        return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                      cfg=cfg, expected_slots=expected_slots, tiles_for=tiles_of,
                                      hot_for=hot_for or cuda_v12.launch_bands,
                                      tail_for=tail_for)

    op.__name__ = op.__qualname__ = "int4_moe_cuda"
    op.__module__ = tiles_of.__module__  # the version's op (its CLI's knob check reads it)
    op.__doc__ = (f"The contract of `workbench.reference.int4_moe.int4_moe`: cuda_v15's cut on "
                  f"{tiles_of.__module__}'s tiles, cuda_v5's launches on small hinted calls, "
                  f"cuda_v14's elsewhere (cfg overrides the tiles).")

    def main(argv=None) -> int:
        """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI), e.g.
        `--ep 8 --T 17,33,65,136 --cfgs "v=cuda_v16;base"`."""
        from .triton_v5 import _main as v5_main

        return v5_main(argv, launcher=op, default_cfgs=default_cfgs)

    return op, main


# the op and its CLI: cuda_v15's cut on this file's tiles (cuda_v16's outside small hinted calls)
int4_moe_cuda, _main = on_tiles(tiles, "v=cuda_v16;base")


if __name__ == "__main__":
    raise SystemExit(_main())
