"""int4_moe triton_v34: v33's twice-split gate/up GEMM only where the op's hint sizes the grid
(`expected_slots` given: an expert-parallel rank, whose active-expert count varies draw by
draw); without a hint (T tokens over all E experts) v32's tiles.

Why (H200, session 23 calls 7-8, traces/gpu/session23/README.md): the split won on an EP8 rank at
hints 8-9 (the C 8 decode and the C 1 budget-8 verify: the step 0.21 / 0.14 ms faster) and lost
at T 1 on 384 experts (80.8 vs 78.4 µs). A hypothesis for the difference (not profiled): on all
384 experts T 1 always holds 8 experts, 512 programs unsplit, one full wave of four CTAs an SM
(97 % of the slots) that the split turns into 1.94 waves; on a rank the draw holds ~5-12
experts (320-770 programs unsplit: 0.6-1.5 waves, most draws with idle slots or a thin last
wave), where twice the shorter programs fill the waves better.

**Prepared, compile-checked and CPU-tested only: not yet run on a GPU** (session 23 ran out of
device time). `scripts/gpu_plans/session24_a.tsv` measures it.
Numerics: v33's on hinted calls, v32's bits without a hint.
Dimension legend: v16's.
"""

from __future__ import annotations

from torch import Tensor

from .triton_v29 import launch_v29
from .triton_v32 import tiles as _tiles_v32
from .triton_v33 import tiles as _tiles_v33


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v33's tiles where a hint (slots) is given, v32's without. Shapes only."""
    return (_tiles_v32 if slots is None else _tiles_v33)(T, K, E, D, I, slots)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """v32's contract and launches on v34's tiles; cfg: tile overrides (keys of `tiles`)."""
    return launch_v29(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, tiles)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v34's launcher):

        python -m workbench.kernels.int4_moe.triton_v34 [--ep 8] [--T 1,8,9]
            [--cfgs "v=32;v=33;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=32;v=33;base")


if __name__ == "__main__":
    raise SystemExit(_main())
