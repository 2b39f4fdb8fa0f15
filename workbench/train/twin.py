"""TrainKimi: a trainable float twin of reference/model.py (KimiModel), same names, same math.

Differences from the inference model, each for training speed, none changing the function:
  * MLA is computed the textbook way (k_nope, v decompressed per head through kv_b_proj, then
    SDPA, causal); the export runs the absorbed form, which the reference tests prove equal.
  * Routed experts are float [E, I, D] / [E, D, I] parameters, computed for every token as two
    wide GEMMs ([T, D] x [D, E*I]) whose outputs are weighted by a dense [T, E] matrix that is
    zero outside the top-k: exactly the sparse top-k sum, at E/K times the FLOPs, which at
    E*I = 4096 beats a grouped loop over 32 small GEMMs.
  * `quant=True` (the QAT tail) runs the experts through `fake_quant_g32`, the very rule of
    reference/int4.quantize_int4_g32 + dequant_int4_g32, with a straight-through gradient.
Routing: sigmoid(h Wg^T) in fp32, top-k of (s + e_score_correction_bias), weights = the
unbiased s of the chosen, renormalised, x routed_scaling_factor (reference/moe_route.py).
Layout of every projection equals KimiModel's: q_b -> [H, nope | rope], kv_a -> [C | R],
kv_b -> [H, nope | v], RoPE interleaved pairs (2i, 2i+1) with K2's YaRN frequencies.
Legend: B batch, S sequence, T tokens (B*S), D hidden, H heads, C latent, R rope dims,
E experts, K experts per token, I expert FFN width, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.reference.rope import target_rope


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def fake_quant_g32(w: torch.Tensor) -> torch.Tensor:
    """w [..., O, I] -> the bf16 values INT4 g32 export gives (min-max scale, round, clamp),
    as w's dtype, with a straight-through gradient. Equals dequant(quantize_int4_g32(w))."""
    g = w.detach().float().unflatten(-1, (-1, 32))  # [..., O, I/32, 32]
    scale = (g.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 7.5).to(torch.bfloat16).float()
    q = torch.round(g / scale).clamp(-8, 7)
    wq = (q * scale).to(torch.bfloat16).flatten(-2).to(w.dtype)  # bf16 product, as dequant
    return w + (wq - w).detach()


class Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Linear(nn.Module):
    """Weight [out, in] like reference/model.py's Linear (no bias)."""

    def __init__(self, d_in: int, d_out: int, std: float = 0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * std)

    def forward(self, x):
        return F.linear(x, self.weight)


class SwiGLU(nn.Module):
    def __init__(self, d: int, inter: int, out_std: float):
        super().__init__()
        self.gate_proj, self.up_proj = Linear(d, inter), Linear(d, inter)
        self.down_proj = Linear(inter, d, out_std)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cfg.n_routed_experts, cfg.hidden_size) * 0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))


class Experts(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float):
        super().__init__()
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate
        self.gate_w = nn.Parameter(torch.randn(E, I, D) * 0.02)
        self.up_w = nn.Parameter(torch.randn(E, I, D) * 0.02)
        self.down_w = nn.Parameter(torch.randn(E, D, I) * out_std)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = Experts(cfg, out_std)
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.moe_intermediate * cfg.n_shared_experts,
                                     out_std)

    def forward(self, x: torch.Tensor, quant: bool, stats: dict | None):
        cfg = self.cfg
        B, S, D = x.shape
        E, I = cfg.n_routed_experts, cfg.moe_intermediate
        h = x.reshape(B * S, D)
        with torch.autocast(h.device.type, enabled=False):  # the router is fp32, as engines run it
            s = torch.sigmoid(F.linear(h.float(), self.gate.weight.float()))  # [T, E]
            ids = torch.topk(s + self.gate.e_score_correction_bias, cfg.n_experts_per_tok).indices
            w = s.gather(1, ids)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor  # [T, K]
            dense = torch.zeros_like(s).scatter(1, ids, w)  # [T, E]: zero outside the top-k
        if stats is not None:
            stats.setdefault("load", []).append(torch.bincount(ids.flatten(), minlength=E))
        ex = self.experts
        wg, wu, wd = ex.gate_w, ex.up_w, ex.down_w
        if quant:
            wg, wu, wd = fake_quant_g32(wg), fake_quant_g32(wu), fake_quant_g32(wd)
        a = F.silu(F.linear(h, wg.reshape(E * I, D))) * F.linear(h, wu.reshape(E * I, D))
        a = (a.view(-1, E, I) * dense.unsqueeze(-1).to(a.dtype)).view(-1, E * I)  # [T, E*I]
        y = F.linear(a, wd.permute(1, 0, 2).reshape(D, E * I))  # [T, D]
        return y.view(B, S, D) + self.shared_experts(x)


def rope_interleaved(x, cos, sin):
    """x [B, S, (H,) R] with pairs (2i, 2i+1); cos, sin [S, R/2] fp32."""
    if x.dim() == 4:
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).to(x.dtype)


