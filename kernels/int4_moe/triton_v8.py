"""int4_moe triton_v8: v7 with 128 weight rows per program on one warpgroup (two m64 wgmma row
blocks sharing each activation slab), so the per-tile fixed work of v7's K loop is paid once per
256 weights a thread instead of once per 128.

Why (H200, README.md "v7 measured"): with the dequant ablated v7 streams at 94-96 % of copy, with
it 75-81 %: the K loop is issue-bound. Of v7's 401 (gate/up) / 417 (down) SASS per K tile and
thread (128 weights), 240 are the dequant; the other ~160 are per tile and per CTA whatever the
tile's height: the mbarrier waits and arrivals, the TMA issue (elect, vote, coordinates), three
CTA barriers and the proxy fence, the cp.async of the activation slabs, the wgmma descriptor
arithmetic (4 slabs x ~7 uniform ops), the stage / phase counters. A program of BN = 128 rows
on the same 4 warps gives every thread 2 x 128 weights a tile: the dequant doubles (480), the
fixed part stays (~180: + 16 HGMMA for the second row block, + 2 LDSM / 2 LDS for the extra
words / scales): 663 / 679 SASS a tile, **2.59 / 2.65 per weight (v7 3.13 / 3.26)**.
(BN = 128 on 8 warps, two warpgroups of 64 rows each, leaves every thread v7's 128 weights
and v7's 401 / 417: no gain per instruction; README.md "v8" has the compile table.)

Arithmetic = v7's = v5's, bit for bit: a weight row's K chain does not depend on the rows
beside it (each m64 block is its own m64n16k16 chain over the same K tiles, the same 64-deep
slabs in the same order, the same B operand); the dequant, hi + lo, split-K (the K split table
is v5's, computed for BN = 64 so that the split count, and with it the fp32 association, is
v7's) and combine are v7's. The code is v7's (`triton_v7.launch`, `_gemm_kernel`: BN is a
constexpr there) with the gate/up select compiled into the down GEMM as well; the grid has
half the N tiles.
Costs: 168 registers (maxnreg; 3 CTAs / SM instead of v7's 4: 12 warps), 61.5 KB smem at
3 stages (2 K tiles of 16 KB words + 2 KB scales + 8 KB activations in flight per CTA: 3 x 2 x
18 KB = 108 KB of HBM loads in flight an SM, v7 72 KB).

Launch knobs (`tiles`, `cfg`): BN (64 gives v7's kernel shape, v8's code), warps, stages,
maxnreg, KS1 / TPS1, KS2 / TPS2 (v7's split table by default: same bits as v7; other splits
change the fp32 association), BM1 / BM2.

Dimension legend: v5's (T tokens, K slots, S = T*K, E experts, A active experts, D hidden,
I expert FFN width; KT = 256 inputs per K tile = 32 words; BN weight rows, BM slot rows per MMA,
NH halves, R = NH * BM MMA columns; KS1 / KS2 K splits; Dp, Ip = D, I rounded up to KT).
"""

from __future__ import annotations

from torch import Tensor

from .triton_v7 import launch
from .triton_v7 import tiles as _tiles_v7


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe): v7's table (v5's BM1 / BM2 and K splits, computed for BN 64:
    v7's fp32 association) with BN 128 on 4 warps; 168 registers (no spill in the K loops),
    3 stages (61.5 KB smem): 3 CTAs / SM."""
    return _tiles_v7(T, K, E, D, I) | dict(BN=128, warps=4, stages=3, maxnreg=168)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is; weight words 16-byte aligned) -> [T, D] bf16;
    the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: tile overrides (keys of `tiles`; KSn with TPSn), for sweeps.
    v7's launches and program (`triton_v7.launch`) on v8's tiles, the select in both GEMMs."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, tiles, down_select=True,
                  expected_slots=expected_slots)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v8's launcher):

        python -m workbench.kernels.int4_moe.triton_v8 [--T 1,9,33,128,512]
            [--cfgs "base;nodequant;BN=64;maxnreg=192"]

    `nodequant` is v5's ablation (INT4_MOE_V5_ABLATE, read by v8's launcher too)."""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton)


if __name__ == "__main__":
    raise SystemExit(_main())
