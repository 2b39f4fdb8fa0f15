"""int4_moe cuda_v29: cuda_v28 with the middle down launch on a side stream (MS 1), forked after
the cold down launch and joined after the hot one, so the band's experts stream beside the hot
down instead of before it.

Why (session 56 call 3, H100 80GB, traces/gpu/session56, skewed T 512 by kernel): after the
cold down (867.4 µs) the band (139.4 µs: ~0.3 GB of 17-64-slot experts, a DRAM-bound stream)
and the hot down (296.6 µs for the ~10 experts past 64 slots, at ~17 % of DRAM: MMA- and
latency-bound, session 52's ncu) run one after the other. They touch different experts and
write different slot rows of y, and they fit one SM together: the hot program holds 116.8 KB
of shared memory (one CTA an SM) and the band's at BM2_MID 32 67.6 KB (sm_90 build, 160
registers), 184.4 of the SM's 228 KB. Beside the hot launch the band should cost little of
its 139 µs; if the two compete for issue slots more than expected, MS 0 gives cuda_v28 back.
Unmeasured.

What: cuda_v28's tiles with MS (1; 0: cuda_v28's launches, one stream), cuda_v27's hook
(`grid_gemm_mid`) given a `workbench.streams.Side` under MID_KEY (normal priority: the hot
launch is the longer one, and neither should wait on the other). Same kernels, tiles and
programs as cuda_v28, so cuda_v28's bits (each slot row of y written by one program of one
launch). Graph-safe: the fork and join are stream waits, which capture as graph branches.
Dimension legend: cuda_v27's.
"""

from __future__ import annotations

import functools

from workbench.streams import Side

from . import cuda_v4, cuda_v17, cuda_v26, cuda_v27, cuda_v28
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

MID_KEY = "int4_moe_mid"  # the band launch's side stream (one a device)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v28's tiles with MS 1."""
    return cuda_v28.tiles(T, K, E, D, I, slots) | {"MS": 1}


def check_ms(c: dict) -> bool:
    """MS refused by name unless 0 or 1; whether the band runs on the side stream."""
    ms = c.get("MS", 0)
    _require(type(ms) is int and ms in (0, 1), "cfg['MS']",
             "0 (the band on the current stream) or 1 (on a side stream)", ms)
    return bool(ms)


def grid_gemm_mid_side(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """cuda_v27's `grid_gemm_mid` with the band launch on MID_KEY's side stream where MS 1
    (a CPU run has no streams: `Side` then runs it on the current one)."""
    side = Side(r.bad.device, check_ms(c), key=MID_KEY)
    cuda_v27.grid_gemm_mid(n, c, r, NT, args, kw, side=side)


# the op and its CLI: cuda_v28's with the band beside the hot down
int4_moe_cuda, _main = cuda_v17.on_tiles(
    tiles, "v=cuda_v28;base;MS=0", hot_for=cuda_v26.launch_bands_tc,
    tail_for=functools.partial(cuda_v4.down_tail, gemm=grid_gemm_mid_side))


if __name__ == "__main__":
    raise SystemExit(_main())
