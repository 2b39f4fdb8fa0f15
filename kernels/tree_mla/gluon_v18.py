"""tree_mla gluon_v18: gluon_v13's attention kernel (the seesaw, with the partition barriers)
under triton_v7's split policy by head count, merged by triton_v17's one-round combine.

Why (H200, session 15, call 4, `scripts/sweep_tree_mla_policy.py --version gluon_v13_c8`): at 8
heads gluon_v13's attention under v7's 128-key parts is 10.1 / 12.3 / 22.5 µs at N 1 / 17 / 33
P 4096 (v4's parts: 18.4 / 20.6 / 20.8), and 10.4 / 23.8 µs at N 1 / 17 P 8192 (19.5 /
21.2): what is left between that and the busy time is the merge of up to 65 parts (v8's
merge: 8.4 µs at N 1 P 4096, 18.3 at N 17). triton_v17's merge reads every part in one load
round. At 32 heads or more the policy and the merge are gluon_v13's (v4's): there gluon_v18 is
gluon_v13.

A row's partition is fixed by its request's P and the model's heads (v7), the merge tree by
constexprs: batch invariant, not gluon_v13's bits below 32 heads (another partition and merge).
sm_90 only (Gluon); the merge is the Triton kernel triton_v17 runs on the CPU interpreter.
Legend: _common.py.
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch
from .triton_v7 import policy_of
from .triton_v17 import combine_for


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); triton_v7's policy, triton_v17's merge (below 32 heads; gluon_v13 at
    32 or more). No host sync unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_of(q), publish=True,
                   combine=combine_for(q.shape[2] if q.dim() == 4 else 0))
