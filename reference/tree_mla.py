"""Absorbed-MLA attention over a latent cache with a tree (ancestor) mask: the `tree_mla` op.

Request b has N query rows; row i sits at cache slot P_b + i (its latent row already written)
and attends to every committed slot [0, P_b) plus the slots P_b + j of its ancestors-or-self
(bit j of anc_bits[b, i]). N = 1 with bit 0 is plain decode; a chain mask is causal prefill.

    Q[h] = [q_nope[h] W_UK[h], rope(q_pe[h])]   (576 = C + R wide)
    s    = Q[h] . Kc[s] * scale,   o_lat[h] = softmax(s) . Kc[:, :C]   (V = the latent itself)

`mla_naive` is the same layer computed the textbook way (keys/values decompressed per head
through W_kvb) so tests can show the absorbed form equals it.
"""

from __future__ import annotations

import torch

from .layers import ACC


def unpack_anc_bits(anc_bits: torch.Tensor, n: int) -> torch.Tensor:
    """anc_bits int64 [..., W] -> bool [..., n]: bit j of word w is node 64 w + j."""
    j = torch.arange(n, device=anc_bits.device)
    words = anc_bits[..., j // 64]
    return ((words >> (j % 64)) & 1).bool()


def pack_anc_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [..., n] -> int64 [..., ceil(n/64)] (inverse of unpack_anc_bits)."""
    n = mask.shape[-1]
    w = (n + 63) // 64
    padded = torch.zeros(*mask.shape[:-1], w * 64, dtype=torch.int64, device=mask.device)
    padded[..., :n] = mask.to(torch.int64)
    bits = padded.reshape(*mask.shape[:-1], w, 64) << torch.arange(64, device=mask.device)
    return bits.sum(-1)  # int64 wrap-around on bit 63 is exactly the two's complement word


def causal_anc_bits(n: int, batch: int = 1, device=None) -> torch.Tensor:
    """A chain: row i sees rows 0..i. int64 [batch, n, ceil(n/64)]."""
    m = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return pack_anc_bits(m).unsqueeze(0).expand(batch, -1, -1).contiguous()


def visible_mask(prefix_lens: torch.Tensor, anc_bits: torch.Tensor, n: int, t_max: int):
    """bool [B, N, T]: row i of request b may read cache slot s."""
    B = prefix_lens.shape[0]
    dev = anc_bits.device
    s = torch.arange(t_max, device=dev)
    P = prefix_lens.to(dev).view(B, 1, 1)
    tree = unpack_anc_bits(anc_bits, n)  # [B, N, N]
    rel = s.view(1, 1, -1) - P  # slot -> tree index
    in_tree = (rel >= 0) & (rel < n)
    tree_ok = torch.gather(tree, 2, rel.clamp(0, n - 1).expand(B, n, t_max))
    return (s.view(1, 1, -1) < P) | (in_tree & tree_ok)


def _valid_rows(kv_cache: torch.Tensor, prefix_lens: torch.Tensor, n: int) -> torch.Tensor:
    """Wide (ACC) cache cut to max(P_b + N) slots, rows past each request's P_b + N zeroed.

    Rows past a request's length may hold anything (NaN in tests): a zero-probability row still
    poisons p @ V through 0 * NaN, so they are dropped here. Rows inside stay as they are, so a
    NaN there (a bug upstream) still shows in the output.
    """
    t_used = int((prefix_lens + n).max())
    if t_used > kv_cache.shape[1]:
        raise ValueError(f"kv_cache: expected at least {t_used} slots for prefix_lens + N, "
                         f"got {kv_cache.shape[1]}")
    kc = kv_cache[:, :t_used].to(ACC)
    live = torch.arange(t_used, device=kc.device).view(1, -1) < (prefix_lens.view(-1, 1) + n)
    return kc.masked_fill(~live.unsqueeze(-1), 0.0)


def tree_mla(q: torch.Tensor, kv_cache: torch.Tensor, prefix_lens: torch.Tensor,
             anc_bits: torch.Tensor, softmax_scale: float, kv_lora_rank: int):
    """q [B, N, H, C+R], kv_cache [B, T, C+R], prefix_lens [B], anc_bits [B, N, W]
    -> (o_lat [B, N, H, C] in q.dtype, lse [B, N, H] fp32, natural log)."""
    B, N, H, _ = q.shape
    kc = _valid_rows(kv_cache, prefix_lens, N)  # [B, T, C+R] float64
    T = kc.shape[1]
    s = torch.einsum("bnhc,btc->bnht", q.to(ACC), kc) * softmax_scale  # [B, N, H, T]
    allowed = visible_mask(prefix_lens, anc_bits, N, T)  # [B, N, T]
    s = s.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, N, H]
    p = torch.exp(s - lse.unsqueeze(-1))
    o = torch.einsum("bnht,btc->bnhc", p, kc[..., :kv_lora_rank])
    return o.to(q.dtype), lse.float()


def mla_naive(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
              kv_b_proj: torch.Tensor, prefix_lens: torch.Tensor, anc_bits: torch.Tensor,
              softmax_scale: float, v_head_dim: int) -> torch.Tensor:
    """Non-absorbed MLA: q_nope [B,N,H,dn], q_pe [B,N,H,R] (roped), kv_b_proj [H*(dn+dv), C]
    -> o [B, N, H, dv] float64 (per-head values, before o_proj)."""
    B, N, H, dn = q_nope.shape
    C = kv_b_proj.shape[1]
    w = kv_b_proj.to(ACC).view(H, dn + v_head_dim, C)
    kc = _valid_rows(kv_cache, prefix_lens, N)
    T = kc.shape[1]
    c, k_pe = kc[..., :C], kc[..., C:]
    k_nope = torch.einsum("btc,hdc->bthd", c, w[:, :dn])  # [B, T, H, dn]
    v = torch.einsum("btc,hdc->bthd", c, w[:, dn:])  # [B, T, H, dv]
    s = torch.einsum("bnhd,bthd->bnht", q_nope.to(ACC), k_nope)
    s = s + torch.einsum("bnhr,btr->bnht", q_pe.to(ACC), k_pe)
    s = s * softmax_scale
    allowed = visible_mask(prefix_lens, anc_bits, N, T)
    s = s.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    return torch.einsum("bnht,bthd->bnhd", s.softmax(-1), v)
