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

How: `parts` gives NP copies of topk_ids in one launch, each with the other parts' slots set
to -1 (not routed here: the op's contract); the repacked gate / up weights are fetched on the
current stream before the fork (`cuda_v1.repacked_gate_up`: the first call's repack must be
queued before a side stream waits); `workbench.streams.Side` under this module's keys (its own
streams: the model's shared-expert fork may be running beside the whole op) forks, runs parts
1.. NP-1 on side streams, and joins before the adds, recording the inputs on the side streams
and their outputs on the current one. Knobs (cfg, taken out before cuda_v5 sees it): NP
(parts, default 2) and PH (1: each part's call hinted with its T K / NP slots).

Numerics: each part's combine sums its K / NP slots in slot order in fp32 and rounds to bf16;
each add rounds once more (the reference sums all K in fp32 and rounds once): within the op's
bf16 tolerance, deterministic. Everywhere else (more than one token, a hint, K < 2) it is
cuda_v5, launch for launch.

Measured (H200, session 28 call 1, traces/gpu/session28): GPU tests 21 passed; T 1 on 384
experts **77.7 µs against cuda_v5's 72.7** (four parts 86.2, hinted halves 83.3, hinted fours
90.6): a measured negative. One wave of gate/up CTAs (128 registers, 16 warps an SM) already
holds every SM, so a second chain's CTAs wait for the first's to leave (each half's gate/up
took 27.0 µs for 4 experts, cuda_v5's 38.1 for 8), and the parts' masks and adds cost more.
Dimension legend: cuda_v1.cu's (CUDA) and triton_v16's (Triton).
"""

from __future__ import annotations

import torch
from torch import Tensor

from workbench.streams import Side

from . import cuda_v1, cuda_v5
from ._common import _require
from .cuda_v4 import REPACKED, h_column  # noqa: F401  (the load step reads REPACKED)

SPLIT_T = 1  # tokens up to which a call is split (decode)
# this op's own side streams: the model's shared-expert fork (key "model") may run beside the op
SIDE_KEY = "int4_moe"
# cuda_v7's own knobs, taken out of cfg before cuda_v5 sees it: NP the number of concurrent
# parts (2 = halves), PH 1 = each part's call hinted with its own slot count (cuda_v4's tiles
# for K / NP experts: smaller grids that fill one wave together) instead of cuda_v5's
# unhinted tiles for all K (each part's grid a wave, its other parts' CTAs exiting at once)
KNOBS = {"NP": 2, "PH": 0}
_MASKS: dict = {}  # (device, K, n) -> bool [n, 1, K]: slot k not in part i


def split_here(topk_ids: Tensor, expected_slots: int | None, n: int = 2) -> bool:
    """The rule (shapes only, graph-safe): one token's call without an EP hint, K >= n."""
    T, K = topk_ids.shape
    return expected_slots is None and 1 <= T <= SPLIT_T and K >= n >= 2


def _not_in_part(device, K: int, n: int) -> Tensor:
    """bool [n, 1, K]: True where slot k is not in part i (part i = slots K i / n .. K (i+1)
    / n). Cached outside graph capture only: a tensor made while capturing lives in the
    graph's pool."""
    key = (torch.device(device), K, n)
    m = _MASKS.get(key)
    if m is None:
        k = torch.arange(K, device=device)
        m = ((k + 1) * n - 1) // K  # the part holding slot k: the i with K i // n <= k < K (i + 1) // n
        m = m[None, None, :] != torch.arange(n, device=device)[:, None, None]
        if not (m.is_cuda and torch.cuda.is_current_stream_capturing()):
            _MASKS[key] = m
    return m


def parts(topk_ids: Tensor, n: int) -> Tensor:
    """[n, T, K]: part i is topk_ids with every slot outside K i / n .. K (i + 1) / n set to -1
    (not routed here: the op's contract), each a valid topk_ids of the op; one launch."""
    K = topk_ids.shape[1]
    return topk_ids.unsqueeze(0).masked_fill(_not_in_part(topk_ids.device, K, n), -1)


def halves(topk_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(ids with slots K / 2.. set to -1, ids with slots ..K / 2 set to -1): `parts` at 2."""
    a, b = parts(topk_ids, 2)
    return a, b


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """cuda_v5's op (its contract and checks); a one-token call without a hint as NP
    concurrent parts of the token's experts (module docstring)."""
    op = cuda_v5.int4_moe_cuda
    cfg = dict(cfg or {})
    knobs = {k: cfg.pop(k, v) for k, v in KNOBS.items()}
    n = knobs["NP"]
    _require(isinstance(n, int) and n >= 2, "cfg['NP']", "an int >= 2 (concurrent parts)", n)
    kw = dict(validate=validate, cfg=cfg or None, expected_slots=expected_slots)
    if x.device.type != "cuda" or not split_here(topk_ids, expected_slots, n):
        return op(x, topk_ids, topk_weights, experts, **kw)
    T, K = topk_ids.shape
    if knobs["PH"]:
        kw["expected_slots"] = max(1, T * K // n)
    cuda_v1.repacked_gate_up(experts)  # a first call's repack queued before the fork
    ids = parts(topk_ids, n)
    sides = [Side(x.device, True, key=f"{SIDE_KEY}{i or ''}") for i in range(n - 1)]
    outs = []
    for i, side in enumerate(sides, 1):
        side.fork(x, ids, topk_weights)
        outs.append(side.run(lambda i=i: op(x, ids[i], topk_weights, experts, **kw)))
    out = op(x, ids[0], topk_weights, experts, **kw)
    for side, o in zip(sides, outs):
        side.join(o)
        out = out + o
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v7's launcher):

        python -m workbench.kernels.int4_moe.cuda_v7 [--T 1] [--cfgs "v=cuda_v5;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v5;base")


if __name__ == "__main__":
    raise SystemExit(_main())
