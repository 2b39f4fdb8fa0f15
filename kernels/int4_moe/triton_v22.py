"""int4_moe triton_v22: v19 with the combine at 256 columns a program instead of 1024 up to T 32
tokens (v19's above).

Why (H200, session 18 call 8, `scripts/probe_small_launches.py`, traces/gpu/session18): the
combine (out[t] = sum over the K slots of w y, fp32, one rounding) takes 2.22 µs of kernel
time at T 1 with v7's 1024 columns a program (7 programs at D 7168) and 1.28 µs at 256 (28
programs); 2.53 -> 1.98 µs at T 17, 5.86 -> 5.59 at 136, every slot routed (why the shorter
column run is faster was not profiled).
The combine runs once a MoE layer (60 a step of the EP8 loop). In the EP8 emulation (call 9)
the step's combines took 369 / 466 / 412 µs against 387 / 504 / 434 at C 1 AR / C 1 DDTree-16
/ C 8 AR, but 852 against 781 at C 8 DDTree-16 (one run): there the rank's op sees T 136
tokens with ~7 of every 8 slots not routed to it, unlike the probe, and 4x the programs each
load every slot's id and weight; so past T 32 (FUSE_T of v17, the decode and small-verify
sizes) the combine is v19's. Same per-column arithmetic in the same slot order: v19's bits.
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot
from .triton_v19 import tiles as _tiles_v19

BD_COMBINE = 256  # columns a combine program up to COMBINE_T tokens (v7-v21: 1024)
COMBINE_T = 32


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v19's tiles and, up to COMBINE_T tokens, the combine's columns a program. Shapes only
    (graph-safe)."""
    c = _tiles_v19(T, K, E, D, I, slots)
    return c | dict(BD_COMBINE=BD_COMBINE) if T <= COMBINE_T else c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v19's contract and launches (`triton_v19.int4_moe_triton`) with the combine at
    BD_COMBINE columns a program up to COMBINE_T tokens; cfg: tile overrides (keys of
    `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_hot)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v22's launcher):

        python -m workbench.kernels.int4_moe.triton_v22 [--T 1,9,17] [--cfgs "v=19;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=19;base")


if __name__ == "__main__":
    raise SystemExit(_main())
