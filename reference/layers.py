"""Small dense ops the model uses: RMSNorm, linear, SwiGLU MLP, LM head and the two per-head
projections of absorbed MLA. Wide math, bf16 in and out.

Every reference op computes in high precision and rounds its result once to the activation
dtype (bf16), the same boundary an optimized kernel has, so swapping one op changes only that
op's rounding.

Reductions accumulate in float64 (ACC), not fp32: an fp32 GEMM sums in an order that depends on
the batch shape (gemv for one row, blocked gemm for many, split-K on GPUs), which flips bf16
roundings between a 1-row AR step and an N-row tree verify, and MoE top-k routing turns such a
flip into different experts and different tokens. With float64 accumulation the rounded result
of a row does not depend on which rows share the call (a difference needs the exact value within
~1e-16 of a rounding boundary), so the reference loop is batch-invariant and AR and DDTree are
token-exact on it by construction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACC = torch.float64  # accumulation dtype of every reference reduction (see above)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> [..., D] in x.dtype; y = x / rms(x) * weight, in fp32."""
    xf = x.to(ACC)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(ACC)
    return y.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T -> [..., out] in x.dtype (float64 accumulate)."""
    return F.linear(x.to(ACC), weight.to(ACC)).to(x.dtype)


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    """down(silu(gate x) * up x): the dense first layer and the shared expert. [..., D] -> [..., D]."""
    xf = x.to(ACC)
    a = F.silu(F.linear(xf, gate.to(ACC))) * F.linear(xf, up.to(ACC))
    return F.linear(a, down.to(ACC)).to(x.dtype)


def lm_head(h: torch.Tensor, weight: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """h [..., D] -> logits [..., V] fp32. Vocab chunks bound the wide copy of the weight."""
    hf = h.to(ACC)
    return torch.cat([F.linear(hf, weight[i : i + chunk].to(ACC)).float()
                      for i in range(0, weight.shape[0], chunk)], dim=-1)


def mla_q_absorb(q_nope: torch.Tensor, w_uk: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA query: q_lat[h] = q_nope[h] W_UK[h], per head.
    q_nope [B, N, H, dn], w_uk [H, dn, C] -> [B, N, H, C] in q_nope.dtype (float64 accumulate).
    out: a [B, N, H, C] view to write instead (the model's q buffer [..., :C]); returned."""
    q_lat = torch.einsum("bnhd,hdc->bnhc", q_nope.to(ACC), w_uk.to(ACC)).to(q_nope.dtype)
    return q_lat if out is None else out.copy_(q_lat)


def mla_v_up(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """Absorbed MLA output back to value heads: o[h] = o_lat[h] W_UV[h]^T, per head.
    o_lat [B, N, H, C], w_uv [H, dv, C] -> [B, N, H, dv] in o_lat.dtype (float64 accumulate)."""
    return torch.einsum("bnhc,hdc->bnhd", o_lat.to(ACC), w_uv.to(ACC)).to(o_lat.dtype)


def mla_kv_write(kv: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                 positions: torch.Tensor, table: torch.Tensor, interleaved: bool,
                 kv_cache: torch.Tensor, prefix_lens: torch.Tensor) -> None:
    """The MLA latent rows of one layer into its cache, in place: kv [B, N, C+R] (kv_a's
    output) -> kv_cache[b, P_b + i] = [rmsnorm(kv[..., :C]) | rope(kv[..., C:] at positions)].

    norm_weight [C] (kv_a_layernorm); positions [B, N] int (RoPE: tree depth, not the slot);
    table [n, R] fp32 cos|sin (Rope.table); kv_cache [B, T, C+R]; prefix_lens [B]: row i of
    request b goes to slot P_b + i. The reference rmsnorm and rope, rounded as they round."""
    from workbench.reference.rope import rope

    B, N = kv.shape[0], kv.shape[1]
    C = norm_weight.shape[0]
    c = rmsnorm(kv[..., :C], norm_weight, eps)  # [B, N, C]
    k_pe = rope(kv[..., C:], positions, table, interleaved)  # [B, N, R]
    slots = prefix_lens.view(B, 1) + torch.arange(N, device=kv.device)  # [B, N]
    kv_cache[torch.arange(B, device=kv.device).view(B, 1), slots] = torch.cat([c, k_pe], -1).to(
        kv_cache.dtype)


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm: h = x + r (in x.dtype, rounded once, as the model's
    `x = x + r` is), y = rmsnorm(h). [..., D] each -> (h, y)."""
    h = x + r
    return h, rmsnorm(h, weight, eps)
