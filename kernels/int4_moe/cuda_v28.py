"""int4_moe cuda_v28: cuda_v27's middle down launch only where the down GEMM takes its wide
tiles (BN 128 at BM2 16: unhinted T >= 384 on 384 experts, an EP8 rank's hints from 264 slots),
at BM2_MID 32; MID 0 (cuda_v26's launches and bits) everywhere else.

Why (session 56 calls 1 and 3, H100 80GB, traces/gpu/session56): cuda_v27 against its MID 0
(= cuda_v26) in process, medians of 3 interleaved rounds, graph-replayed µs:
- skewed T 512: MID 0 3494.7, cuda_v27 (BM2_MID 64) 3481.0, **BM2_MID 32 3400.6** (-2.7 %);
  by kernel, the cold down 1084.2 -> 867.4 µs plus the band 139.4: the down phase 1384.0 ->
  1306.3 µs (2.01 -> 2.13 TB/s).
- uniform T 512: MID 0 3665.3, BM2_MID 32 3644.3 (-0.6 %), BM2_MID 64 3700.9.
- skewed T 128 (BN 64, BM2 8): MID 0 1974.7, BM2_MID 64 1999.6, BM2_MID 32 1991.7 (+0.9 %):
  the band launch costs 109.2 µs by kernel and the cold down saves only 89.6. At this size
  the cold launch's ~3 programs an SM hold less than the L2, so its second chunk's weights
  are mostly still there; the band only adds a launch behind it.
So the band pays where the cold launch's tiles are wide and its chunks are 16 slots (the L2
re-read that motivated cuda_v27), and a 32-slot chunk (two CTAs an SM fit, where 64 slots'
116.8 KB held one) streams it faster than a 64-slot one. Unmeasured between T 384 and 511
and on EP8 ranks; T 256-383 (BN 64, BM2 16) and the small hinted calls' BN 128 at BM2 8 stay
MID 0 until measured.

What: cuda_v27's op, hook and knobs; only `tiles` changes. Dimension legend: cuda_v27's.
"""

from __future__ import annotations

import functools

from . import cuda_v4, cuda_v17, cuda_v26, cuda_v27
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

WIDE_DOWN = (128, 16)  # the down GEMM's (BN, BM2) from which the band launch pays (session 56)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v27's tiles at BM2_MID 32, MID 0 below the wide down
    tile."""
    t = cuda_v27.tiles(T, K, E, D, I, slots) | {"BM2_MID": 32}
    wide = t["BN"] >= WIDE_DOWN[0] and t["BM2"] >= WIDE_DOWN[1]
    return t if wide else t | {"MID": 0}


# the op and its CLI: cuda_v27's hook on these tiles
int4_moe_cuda, _main = cuda_v17.on_tiles(
    tiles, "v=cuda_v26;v=cuda_v27;base", hot_for=cuda_v26.launch_bands_tc,
    tail_for=functools.partial(cuda_v4.down_tail, gemm=cuda_v27.grid_gemm_mid))


if __name__ == "__main__":
    raise SystemExit(_main())
