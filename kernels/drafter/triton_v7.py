"""drafter triton_v7: triton_v6 with the whole vocab-parallel head in Triton
(`_head_v7.dist_head`, kernels/drafter HEAD): four launches around the head's two collectives.

Why (H100, session 60 call 1, traces/gpu/session60, v6's op-kernel table at the EP8 16-layer
step, C 1 DDTree-16): the "(draft head top-k)" range took 64 µs in ~25 launches, of which v6's
shard top-k was 23 µs in 4. The rest is torch's plumbing around it, ~1.5-3.6 µs a launch: the
shard's max and exp-sum, the global max and log of the exp-sum from the gathered stats, the
candidates' casts and stacking, the final merge's cast, fill, gather and cast. Here: the stats
in one online pass, the global constants inside the chunk and candidate kernels (w pairs a
program), the candidates written in the all-gather's layout, the final merge one launch.
Expected: the range ~30 µs (4 launches + the collectives' stand-ins), ~20 fewer launches a
draft. Not yet timed on a GPU: plan `session60_a` runs it beside v5 / v6.

Numerics: the body is v6's; the head's log-softmax constants are Triton's (online max / sum,
`tl.exp`), so its log-probs are within a few fp32 ulps of the reference head's, the same ids
wherever no two log-probs sit that close (equal logits stay equal). The drafter only proposes:
DDTree's tokens are the target's whatever the draft (the exact suite's AR == DDTree).
The one-GPU drafter (`draft_topk_triton`) is v6's (v2's fused LM head + top-k).
Legend: B batch, L draft depth, k candidates a row, w ranks.
"""

from __future__ import annotations

from .triton_v6 import block_hidden, draft_topk_triton  # noqa: F401  (the registry's entries)
