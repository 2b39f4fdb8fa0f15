"""int4_moe cuda_v6: cuda_v5 with the down GEMM's weights asked of L2 by the gate/up GEMM where
few experts are active (an EP rank's decode).

Why (H200, session 27 call 1, `python -m workbench.kernels.int4_moe.cuda_v4 --ep 8 --T 1
--by-kernel`): with one active expert on an EP8 rank (the C 1 AR step's 60 MoE calls) the
gate/up GEMM streams its 14.7 MB in 11.5 µs (~1.3 TB/s: DRAM mostly idle) and the down GEMM
then starts a cold stream of 8.3 MB that takes 7.0 µs (~1.2 TB/s), about half of it the
stream's ramp after the gate/up drains. The down weights do not depend on h.

How: `L2D` 1 passes the down experts' checkpoint blocks to the gate/up launch (cuda_v1.cu's
`l2_w` ... `l2_sb`); before its own K loop each gate/up CTA asks L2
(`cp.async.bulk.prefetch.L2`, 16 KB a thread) for its 1 / gridDim.x share of the down words
and scales of every active expert its CTA row takes. The prefetch carries no data into
registers or shared memory and changes no result: the down GEMM (triton_v34's, unchanged)
reads the same bytes, from L2 where they arrived. Where: the experts expected active hold at
most L2D_BYTES of down weights (a fraction of the 50 MB L2, which the gate/up stream passes
through too): an EP8 rank's hints 1-2; T 1 on 384 experts (8 experts, 66 MB) does not.

Measured (call 4, traces/gpu/session27): **a measured negative.** GPU tests 32 passed (the
prefetch forced on at hints 1 / 2 / 17 and T 1 changes no bit, eager or graph-replayed). By
kernel at hint 1 (3 rounds): the down GEMM 6.9-7.0 µs with or without it, the gate/up 12.0-12.1
against 11.5; in the EP8 C 1 AR step (ABA) the down GEMMs took 387-389 µs a step against 401,
the gate/up GEMMs 753-755 against 660: kernels 5.354 / 5.360 ms against cuda_v5's 5.294. T 1
on 384 experts with it forced: gate/up 45.8-46.1 against 38.3. The down GEMM's 7 µs at one
expert is not its DRAM stream: 224 programs of 4 serial K tiles and the launch's ramp cost
about as much from L2. Not the engine preset's (cuda_v5 stays); L2D stays a knob.

Everything else is cuda_v5's (its tiles, instances and bits: the prefetch is a hint).
Dimension legend: cuda_v1.cu's (CUDA) and triton_v16's (Triton).
"""

from __future__ import annotations

from . import cuda_v4, cuda_v5
from .cuda_v4 import REPACKED, h_column  # noqa: F401  (the load step reads REPACKED)
from .triton_v26 import expected_active

L2D_BYTES = 20 << 20  # down weights of the expected active experts the prefetch may ask for


def down_bytes(D: int, I: int) -> int:
    """One expert's down block in the checkpoint layout: int4 words and bf16 group scales."""
    return D * I // 2 + D * (I // 32) * 2


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v5's tiles, with L2D 1 where the experts expected active
    hold at most L2D_BYTES of down weights."""
    S = T * K if slots is None else slots
    few = max(1.0, expected_active(E, S)) * down_bytes(D, I) <= L2D_BYTES
    return cuda_v5.tiles(T, K, E, D, I, slots) | {"L2D": int(few)}


# the op and its CLI: cuda_v4's launches on this file's tiles
int4_moe_cuda, _main = cuda_v4.on_tiles(tiles, "v=cuda_v5;base")


if __name__ == "__main__":
    raise SystemExit(_main())
