"""tree_mla gluon_v25: gluon_v19 (the seesaw with the reciprocal epilogue) under gluon_v11_long's
split policy: past P = 2048 at 32 heads or more, prefix splits of at least 1024 keys (at most 8)
instead of v4's at least 512 (at most 32).

Why (H200, session 14 calls 2-3, traces/gpu/session14/README.md, graph-replayed µs, gluon_v13
against gluon_v13_long, the same kernel under the two policies): at 64 heads past P = 2048 the
long splits were 12-21 % faster wherever the verify has 9 rows or more (N 9 / 17 / 33 / 65 / 129
at P 8192: 55.6 / 92.5 / 138.0 / 228.7 / 436.7 against 44.9 / 81.7 / 109.6 / 189.1 / 353.9; B 8
N 17 P 4096 247.4 against 213.9), because v4's parts cost a large verify their fp32 partials
(N 129 x P 8192: 17 parts of [8256, 512] fp32 written and re-read, 287 MB) and past one wave of
programs a second, partial wave. They were slower where the launch has few row blocks (N 1 P
8192 31.8 against 42.7, B 1 N 9 P 4096 31.3 against 42.0): half the programs, under one wave
either way. gluon_v19 (BEST since session 17) took v13's policy with the reciprocal epilogue;
this version is the same kernel under the long policy, so that the two can be measured side by
side (the REAL table's largest shape, N 129 H 64 P 8192, is 426.8 µs = 44 % of the ceiling under
gluon_v19; #7's bar is 60 %).

Numerics: gluon_v19's kernel and combine; the policy depends on P and the head count only (a
model constant per rank), so a row's bits never depend on how many rows share the launch (batch
invariance by P, as gluon_v19). Below 32 heads it is gluon_v19 call for call.
Legend: _common.py.
"""

from __future__ import annotations

import torch

from .gluon_v11 import _launch, policy_long


def tree_mla_gluon(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
                   anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int, *,
                   validate: bool = False):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W] int64
    -> (o_lat [B, N, H, C] q.dtype, lse [B, N, H] fp32), as reference.tree_mla (gluon_v9's
    inputs and errors); gluon_v19's kernel under `gluon_v11.policy_long(q)`. No host sync
    unless validate=True."""
    return _launch(q, kv_cache, prefix_lens, anc_bits, softmax_scale, kv_lora_rank, validate,
                   policy_long(q), publish=True, rcp=True)
