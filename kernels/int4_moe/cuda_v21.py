"""int4_moe cuda_v21: cuda_v18, with the cold gate/up launch's weight ring filled by TMA bulk
copies (TB1 3 stages a warp; cuda_v1.cu's BK, the form cuda_v8's GB 1 gave T 1's phase 1)
instead of U1 cp.async stages and the L2 prefetch.

Why (session 47 call 2, H100 80GB, ncu of cuda_v18 at skewed T 128, traces/gpu/session47): the
cold gate/up launch (cuda_v1.cu's `int4_moe_mma`, ~2/3 of the op's bytes) holds 45 % of its
warp samples in long-scoreboard stalls, 23 % on the cp.async ring's wait and 15.5 % on the
first mma of a pair, at 42 % issue-active; its weights move by six 16-byte cp.async a lane a
pair plus an L2 prefetch request. T 1's phase 1 (the same `unit_block`) went 38.9 -> 35.2 µs
on the H200 when one lane a warp issued a pair's 2 KB of words and 256 B of scales as two bulk
copies on an mbarrier (session 31 call 2: long-scoreboard 2.85 -> 0.94 an issue). On the H200
this launch streamed ~2.85 TB/s at skewed T 128 (session 46 call 3) while the whole op reaches
~3.6 TB/s at uniform T 128 (session 37): fewer instructions and memory requests a weight byte
are one lever on that gap (whether it is the one that binds there is the GPU's to say).

What: cuda_v18's dispatch and tiles, with TB1 3, PF01 0, PF1 0 wherever a call reaches cuda_v4's
cold gate/up launch (every call past one token; T 1 stays cuda_v9's one launch, which already
takes GB 1). The K loop's SASS at the default instance: ~575 instructions a two-pair iteration
against the cp.async ring's 600, 126 registers, no local memory (nvcc, sm_90). The same pairs
reach the same registers in the same order, so the bits are cuda_v18's exactly (GPU test);
TB1 0 (with cuda_v18's PF1) is cuda_v18 itself. Knobs: TB1 in 2..8 (`cuda_v4.check_tb1`
refuses it with U1 < 3, an L2 prefetch or IT1 1, by name). Numerics, graph safety, load step:
cuda_v18's. GPU only (cupy). Dimension legend: cuda_v1.cu's and cuda_v10.cu's.

Measured (session 48, H100 80GB, traces/gpu/session48; the H200 not yet): cuda_v18's bits at
every REAL shape and on an EP8 rank (`scripts/int4_moe_bitwise.py --a cuda_v21 --b cuda_v18`,
call 12); GPU tests 17 passed, the shared suites 21, memcheck 0 errors, racecheck 0 hazards.
In process against cuda_v18 (`--T 65,128,512 --skew 1.2 --rounds 3 --cfgs
"v=cuda_v18;base;TB1=2;TB1=4"`, medians of 3, every round faster): skewed T 65 / 128 / 512
1423.9 / 1968.3 / 3850.7 µs against 1441.0 / 2016.2 / 3920.2; TB1 2 / 4 within 0.5 % of TB1 3;
uniform T 9 / 128 / 512 566.3 / 3010.8 / 3649.8 against 583.1 / 3041.2 / 3658.3. REAL bench
with Humming (call 9, medians of 2): faster than cuda_v18 at 11 of 14 shapes, T 1 tied, uniform
T 9 slower (609.6 vs 599.6 µs; 612.8 vs 598.6 in call 6: the one regression, unexplained; the
in-process draw above gained there); x Humming 0.97-1.07 (1.03 at skewed T 128, 1.07 at skewed
T 512). ncu at skewed T 128 (call 2, the cold launch alone): 1048 vs 1067 µs for the same 3.18
vs 3.21 GB of DRAM reads, with **half the L2 sectors** (155.6 M vs 310.7 M: cuda_v18's L2
prefetch touched every weight sector twice) and a third of the L2 requests from the SMs (27.0 M
vs 77.4 M). On the H100 the launch stays DRAM-bound (90 % of peak); whether the lighter L2
load frees the H200's skewed launches (~2.85 TB/s there, session 46) is the next H200 call's.
Session 49 (another H100 80GB, traces/gpu/session49): the REAL bench again, the same 11 of 14;
uniform T 9 slower a third time (593.0 vs 579.8 µs). By routing draw the loss is one draw's
gain and three draws' losses of 5-13 µs; TB1 4 / 5 recover those but cost uniform T 17 and the
skewed shapes, and RW1 2 / 8 change nothing, so no shape rule replaces TB1 3.
"""

from __future__ import annotations

from . import cuda_v17, cuda_v18
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

# the cold launch's bulk ring: 3 stages (2 pairs in flight a warp, as cuda_v18's U1 3), and
# no L2 prefetch (the cp.async ring's; the bulk ring has none)
BULK = {"TB1": 3, "PF01": 0, "PF1": 0}


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v18's tiles with BULK."""
    return cuda_v18.tiles(T, K, E, D, I, slots) | BULK


# the op and its CLI: cuda_v17's dispatch on this file's tiles
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v18;base")


if __name__ == "__main__":
    raise SystemExit(_main())
