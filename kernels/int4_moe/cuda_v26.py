"""int4_moe cuda_v26: cuda_v25 with the TC launch on half its CTA columns past TYH items a column,
and the TC launch only from TC_SLOTS slots a call (TC 0 below: cuda_v21's launches and bits).

Why (session 54, H100 80GB, in process, medians of 2-3, `python3 -m
workbench.kernels.int4_moe.cuda_v25 --T ... [--skew 1.2] --cfgs "v=cuda_v21;base;TY=4;TC=0"`,
traces/gpu/session54/call4-5):
- The TC launch's CTAs hold a whole SM each (384 threads x 168 registers), and it starts first
  on its side stream: at 8 columns (TY 0 at Kimi's 16 row blocks: 128 SMs) the cold gate/up
  launch beside it waits for SMs while the TC launch keeps DRAM at ~52 % (ncu, call 2). On 4
  columns the cold launch streams beside it: skewed T 512 3391.1 against 3477.2 µs (51 items,
  6.4 a column at 8), T 128 1920.9 against 1930.6. Where the TC launch has little work the
  halving only lengthens it: uniform T 512 (~15 items, 2 a column) 3551.2 against 3502.8. The
  kernel counts its items (hot_items) before it starts, so it picks the columns itself: half of
  the launch's past TYH (3) items a column, the other CTAs exit at once.
- Below 512 slots the TC launch has at most a few experts of one short pass each, where
  cuda_v10's hot launch is as fast or faster: skewed T 9 364.9 against TC 0's 361.9 µs (cuda_v21
  361.2), T 33 863.0 against 859.7 (859.8); the REAL bench (call 3) had cuda_v25 1-2 % behind
  cuda_v21 at skewed T 9 / 17 and 2 % ahead from T 65 (520 slots).

What: cuda_v25's op and kernel (`hot_tc_body<ST, NTC, PW, TYH>`, cuda_v24.cu) with TYH (0:
cuda_v25's columns), and tiles with TC = 1 from TC_SLOTS slots (T K, or the hint). The same
items on fewer columns are the same sums: cuda_v25's bits (TC 1), cuda_v21's (TC 0). TLO (0,
the measured default): the experts of WB (WT) + 1 .. TLO slots on cuda_v10's hot launch at the
hot knobs (cuda_v21's bits for them), the TC launch past TLO only -- a knob for the next
measurement (uniform T 512's ~15 experts of 17-25 slots ran 1 % slower on the TC launch's N-32
passes than on cuda_v21's hot launch, session 54 call 6), not a measured choice. GPU only
(cupy, nvcc 12+ for sm_90a). Dimension legend: cuda_v24's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v17, cuda_v25
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

TC_SLOTS = 512  # the TC launch from this many slots a call (T K, or the hint)
TYH = 3  # items a column past which half the TC launch's columns run


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v25's tiles with TYH, TLO 0, and TC 0 below TC_SLOTS
    slots."""
    S = T * K if slots is None else slots
    return cuda_v25.tiles(T, K, E, D, I, slots) | {"TYH": TYH, "TLO": 0,
                                                   "TC": int(S >= TC_SLOTS)}


def check_tc(c: dict, S: int, E: int) -> None:
    """cuda_v25's TC knob checks, TYH and TLO (names the cfg key)."""
    cuda_v25.check_tc(c, S, E)
    _require(isinstance(c["TYH"], int) and 0 <= c["TYH"] < 2**10, "cfg['TYH']",
             "an int in [0, 1024) (0: every column runs)", c["TYH"])
    lo = c.get("WB") or c["WT"]
    _require(c["TLO"] == 0 or (isinstance(c["TLO"], int) and c["TLO"] > lo), "cfg['TLO']",
             f"0 or an int > WB / WT ({lo}): the middle tier's top slot count", c["TLO"])


def launch_bands_tc(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                    h: Tensor) -> tuple:
    """cuda_v25's hot hook with TYH and TLO."""
    return cuda_v25.launch_bands_tc(c, p, xq, w1, s1, NU1, C1, h, check=check_tc,
                                    tyh=c.get("TYH", 0), tlo=c.get("TLO", 0))


# the op and its CLI: cuda_v25's with TYH and the TC rule
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v25;base;TYH=0", hot_for=launch_bands_tc)


if __name__ == "__main__":
    raise SystemExit(_main())