class MLA(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float):
        super().__init__()
        self.cfg = cfg
        H, D = cfg.num_heads, cfg.hidden_size
        self.q_a_proj = Linear(D, cfg.q_lora_rank)
        self.q_a_layernorm = Norm(cfg.q_lora_rank)
        self.q_b_proj = Linear(cfg.q_lora_rank, H * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(D, cfg.latent_dim)
        self.kv_a_layernorm = Norm(cfg.kv_lora_rank)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_dim + cfg.v_head_dim))
        self.o_proj = Linear(H * cfg.v_head_dim, D, out_std)

    def forward(self, x, cos, sin, cache=None, start: int = 0):
        """x [B, S, D]; cache (k [B, H, T, dn+R], v [B, H, T, dv]) is written at start..start+S."""
        cfg, (B, S, _) = self.cfg, x.shape
        H, C, dn, R, eps = (cfg.num_heads, cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.qk_rope_dim,
                            cfg.rms_norm_eps)
        q = self.q_b_proj(rms_norm(self.q_a_proj(x), self.q_a_layernorm.weight, eps))
        q = q.view(B, S, H, dn + R)
        q = torch.cat([q[..., :dn], rope_interleaved(q[..., dn:], cos, sin)], -1)
        kv = self.kv_a_proj_with_mqa(x)  # [B, S, C+R]
        c = rms_norm(kv[..., :C], self.kv_a_layernorm.weight, eps)
        k_pe = rope_interleaved(kv[..., C:], cos, sin)  # [B, S, R], shared by all heads
        kvb = self.kv_b_proj(c).view(B, S, H, dn + cfg.v_head_dim)
        k = torch.cat([kvb[..., :dn], k_pe.unsqueeze(2).expand(B, S, H, R)], -1)
        v = kvb[..., dn:]
        q, k, v = (t.transpose(1, 2) for t in (q, k.to(q.dtype), v))  # [B, H, S, .]
        if cache is not None:
            ck, cv = cache
            ck[:, :, start:start + S], cv[:, :, start:start + S] = k, v
        if start == 0:  # training, or a prompt: one fixed shape, the fused kernel pays off
            o = F.scaled_dot_product_attention(q, k, v, is_causal=S > 1,
                                               scale=cfg.softmax_scale)  # [B, H, S, dv]
        elif S == 1:
            # Decode over a cache that grows by one every call: plain math. SDPA would pick a
            # backend that plans per shape (~50 ms per new length on the H200 run).
            s = (q.float() @ ck[:, :, :start + 1].float().transpose(-1, -2)) * cfg.softmax_scale
            o = (s.softmax(-1) @ cv[:, :, :start + 1].float()).to(q.dtype)
        else:
            raise ValueError("MLA twin: a chunk after a cached prefix is not supported")
        return self.o_proj(o.transpose(1, 2).reshape(B, S, H * cfg.v_head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        out_std = 0.02 / (2 * cfg.num_layers) ** 0.5  # GPT-2's residual-branch scaling
        self.input_layernorm = Norm(cfg.hidden_size)
        self.post_attention_layernorm = Norm(cfg.hidden_size)
        self.self_attn = MLA(cfg, out_std)
        self.is_moe = cfg.is_moe_layer(layer)
        self.mlp = (MoE(cfg, out_std) if self.is_moe
                    else SwiGLU(cfg.hidden_size, cfg.dense_intermediate, out_std))


class TrainKimi(nn.Module):
    """The target twin: forward(ids) -> final hidden, captured layer outputs, logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.randn(cfg.vocab_size,
                                                                  cfg.hidden_size) * 0.02)
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.model.norm = Norm(cfg.hidden_size)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.rope = target_rope(cfg)
        self.quant = False  # the QAT tail flips this on
        self.dropout = 0.0  # on the residual branches, training mode only (not exported)

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.model.layers if layer.is_moe]

    def forward(self, ids: torch.Tensor, capture=(), cache=None, start: int = 0,
                want_logits: bool = True, stats: dict | None = None):
        """ids [B, S] at positions start..start+S -> (hidden [B, S, D], captured
        [B, S, len(capture)*D] or None, logits [B, S, V] or None)."""
        cfg = self.cfg
        S = ids.shape[1]
        cos, sin = self.rope.cos_sin(torch.arange(start, start + S, device=ids.device))
        x = self.model.embed_tokens.weight[ids]
        caps = []
        p = self.dropout if self.training else 0.0
        for i, layer in enumerate(self.model.layers):
            a = rms_norm(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
            a = layer.self_attn(a, cos, sin, None if cache is None else cache[i], start)
            x = x + F.dropout(a, p, self.training)
            m = rms_norm(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
            m = layer.mlp(m, self.quant, stats) if layer.is_moe else layer.mlp(m)
            x = x + F.dropout(m, p, self.training)
            if i in capture:
                caps.append(x)
        captured = torch.cat(caps, -1) if caps else None
        logits = None
        if want_logits:
            logits = self.lm_head(rms_norm(x, self.model.norm.weight, cfg.rms_norm_eps))
        return x, captured, logits

    def new_cache(self, batch: int, length: int, dtype, device):
        c = self.cfg
        return [(torch.zeros(batch, c.num_heads, length, c.qk_head_dim, dtype=dtype,
                             device=device),
                 torch.zeros(batch, c.num_heads, length, c.v_head_dim, dtype=dtype,
                             device=device)) for _ in range(c.num_layers)]

    @torch.no_grad()
    def greedy(self, prompts: torch.Tensor, n_new: int, autocast: bool) -> torch.Tensor:
        """prompts [B, P] (one common length) -> [B, P + n_new]: greedy, with a KV cache."""
        B, P = prompts.shape
        dt = torch.bfloat16 if autocast else torch.float32
        cache = self.new_cache(B, P + n_new, dt, prompts.device)
        out = [prompts]
        with torch.autocast(prompts.device.type, torch.bfloat16, enabled=autocast):
            _, _, logits = self(prompts, cache=cache)
            for t in range(n_new):
                nxt = logits[:, -1].float().argmax(-1, keepdim=True)  # [B, 1]
                out.append(nxt)
                if t + 1 < n_new:
                    _, _, logits = self(nxt, cache=cache, start=P + t)
        return torch.cat(out, 1)
