"""drafter triton_v6: triton_v5 with at most 32 attention splits, and the vocab-parallel
head's shard top-k in Triton (`_shard_topk.shard_topk`, kernels/drafter HEAD_TOPK).

Why (H100, session 59 call 1, traces/gpu/session59):
- `scripts/sweep_drafter_attention.py` at the TP8 rank (one kv head, 64 query rows, d 128),
  µs at B 1: v5's one-tile splits win on the sliding layers (2047 keys, 32 splits: 8.45 against
  v2's 15.08) but lose on the full one (4096 keys, 64 splits: 16.22): 64 parts leave the
  one-load combine one row a program; 32 two-tile splits take 9.18 there. Capped at 32, a
  draft's attention is ~51 µs (5 x 8.45 + 9.18) against v5's 58.5 and v2's 94.3. At B 8 the cap
  changes nothing (33 -> 32 splits: 14.87 vs 14.65).
- the EP8 step's op-kernel table: the head's "(draft head top-k)" took 152 µs at C 1 (213 at
  C 8), mostly torch.topk's radix select on `stable_topk`'s int64 keys (8 digit passes x 3
  launches) and the keys' elementwise building, then a stable torch.sort of the ranks'
  candidates; `shard_topk` keeps the keys in registers, two launches, the same bits
  (`tests/test_drafter_kernel.py`), and merges the candidates too (`dist_topk_logprobs`).
Measured (H100, session 60 call 1, traces/gpu/session60, EP8 16-layer step, ABAB against v5):
the draft's kernels 0.604-0.607 ms against 0.696-0.698 at C 1 DDTree-16 (-13 %), 0.720 against
0.848-0.853 at C 8; the head's top-k range 64 µs against v2's 152. But the C 1 graph replay
was 0.07-0.16 ms LONGER (its idle between kernels 0.40-0.46 ms against 0.22-0.24), not yet
explained: the engine preset keeps v5 until the idle columns (`loopbench.idle_gaps`) say why.
The one-GPU drafter (`draft_topk_triton`) keeps v2's fused LM head + top-k; only the
vocab-parallel head (workbench/dist/vocab.py) takes the shard top-k.

Numerics: v5's (the splits' partition moves at the full layer: another fp32 merge order);
the head's top-k bit for bit stable_topk's.
Legend: B batch, S block rows, Hkv kv heads, d head_dim, k candidates a row.
"""

from __future__ import annotations

from .triton_v2 import on_proj
from .triton_v4 import proj
from .triton_v5 import MIN_TILES, ONE_LOAD

MAX_SPLITS = 32  # the most attention splits (v5: no cap)

# the registry's entry points: triton_v4's projections, v5's attention options capped
draft_topk_triton, block_hidden = on_proj(proj, min_tiles=MIN_TILES, one_load=ONE_LOAD,
                                          max_splits=MAX_SPLITS)
