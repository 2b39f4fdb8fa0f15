"""int4_moe cuda_v12: cuda_v11 with, where T K >= 8 E (T 512 on 384 experts), the hot experts
in two bands on the side stream: those of WT + 1 .. WB slots (9-16) on a hot launch of four
4-warp CTAs an SM on 16-slot passes (WBU 4 / WBNT 2 / WBST 3 / WBMB 4), those past WB on
cuda_v11's (two 8-warp CTAs an SM on 32-slot passes).

Why (H200, session 35 call 3, traces/gpu/session35, `python -m
workbench.kernels.int4_moe.cuda_v11 --T 512 --cfgs "base;WU=4,WNT=2,WST=3,WMB=4" --rounds 3`,
medians, graph-replayed µs): at uniform T 512 (~10.7 slots an expert, ~70 % of the experts at
9-16) cuda_v11's hot launch with every expert on four 4-warp CTAs an SM and 16-slot passes took
the op from 3569.2 to **3462.4** (every round under every base round); but 16-slot passes
re-stream an expert's weights every 16 slots, and skewed T 512 lost 7.6 % at WNT 2 (session 34
call 1). The slot count is known only on the device, so both launches go out and each takes
its band of experts (`int4_moe_hot`'s item list: more than ht and at most hi slots).

What: cuda_v10's kernels and bits (a hot expert's columns are the same mma sequence on either
launch: K in input order in one warp, whatever the CTA shape or n-tiles); the two hot launches
in turn on cuda_v11's high-priority side stream (the long passes first), the cold launch on
the current stream. Knobs (cfg): cuda_v11's, and WB (0: cuda_v11's one hot launch), WBU, WBNT,
WBST, WBMB (the band launch's WU, WNT, WST, WMB). Numerics, graph safety, load step:
cuda_v10's (not batch invariant). GPU only (cupy). Dimension legend: cuda_v1.cu's and
cuda_v10.cu's.
"""

from __future__ import annotations

from torch import Tensor

from . import cuda_v10, cuda_v11
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

BAND = {"WB": 16, "WBU": 4, "WBNT": 2, "WBST": 3, "WBMB": 4}  # T K >= 8 E: 9-16 slots apart
BAND_KEYS = {"WBU": "WU", "WBNT": "WNT", "WBST": "WST", "WBMB": "WMB"}


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v11's tiles, with BAND where T K >= 8 E (WB 0
    elsewhere: cuda_v11's launches)."""
    c = cuda_v11.tiles(T, K, E, D, I, slots)
    return c | (BAND if T * K >= 8 * E else {"WB": 0})


def band_knobs(c: dict) -> dict:
    """c with the band launch's knobs: WB* as cuda_v10's WU / WNT / WST / WMB (BAND's where c
    has none: a cfg WB at a T whose tiles have no band), WHI = WB."""
    return c | {k: c.get(b, BAND[b]) for b, k in BAND_KEYS.items()} | {"WHI": c["WB"]}


def launch_bands(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                 h: Tensor, *, launch=None) -> tuple:
    """cuda_v4's `hot` hook: at WB 0 cuda_v10's `launch_hot`; else two of its launches, the
    experts past WB slots on c's hot knobs, then those of WT + 1 .. WB on the band's (WB*),
    both on WS's stream; returns (the cold launch's SKIP, WT; a join of both). launch: a later
    version's hot launch (`launch_hot`'s signature: cuda_v19's wgmma pass)."""
    launch = launch or cuda_v10.launch_hot
    wb = c.get("WB", 0)
    if not wb or not c["WIDE"] or p.S <= c["WT"]:
        return launch(c, p, xq, w1, s1, NU1, C1, h)
    _require(isinstance(wb, int) and wb > c["WT"], "cfg['WB']",
             f"0 or an int > WT ({c['WT']})", wb)
    band = band_knobs(c)
    cuda_v10.check_hot(band, p.S, p.E)  # names the band's knobs before anything launches
    _, join_hot = launch(c | {"WT": wb}, p, xq, w1, s1, NU1, C1, h)
    _, join_band = launch(band, p, xq, w1, s1, NU1, C1, h)

    def join():
        for j in (join_hot, join_band):
            if j is not None:
                j()

    return c["WT"], join


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v10's op (contract, checks, launches) on this file's tiles and hot bands."""
    return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                  cfg=cfg, expected_slots=expected_slots, tiles_for=tiles,
                                  hot_for=launch_bands)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v12's op):

        python -m workbench.kernels.int4_moe.cuda_v12 [--T 128,512] [--skew 1.2]
            [--cfgs "v=cuda_v11;base;WB=0"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v11;v=triton_v34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
