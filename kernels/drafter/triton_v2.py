"""drafter triton_v2: triton_v1's step with fewer launches and tiles retuned on the H200.

Per layer (M = B*S rows; r = the previous projection's output, added in the next norm):
    x, a = x + r, rmsnorm(x + r)                      one Triton pass (dense add_rmsnorm)
    qkv  = a @ [Wq; Wk; Wv]^T                         cuBLAS
    q, k = rope(q_norm(q)), rope(k_norm(k))           Triton (v1's)
    o    = attention(q, [cache ctx ; k], [ctx ; v])   v1's split-KV kernel; the combine runs
                                                      16 query rows a program (4x the programs)
    r    = o @ Wo^T                                   skinny Triton GEMM at <= 16 rows (_gemm)
    x, a2 = x + r, rmsnorm(x + r)                     one Triton pass
    h    = silu(a2 @ Wg^T) * (a2 @ Wu^T)              skinny GEMM at <= 16 rows + v1's silu*up
    r    = h @ Wd^T                                   skinny GEMM at <= 64 rows
then x + r and the final norm in one pass, and v1's fused LM head + log-softmax + top-k with
the tiles of `_lm_head_topk.tiles_v2`.

What changed against v1 and why (session 9's kernel table of v1 at bs 1, P 1024, 2335 µs):
the 12 residual adds (17.5 µs) fold into the norms that follow them; o / gate_up / down at 8
rows ran at 3.5-4.2 TB/s in cuBLAS (split-K + a reduce launch on o and down) and 4.0-4.2 in
the skinny kernel; the LM head's 128-vocab-row tile left ~4-20 % on the table at every M; the
combine's 8 programs of 64 rows took 6 µs a layer. Rounding points are v1's (the fused add
rounds x + r to bf16 exactly as torch's add, then norms the rounded value).

Legend: B batch, L depths, S = L + 1, Hq/Hkv heads, d head_dim, D hidden, V vocab, k top-k.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..dense.add_rmsnorm_triton_v1 import add_rmsnorm
from ._attention import block_attention
from ._common import check_block_args, prepared, to_bf16
from ._fused import qk_norm_rope, rmsnorm, silu_mul
from ._gemm import proj
from ._lm_head_topk import tiles_v2
from .triton_v1 import block_prologue, draft

COMBINE_ROWS = 16  # query rows a combine program (sm90.py: 72 registers, no spill)
ATTENTION = {"combine_rows": COMBINE_ROWS}  # this version's `block_attention` options


def draft_topk_triton(drafter, target, cache, bonus: Tensor, start: Tensor,
                      k: int) -> tuple[Tensor, Tensor]:
    """Same contract as `workbench.reference.drafter.draft_topk`:
    bonus [B], start [B] -> (logprobs fp32 [B, L, k], ids int64 [B, L, k])."""
    return draft(drafter, target, cache, bonus, start, k, _block_hidden, tiles_v2)


def block_hidden(drafter, target, cache, bonus: Tensor, start: Tensor, *,
                 reduce=None) -> Tensor:
    """The step without its LM head (as triton_v1's): the final-normed hidden of the decoded
    rows 1..L, [B*L, D] bf16. reduce: applied to each o_proj and down_proj output before it
    joins the residual (the tensor-parallel drafter's all-reduce of its ranks' partials,
    workbench/dist/drafter.py; None: the whole projection, as here)."""
    check_block_args(drafter, cache, bonus, start)
    return _block_hidden(drafter, target, cache, bonus, start, reduce)


def on_proj(proj_fn, **attention):
    """(draft_topk_triton, block_hidden) of a version that is this step with another
    projection rule, proj_fn(x [M, K], w [N, K], name) -> [M, N] bf16 (triton_v3, v4), and
    attention: `block_attention`'s split / combine options in place of this file's (v5):
    this file's two contracts, `reduce` included."""
    body = functools.partial(_block_hidden, proj=proj_fn, attention={**ATTENTION, **attention})

    def draft_topk_triton(drafter, target, cache, bonus: Tensor, start: Tensor,
                          k: int) -> tuple[Tensor, Tensor]:
        """Same contract as `workbench.reference.drafter.draft_topk`."""
        return draft(drafter, target, cache, bonus, start, k, body, tiles_v2)

    def block_hidden(drafter, target, cache, bonus: Tensor, start: Tensor, *,
                     reduce=None) -> Tensor:
        """triton_v2.block_hidden on this rule's projections (the tensor-parallel drafter's
        body: `reduce` sums the ranks' o_proj / down_proj partials)."""
        check_block_args(drafter, cache, bonus, start)
        return body(drafter, target, cache, bonus, start, reduce)

    return draft_topk_triton, block_hidden


def _block_hidden(drafter, target, cache, bonus: Tensor, start: Tensor,
                  reduce=None, proj=proj, attention=ATTENTION) -> Tensor:
    """proj(x [M, K], w [N, K], name) -> [M, N] bf16: the version's projection rule
    (here _gemm.proj; triton_v3 / v4 pass their own through `on_proj`); attention:
    `block_attention`'s keyword options (here ATTENTION; v5 / v6 pass their own)."""
    c = drafter.cfg
    B, L, S = bonus.shape[0], c.depth, c.block_size
    Hq, Hkv, d, D = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    if B == 0:
        return torch.empty(0, D, dtype=torch.bfloat16, device=drafter.device)
    w = prepared(drafter)
    eps = c.rms_norm_eps
    x, cos, sin, start, n_sm = block_prologue(drafter, target, bonus, start)  # x: the residual
    r = None  # the last projection's output, not yet added to x
    for li, layer in enumerate(drafter.layers):
        at = layer.self_attn
        if r is None:
            a = to_bf16(rmsnorm(x, layer.input_layernorm.weight, eps))
        else:
            x, a = add_rmsnorm(x, r, layer.input_layernorm.weight, eps)
        qkv = proj(a, w.qkv[li], "qkv")  # [M, (Hq + 2 Hkv) d]
        qk = to_bf16(qk_norm_rope(qkv, at.q_norm.weight, at.k_norm.weight, cos, sin, Hq, Hkv,
                                  eps)).view(B, S, Hq + Hkv, d)
        v = qkv.view(B, S, Hq + 2 * Hkv, d)[:, :, Hq + Hkv:]  # [B, S, Hkv, d] view
        o = block_attention(qk[:, :, :Hq], qk[:, :, Hq:], v, cache.k[li], cache.v[li], start,
                            layer.sliding, c.sliding_window, c.causal_sliding_in_block, n_sm,
                            **attention)
        r = proj(to_bf16(o).view(B * S, Hq * d), at.o_proj.weight, "o")
        r = r if reduce is None else reduce(r)
        x, a2 = add_rmsnorm(x, r, layer.post_attention_layernorm.weight, eps)
        h = to_bf16(silu_mul(proj(a2, w.gate_up[li], "gate_up")))  # [M, F]
        r = proj(h, layer.mlp.down_proj.weight, "down")
        r = r if reduce is None else reduce(r)
    # the last residual add and the final norm in one pass over all rows; rows 1..L decode
    _, z = add_rmsnorm(x, r, drafter.norm.weight, eps)
    return z.view(B, S, D)[:, 1:].reshape(B * L, D)
