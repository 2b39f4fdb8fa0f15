"""int4_moe cuda_v2: cuda_v1's kernels with the scales applied to each group's fp32 partial
instead of to the weights (`cuda_v1.cu`'s POST = 1).

Why (the sm_90 SASS of cuda_v1's K loop, `python -m workbench.kernels.int4_moe.cuda_sass`):
2.34 instructions a weight at gate/up, 1.875 of them the exact bf16 dequant (a lop3, a sub
and a mul a weight pair, a shift every 8 weights). Here the mma takes the stored nibble as it
comes out of the lop3, 128 + q' (q' = q + 8: exact in bf16), and a group's two mma steps
start from -136 sum(x) over the group's inputs (two more mmas with a constant A = -136, shared
by both tiles of the warp), so the group's fp32 partial is sum_k (q_k - 8) x_k; one fp32 fma
per accumulator then applies the group's scale. Expected ~1.8 a weight.

Numerics: W = (q - 8) s exactly in fp32 (the product of a 4-bit integer and an 8-bit
significand), not rounded to bf16 as the reference rounds it (reference/int4.py): a weight
differs from the reference's by at most half a bf16 ulp, every output by the reference's own
rounding of W; the partial's cancellation (136 sum(x) against sum(128 + q') x in the tensor
core's fp32) costs ~7 of its 24 bits. Tolerance against the reference, as cuda_v1.
Dimension legend: cuda_v1.cu's.
"""

from __future__ import annotations

from torch import Tensor

from .cuda_v1 import REPACKED, launch, tiles  # noqa: F401  (tiles: the same rule)


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v1's contract and launches, the scales on the groups' fp32 partials."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, post=1)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v2's launcher):

        python -m workbench.kernels.int4_moe.cuda_v2 [--ep 8] [--T 1,9,17] [--cfgs "v=34;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
