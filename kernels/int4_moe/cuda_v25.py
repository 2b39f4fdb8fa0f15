"""int4_moe cuda_v25: cuda_v24 with the TC launch's ring filled by TPW producer warps (4: every
warp of the producer warpgroup) instead of one thread.

Why (session 54 call 1, H100 80GB, skewed T 512, ncu's stall sampling by SASS line of
`int4_moe_hot_tc_4_16`, traces/gpu/session54/call1/ncu_tc_source.csv.gz): the consumers' samples
sit 29 % at the wait for a full stage (the branch after `SYNCS.PHASECHK.TRANS64.TRYWAIT`, three
pass widths), while the one producer thread is busy ~70 % of the kernel issuing the stage's 18
bulk copies (~25 uniform instructions a copy: 64-bit address arithmetic, the ELECT loop around
`UBLKCP`) and waits at the empty barrier for under 0.3 % of the samples: the ring runs dry
because one warp cannot issue a stage (~1.2 µs of issue) as fast as the wgmmas eat it (~1.1 µs
a 128-slot stage at tensor peak). Four warps sit on four SM sub-partitions, each with its own
issue slot and uniform datapath: warp pw copies the weights and scales of consumer warps 2 pw,
2 pw + 1 (TPW 4), warp 0 also the activations, and each arrives on the stage's full barrier
(TPW arrivals) with its own byte count.

What: cuda_v24's op, dispatch, tiles and kernel (`hot_tc_body<ST, NTC, PW>`, cuda_v24.cu) with
the knob TPW (1, 2 or 4 producer warps; TPW 1 is cuda_v24's kernel, SASS for SASS). The same
copies land in the same stages: cuda_v24's bits. GPU only (cupy, nvcc 12+ for sm_90a).
Dimension legend: cuda_v24's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v17, cuda_v24
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

TC_DEFAULTS = cuda_v24.TC_DEFAULTS | {"TPW": 4}
PRODUCER_WARPS = (1, 2, 4)  # divisors of the 8 consumer warps, within the producer warpgroup


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v24's tiles and TPW."""
    return cuda_v24.tiles(T, K, E, D, I, slots) | TC_DEFAULTS


def check_tc(c: dict, S: int, E: int) -> None:
    """cuda_v24's TC knob checks and TPW (names the cfg key)."""
    cuda_v24.check_tc(c, S, E)
    _require(c["TPW"] in PRODUCER_WARPS, "cfg['TPW']", "1, 2 or 4 (producer warps)", c["TPW"])


def launch_bands_tc(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                    h: Tensor, check=check_tc, **form) -> tuple:
    """cuda_v24's hot hook with the TC kernel of TPW producer warps; check and form (tyh, tlo):
    a later version's knob check and kernel form (cuda_v26's)."""
    return cuda_v24.launch_bands_tc(c, p, xq, w1, s1, NU1, C1, h, check=check,
                                    pw=c.get("TPW", TC_DEFAULTS["TPW"]), **form)


# the op and its CLI: cuda_v24's with TPW producer warps
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v24;base;TPW=2", hot_for=launch_bands_tc)


if __name__ == "__main__":
    raise SystemExit(_main())
