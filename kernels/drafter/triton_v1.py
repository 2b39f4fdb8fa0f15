"""drafter triton_v1: the DFlash draft step from Triton kernels where they pay, torch GEMMs
(cuBLAS, bf16) for the projections.

Per layer (M = B*S rows of the block [bonus, MASK x L]):
    a    = rmsnorm(x)                                   Triton, one pass per row
    qkv  = a @ [Wq; Wk; Wv]^T                           one cuBLAS GEMM  [M, (Hq + 2Hkv) d]
    q, k = rope(q_norm(q)), rope(k_norm(k))             Triton, one pass (v read in place)
    o    = attention(q, [cache ctx ; k], [ctx ; v])     Triton split-KV flash, GQA groups
    x    = x + o @ Wo^T                                 cuBLAS
    h    = silu(a2 @ Wg^T) * (a2 @ Wu^T), a2 = rmsnorm(x)   one cuBLAS GEMM + Triton
    x    = x + h @ Wd^T                                 cuBLAS
then z = rmsnorm(x[:, 1:]) and the fused LM head + log-softmax + top-k (`_lm_head_topk`).

No host sync: shapes alone decide every launch, `start` is only read on the device, so the
step is CUDA-graph capturable (after a first eager call has built the fused weights).
Context materialisation is the separate op `drafter_materialize` (materialize_v1.py).

Legend: B batch, L depths, S = L + 1, Hq/Hkv heads, d head_dim, D hidden, V vocab, k top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._attention import block_attention
from ._common import check_args, check_block_args, prepared, rope_tables, to_bf16
from ._fused import qk_norm_rope, rmsnorm, silu_mul
from ._lm_head_topk import lm_head_topk, tiles_v1


def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 4  # interpreter: a few splits, so the combine path runs too


def block_prologue(drafter, target, bonus: Tensor, start: Tensor):
    """The block [bonus, MASK x L] of every request, embedded, and what its layers share:
    -> (x [M, D] bf16, cos / sin [M, d/2] fp32, start int32 [B], SM count), M = B*S."""
    c = drafter.cfg
    B, S, dev = bonus.shape[0], c.block_size, drafter.device
    block = torch.full((B, S), c.mask_token_id, dtype=torch.long, device=dev)
    block[:, 0] = bonus
    start = start.to(torch.int32)
    pos = start.view(B, 1).to(torch.long) + torch.arange(S, device=dev)  # [B, S]
    cos, sin = rope_tables(drafter, pos.view(-1))  # [M, d/2] fp32
    x = target.embed(block).reshape(B * S, c.hidden_size)  # [M, D] bf16
    return x, cos, sin, start, _sm_count(dev)


def draft_topk_triton(drafter, target, cache, bonus: Tensor, start: Tensor,
                      k: int) -> tuple[Tensor, Tensor]:
    """Same contract as `workbench.reference.drafter.draft_topk`:
    bonus [B], start [B] -> (logprobs fp32 [B, L, k], ids int64 [B, L, k])."""
    return draft(drafter, target, cache, bonus, start, k, _block_hidden, tiles_v1)


def draft(drafter, target, cache, bonus: Tensor, start: Tensor, k: int, body,
          tiles) -> tuple[Tensor, Tensor]:
    """A version's draft step: the argument checks, its block body (-> [B*L, D] bf16) and the
    fused LM head + log-softmax + top-k with its tile policy (`_lm_head_topk.tiles_v*`)."""
    k = check_args(drafter, target, cache, bonus, start, k)
    B, L = bonus.shape[0], drafter.cfg.depth
    z = body(drafter, target, cache, bonus, start)  # [B*L, D]
    if B == 0:
        return (torch.empty(0, L, k, dtype=torch.float32, device=z.device),
                torch.empty(0, L, k, dtype=torch.int64, device=z.device))
    lp, ids = lm_head_topk(z, target.lm_head.weight, k, tiles=tiles)  # [B*L, k]
    return lp.view(B, L, k), ids.view(B, L, k)


def block_hidden(drafter, target, cache, bonus: Tensor, start: Tensor) -> Tensor:
    """The step without its LM head: bonus [B], start [B] -> the final-normed hidden of the
    decoded rows 1..L, [B*L, D] bf16 (what the head reads). The distributed drafter puts its
    vocab-parallel head on this (workbench/dist/vocab.py). `target` gives the embedding."""
    check_block_args(drafter, cache, bonus, start)
    return _block_hidden(drafter, target, cache, bonus, start)


def _block_hidden(drafter, target, cache, bonus: Tensor, start: Tensor) -> Tensor:
    c = drafter.cfg
    B, L, S = bonus.shape[0], c.depth, c.block_size
    Hq, Hkv, d, D = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    if B == 0:
        return torch.empty(0, D, dtype=torch.bfloat16, device=drafter.device)
    w = prepared(drafter)
    eps = c.rms_norm_eps
    x, cos, sin, start, n_sm = block_prologue(drafter, target, bonus, start)
    for li, layer in enumerate(drafter.layers):
        at = layer.self_attn
        a = to_bf16(rmsnorm(x, layer.input_layernorm.weight, eps))
        qkv = F.linear(a, w.qkv[li])  # [M, (Hq + 2 Hkv) d]
        qk = to_bf16(qk_norm_rope(qkv, at.q_norm.weight, at.k_norm.weight, cos, sin, Hq, Hkv,
                                  eps)).view(B, S, Hq + Hkv, d)
        v = qkv.view(B, S, Hq + 2 * Hkv, d)[:, :, Hq + Hkv:]  # [B, S, Hkv, d] view
        o = block_attention(qk[:, :, :Hq], qk[:, :, Hq:], v, cache.k[li], cache.v[li], start,
                            layer.sliding, c.sliding_window, c.causal_sliding_in_block, n_sm)
        x = x + F.linear(to_bf16(o).view(B * S, Hq * d), at.o_proj.weight)
        a2 = to_bf16(rmsnorm(x, layer.post_attention_layernorm.weight, eps))
        h = to_bf16(silu_mul(F.linear(a2, w.gate_up[li])))  # [M, F]
        x = x + F.linear(h, layer.mlp.down_proj.weight)
    # only rows 1..L are decoded (row 0, the bonus, is not)
    return to_bf16(rmsnorm(x.view(B, S, D)[:, 1:].reshape(B * L, D), drafter.norm.weight, eps))
