"""int4_moe cuda_v13: cuda_v12 with the down GEMM in two launches, each queued behind the gate/up
launch of its experts: the hot experts' (more than WT slots) on the side stream after the hot
launches, the cold experts' on the current stream after the cold launch; the join moves from
before the down GEMM to before the combine.

Why (H200, session 35 call 4, traces/gpu/session35, `python -m
workbench.kernels.int4_moe.cuda_v12 --T 512 [--skew 1.2] --by-kernel`, eager µs of each kernel
beside the others): the down GEMM (`_gemm_kernel` 1220-1235 uniform, 1080 + 427 of
`_gemm_hot_kernel` skewed) waits for both gate/up launches, so the one that finishes first
leaves its SMs to the other's tail alone: uniform T 512 the cold launch ends at ~1780 µs, the
two hot ones at ~1880; skewed the hot ones at ~1330, the cold one at ~1805. A down launch
needs only its own experts' rows of h, so each stream's down GEMM can fill the SMs its gate/up
launch leaves while the other stream's gate/up still runs.

What: cuda_v12's kernels, tiles and bits: each expert's down tiles are the programs cuda_v12
runs for it (triton_v7's `_gemm_kernel` on the experts of at most WT slots, HOT = WT; the same
kernel on the rest, LO = WT, with triton_v16's hot launch past HOT where cuda_v12 makes one),
the partials y written by exactly one launch a slot, the combine triton_v3's. Where no hot
launch is made (T K <= WT, WIDE 0) or DS is 0, cuda_v12's launches. Knobs (cfg): cuda_v12's
and DS (1: the split; 2: the split with the hot experts' down on a third stream of the
current stream's priority, forked behind the hot launches, so it takes only the SMs the cold
launch leaves, where DS 1's side stream outranks the cold launch; 0: cuda_v12's one down
launch after the join).
Numerics, graph safety (y allocated before the fork, used on both streams, freed after the
join), load step: cuda_v12's (not batch invariant). GPU only (cupy). Dimension legend:
cuda_v1.cu's, cuda_v10.cu's and triton_v16's.
"""

from __future__ import annotations

from torch import Tensor

from workbench.streams import Side

from . import cuda_v4, cuda_v10, cuda_v12
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)
from .triton_v7 import combine_partials, down_gemm, down_partials, grid_gemm
from .triton_v16 import hot_launch, hot_mode

SPLIT = {"DS": 1}  # the down GEMM behind each stream's gate/up launch
DOWN_KEY = "int4_moe_down"  # DS 2's stream (workbench.streams.Side)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v12's tiles and SPLIT."""
    return cuda_v12.tiles(T, K, E, D, I, slots) | SPLIT


def gemm_cold(wt: int):
    """The down launch hook (triton_v7's `gemm` signature) of the experts of at most wt slots:
    `_gemm_kernel` with HOT = wt (cuda_v12's programs for them)."""

    def gemm(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
        grid_gemm(n, c, r, NT, args, dict(kw, HOT=wt))

    return gemm


def gemm_hot(wt: int):
    """The down launch hook of the experts past wt slots: `_gemm_kernel` with LO = wt (and HOT
    = c's, with triton_v16's hot launch past it, where `hot_mode` makes one: cuda_v12's
    programs for them)."""

    def gemm(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
        if hot_mode(c, r.bad.shape[0]):
            _require(wt < c["HOT"], "cfg['WT']", f"below HOT ({c['HOT']}): the down GEMM's hot "
                     "launch takes the experts past HOT", wt)
            grid_gemm(n, c, r, NT, args, dict(kw, HOT=c["HOT"], LO=wt))
            hot_launch(n, c, r, args, kw)
        else:
            grid_gemm(n, c, r, NT, args, dict(kw, LO=wt))

    return gemm


class SplitJoin:
    """cuda_v4's join (called: the current stream waits for the side stream) with the down
    partials y, allocated before the fork."""

    def __init__(self, join, y: Tensor):
        self.join, self.y = join, y

    def __call__(self) -> None:
        self.join()


def launch_split(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                 h: Tensor) -> tuple:
    """cuda_v4's `hot` hook: y, then cuda_v12's hot launches (`launch_bands`); returns (SKIP,
    a `SplitJoin`), or cuda_v12's (SKIP, join) where no hot launch is made or DS is 0."""
    ds = c.get("DS", 0)
    _require(ds in (0, 1, 2), "cfg['DS']", "0, 1 or 2", ds)
    if not ds:
        return cuda_v12.launch_bands(c, p, xq, w1, s1, NU1, C1, h)
    return bands_with_partials(c, p, xq, w1, s1, NU1, C1, h)


def bands_with_partials(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                        h: Tensor, *, launch=None) -> tuple:
    """y (`down_partials`), then the hot launches (launch: cuda_v12's bands, `launch_hot`'s
    signature) -> (SKIP, a `SplitJoin` carrying y), or (SKIP, None) where none is made: for a
    tail that queues down work on the hot launches' stream (cuda_v13, cuda_v22's HS 2)."""
    # allocated before the fork: the side stream never gets a block that a launch queued on
    # the current stream after the fork (the cold one's temporaries) may still use
    y = down_partials(p)
    skip, join = (launch or cuda_v12.launch_bands)(c, p, xq, w1, s1, NU1, C1, h)
    return skip, (join if join is None else SplitJoin(join, y))


def tail_split(p, h: Tensor, join, topk_ids: Tensor, topk_weights: Tensor, experts) -> Tensor:
    """cuda_v4's `tail`: with a `SplitJoin`, the down GEMM of the experts past WT slots on the
    hot launches' stream (queued behind them), that of the others on the current stream
    (behind the cold launch), the join, the combine; else cuda_v4's default tail."""
    if not isinstance(join, SplitJoin):
        return cuda_v4.down_tail(p, h, join, topk_ids, topk_weights, experts)
    c, y, ds = p.c, join.y, experts[5]
    on = bool(c.get("WS", 0))
    hot = Side(h.device, on, key=cuda_v10.SIDE_KEY, priority=-100)
    down = hot
    if c["DS"] == 2:  # the hot experts' down on a stream of the current one's priority
        down = Side(h.device, on, key=DOWN_KEY, priority=0)
        if down.stream is not None:
            down.stream.wait_stream(hot.stream)  # behind the hot launches
    down.run(lambda: down_gemm(p, h, y, ds, gemm_hot(c["WT"]), True, {}))
    down_gemm(p, h, y, ds, gemm_cold(c["WT"]), True, {})
    join()
    if down is not hot:
        down.join()
    return combine_partials(p, y, topk_ids, topk_weights, {})


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v10's op (contract, checks, launches) on this file's tiles, cuda_v12's hot bands
    and the split down GEMM."""
    return cuda_v10.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                  cfg=cfg, expected_slots=expected_slots, tiles_for=tiles,
                                  hot_for=launch_split, tail_for=tail_split)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v13's op):

        python -m workbench.kernels.int4_moe.cuda_v13 [--T 128,512] [--skew 1.2]
            [--cfgs "v=cuda_v12;base;DS=0"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v12;base")


if __name__ == "__main__":
    raise SystemExit(_main())
