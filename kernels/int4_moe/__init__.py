"""int4_moe kernels: routed experts of one MoE layer, W4A16 (INT4 g32 weights, bf16 activations).

Versions (README.md has the design and the version log), each with the contract of
`workbench.reference.int4_moe.int4_moe`:
    triton_v1  checkpoint layout, GPU routing metadata, gate/up + SiLU*mul, down, ordered combine
    triton_v2  v1 on a one-time repacked planar layout (one scale per 32-input slab), evict_first
    triton_v3  weight-streaming rework: per (expert, N tile, K split) programs, BM 16, split-K,
               I2F-free dequant, activations permuted to the checkpoint's nibble planes
    triton_v4  v3 with scales and activations pipelined (cp.async), hi+lo in one MMA operand,
               <= 168 registers (3 CTAs / SM, ~81 KB of weights in flight per SM)
    triton_v5  v4 with the dequant in packed bf16x2 inline PTX (lop3 magic, sub, mul: ~1.9
               instructions per weight instead of ~5), 64-deep MMA slabs in the pairs' K order
    triton_v6  v5 made batch-invariant: K reduced in fixed chunks (from the weight shapes) summed
               in chunk order, split-K or fused chunk loop chosen from T, slot tiles fixed
    triton_v7  v5 with the weight words and scales loaded by TMA (host descriptors over the
               checkpoint layout, expert as a coordinate): 128 registers, 4 CTAs / SM; v5's bits
    triton_v8  v7 on 128 weight rows per program (two m64 wgmma row blocks on one warpgroup):
               v7's per-tile loop overhead paid per 256 weights a thread; v7's bits
    triton_v9  v8 with the routing metadata from per-block programs (count, scan, scatter)
               above one block of tokens: no more ~4 µs per 8 tokens in one program; v8's bits
    triton_v10 v9 with a 32-slot gate/up tile where experts average > 16 slots (T > 768 at
               Kimi shapes: the large verify batches); v9's tiles and bits below
    triton_v11 v10 sized for the op's `expected_slots` hint (EP on a replicated stream: most
               slots -1), the SiLU skipping unrouted positions; v10's tiles and bits unhinted
    triton_v12 v11's GEMMs on a persistent grid (one program per resident CTA), each taking an
               equal run of the (expert, N tile, K tile) units: no part-full last wave, no
               3-tile programs at decode sizes; a tile split over programs is split-K
    triton_v13 v11 with its K splits from the active experts it expects (the hint's slots,
               else T K): at most two programs an SM, as many splits as fit (a hinted EP
               rank's decode: 7 / 4 splits where v11's table gave 4 / 3 for 8 experts)
    triton_v14 v13 with every launch after the router's a programmatic dependent launch (PDL)
               of the one before it: the six launches' starts overlap their predecessors'
               tails; v13's arithmetic (H200: 10 µs slower at T 1, ~v13 from T 9)
    triton_v15 v14 with the GEMMs' weight streams begun before they wait: trigger, L2 bulk
               prefetch of each program's first PF K tiles, wait; the SiLU triggers before
               its wait too; v13's arithmetic (H200: slower than v13 at every T)
    triton_v16 v13 with the experts holding > HOT slots run by a second launch of each GEMM
               on wide slot tiles (BN 64 x BM 128 / 64): a hot expert's weights streamed a few
               times, not once per 16 slots (H200: skewed T 128 / 512 / 2080 -7 / -13 / -15 %,
               uniform within 1.5 %; BEST in session 16)
    triton_v17 v16 with, at T <= 32, the SiLU and the combine done by the GEMMs' last
               programs of each group (an atomic count): four launches instead of six
               (H200: v16's bits; 1 µs faster at T 1, 2-6 % slower from T 9)
    triton_v18 v16 with the hot launches' grid capped at 8 programs an N tile (v16's empty hot
               launches cost 16-118 µs at uniform T 128-2080); v16's bits (H200: T 2080
               -1.2 / -1.4 % uniform / skewed, the REAL T within the rounds)
    triton_v19 v18 with v7's 64-row tiles (128 registers, four CTAs an SM) where at most one
               token's slots are expected (decode), v13's split rule on that grid (H200:
               T 1 81.6 vs 84.0 µs, v18's bits there, v18's tiles from T 2; BEST from
               session 17)
    gluon_v20  v19 with the GEMMs' cold programs as a Gluon producer / consumer kernel (warp
               specialization: TMA and cp.async from one warp, STAGES tiles in flight; the
               next slab's dequant under the previous slab's wgmma); sm_90 only (H200:
               v19's bits, 1.04-1.32x slower: a measured negative)
    gluon_v21  gluon_v20 at four CTAs an SM for the decode tiles (BN 64: 3 stages, 64
               registers; v20: 3 CTAs, ncu: T 1's grids in 1.29 / 2.26 waves; H200:
               T 1 91.1 vs v19's 81.4 µs, a measured negative)
    triton_v22 v19 with the combine at 256 columns a program instead of 1024 up to T 32
               (v19's bits; H200: T 1 80.1 vs 81.4 µs, 1.10x Humming; BEST from session 18)
    triton_v23 v22 with gate/up's K splits at the 64-row decode tiles sized for four CTAs an
               SM (a hinted EP8 rank's decode: 7 splits of 4 K tiles instead of 4 of 7;
               H200: the EP8 C 1 AR step no faster, 6.23 vs 6.19 ms: a measured negative)
    triton_v24 v22 with the routing metadata of 9-64 tokens from one program (a sort of the
               routed slots' expert x slots + slot keys) instead of three launches (count,
               scan, scatter): the same metadata, v22's bits (H200: the EP8 C 1 DDTree-16
               step's routing 165 vs 300 µs; BEST from session 20)
    triton_v25 v24 with v19's 64-row tiles wherever at most 3 K experts are expected active
               (v24: at most K slots), v24's everywhere else (H200: one EP8 rank's C 1
               DDTree-16 verify, hint 17, 135.4 vs 147.8 µs as a v24 config; v24's bits)
    triton_v26 v25 with the 64-row tiles where at most 2 K experts are EXPECTED active,
               E (1 - (1 - 1/E)^S) (v25: min(E, S) <= 3 K): v25's tiles on the EP8 step,
               v24's at T 3 on 384 experts (H200: 185.2 vs v25's 192.5 µs); BEST from
               session 21
    triton_v27 v26 with the routing and the permute in one launch where one program routes
               (T <= 64 at K 8): program 0 routes, the others permute x (five launches
               instead of six; v26's bits; H200: T 1 / 8 / 17 on an EP8 rank 29.9 / 58.6 /
               133.5 vs 30.7 / 60.2 / 135.2 µs, but in the EP8 step its GEMMs ran slower:
               C 1 AR -0.07 / -0.08 ms, C 1 DDTree-16 +0.06 / +0.10 in two same-call A/Bs;
               not BEST)
    triton_v28 v27's one launch only up to ROUTE1 tokens (8 at K 8: the step's decode, where
               the step gained), v26's launches above (v26's bits; H200: the EP8 C 1 AR step
               -0.045 ms in an ABBA A/B; BEST from session 22)
    triton_v29 v28 with the K-split GEMMs' grids ordered (N tile, K split, expert): the worst
               case's idle programs last in launch order (an EP8 rank's decode, hint 1-2;
               v28's launches elsewhere; v28's bits; H200: one active expert's GEMMs 10.2 +
               6.9 vs 12.5 + 8.4 µs, the EP8 C 1 AR step 5.469 / 5.474 vs 5.500 / 5.496 ms)
    triton_v30 v29 with those grids sized by the experts expected active (A_GRID = 2 x the
               expectation, programs taking the active experts in turn) instead of the worst
               case (v28's bits; H200: a rank with no expert 1.2 + 1.1 vs 2.1 + 2.0 µs of
               GEMM launches, the EP8 C 1 AR step 5.456 / 5.452 ms; BEST from session 23)
    triton_v31 v30 with the 64-row decode tiles at 96 registers a thread (five CTAs an SM
               instead of four; v28's bits; H200: the EP8 C 1 DDTree-16 step 14.17 vs 14.28
               ms, but C 1 AR 5.54 vs 5.48 and C 8 AR 9.59 vs 9.39: not BEST)
    triton_v32 v31's 96 registers only where the 64-row tiles' gate/up grid is expected past
               1.5 waves of four CTAs an SM (the EP8 C 1 verify at budget 16, T 2 on 384
               experts), v30's tiles elsewhere (v28's bits; H200: the EP8 C 1 DDTree-16 step
               14.16 / 14.17 vs 14.27 / 14.28 ms, T 2 on 384 experts 132.9 vs 135.0 µs, C 1
               AR and DDTree-8 v30's kernels; BEST from session 23)
    triton_v33 v32 with the gate/up GEMM split twice along K where the 64-row tiles expect
               264-660 gate/up programs unsplit (an EP8 rank at hints 5-11, T 1 on 384
               experts): twice the programs, each half as long (another K association there;
               H200: the EP8 C 8 AR step 9.16 vs 9.38 ms, C 1 DDTree-8 11.41 vs 11.55, but T 1
               on 384 experts 80.8 vs 78.4 µs; exact suite not run: not BEST)
    triton_v34 v33's split only where the op's hint sizes the grid (an EP rank), v32's tiles
               without a hint (v32's bits without a hint; H200, session 24 ABBA: the EP8 C 8
               AR step 9.17 / 9.17 vs 9.35 / 9.36 ms, C 1 DDTree-8 11.43 / 11.40 vs 11.53 /
               11.54, T 1 on 384 experts 78.0 vs 77.9 µs; BEST sessions 24-42, then PORTABLE)
    cuda_v1    the expert GEMMs in CUDA C++ (cupy NVRTC): warp mma.sync on weights streamed
               through a per-warp cp.async ring in the A fragments' order (mma_layout: an exact
               one-time repack), the exact dequant (H200: 42 GPU tests passed; REAL T 1 81.9 µs,
               uniform T 9-128 0.92-0.97x v34: not BEST)
    cuda_v2    cuda_v1 with the scales on each group's fp32 partial (1.77 SASS a weight; its
               gate/up GEMM 5-8 % faster than v34's from T 9, its down GEMM 10-20 % slower; REAL
               T 9 470.5 vs v34 482.8 µs, 1.02x Humming skewed; not BEST)
    cuda_v3    cuda_v2's GEMMs with the decode MoE (T K <= 64 slots) in one persistent launch:
               routing in each CTA's shared memory, gate/up then down work items from a
               counter (a down item issues its weights before it waits for its expert's h),
               the combine by the CTA that finishes a row block; cuda_v2's launches past 64
               slots (H200, session 25: 25 GPU tests passed; slower than the four launches:
               REAL T 1 95.3 µs against v34's 79.6, an EP8 rank's T 1 29 against 25-27;
               a measured negative, not BEST)
    cuda_v4    cuda_v2's gate/up GEMM (h written into triton_v5's permuted rows) with
               triton_v34's down GEMM and combine: each GEMM from the version that streams it
               faster; the load step repacks gate / up only (H200, session 26: the EP8 step
               C 1 AR 5.25 vs 5.45 ms, C 1 DDTree-16 14.02 vs 14.26; REAL uniform T 1-128 at
               or under v34, skewed T >= 17 and T 512 slower: not BEST, the engine preset's
               in session 26)
    cuda_v5    cuda_v4 with the gate/up K parts of one wave (16 warps an SM at 128 registers)
               where a call has no EP hint and one part fits (T 1 / 2 on 384 experts; H200,
               session 27: T 1 71.3-72.8 vs 75.3-76.3 µs, T 2 124.6 vs 127.1); cuda_v4's
               tiles and bits on every hinted call (the EP8 step): the engine preset's
    cuda_v6    cuda_v5 with the down experts' weights asked of L2 (cp.async.bulk.prefetch.L2)
               by the gate/up CTAs before their own stream, where the experts expected
               active hold <= 20 MB of them (an EP8 rank's decode); cuda_v5's bits (H200,
               session 27: the down GEMM at one expert 6.9-7.0 µs either way, the gate/up
               +0.6; the EP8 C 1 AR step 5.35-5.36 vs 5.29 ms: a measured negative)
    cuda_v7    cuda_v5 with a one-token call without a hint (decode on 384 experts) as two
               concurrent halves of the token's experts (a side stream, cuda_v5's four
               launches each, the outputs added); cuda_v5 elsewhere (H200, session 28: T 1
               77.7 vs 72.7 µs, four parts 86.2: a measured negative)
    cuda_v8    cuda_v5 with a one-token call as two launches: CTA (128-input slice of I,
               slot) computes its slice of h (cuda_v5's gate/up arithmetic, fp32 h in
               shared memory) and that slice's partial of the down GEMM on the CUDA cores
               from the checkpoint layout (no CTA waits for another), then a combine over
               slices and slots; cuda_v5 elsewhere (H200, session 28: T 1 71.6-72.4 vs
               72.7-73.8 µs, REAL 71.4 µs, 1.27x Humming; not BEST)
    cuda_v9    cuda_v8 with its fastest one-token form as defaults: the down experts from a
               lane-major copy on the tensor cores (DN 8, LY 3), evict-first copies, phase 1
               by TMA bulk copies (GB 1), the down ring's first stages early (EA 1), the
               combine in the launch's tail (FC 1): one launch (H200, session 32: T 1 61.7 vs
               cuda_v5's 73.6 µs, the kernel 59.2; a second copy of the down experts; not BEST)
    cuda_v10   cuda_v9 at one token; past it cuda_v5 with the experts holding more than WT
               (8) slots on a second CUDA gate/up launch of wide n-tiles: a CTA of 8 row
               units takes a pass of up to 64 of a hot expert's slots, their activations
               staged once a CTA in shared memory beside each warp's weight ring (cuda_v5:
               once a pass of 8 slots and a 32-row unit); cold experts on cuda_v5's launch
               (H200, session 33: REAL skewed T 128 1.03x Humming, cuda_v5 0.86x; skewed
               T 65 / 512 0.98x / 0.95x, uniform T 512 0.82x; not BEST)
    cuda_v11   cuda_v10 with the hot launch on a high-priority side stream beside the cold
               launch (WS 1: the same kernels and bits), every expert past 8 slots hot at
               every T, two hot CTAs an SM on 32-slot passes from T K >= 8 E (H200, session
               34: skewed T 17 440.5 vs 471.0 µs, uniform T 512 3802.7 vs 4137.3 against
               cuda_v10 in process; session 35 REAL bench: at or above Humming at
               13 of 14 shapes, uniform T 512 0.89x; not BEST)
    cuda_v12   cuda_v11 with, from T K >= 8 E, the hot experts in two bands on the side
               stream: 9-16 slots on four 4-warp CTAs an SM and 16-slot passes, more on
               cuda_v11's launch (cuda_v10's bits; H200, session 35: that CTA shape for every
               hot expert took uniform T 512 3569 -> 3462 µs; the bands 3447.5 vs cuda_v11's
               3571.6 in process, REAL bench 0.94x Humming; not BEST)
    cuda_v13   cuda_v12 with the down GEMM in two launches, each behind its experts' gate/up
               launch: the hot experts' on the side stream, the cold ones' on the current
               stream, the join before the combine (cuda_v12's bits; H200, session 36: DS 1 /
               DS 2 tie cuda_v12 at every T, uniform T 512 3444.0 / 3438.4 / 3437.9 µs: a
               measured negative, not BEST)
    cuda_v14   cuda_v12 with, from 8 E expected slots, the down GEMM on h's bf16 hi only
               (triton_v7's NH2 1: one bf16 rounding of h, Humming's and Marlin's operand;
               H200, session 37 as cuda_v13 DS 0 knobs: uniform T 512 3612.8 -> 3491.2 µs,
               skewed 3815.3 -> 3523.2, T 9-128 unchanged; call 2 REAL bench: uniform T 512
               3153.7 µs, 0.99x Humming (cuda_v12 0.89x), skewed T 512 1.14x, at or above
               Humming at 13 of 14 shapes; not BEST: the trained exact suite 20 of 21, one
               router near-tie at C 8 its teacher-forced pair does not reproduce)
    cuda_v15   cuda_v14, but cuda_v5 exactly on an EP rank's hinted calls expecting under 3 E
               slots (H200, sessions 37-38 EP8 emulation, graph-replayed ms a step: the
               cut takes the faster of cuda_v5 / cuda_v14 at every C 1-32 x budget 8-64
               measured, C 32 DDTree-64 130.66 vs cuda_v5's 155.44; ENGINE from session 38;
               `small`'s exact suite passed whole, sessions 41-43, memcheck / racecheck clean:
               BEST from session 43)
    cuda_v16   cuda_v15 with, on unhinted calls between one token and 8 E slots, BN 64 (the
               down GEMM's column tile, 128) and PF1 4 (the gate/up L2 prefetch; none) (H100,
               session 44: the knobs' sweep T 9 577.8 -> 566.1 µs (BN 64), T 33 1602.8 ->
               1581.4 (PF1 4), T 128 3005.1 -> 2975.5 (PF1 4); REAL bench: see the README)
    cuda_v17   cuda_v16 with, on an EP rank's small hinted calls (cuda_v5's path), BN 64 from
               hints over E / 2 slots and PF1 4 from E (H100, session 45: rank 0 of EP8,
               hint 33 272.5 -> 265.5 µs, 65 375.0 -> 362.9, 136 425.3 -> 415.3; hint 17 and
               unhinted calls cuda_v16's launches)
    cuda_v18   cuda_v17 with the gate/up GEMM's K in 4 parts a unit (KW1 4, RW1 1) on small
               hinted calls of E / 3 to 5 E / 2 slots (H100, session 45: rank 0 of EP8, hint
               17 over four draws 1.0-6.0 % faster, 33 / 65 / 100 1.2-2.5 %; not cuda_v17's
               bits there: the gate/up K association)
    cuda_v19   cuda_v18 with the hot gate/up launch (cuda_v10.cu's, every version since) on
               wgmma m64nNk16 with A from the dequantised registers and B (the pass's
               activations, permuted once a call into the fragments' logical k order) by
               descriptor from 128-byte-swizzled shared memory; sm_90a through nvcc (session
               46; the reference's tolerance where hot experts exist, cuda_v18's launches
               elsewhere; the hot launch 286.1 vs 324.8 µs at skewed T 128, H200, the op
               unmoved: it runs beside the cold launch)
    cuda_v20   cuda_v19 with the main hot launch's row unit on two warps (gate tile, up
               tile: one tile's accumulators a thread), so its wgmma passes take 128 slots;
               gate and up meet in shared memory for the epilogue (session 46: the hot
               launch 339.8 µs at skewed T 128, slower than cuda_v19's: the 128-slot
               activation stage against 64 weight rows a CTA)
    cuda_v21   cuda_v18 with the cold gate/up launch's weight ring filled by TMA bulk copies
               (TB1 3 stages a warp: one lane issues a chunk pair's 2 KB of words and 256 B of
               scales on an mbarrier, cuda_v8's GB 1 form) instead of cp.async and the L2
               prefetch; cuda_v18's bits (session 48, H100: bitwise, 1-3 % faster at 11 of 14 REAL
               shapes, uniform T 9 2 % slower; BEST)
    cuda_v22   cuda_v21 with the Triton hot launch's programs (the down GEMM's, alone after
               the cold down at large T) dealt (hot expert, slot chunk) items in turn instead
               of whole hot experts (HI 16 programs an N tile; HS 1: beside the cold down
               on a side stream; HS 2: behind the hot gate/up launches there); cuda_v21's
               bits (sessions 50-51, H100); no HS faster at the op (session 51): not BEST
    cuda_v23   cuda_v22 with the cold down launch as a persistent grid (FP 3 programs an SM)
               walking (slot chunk, N tile) items in one flattened loop the pipeliner runs
               across items (FL 1), instead of a program a (N tile, expert); cuda_v22's bits;
               30 % slower (FL 0: 1.5-2 %) on the H100 (session 51): a measured negative
    cuda_v24   cuda_v21 with the hot experts past WB slots on a warp-specialised tensor-core
               launch: 256 weight rows x 128 slots a CTA, a producer warpgroup filling a
               ring by TMA bulk copies (activations gathered once a call into the tile's
               swizzled image), two consumer warpgroups on wgmma with register-A dequant
               (sessions 52-54, H100: exact; REAL bench skewed T 512 -6.5 % against
               cuda_v21, skewed T 9-33 and uniform up to 2 % slower: not BEST)
    cuda_v25   cuda_v24 with the TC launch's ring filled by TPW 4 producer warps (each
               arriving with its own bytes) instead of one thread, whose copy issue starved
               the wgmmas (session 54 ncu: 29 % of consumer samples at the full wait, the
               producer busy ~70 %); cuda_v24's bits; the TC launch 627 -> 499 µs (H100)
    cuda_v26   cuda_v25 with the TC launch on half its CTA columns past TYH 3 items a
               column (the other CTAs exit, leaving SMs to the cold gate/up launch beside
               it) and only from 512 slots a call (TC 0 below: cuda_v21's launches);
               H100 REAL bench: skewed T 512 3335.4 vs cuda_v21's 3781.9 µs (1.19x
               Humming), T 128 -5.6 %, uniform T 512 +1.0 %; the BEST candidate
    cuda_v27   cuda_v26 with the down GEMM's experts of MID + 1 .. HOT slots (17-64) on a
               launch of 64-slot chunks, each streaming its weights once (the cold down's
               16-slot chunks re-read them from DRAM: 2.99 GB read for ~2.7 GB of experts at
               skewed T 512, session 52 ncu); H100 (session 56): at BM2_MID 32 skewed
               T 512 -2.7 % against cuda_v26 in process, skewed T 128 +0.9 %
    cuda_v28   cuda_v27's middle down launch only at the wide down tile (BN 128: T >= 384),
               at BM2_MID 32; cuda_v26's launches and bits below; H100 REAL bench
               (session 56): skewed T 512 3354.0 vs cuda_v26 3440.5 vs cuda_v21 3855.4 µs
               (1.23x Humming, 83.0 % of copy); BEST and ENGINE from session 57
    cuda_v29   cuda_v28 with the middle down launch on a side stream beside the hot down
               (MS 1: the band's DRAM stream and the hot down's MMA work on the same SMs,
               184 KB of shared memory together); cuda_v28's bits; H100 (session 57):
               within the rounds' spread of cuda_v28 at skewed / uniform T 512 (a measured
               negative, not BEST)
    cuda_v30   cuda_v28 with the cold gate/up launch's K in 4 parts a unit (cuda_v18's
               KSPLIT) on unhinted calls of 9-17 tokens: 128 shorter CTAs an expert, so a
               draw whose experts overrun 4 waves of 528 CTAs leaves a quarter of the tail;
               H100 (session 57, as cuda_v28 knobs): REAL uniform T 9 566.4 vs 591.8 µs
               (1.03x Humming); not cuda_v28's bits there; H200 (session 58): faster than
               Humming at all 14 REAL cases, GPU tests and memcheck clean; `small`'s exact
               suite passed under it (session 59); BEST from session 59
`_common.py` holds what versions share (host checks, routing and combine kernels, dequant);
`sm90.py` compiles every kernel for sm_90 without a GPU.
Importing this package imports no Triton; `register()` adds the variants to the op registry.
"""

