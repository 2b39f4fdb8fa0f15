"""int4_moe triton_v14: v13 with every launch after the router's a programmatic dependent
launch (PDL) of the one before it: permute, gate/up GEMM, SiLU, down GEMM and combine each open
with `griddepcontrol.wait` and then `griddepcontrol.launch_dependents` (`_common.pdl_start`),
and are launched with the `launch_pdl` attribute.

Why (H200, session 14, traces/gpu/session14/README.md): at T = 1 (decode on all 384 experts,
the loop's most frequent MoE call) v13 takes 83.4 µs, of which the two GEMMs are ~70 (ncu:
44.1 + 30.3 µs under the profiler) and the rest four small launches and the gaps between six
kernels (session 11, `--by-kernel`: route 2.8, permute 1.3, SiLU 2.4, combine 3.1 µs).
Ablating the dequant leaves 73.6 µs and deeper TMA pipelines are slower (84.8 / 87.8 µs at 4 /
5 stages): the time outside the weight stream is structural. With PDL a launch's CTAs are
resident and past their prologue when its predecessor's last CTA retires, instead of being
launched then; the GEMMs' partial last waves overlap the next launch's start.

Safety: each dependent waits (griddepcontrol.wait) before it reads anything, for the
completion and memory flush of the launch before it, which itself waited for its own
predecessor: the chain orders every launch of the op as the stream did. The router stays an
ordinary launch (it orders the op after the previous op's kernels). Under the interpreter
nothing changes (no griddepcontrol there): v14 on CPU is v13.

Outputs: v13's arithmetic and launches, only their start times move, so v13's bits
(`test_pdl_versions_bitwise_v13_gpu`, passed on the H200 in session 15).
Measured (session 15, README.md "v14 and v15"): 10 µs slower than v13 at T 1 (93.5 vs 83.2
µs graph-replayed), within ~1 % of it from T 9: a dependent's CTAs start early but wait before
their first load, so the weight stream starts no sooner. Kept as a measured negative.

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, D hidden, I expert FFN width).
"""

from __future__ import annotations

from torch import Tensor

from .triton_v11 import launch_hinted
from .triton_v13 import tiles


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (v13's tiles and splits);
    cfg: tile overrides (keys of `tiles`), for sweeps and tests."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, pdl=True)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v14's launcher):

        python -m workbench.kernels.int4_moe.triton_v14 [--T 1,9,33] [--by-kernel]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base", pdl=True)


if __name__ == "__main__":
    raise SystemExit(_main())
