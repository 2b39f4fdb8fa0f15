"""int4_moe gluon_v21: gluon_v20 with four CTAs an SM at the decode tiles (BN 64): three K
tiles in flight instead of four and 64 registers a thread at launch instead of 80.

Why (H200, session 18 call 3, ncu of T 1's two GEMM launches, traces/gpu/session18/README.md):
gluon_v20 is v19's bits but 1.04-1.32x its time, and at T 1 both of its GEMMs are slower
(gate/up 55.9 vs 42.9 µs, down 37.1 vs 27.2). Its 256-thread CTAs hold 80 registers a thread
(20,480 a CTA) and 74 KB of shared memory, so three fit an SM where v19's 64-row programs fit
four: T 1's gate/up grid of 512 programs runs in 1.29 waves instead of 0.97, the down grid of
896 in 2.26 instead of 1.70. At three stages and 64 registers (16,384 a CTA) the build holds
56.5 KB of shared memory and four CTAs fit both budgets (4 x 57.5 KB of the SM's 228 KB);
inside the fork the consumer warpgroup gets 80 registers by setmaxnreg (v20: 112) and the
producer warp 48, with no spill (`python -m workbench.kernels.int4_moe.gluon_v21 --compile`).
What this tests: whether v20's loss is its occupancy. The other cause ncu shows, CTA-barrier
stalls on the three idle warps' register release (34 % of the samples, `USETMAXREG.DEALLOC`),
stays: they are the warps the fork parks, not the producer or the consumer.

Everything else is gluon_v20's (BN 128 tiles keep its three / two stages at 128 registers:
at 80-88 registers they spill 12-64 B, so three CTAs an SM do not fit there). Numerics: v19's
bits (the same K order and fp32 operations as v20). Legend: gluon_v20.py.
"""

from __future__ import annotations

import functools

from torch import Tensor

from .gluon_v20 import WS_OPTS as _WS_OPTS_V20
from .gluon_v20 import _main as _main_v20
from .gluon_v20 import grid_gemm_ws
from .triton_v11 import launch_hinted
from .triton_v19 import tiles

# (K tiles in flight, registers a thread at launch) by (BN, R): v20's, but four CTAs an SM at
# BN 64 (56.5 KB of shared memory, 64 registers x 256 threads)
WS_OPTS = {**_WS_OPTS_V20, (64, 16): (3, 64)}


def int4_moe_gluon(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                   validate: bool | None = None, cfg: dict | None = None,
                   expected_slots: int | None = None) -> Tensor:
    """v19's contract, tiles and launches with the GEMMs' cold programs in gluon_v20's kernel
    under this version's stage options; cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=functools.partial(grid_gemm_ws, opts=WS_OPTS))


def _main(argv=None) -> int:
    """gluon_v20's CLI on this version's launcher and stage options:

        python -m workbench.kernels.int4_moe.gluon_v21 --compile
        python -m workbench.kernels.int4_moe.gluon_v21 --T 1,9 --cfgs "v=19;base" --rounds 3"""
    return _main_v20(argv, launcher=int4_moe_gluon, opts=WS_OPTS)


if __name__ == "__main__":
    raise SystemExit(_main())