from __future__ import annotations

from pathlib import Path

_MOD = "workbench.kernels.int4_moe"
# the version the presets ("optimized", "engine"), the decode-loop test and the notebook use:
# cuda_v15 from session 43 (ENGINE's since session 38; the trained token-exact suite 21 of 21
# with the cuda_v14 launches it runs unhinted, session 39; `small`'s exact suite passed whole:
# AR at C 1 / 8 / 32 and DDTree 1..128 at each C, sessions 41-43 on an H200 and an H100, each
# divergence a reference tie or an explained near-tie; compute-sanitizer memcheck EDGE + REAL
# and racecheck EDGE clean, session 43; traces/gpu/session43); needs CUDA + cupy, so PORTABLE
# (triton_v34) where it cannot run;
# triton_v34 in session 24 (v32's tiles and bits without a hint; v33's twice-split gate/up on
# an EP rank's hinted calls: the EP8 C 8 AR step 9.175 / 9.169 ms against v32's 9.347 / 9.355,
# C 1 DDTree-8 11.428 / 11.399 against 11.531 / 11.543 in one ABBA call, the other step
# configurations within the runs' spread, T 1 on 384 experts 78.0 vs 77.9 µs);
# triton_v32 from session 23 (v28's bits; v30 with 96 registers a thread, five CTAs an SM, where
# the 64-row gate/up grid is expected past 1.5 waves of four: the EP8 C 1 DDTree-16 step 14.16 /
# 14.17 ms against v30's 14.27 / 14.28 in one ABBA call, C 1 AR and DDTree-8 v30's kernels);
# triton_v30 before it in session 23 (v28's bits; an EP8 rank's decode GEMMs, split along K, on grids
# sized by the experts expected active with the idle programs last: the EP8 C 1 AR step 5.456 /
# 5.452 ms against v28's 5.500 / 5.496 and v29's 5.469 / 5.474 in one ABCCBA call; every other
# shape runs v28's launches);
# triton_v28 in session 22 (v26's bits; the routing and the permute in one launch at decode,
# T <= 8: the EP8 C 1 AR step 5.49 / 5.50 vs v26's 5.54 / 5.54 ms in an ABBA same-call A/B, the
# other configurations v26's launches or within the runs' spread; v27's fusion up to 64 tokens
# slowed the verify);
# triton_v26 in session 21 (v25's tiles on the EP8 step, v24's at T 3 on 384 experts where
# v25's lost, 192.5 vs 185.2 µs; v24's bits); triton_v25 before it in session 21 (H200: v24's bits, 18 GPU tests; the EP8 step's int4 GEMMs at C 1
# DDTree-16 7147 vs v24's 7279 µs in the same call, the other configurations' tiles and times
# v24's); triton_v24 from session 20 (H200: v22's bits at T 1-65 uniform and skewed and under graph
# replay, 18 GPU tests; its one routing launch at 9-64 tokens took 165 µs a C 1 DDTree-16 EP8
# step against v22's three, 300 µs); v22 before it (session 18)
# cuda_v16 from session 44: cuda_v15's bits at every REAL shape (T 1-512, uniform and skewed:
# scripts/int4_moe_bitwise.py, H100), so `small`'s exact suite holds for it as cuda_v15's (the
# trained pair's widths and suite under it: plan session45_a); memcheck
# EDGE + REAL 0 errors, racecheck EDGE 0 hazards; REAL bench 3.5-6.5 % faster than cuda_v15 at
# T 9-128 (traces/gpu/session44)
# cuda_v17 from session 45: cuda_v16's launches on unhinted calls (its REAL bench, its bits at
# every REAL shape and the trained pair's widths, the trained exact suite 21 passed under it,
# session 45 call 1), BN 64 / PF1 4 on an EP rank's small hinted calls: cuda_v16's bits at EP8
# hints 17-264 (scripts/int4_moe_bitwise.py --ep 8), 26 GPU tests, memcheck EDGE + REAL 0
# errors, rank 0 of EP8 at hints 33 / 65 / 136 237.2 / 366.2 / 395.9 µs against cuda_v16's
# 241.5 / 384.0 / 403.3 (H100, traces/gpu/session45 call 4); cuda_v18 from session 45 too:
# cuda_v17 with 4 gate/up K parts on small hinted calls of E / 3 to 5 E / 2 slots (the EP8 C 1
# DDTree-16 verify's hint 17 among them): against cuda_v17 in one call hint 17 174.3 -> 170.0 and
# 127.8 -> 118.8 µs (two draws), 33 283.0 -> 275.8, 100 395.9 -> 389.6, 65 310.6 / 311.9, 136
# (outside the rule) the same; 26 GPU tests (cuda_v5's bits at its knobs, the reference's
# tolerance: not cuda_v17's bits on those calls, the gate/up K association), memcheck 0 errors
# (call 8); its unhinted calls are cuda_v16's launches and bits, so the exact suites' evidence
# holds there; an EP rank's hinted calls run only in the dist engine
# cuda_v21 from session 48 (H100 80GB, traces/gpu/session48): cuda_v18's bits at every REAL
# shape T 1-512 uniform / skewed and on an EP8 rank at hints 1-264 (scripts/int4_moe_bitwise.py,
# call 12), so every exact suite's evidence for cuda_v18 holds for it; GPU tests 17 + the shared
# suites 21 passed (calls 1, 3), memcheck EDGE + REAL 0 errors, racecheck EDGE 0 hazards (call
# 11); REAL bench with Humming (call 9, medians of 2 interleaved): faster than cuda_v18 at 11 of
# 14 shapes (skewed T 128 1980.5 vs 2039.7 µs, T 512 3885.6 vs 3953.4, uniform T 128 3048.5 vs
# 3104.0), T 1 tied, uniform T 9 slower (609.6 vs 599.6; 612.8 vs 598.6 in call 6); ncu (call 2,
# skewed T 128): the cold gate/up launch moves the same DRAM bytes with half the L2 sectors
# (155.6 M vs 310.7 M: no L2 prefetch) and a third of the L2 requests.
# cuda_v28 from session 57 (H100 80GB; traces/gpu/session56, traces/gpu/session57): REAL bench
# with Humming (session 56 call 4) skewed T 512 / 128 3354.0 / 1874.0 µs against cuda_v21's
# 3855.4 / 1980.3, the other shapes within 0.5 %; GPU tests 10 + the shared suites 21 passed;
# not cuda_v21's bits from 512 slots (the TC launch, the band), so the suites ran under it: the
# trained exact suite 21 passed (session 56 call 5), memcheck at skewed T 512 0 errors and
# `small`'s DDTree == AR suite at C 1 / 8, AR and DDTree 1-128, 14 passed (session 57 calls 1-2;
# every divergence a reference tie or an explained near-tie); `small` at C 32 not run under it
# cuda_v30 from session 59: cuda_v28's bits but on unhinted calls of 9-17 tokens (the cold
# gate/up launch's K in 4 parts a unit there); H200 (session 58 call 3, REAL bench with
# Humming, one round) faster than Humming at all 14 REAL cases, 1.01-1.47x, where cuda_v28
# trails it at uniform T 9 (478.2 vs 470.3 µs) and skewed T 17 (482.1 vs 475.9); slower than
# cuda_v28 at uniform T 17 (803-807 vs 791-793); its GPU tests 13 + the shared suites 22
# passed, memcheck 0 errors (call 4); `small`'s exact suite under it (session 59 call 2, an
# H100): C 1 AR vs the reference loop and DDTree 1-128 == AR, C 8 DDTree-1 == AR, 8 passed,
# every divergence an explained near-tie; the trained pair (D 256) keeps cuda_v28's KW1 2, so
# its suite is cuda_v28's; `small` at C 32 not run under it
BEST = "cuda_v30"
# the "engine" preset's version (kernels/__init__.py; what the full-size emulation times):
# cuda_v4 in session 26 (H200, EP8 emulation ABA against v34, kernel ms: C 1 AR 5.256 vs
# 5.472 / 5.457, C 1 DDTree-16 14.059 vs 14.324 / 14.346, C 8 AR 9.034 vs 9.190 / 9.197, C 8
# DDTree-16 29.83 vs 29.89 / 29.85); not BEST: not v34's bits, CUDA + cupy only, and slower
# than v34 under skewed routing from T 17 on 384 experts (an expert's slots past 8 re-stream
# its weights: REAL skewed T 33 834 vs 763 µs)
# cuda_v5 from session 27: cuda_v4's kernels and bits on every hinted call (the EP8 step's), one
# wave of gate/up K parts on unhinted decode (H200: T 1 on 384 experts 71.3-72.8 vs 75.3-76.3 µs)
# cuda_v15 from session 38: cuda_v5 exactly on a rank's hinted calls under 3 E slots, cuda_v14
# (hot bands on a side stream, bf16 h from 8 E) above (H200, EP8 emulation, graph-replayed ms a
# step, cuda_v15 vs cuda_v5 in one call, traces/gpu/session38 call 1: C 8 DDTree-8 / -32 / -64
# 25.06 / 38.66 / 45.77 vs 25.01 / 38.76 / 52.31, C 32 DDTree-8 / -32 / -64 43.73 / 79.25 /
# 130.66 vs 43.81 / 90.28 / 155.44 -- that run at session 37's 8 E cut; call 2 moved the cut to
# 3 E, where cuda_v14 took 168 / 200 slots 31.26 / 34.30 vs 31.52 / 35.54 and lost at 136 and
# below, so C 8 DDTree-32 and C 32 DDTree-8 now take cuda_v14's 35.90 / 41.00); GPU tests 25
# passed; the BEST candidate from session 39: the trained token-exact suite with cuda_v14 (whose
# unhinted launches it runs) 21 of 21 under the real-loop witness (traces/gpu/session39 call 1);
# BEST from session 43
# cuda_v28 from session 57 (H100 80GB, traces/gpu/session57; the 16-layer EP8 step, DDTree-16,
# graph-replayed ms): call 6 cuda_v15 / cuda_v21 at C 1 / 8 / 32 4.66 / 4.56, 10.16 / 9.81,
# 16.48 / 16.30 (call 5: C 1 / 8 4.51 / 4.44, 9.83 / 9.55); call 7 (ABAB) cuda_v21 / cuda_v28
# 4.47 / 4.41 and 4.47 / 4.43, 9.61 / 9.52 and 9.55 / 9.53, 15.95 / 15.49 and 15.99 / 15.46
# (C 32's hints pass 264 slots, where cuda_v28's band runs); larger budgets not re-measured
ENGINE = "cuda_v28"
# what a preset selects where its version cannot run here (cuda_v28 without CUDA or cupy: the
# CPU tests, the CPU demo): triton_v34, the fastest version that runs everywhere (BEST sessions
# 24-42)
PORTABLE = "triton_v34"
# batch/position-invariant (fixed K chunks and slot tiles): the "invariant" preset, DDTree
# bitwise AR on the H200 (session 4)
INVARIANT = "triton_v6"


