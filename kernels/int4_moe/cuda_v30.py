"""int4_moe cuda_v30: cuda_v28, with the cold gate/up launch's K split into 4 parts a unit (KW1 4,
RW1 1: cuda_v18's KSPLIT, which an EP rank's small hinted calls already take) on unhinted calls
of 9 to 17 tokens. Everywhere else cuda_v28's tiles, launches and bits.

Why (H100 80GB, session 57 calls 6 and 8, traces/gpu/session57): at uniform T 9 cuda_v28's time
moves 8 % from one routing draw to the next at the same bytes (565.6 / 610.5 / 595.5 µs,
in process), and TB1 5 won on two draws and lost on the third. The cold gate/up launch runs
32 CTAs an expert (128 units of 16 rows, RW1 4 units a CTA) and the 126-register instance
holds 4 CTAs an SM: 528 resident on 132 SMs. A draw of 66 active experts is 2112 CTAs, exactly
4 waves; 67-68 experts leave a tail of 32-64 CTAs that runs after the rest, each streaming
0.49 MB through a 3-stage ring. Four K parts a unit (one unit a CTA, 128 CTAs an expert) cut a
CTA's bytes, so the tail, by four. Measured against cuda_v28 (KW1 1, RW1 4):
- in process, three uniform T 9 draws (`cuda_v28 --T 9,9,9 --rounds 3 --cfgs
  "base;KW1=2,RW1=2;KW1=4,RW1=1;TB1=5"`, medians of 3): 548.7 -> 549.7 on the 4-wave draw,
  592.6 -> **565.1** and 576.4 -> **560.3** on the others (KW1 2: 550.8 / 567.6 / 562.8);
- the REAL bench's own cases with Humming (`bench int4_moe --variants
  cuda_v28,cuda_v28@KW1=4+RW1=1 --peers humming --case ...`, medians of 2): uniform T 9 591.8
  -> **566.4 µs (1.03x Humming's 582.0; 99.8 % of the floor)**, skewed T 9 368.2 -> 367.1,
  uniform T 17 928.1 -> 924.9.
The rule keeps to the measured tokens; T 2-8 and 18-32 would need their own A/B. It applies
only where 4 parts divide the gate/up chunk pairs (`cuda_v18.ksplit_fits`: not tiny's D 64).

What: cuda_v28's op on `tiles` below (its hooks: cuda_v26's hot bands, cuda_v27's middle down
launch). The gate/up dot products sum 4 fp32 partials a unit in part order (cuda_v1's KW1 > 1,
as cuda_v18's hinted calls): not cuda_v28's bits at 9-17 unhinted tokens, within the
reference's tolerance (GPU tests); cuda_v28's bits elsewhere. Numerics otherwise, graph safety,
load step: cuda_v28's. GPU only (cupy). Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

import functools

from . import cuda_v4, cuda_v17, cuda_v18, cuda_v26, cuda_v27, cuda_v28
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

KSPLIT_T = (9, 17)  # unhinted tokens (inclusive) that take cuda_v18's KSPLIT (session 57)


def ksplit(T: int, slots: int | None) -> bool:
    """Whether an unhinted call of T tokens asks for 4 gate/up K parts a unit (shapes only)."""
    return slots is None and KSPLIT_T[0] <= T <= KSPLIT_T[1]


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v28's tiles, with cuda_v18's KSPLIT where `ksplit` asks
    and the widths fit it (`cuda_v18.with_ksplit`: not tiny's D 64)."""
    c = cuda_v28.tiles(T, K, E, D, I, slots)
    return cuda_v18.with_ksplit(c, D, I) if ksplit(T, slots) else c


# the op and its CLI: cuda_v28's hooks on these tiles
int4_moe_cuda, _main = cuda_v17.on_tiles(
    tiles, "v=cuda_v28;base", hot_for=cuda_v26.launch_bands_tc,
    tail_for=functools.partial(cuda_v4.down_tail, gemm=cuda_v27.grid_gemm_mid))


if __name__ == "__main__":
    raise SystemExit(_main())
