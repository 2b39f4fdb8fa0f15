"""drafter triton_v5: triton_v4's step (its projections) with the attention split into
one-tile parts and merged by a combine that loads every part at once.

Why (H200, session 58 call 1, the EP8 emulation's C 1 DDTree-16 glue table): the
tensor-parallel drafter's attention holds one kv head a rank (G 8 query heads x S 8 block rows
= 64 rows), so triton_v1's split rule (~2 programs an SM, never a split shorter than 4 key
tiles, tuned where the whole drafter's 8 kv heads share the launch) gives 8 programs of 4
tiles on the sliding layers (window 2048) and 16 on the full one (P 4096): 132 SMs mostly
idle while each walks its 4 tiles, 9.8 µs a layer for `_attn_split_kernel`. The combine then
merged its 8-16 parts one after the other, a load latency each: 4.9 µs a layer. With one-tile
parts (min_tiles 1) the splits are 32 / 64 programs of one tile each; their partials (64 rows
x 128 fp32 a part: 1 MB at 64 parts) are merged by `_attention.combine_tiles`' one-load
combine ([parts, rows, d] in one load, one max and two sums over the parts). Expected ~6 µs
a layer less; `scripts/sweep_drafter_attention.py` times each (min_tiles, combine) pair.

Numerics: the same flash update per tile; the merge sums the parts in another order (tree
reduction over the parts), so rows differ from triton_v4's by fp32 summation order: the
drafter's tolerance, not bitwise.
Legend: B batch, S block rows, Hkv kv heads, G query heads a kv head, d head_dim.
"""

from __future__ import annotations

from .triton_v2 import on_proj
from .triton_v4 import proj

MIN_TILES = 1  # the shortest attention split, key tiles (triton_v1-v4: 4)
ONE_LOAD = True  # the combine loads every split at once (triton_v1-v4: one after the other)

# the registry's entry points: triton_v4's projections, these attention options
draft_topk_triton, block_hidden = on_proj(proj, min_tiles=MIN_TILES, one_load=ONE_LOAD)