def _numbered(impl: str) -> list[int]:
    """The N of this folder's <impl>_vN.py files, ascending: the table below follows the files
    (hand-kept ranges missed cuda_v17 in session 45 and cuda_v21 in session 48)."""
    here = Path(__file__).parent
    return sorted(int(f.stem.rsplit("_v", 1)[1]) for f in here.glob(f"{impl}_v*.py"))


# every <impl>_vN.py is variant <impl>_vN, its op function int4_moe_<impl>
VARIANTS: dict[str, dict[str, str]] = {
    "int4_moe": {f"{impl}_v{v}": f"{_MOD}.{impl}_v{v}:int4_moe_{impl}"
                 for impl in ("triton", "gluon", "cuda") for v in _numbered(impl)},
}
DESCRIPTIONS: dict[tuple[str, str], str | tuple] = {
    ("int4_moe", "cuda_v1"): ("CUDA C++ (cupy NVRTC): warp mma.sync on weights streamed into "
                              "registers in fragment order (an exact one-time repack), the "
                              "exact bf16 dequant, SiLU fused into gate/up; Triton routing and "
                              "combine; 4 launches, no sync", ("cuda", "cupy")),
    ("int4_moe", "cuda_v2"): ("cuda_v1 with each scale group's fp32 partial scaled instead of "
                              "the weights (the mma takes 128 + q, a -136 sum(x) correction "
                              "mma): ~1.8 instead of 2.3 SASS a weight", ("cuda", "cupy")),
    ("int4_moe", "cuda_v3"): ("cuda_v2's GEMMs with the decode MoE (T K <= 64) in one launch: "
                              "each CTA routes in shared memory, work items from a counter "
                              "(gate/up, then down waiting on its expert's h), the combine by "
                              "a row block's last CTA; cuda_v2 past 64 slots", ("cuda", "cupy")),
    ("int4_moe", "cuda_v4"): ("cuda_v2's gate/up GEMM (SiLU fused, h in triton_v5's permuted "
                              "rows) with triton_v34's down GEMM and combine; gate / up "
                              "repacked, down in the checkpoint layout", ("cuda", "cupy")),
    ("int4_moe", "cuda_v5"): ("cuda_v4 with the gate/up GEMM's K parts of one wave where a call "
                              "has no EP hint (T 1 / 2 on 384 experts); cuda_v4's tiles and "
                              "bits on hinted calls", ("cuda", "cupy")),
    ("int4_moe", "cuda_v6"): ("cuda_v5 with the gate/up CTAs asking L2 for the active experts' "
                              "down weights before their own stream where few experts are "
                              "active (an EP rank's decode); cuda_v5's bits; measured slower",
                              ("cuda", "cupy")),
    ("int4_moe", "cuda_v7"): ("cuda_v5 with a one-token call without a hint as two concurrent "
                              "halves of its experts (a side stream each half's four launches, "
                              "the outputs added); measured slower", ("cuda", "cupy")),
    ("int4_moe", "cuda_v8"): ("cuda_v5 with a one-token call as one GEMM launch of (I slice, "
                              "slot) CTAs, each its slice of h and that slice's down partial "
                              "(CUDA cores, checkpoint layout), and a combine over the slices",
                              ("cuda", "cupy")),
    ("int4_moe", "cuda_v9"): ("cuda_v8 with its fastest one-token form as defaults (DN 8 on the "
                              "lane-major down copy, EF 1, GB 1 bulk copies, EA 1, FC 1: the combine "
                              "in the launch's tail): one launch a decode call", ("cuda", "cupy")),
    ("int4_moe", "cuda_v10"): ("cuda_v9 at one token; past it cuda_v5 with the experts holding "
                               "more than WT (8) slots on a second gate/up launch of wide "
                               "n-tiles (64 slots a pass, the pass's activations shared by a "
                               "CTA's 8 units in shared memory)", ("cuda", "cupy")),
    ("int4_moe", "cuda_v11"): ("cuda_v10 with the hot launch on a high-priority side stream "
                               "beside the cold launch, every expert past 8 slots hot, two hot "
                               "CTAs an SM on 32-slot passes from T K >= 8 E", ("cuda", "cupy")),
    ("int4_moe", "cuda_v12"): ("cuda_v11 with, from T K >= 8 E, the experts of 9-16 slots on a "
                               "second hot launch of four 4-warp CTAs an SM on 16-slot passes "
                               "(both on the side stream); cuda_v10's bits", ("cuda", "cupy")),
    ("int4_moe", "cuda_v13"): ("cuda_v12 with the down GEMM in two launches, each behind its "
                               "experts' gate/up launch (hot experts on the side stream, cold "
                               "ones on the current one); cuda_v12's bits", ("cuda", "cupy")),
    ("int4_moe", "cuda_v14"): ("cuda_v12 with, from 8 E expected slots, the down GEMM on h's "
                               "bf16 hi half only (one rounding of h, as Humming and Marlin): "
                               "half the down GEMM's MMA columns and activation reads",
                               ("cuda", "cupy")),
    ("int4_moe", "cuda_v15"): ("cuda_v14, but cuda_v5 exactly on an EP rank's hinted calls "
                               "expecting fewer than 3 E slots (where cuda_v14's hot launch "
                               "finds few experts past 8 slots)", ("cuda", "cupy")),
    ("int4_moe", "cuda_v16"): ("cuda_v15 with, on unhinted calls of 2 tokens to 8 E slots, the "
                               "down GEMM on 64-column tiles and the gate/up CTAs asking L2 "
                               "for their weight slice 4 chunk pairs ahead", ("cuda", "cupy")),
    ("int4_moe", "cuda_v17"): ("cuda_v16 with, on an EP rank's small hinted calls, the down "
                               "GEMM on 64-column tiles from hints over E / 2 slots and the "
                               "gate/up L2 prefetch 4 chunk pairs ahead from E", ("cuda", "cupy")),
    ("int4_moe", "cuda_v18"): ("cuda_v17 with the gate/up GEMM's K in 4 parts a unit on an EP "
                               "rank's small hinted calls of E / 3 to 5 E / 2 slots (more warps "
                               "on each active expert's stream)", ("cuda", "cupy")),
    ("int4_moe", "cuda_v19"): ("cuda_v18 with the hot gate/up launch's MMAs on wgmma (sm_90a, "
                               "built by nvcc): one dequant a k16 step serves a whole pass of "
                               "slots; the activations permuted once a call into the fragments' "
                               "logical k order", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v20"): ("cuda_v19 with the main hot launch's unit on two warps (gate "
                               "tile, up tile): 64 accumulators a thread at 128-slot wgmma "
                               "passes, gate and up met in shared memory", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v21"): ("cuda_v18 with the cold gate/up launch's weight ring filled by "
                               "TMA bulk copies (one lane a warp, an mbarrier a stage) instead "
                               "of cp.async and the L2 prefetch; cuda_v18's bits", ("sm90", "cupy")),
    ("int4_moe", "cuda_v22"): ("cuda_v21 with the hot launch's programs dealt (hot expert, "
                               "slot chunk) items in turn instead of whole hot experts; "
                               "cuda_v21's bits", ("sm90", "cupy")),
    ("int4_moe", "cuda_v23"): ("cuda_v22 with the cold down launch as a persistent grid of "
                               "(slot chunk, N tile) items in one flattened, pipelined loop; "
                               "cuda_v22's bits", ("sm90", "cupy")),
    ("int4_moe", "cuda_v24"): ("cuda_v21 with the hot experts' gate/up on a warp-specialised "
                               "256 x 128 wgmma tile fed by TMA bulk copies of gathered "
                               "activations", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v25"): ("cuda_v24 with the TC launch's ring filled by 4 producer warps "
                               "(each arriving with its own bytes) instead of one thread; "
                               "cuda_v24's bits", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v26"): ("cuda_v25 with the TC launch on half its columns past 3 items "
                               "a column and only from 512 slots a call (cuda_v21's launches "
                               "below)", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v27"): ("cuda_v26 with the down GEMM's 17-64-slot experts on a launch "
                               "of 64-slot chunks (their weights streamed once, not once a "
                               "16-slot chunk)", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v28"): ("cuda_v27's middle down launch only at the wide down tile "
                               "(T >= 384) at 32-slot chunks; cuda_v26's launches below",
                               ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v29"): ("cuda_v28 with the middle down launch on a side stream beside "
                               "the hot down launch; cuda_v28's bits", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "cuda_v30"): ("cuda_v28 with the cold gate/up launch's K in 4 parts a unit on "
                               "unhinted calls of 9-17 tokens", ("sm90", "cupy", "nvcc")),
    ("int4_moe", "triton_v1"): "Triton W4A16 MoE on the checkpoint layout: GPU routing metadata, "
    "fused dequant gate/up + SiLU*mul, down, ordered combine; 4 launches, no sync",
    ("int4_moe", "triton_v2"): "v1 on a repacked planar INT4 layout (one scale per 32-input slab, "
    "no register reshape), evict_first weight loads; repack cached per weight tensor",
    ("int4_moe", "triton_v3"): "weight-streaming rework: (expert, N tile, K split) programs read "
    "each weight slice once for all the expert's slots (BM 16), split-K with ordered reductions, "
    "I2F-free exact dequant on the checkpoint layout (activations permuted instead), 6 launches",
    ("int4_moe", "triton_v4"): "v3 with every K-loop load pipelined (weights, scales, activations "
    "as cp.async: unmasked main K loop, peeled tail), hi+lo in one MMA operand, maxnreg 168: "
    "3 CTAs/SM, ~81 KB of weight loads in flight per SM",
    ("int4_moe", "triton_v5"): "v4 with the INT4 dequant as packed bf16x2 inline PTX (lop3 "
    "0x4300|q, sub 136, mul by the scale pair; bitwise the reference): ~1.9 instead of ~5 "
    "instructions per weight, 64-deep MMA slabs in the pairs' K order (activations permuted)",
    ("int4_moe", "triton_v6"): "v5 made batch-invariant (a row's bits independent of T and of "
    "the other rows' routing): K summed in fixed chunks of the weight's K tiles, ((c0 + c1) + "
    "c2)... in fp32, as split-K partials at small T or one program's chunk-reset loop at large "
    "T; slot tiles fixed (BM 16 gate/up, 8 down)",
    ("int4_moe", "triton_v7"): "v5 with the INT4 weight words (and 16-byte-aligned scale rows) "
    "brought in by TMA bulk copies from host descriptors over the checkpoint tensors [E, N, "
    "IN/8] (expert as a coordinate, tails zero-filled): no per-thread weight addresses, 128 "
    "registers, 3 stages, 4 CTAs/SM; outputs bitwise v5's",
    ("int4_moe", "triton_v8"): "v7 with 128 weight rows per program on 4 warps (two m64 wgmma "
    "row blocks sharing each activation slab): the K loop's per-tile work (mbarriers, TMA "
    "issue, CTA barriers, activation cp.async, wgmma descriptors) per 256 weights a thread, "
    "2.59 instead of 3.13 SASS per weight; 168 registers, 3 CTAs/SM; outputs bitwise v7's",
    ("int4_moe", "triton_v9"): "v8 with the routing metadata built by grids over blocks of 8 "
    "tokens (histogram, one-program prefix over the blocks, scatter) instead of one program "
    "walking the blocks (~4 µs each: ~250 µs at T = 512); one program still at T <= 8; "
    "outputs bitwise v8's",
    ("int4_moe", "triton_v10"): "v9 with the gate/up slot tile at 32 (wgmma m64n32) where "
    "experts average more than 16 slots (S > 16 E): half the slot chunks re-reading each "
    "weight slice at large verify batches; v9's tiles (and bits) below",
    ("int4_moe", "triton_v11"): "v10 with tiles sized for the op's expected_slots hint (EP on "
    "the replicated stream: each rank passes T x K slots, ~7/8 of them -1) and a SiLU over "
    "the routed positions only (count read on the device, grid-strided from the hint's grid); "
    "v10's tiles and bits without the hint",
    ("int4_moe", "triton_v12"): "v11 with both GEMMs on a persistent grid (SMs x 3 programs): "
    "the (active expert, N tile, K tile) units read from the routing count on the device and "
    "cut into equal runs, a run inside a tile stored as one of its K-split partials (zeros "
    "after the last): equal weight bytes per CTA, no part-full last wave",
    ("int4_moe", "triton_v13"): "v11 with K splits from the expected active experts (the "
    "hint's slots, else T K): the most splits that keep each GEMM within 264 programs (two "
    "an SM), so a hinted EP rank's one-expert decode fills the GPU; v11's splits from T 9 up",
    ("int4_moe", "triton_v14"): "v13 with every launch after the router's a programmatic "
    "dependent launch of the one before (griddepcontrol.wait, then launch_dependents): the "
    "launches' starts overlap their predecessors' tails; v13's arithmetic (H200: 10 us slower "
    "at T 1, within ~1 % from T 9)",
    ("int4_moe", "triton_v15"): "v14 with both GEMMs' weight streams begun before they wait: "
    "each program triggers the next launch, asks L2 for its first PF K tiles of words and "
    "scales (cp.async.bulk.prefetch.L2; the router's outputs are in L2 before either GEMM "
    "starts) and then waits; the SiLU triggers before its wait too; v13's arithmetic (H200: "
    "slower than v13 at every T, more so the more it prefetches)",
    ("int4_moe", "triton_v16"): "v13 with the hot experts (more than HOT = 64 slots) run by a "
    "second launch of each GEMM on 64-row x 128 / 64-slot tiles (the h-th hot expert found on "
    "the device from the counts' prefix sum), the rest by v7's program: skewed large-T routing "
    "streams a hot expert's weights a few times instead of once per 16 slots",
    ("int4_moe", "triton_v17"): "v16 with, at T <= 32, the SiLU done by the gate/up GEMM's last "
    "program of each (expert, 256-column block) and the combine by the down GEMM's last "
    "program of each N tile (counted by an acq_rel atomic, zeroed by the permute): four "
    "launches instead of six, v16's bits",
    ("int4_moe", "triton_v18"): "v16 with its hot launches' grid capped at HOT_GRID = 8 programs "
    "an N tile (they stride over the hot experts): v16's bits, and empty hot launches of 1408 "
    "programs instead of up to ~45,000 at uniform routing",
    ("int4_moe", "triton_v19"): "v18 with 64-row weight tiles at 128 registers (four CTAs an "
    "SM, twice the programs) where at most K slots are expected (decode), K splits by v13's "
    "rule for that grid; v18's tiles above",
    ("int4_moe", "gluon_v20"): ("v19 with the GEMMs' cold programs in Gluon: a producer warp "
                                "(TMA words and scales, cp.async activations, STAGES K tiles "
                                "in flight) and a consumer warpgroup (v5's dequant into the "
                                "wgmma A registers, one slab's MMA under the next's dequant)",
                                ("sm90", "triton")),
    ("int4_moe", "triton_v22"): "v19 with the combine at 256 columns a program instead of 1024 "
    "up to T 32 (v19's bits)",
    ("int4_moe", "triton_v23"): "v22 with gate/up's K splits at the 64-row decode tiles sized for "
    "four CTAs an SM (528 programs) instead of two",
    ("int4_moe", "triton_v24"): "v22 with the routing metadata of 9-64 tokens in one launch (a "
    "sort of expert x slots + slot: the same slot list) instead of three (v22's bits)",
    ("int4_moe", "triton_v25"): "v24 with the 64-row decode tiles (four CTAs an SM) wherever at "
    "most 3 K experts are expected active, e.g. an EP8 rank's C 1 verify (v24: at most K slots)",
    ("int4_moe", "triton_v26"): "v25 with the 64-row tiles where at most 2 K experts are "
    "expected active, E (1 - (1 - 1/E)^S) for S slots (v25: min(E, S) <= 3 K)",
    ("int4_moe", "triton_v27"): "v26 with the routing and the activations' permute in one "
    "launch where one program routes (T <= 64 at K 8): five launches instead of six",
    ("int4_moe", "triton_v28"): "v27's one routing + permute launch only up to ROUTE1 tokens "
    "(8 at K 8: decode), v26's launches above",
    ("int4_moe", "triton_v29"): "v28 with the K-split GEMMs' grids ordered (N tile, K split, "
    "expert) so the worst case's idle programs come last in launch order (v28's bits)",
    ("int4_moe", "triton_v30"): "v29 with the K-split GEMMs' grids sized by the experts "
    "expected active (2 x the expectation), programs taking the active experts in turn",
    ("int4_moe", "triton_v31"): "v30 with the 64-row decode tiles at 96 registers a thread: "
    "five CTAs an SM instead of four (v28's bits)",
    ("int4_moe", "triton_v32"): "v30 with v31's 96 registers only where the 64-row tiles' "
    "gate/up grid is expected past 1.5 waves of four CTAs an SM (v28's bits)",
    ("int4_moe", "triton_v33"): "v32 with the gate/up GEMM split twice along K where the "
    "64-row tiles expect 264-660 gate/up programs unsplit (under ~1.25 waves of four CTAs an SM)",
    ("int4_moe", "triton_v34"): "v33's twice-split gate/up only where the op's hint sizes the "
    "grid (an expert-parallel rank), v32's tiles without a hint",
    ("int4_moe", "gluon_v21"): ("gluon_v20 with four CTAs an SM at the decode tiles (BN 64: "
                                "three K tiles in flight, 64 registers at launch) instead of "
                                "three", ("sm90", "triton")),
}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
