"""int4_moe triton_v13: v11 with its K splits chosen from the active experts it expects (the
hint's routed slots, else T K), at most two programs an SM, instead of v3's table.

Why (H200, session 11, `scripts/sweep_int4_splits.py`, call 9: v11's kernels with KSn / TPSn
overrides, graph replay, traces/gpu/session11/README.md):
* v3's table aims at ~2048 programs (PROGRAMS, ~16 an SM) and v11 feeds it ceil(slots / K) K
  expected slots: on a hinted EP8 rank at hint 1 (C 1 x AR: one routed slot, one active expert)
  that is 8 experts, so gate/up runs 4 splits x 32 N tiles = 128 programs of 7 K tiles and
  down 3 x 56 of 2-3: **41.4 µs**, where 7 splits (224 programs of 4 tiles) and 4 (224 of 2)
  take **29.4 µs**.
* T = 1 on all 384 experts (8 active): the table's 4 / 3 splits (1024 + 1344 programs, 2.6 /
  3.4 waves of 396 resident CTAs) **89.3 µs**; 1 / 1 (256 + 448 programs, one K run each)
  85.2, the best 84.3 (1 / 2).
* Hint 17 on an EP8 rank (15 routed): the table's 1 / 1 is already the best (110.9-112.8 µs).
Measured through v11's `cfg`: v13 picks exactly those configs (the `tiles` test pins them), on
v11's kernels.

The rule: A = max(1, min(E, expected slots)) active experts; GEMM n's grid has NTn x A x KSn
programs (BN 128 N tiles); KSn = the most splits with NTn x A x KSn <= TARGET_PROGRAMS (264 =
2 x 132 SMs), at least 1, at most the K tiles, then v3's normalisation (TPS = ceil(tiles / KS),
KS = ceil(tiles / TPS)) and its workspace cap. Past ~1 active expert per 8 N tiles that is 1:
v11's splits at every T >= 9 (and so its bits there). Everything else is v11's: slot tiles, the
router, the hinted SiLU.
Numerics: other splits than v11's at small T (another fp32 association of a K run): within
the harness tolerance of the reference, not v11's bits there.

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, D hidden, I expert FFN width;
KT = 256 inputs per K tile; NT N tiles of BN rows; KSn / TPSn splits and K tiles a split).
"""

from __future__ import annotations

import triton
from torch import Tensor

from .triton_v3 import KT, WS_BYTES, normalised_split
from .triton_v11 import launch_hinted
from .triton_v11 import tiles as _tiles_v11

TARGET_PROGRAMS = 264  # two CTAs an SM on the H200's 132: 168 registers, 61.5 KB each


def split(k_tiles: int, programs_per_split: int, ws_per_split: int,
          target: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """(KS, TPS) for a GEMM of k_tiles K tiles whose one-split grid has programs_per_split
    programs: the most splits that keep the grid within `target` programs, v3's normalisation
    and workspace cap."""
    ks = max(1, min(k_tiles, target // max(1, programs_per_split),
                    WS_BYTES // max(1, ws_per_split)))
    return normalised_split(k_tiles, ks)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v11's tiles with the K splits of the rule above. Shapes only (graph-safe)."""
    c = _tiles_v11(T, K, E, D, I, slots)
    return c | splits(c["BN"], T, K, E, D, I, slots)


def splits(BN: int, T: int, K: int, E: int, D: int, I: int, slots: int | None,
           target1: int = TARGET_PROGRAMS) -> dict:
    """The rule above for BN-row N tiles: {KS1, TPS1, KS2, TPS2}; target1: the gate/up grid's
    program target (triton_v23: four CTAs an SM at the 64-row decode tiles)."""
    S = T * K
    A = max(1, min(E, S if slots is None else slots))  # active experts expected
    ks1, tps1 = split(triton.cdiv(D, KT), 2 * triton.cdiv(I, BN) * A, S * 2 * I * 4, target1)
    ks2, tps2 = split(triton.cdiv(I, KT), triton.cdiv(D, BN) * A, S * D * 4)
    return dict(KS1=ks1, TPS1=tps1, KS2=ks2, TPS2=tps2)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (tiles and splits);
    cfg: tile overrides (keys of `tiles`), for sweeps and tests."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v13's launcher):

        python -m workbench.kernels.int4_moe.triton_v13 [--T 1,9,33] [--by-kernel]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base")


if __name__ == "__main__":
    raise SystemExit(_main())
