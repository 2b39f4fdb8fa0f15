"""int4_moe cuda_v7: cuda_v5 with a decode call (one token, no EP hint) run as two concurrent
halves: the token's first K / 2 routed experts on the current stream and the other K / 2 on a
side stream forked from it, each half cuda_v5's four launches, their outputs added.

Why (H200, session 27 calls 3-5, traces/gpu/session27): T 1 on 384 experts takes 73.7 µs
(the #6 bar: 60) as routing 2.8 + gate/up 38.0 (85 % of copy) + down 25.0 (64 %) + combine 1.8
+ ~6 µs between the launches. The four launches are a chain: each GEMM's ramp and tail and
each gap stand alone, and no knob moved the down GEMM. A token's experts are independent, so
two chains over disjoint halves of its experts can overlap in the CUDA graph (a fork / join of
streams, as the model's shared expert does): one half's ramps and gaps under the other half's
weight stream, the same bytes in all. Each half's grid is cuda_v5's for T 1 (one wave for 8
experts), so the two halves' CTAs together fill one wave.

How: `halves` gives two copies of topk_ids with the other half's slots set to -1 (not routed
here: the op's contract); the repacked gate / up weights are fetched on the current stream
before the fork (`cuda_v1.repacked_gate_up`: the first call's repack must be queued before the
side stream waits); `workbench.streams.Side` under this module's key (its own stream: the
model's shared-expert fork may be running beside the whole op) forks, runs the second half,
and joins before the add, recording the inputs on the side stream and its output on the
current one.

Numerics: each half's combine sums its K / 2 slots in slot order in fp32 and rounds to bf16;
the add rounds once more (the reference sums all K in fp32 and rounds once): within the op's
bf16 tolerance, deterministic. Everywhere else (more than one token, a hint, K < 2) it is
cuda_v5, launch for launch.

**Not yet measured on the H200** (session 27 had no device time left): CPU-tested (the split
of the ids, the dispatch rule), its GPU tests (EDGE, REAL, an EP8 rank, graph replay == eager)
parametrized beside the other CUDA versions, for the next device call:
`python3 -m workbench.kernels.int4_moe.cuda_v7 --T 1 --cfgs "v=cuda_v5;base" --rounds 3`.
Dimension legend: cuda_v1.cu's (CUDA) and triton_v16's (Triton).
"""

from __future__ import annotations

from torch import Tensor

from workbench.streams import Side

from . import cuda_v1, cuda_v5
from .cuda_v4 import REPACKED, h_column  # noqa: F401  (the load step reads REPACKED)

SPLIT_T = 1  # tokens up to which a call is split in two (decode)
# this op's own side stream: the model's shared-expert fork (key "model") may run beside the op
SIDE_KEY = "int4_moe"


def split_here(topk_ids: Tensor, expected_slots: int | None) -> bool:
    """The rule (shapes only, graph-safe): one token's call without an EP hint, K >= 2."""
    T, K = topk_ids.shape
    return expected_slots is None and 1 <= T <= SPLIT_T and K >= 2


def halves(topk_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(ids with slots K / 2.. set to -1, ids with slots ..K / 2 set to -1): the two halves'
    routing, each a valid topk_ids of the op (-1: not routed here)."""
    h = topk_ids.shape[1] // 2
    a, b = topk_ids.clone(), topk_ids.clone()
    a[:, h:] = -1
    b[:, :h] = -1
    return a, b


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v5's op (its contract and checks); a one-token call without a hint as two
    concurrent halves of the token's experts (module docstring)."""
    op = cuda_v5.int4_moe_cuda
    kw = dict(validate=validate, cfg=cfg, expected_slots=expected_slots)
    if x.device.type != "cuda" or not split_here(topk_ids, expected_slots):
        return op(x, topk_ids, topk_weights, experts, **kw)
    cuda_v1.repacked_gate_up(experts)  # a first call's repack queued before the fork
    ids_a, ids_b = halves(topk_ids)
    side = Side(x.device, True, key=SIDE_KEY)
    side.fork(x, ids_b, topk_weights)
    out_b = side.run(lambda: op(x, ids_b, topk_weights, experts, **kw))
    out_a = op(x, ids_a, topk_weights, experts, **kw)
    side.join(out_b)
    return out_a + out_b


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v7's launcher):

        python -m workbench.kernels.int4_moe.cuda_v7 [--T 1] [--cfgs "v=cuda_v5;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v5;base")


if __name__ == "__main__":
    raise SystemExit(_main())
