"""int4_moe triton_v28: v27's one launch for the routing and the permute only where the
one-program router routes without sorting (T <= ROUTE1: 8 tokens at K 8, the EP8 step's decode
at C 1 and C 8); v26's launches above (v24's sorted router, then the permute, at 9-64 tokens).

Why (H200, session 22 calls 3-4, traces/gpu/session22/README.md): v27's fused launch made the
op faster alone at every hint up to 17 (0.8-1.7 µs a call, every interleaved round), yet in the
EP8 step, in two same-call A/Bs against v26, the C 1 AR step got faster (-0.07 / -0.08 ms) and
the C 1 DDTree-16 verify slower (+0.06 / +0.10 ms): the routing + permute kernels took ~110 µs
a step less while the GEMMs took 45-265 µs more, the same launches on the same data. Why the
GEMMs slow down is not profiled; a hypothesis: they start ~1.3 µs earlier, further inside the
shared expert's kernels on the side stream. v28 keeps the fusion where the step gained.
Bits: v26's (v27's at T <= 8, v26's launches above).
Dimension legend: v16's.
"""

from __future__ import annotations

import functools

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v24 import _router as _router_v24
from .triton_v26 import tiles
from .triton_v27 import route_permute


def route_permute_decode(x: Tensor, topk_ids: Tensor, E: int, c: dict):
    """v27's `route_permute` up to ROUTE1 tokens (one unsorted routing program beside the
    permute), v26's router above (the launcher permutes)."""
    if topk_ids.shape[0] > c["ROUTE1"]:
        return _router_v24(topk_ids, E, c)
    return route_permute(x, topk_ids, E, c)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v26's contract, tiles and launches, the routing and the permute in one launch up to
    ROUTE1 tokens; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot,
                         router=functools.partial(route_permute_decode, x))


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v28's launcher):
        python -m workbench.kernels.int4_moe.triton_v28 [--ep 8] [--T 1,8] [--cfgs "v=26;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=26;base")


if __name__ == "__main__":
    raise SystemExit(_main())
