"""int4_moe triton_v10: v9 with the gate/up GEMM's slot tile doubled (BM1 32, wgmma m64n32)
where experts average more than 16 slots (S > 16 E: T > 768 at Kimi's K 8, E 384).

Why (H200, session 6, `python -m workbench.kernels.int4_moe.triton_v9 --T 512,2080 --cfgs
"base;BM1=32;..."`): at the loop's C 32 x budget 64 verify (T = 2080, ~43 slots an expert)
v9's gate/up programs run each weight slice over three BM1 = 16 slot chunks (the slice re-read
from L2 per chunk, an m64n16 wgmma chain per chunk): 11.03 ms a layer; BM1 = 32 halves the
chunks: 9.03 ms (18 % faster). At T = 512 (10.7 slots an expert: one chunk either way) BM1 32
only adds MMA columns of padding: 3.64 vs 3.46 ms, so T <= 768 keeps v9's tiles (and bits).
BM2 16 (the down GEMM's) already applies from S > 4 E; 32 was slower at both T.

Outputs: v9's bits at S <= 16 E; above, the gate/up wgmma is m64n32 instead of m64n16 (a
slot's column of the MMA is computed by another instruction shape: not claimed bitwise, the
harness tolerance and the token rule apply, as for every version that is not INVARIANT).

Dimension legend: v5's (S = T K slots, E experts).
"""

from __future__ import annotations

from torch import Tensor

from .triton_v7 import launch
from .triton_v9 import _router
from .triton_v9 import tiles as _tiles_v9

WIDE_SLOTS_PER_EXPERT = 16  # above this average, gate/up runs 32 slot columns a chunk


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """v9's tiles; BM1 32 where S > 16 E (experts average more than one 16-slot chunk)."""
    c = _tiles_v9(T, K, E, D, I)
    return c | dict(BM1=32) if T * K > WIDE_SLOTS_PER_EXPERT * E else c


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is; weight words 16-byte aligned) -> [T, D] bf16;
    the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: tile overrides (keys of `tiles`), for sweeps and tests."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, tiles, down_select=True,
                  router=_router, expected_slots=expected_slots)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v10's launcher):

        python -m workbench.kernels.int4_moe.triton_v10 [--T 512,1024,2080] [--by-kernel]
            [--cfgs "base;BM1=16"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base;BM1=16")


if __name__ == "__main__":
    raise SystemExit(_main())
