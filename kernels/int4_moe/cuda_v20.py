"""int4_moe cuda_v20: cuda_v19 with the main hot launch's unit on two warps (gate tile, up tile),
so one dequant a k16 step serves a 128-slot pass (cuda_v20.cu's `hot_gs_body`).

Why (cuda_v19's sm_90a build, session 46): a cuda_v19 warp holds both tiles' accumulators, 2 x
N / 2 fp32: its N 128 build spilled at 255 registers, so its passes stop at 64 slots, and its
K loop issues ~500 SASS a 4096-weight pair at N 64 (285 of them dequant): 7.9 a weight and
slot-pass of 64 against cuda_v10's 13.8 at 32 slots. One tile a warp (64 accumulators at N
128, 249-255 registers at one 8-warp CTA an SM, no local memory in the K loops) takes the K
loop to ~413 SASS a 2048-weight half pair at N 128: ~6.5 a weight and slot, and skewed T 128's
hottest experts (up to ~119 slots) in one pass each.

What: cuda_v19's op and dispatch with `launch_bands_gs` as the hot hook: at GS 1 (default) the
main hot launch (experts past WT, or past WB where cuda_v12's band runs) on cuda_v20.cu's
kernel at GS_DEFAULTS' form (knobs SU / SNT / SST / SMB, cuda_v10's WU / WNT / WST / WMB for
this launch: 4 units = 8 warps a CTA, 128-slot passes, 4 stages, one CTA an SM); cuda_v12's
band launch (9-16 slots, WNT 2) stays on cuda_v19.cu's kernel and knobs. GS 0: cuda_v19's
launches and bits. The cost this form pays: a CTA covers 64 weight
rows against its 128-slot activation stage (32 KB of activations to 12 KB of weights a stage,
read from L2 by each of the 32 CTA columns): whether L2 feeds that is the GPU's to say.
Numerics: cuda_v19's (the same A fragments and B; the wgmma's N differs): the reference's
tolerance. Graph-safe, load step, nvcc build: cuda_v19's. GPU only (cupy, nvcc). Dimension
legend: cuda_v1.cu's, cuda_v10.cu's, cuda_v19.cu's and cuda_v20.cu's.

Measured (session 46, traces/gpu/session46): the shared suites pass (H100); the hot launch
339.8 µs against cuda_v19's 286.1 and cuda_v18's 324.8 at skewed T 128 (H200, `--by-kernel`):
the activation side of the trade lost; the op within the rounds of cuda_v18 (H100). Not BEST.
"""

from __future__ import annotations

import functools
import os

from torch import Tensor

from . import cuda_v10, cuda_v17, cuda_v19
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

GS_DEFAULTS = {"GS": 1, "SU": 4, "SNT": 16, "SST": 4, "SMB": 1}
# read as cuda_v10's knobs by this launch ("S" for split; cuda_v8's KNOBS hold a "GU", which
# cuda_v10's op drops from cfg: session 46 call 3 found a G-named form silently at default)
GS_KEYS = {"SU": "WU", "SNT": "WNT", "SST": "WST", "SMB": "WMB"}
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v20.cu")
PREFIX = "int4_moe_hot_gs"


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v19's tiles with GS_DEFAULTS."""
    return cuda_v19.tiles(T, K, E, D, I, slots) | GS_DEFAULTS


def source(configs=()) -> str:
    """cuda_v19's source with cuda_v20.cu and a 64 WU-thread kernel a (WU, NT, ST, MB)."""
    return cuda_v19.source(configs, files=(_SRC,), body="hot_gs_body", threads_a_unit=64,
                           prefix=PREFIX)


@functools.cache
def _kernel_gs(kpad: int, wu: int, nt: int, st: int, mb: int):
    """cuda_v10's `_kernel` signature (KPAD unused: xp holds zeros past k_real; both
    KPAD values' wrappers are one CUfunction, whose shared-memory limit cuda_v1.opt_in keys by
    its handle)."""
    return cuda_v19.module(source(((wu, nt, st, mb),))).get_function(
        cuda_v19.kernel_name(wu, nt, st, mb, PREFIX))


def check_split_shape(c: dict) -> None:
    """cuda_v20.cu's CTA-shape knobs (SU / SNT / SST / SMB, read as WU / WNT / WST / WMB) in
    ranges it compiles and fits (names the cfg key)."""
    wu, nt, mb = c["WU"], c["WNT"], c.get("WMB", 1)
    _require(wu in (2, 4), "cfg['SU']", "2 or 4 with GS 1 (two warps a unit, whole warpgroups)",
             wu)
    _require(nt in (2, 4, 8, 16) and 8 * nt * 16 % (64 * wu) == 0, "cfg['SNT']",
             "2, 4, 8 or 16 with 128 SNT a multiple of 64 SU", {"SNT": nt, "SU": wu})
    _require(c["WST"] in range(2, 9), "cfg['SST']", "2 .. 8", c["WST"])
    _require(mb in range(1, 5) and wu * mb <= 4, "cfg['SMB']", "1 .. 4 with SU x SMB <= 4 "
             "(the 128-slot build needs ~250 registers a thread)", {"SMB": mb, "SU": wu})


def check_gs(c: dict, S: int, E: int, smem_pad: int = 0) -> None:
    """cuda_v10's `check_hot` (`launch_hot`'s check) with cuda_v20.cu's shape knobs and names."""
    cuda_v10.check_hot(c, S, E, smem_pad, shape=check_split_shape,
                       names={w: s for s, w in GS_KEYS.items()})


def launch_hot_gs(c: dict, p, xp: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                  h: Tensor) -> tuple:
    """cuda_v10's `launch_hot` on cuda_v20.cu's kernel (x = xp, ldx = KP, 2 warps a unit, the
    G* knobs as its W*); cuda_v12's band launch (WHI set) on cuda_v19.cu's."""
    if c.get("WHI") is not None:
        return cuda_v19.launch_hot_wg(c, p, xp, w1, s1, NU1, C1, h)
    c = c | {w: c[g] for g, w in GS_KEYS.items()}
    return cuda_v10.launch_hot(c, p, xp, w1, s1, NU1, C1, h, kernel=_kernel_gs,
                               smem_pad=cuda_v19.SMEM_PAD, warps_a_unit=2, check=check_gs)


def launch_bands_gs(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                    h: Tensor) -> tuple:
    """cuda_v4's `hot` hook: cuda_v19's (`launch_bands_wg`) with the main hot launch on
    cuda_v20.cu's kernel at GS 1."""
    gs = c.get("GS", 1)
    _require(gs in (0, 1), "cfg['GS']", "0 or 1", gs)
    return cuda_v19.launch_bands_wg(c, p, xq, w1, s1, NU1, C1, h,
                                    launch=launch_hot_gs if gs else None)


# the op and its CLI: cuda_v19's dispatch and tiles, the main hot launch two warps a unit
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v19;base", hot_for=launch_bands_gs)


if __name__ == "__main__":
    raise SystemExit(_main())
