"""int4_moe cuda_v18: cuda_v17, with the gate/up GEMM's K split into 4 parts a unit (KW1 4, RW1
1; cuda_v1's rule gives 2 or 1) on an expert-parallel rank's small hinted calls expecting E / 3
to 5 E / 2 slots (16-119 on an EP8 rank's 48 experts: the C 1 DDTree-16 verify's 17 among them).

Why (H100 80GB, session 45 calls 6-7, traces/gpu/session45, `python -m
workbench.kernels.int4_moe.cuda_v17 --ep 8 --T ... --rounds 3 --cfgs "base;KW1=4,RW1=1;..."`,
medians of 3 interleaved, graph-replayed µs of rank 0's 48 experts, hint = T slots, each T a new
routing draw): cuda_v1's rule takes the fewest K parts that give a launch ~24 warps an SM over
the experts *expected* active, but the 128-register instances hold 16 warps an SM, and at a
rank's 10-30 active experts the launch is a fraction of a wave either way: more K parts put
more warps on each expert's stream. KW1 4 against the rule's parts: hint 17 (four draws) 173.6
-> 171.1, 125.7 -> 119.2, 174.1 -> 171.0, 126.5 -> 118.9, 162.7 -> 161.1; 20 182.8 -> 178.9;
28 164.1 -> 163.5; 33 235.7 -> 233.0, 227.5 -> 223.8, 226.9 -> 224.1; 48 292.8 -> 290.0; 65
384.5 -> 375.3; 100 383.0 -> 373.5; but 24 230.6 / 230.6, 12 145.0 -> 145.6, 9 120.8 -> 121.1
and 136 424.9 -> 427.0. KW1 8 lost at 17 (122.0 against KW1 4's 119.2); KW1 2 at 48 and 136.
So KW1 4 from E / 3 to 5 E / 2 expected slots; under and over it cuda_v17's tiles.

Measured (call 8, 6ed19dc): against cuda_v17 in one call (3 rounds) hint 17 174.3 -> 170.0 and
127.8 -> 118.8 µs (two draws), 33 283.0 -> 275.8, 65 310.6 / 311.9, 100 395.9 -> 389.6, 136
(outside the rule) 425.9 / 426.0; GPU tests 26 passed (cuda_v5's bits at these tiles, the
reference's tolerance, the shared suites), memcheck EDGE + REAL 0 errors.

What: cuda_v17's dispatch and tiles, with `KSPLIT` added where `ksplit` says. Unlike cuda_v17's
knobs this changes the gate/up dot products' K association (4 fp32 partials a unit summed in
part order, as cuda_v1's KW1 > 1 always does): not cuda_v17's bits on those calls, within the
reference's tolerance (the GPU tests); unhinted calls are cuda_v17's (cuda_v16's) launches and
bits. Numerics otherwise, graph safety, load step: cuda_v5's / cuda_v16's (not batch
invariant). GPU only (cupy). Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

from . import cuda_v15, cuda_v17, mma_layout
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

KSPLIT = {"KW1": 4, "RW1": 1}  # small hinted, E / 3 <= hint < 5 E / 2: 4 K parts a unit


def ksplit_fits(D: int, I: int) -> bool:
    """Whether KSPLIT's K parts divide the gate/up GEMM's chunk pairs (`cuda_v1.operands`
    refuses a KW1 that does not): 56 at Kimi's D 7168, 1 at tiny's D 64 (session 57: a rule
    that ignored the widths would have made tiny's calls a ValueError)."""
    return (mma_layout.dims(I, D, True)[1] // 2) % KSPLIT["KW1"] == 0


def with_ksplit(c: dict, D: int, I: int) -> dict:
    """Tiles c with KSPLIT where its K parts fit the widths (`ksplit_fits`), else c: what every
    rule that takes KSPLIT (this file's hinted one, cuda_v30's unhinted one) applies."""
    return c | KSPLIT if ksplit_fits(D, I) else c


def ksplit(E: int, slots: int | None) -> bool:
    """Whether KSPLIT applies: a small hinted call (cuda_v15's cut) of E / 3 to 5 E / 2 slots."""
    return (cuda_v15.small_hinted(slots, E) and 3 * slots >= E and 2 * slots < 5 * E)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v17's tiles, with KSPLIT where `ksplit`."""
    c = cuda_v17.tiles(T, K, E, D, I, slots)
    return with_ksplit(c, D, I) if ksplit(E, slots) else c


# the op and its CLI: cuda_v17's dispatch on this file's tiles
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v17;base")


if __name__ == "__main__":
    raise SystemExit(_main())
