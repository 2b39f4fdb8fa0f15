"""The Kimi K2.6 target model (DeepSeek-V3 architecture), readable, calling its ops by name.

Parameter names are the checkpoint's (Hugging Face DeepseekV3 names without K2.6's
`language_model.` prefix), except the routed experts, which are stacked per layer
(`mlp.experts.gate_packed` [E, I, D/8], ...) instead of 384 separate modules.

Every op goes through the registry (`workbench.ops.get(name)`), so an optimized kernel can be
swapped in with `workbench.ops.use(...)` without touching this file.
Legend: B batch, N rows per request this forward, T cache length, H heads, C latent 512,
R rope 64, D hidden, E experts, K experts per token, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from workbench import ops
from workbench.config import ModelConfig

from .int4_moe import Int4Experts
from .rope import Rope, target_rope


def _param(*shape, dtype=torch.bfloat16) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _buffer(module: nn.Module, name: str, *shape, dtype) -> None:
    module.register_buffer(name, torch.empty(*shape, dtype=dtype))


class Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = _param(dim)


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = _param(d_out, d_in)


class SwiGLU(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.gate_proj, self.up_proj = Linear(d, inter), Linear(d, inter)
        self.down_proj = Linear(inter, d)

    def forward(self, x):
        return ops.get("swiglu_mlp")(x, self.gate_proj.weight, self.up_proj.weight,
                                     self.down_proj.weight)


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = _param(cfg.n_routed_experts, cfg.hidden_size)
        _buffer(self, "e_score_correction_bias", cfg.n_routed_experts, dtype=torch.float32)


class RoutedExperts(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate
        for proj, (o, i) in (("gate", (I, D)), ("up", (I, D)), ("down", (D, I))):
            _buffer(self, f"{proj}_packed", E, o, i // 8, dtype=torch.int32)
            _buffer(self, f"{proj}_scale", E, o, i // cfg.group_size, dtype=torch.bfloat16)

    def stacked(self) -> Int4Experts:
        return Int4Experts(self.gate_packed, self.gate_scale, self.up_packed, self.up_scale,
                           self.down_packed, self.down_scale)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = RoutedExperts(cfg)
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.moe_intermediate * cfg.n_shared_experts)

    def forward(self, x: torch.Tensor, stats: dict | None = None):
        B, N, D = x.shape
        h = x.reshape(B * N, D)
        ids, w = ops.get("moe_route")(h, self.gate.weight, self.gate.e_score_correction_bias,
                                      self.cfg.n_experts_per_tok, self.cfg.routed_scaling_factor)
        if stats is not None:
            stats.setdefault("routing", []).append(ids.view(B, N, -1))
        y = ops.get("int4_moe")(h, ids, w, self.experts.stacked())
        # bf16 sum of the two branch outputs, as engines add them
        return y.view(B, N, D) + self.shared_experts(x)


class MLA(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, D = cfg.num_heads, cfg.hidden_size
        self.q_a_proj = Linear(D, cfg.q_lora_rank)
        self.q_a_layernorm = Norm(cfg.q_lora_rank)
        self.q_b_proj = Linear(cfg.q_lora_rank, H * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(D, cfg.latent_dim)
        self.kv_a_layernorm = Norm(cfg.kv_lora_rank)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_dim + cfg.v_head_dim))
        self.o_proj = Linear(H * cfg.v_head_dim, D)

    def forward(self, x, positions, kv_cache, prefix_lens, anc_bits, rope: Rope):
        """x [B, N, D]; writes this layer's latent rows to kv_cache[b, P_b + i] ([B, T, C+R])."""
        cfg, B, N = self.cfg, x.shape[0], x.shape[1]
        H, C, dn = cfg.num_heads, cfg.kv_lora_rank, cfg.qk_nope_dim
        eps, linear, rmsnorm = cfg.rms_norm_eps, ops.get("linear"), ops.get("rmsnorm")
        table = rope.table(positions.device)  # [T, R] fp32 cos|sin, reserved by new_cache

        cq = rmsnorm(linear(x, self.q_a_proj.weight), self.q_a_layernorm.weight, eps)
        q = linear(cq, self.q_b_proj.weight).view(B, N, H, cfg.qk_head_dim)
        q_nope = q[..., :dn]  # [B, N, H, dn]
        qq = torch.empty(B, N, H, cfg.latent_dim, dtype=x.dtype, device=x.device)  # [.., C+R]
        ops.get("rope")(q[..., dn:], positions, table, rope.interleaved, out=qq[..., C:])

        kv = linear(x, self.kv_a_proj_with_mqa.weight)  # [B, N, C+R]
        # kv_cache[b, P_b + i] = [rmsnorm(c) | rope(k_pe)]
        ops.get("mla_kv_write")(kv, self.kv_a_layernorm.weight, eps, positions, table,
                                rope.interleaved, kv_cache, prefix_lens)

        # absorb W_UK into the query: q_lat[h] = q_nope[h] W_UK[h]  ([dn] x [dn, C] -> [C])
        w_kvb = self.kv_b_proj.weight.view(H, dn + cfg.v_head_dim, C)
        ops.get("mla_q_absorb")(q_nope, w_kvb[:, :dn], out=qq[..., :C])  # qq = [q_lat | q_pe]
        o_lat, _ = ops.get("tree_mla")(qq, kv_cache, prefix_lens, anc_bits, cfg.softmax_scale, C)
        o = ops.get("mla_v_up")(o_lat, w_kvb[:, dn:])  # [B, N, H, dv] (W_UV)
        return linear(o.to(x.dtype).reshape(B, N, H * cfg.v_head_dim), self.o_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.index = layer
        self.input_layernorm = Norm(cfg.hidden_size)
        self.post_attention_layernorm = Norm(cfg.hidden_size)
        self.self_attn = MLA(cfg)
        self.is_moe = cfg.is_moe_layer(layer)
        self.mlp = MoE(cfg) if self.is_moe else SwiGLU(cfg.hidden_size, cfg.dense_intermediate)


def new_latent_cache(cfg: ModelConfig, layers: int, batch: int, max_len: int, device):
    """Latent KV cache [layers, B, T, C+R] bf16, NaN-filled so unwritten rows show."""
    return torch.full((layers, batch, max_len, cfg.latent_dim), float("nan"),
                      dtype=torch.bfloat16, device=device)


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # [B, N, V] fp32, or None when logits were not asked for
    hidden: torch.Tensor  # [B, N, D] final-norm input (residual stream after the last layer)
    captured: torch.Tensor | None  # [B, N, len(capture) * D]: outputs of the captured layers
    stats: dict = field(default_factory=dict)  # "routing": list of [B, N, K] per MoE layer


def forward_out(model, x, caps: dict, capture, want_logits: bool, stats) -> ForwardOut:
    """The end of a forward (single-process or one rank): captured layers, final logits.

    x [B, N, D] residual stream after the last layer; caps {layer id: its output}."""
    missing = [i for i in capture if i not in caps]
    if missing:
        raise ValueError(f"capture: layers {missing} are not loaded ({model.layer_ids})")
    captured = torch.cat([caps[i] for i in capture], -1) if capture else None
    logits = model.logits(x) if want_logits else None
    return ForwardOut(logits, x, captured, stats or {})


class KimiModel(nn.Module):
    """Target model; `layers` (default all) loads a subset, run in increasing order."""

    def __init__(self, cfg: ModelConfig, layers: list[int] | None = None):
        super().__init__()
        self.cfg = cfg
        self.layer_ids = sorted(range(cfg.num_layers) if layers is None else set(layers))
        bad = [i for i in self.layer_ids if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"layers: expected indices in [0, {cfg.num_layers}), got {bad}")
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = _param(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, i) for i in self.layer_ids})
        self.model.norm = Norm(cfg.hidden_size)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.rope = target_rope(cfg)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self, batch: int, max_len: int) -> torch.Tensor:
        self.rope.reserve(max_len, self.device)  # positions are cache slots: < max_len
        return new_latent_cache(self.cfg, len(self.layer_ids), batch, max_len, self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens.weight[ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: [..., D] -> [..., V] fp32."""
        h = ops.get("rmsnorm")(hidden, self.model.norm.weight, self.cfg.rms_norm_eps)
        return ops.get("lm_head")(h, self.lm_head.weight)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                prefix_lens: torch.Tensor, anc_bits: torch.Tensor, capture=(),
                want_logits: bool = True, record_routing: bool = False) -> ForwardOut:
        """One forward over N rows per request.

        ids, positions [B, N]; kv_cache [layers, B, T, C+R] (rows P_b..P_b+N-1 written here);
        prefix_lens [B] committed lengths P_b; anc_bits [B, N, W] (see tree_mla.py);
        capture: target layer ids whose outputs are concatenated into `captured`.
        """
        cfg = self.cfg
        stats: dict = {} if record_routing else None
        x = self.embed(ids)  # [B, N, D]
        caps = {}
        eps, add_norm = cfg.rms_norm_eps, ops.get("add_rmsnorm")
        pending = None  # the last MLP output, added by the next layer's fused add + norm
        for li, i in enumerate(self.layer_ids):
            layer = self.model.layers[str(i)]
            if pending is None:
                a = ops.get("rmsnorm")(x, layer.input_layernorm.weight, eps)
            else:  # x = x + mlp; a = rmsnorm(x)
                x, a = add_norm(x, pending, layer.input_layernorm.weight, eps)
            attn = layer.self_attn(a, positions, kv_cache[li], prefix_lens, anc_bits, self.rope)
            x, m = add_norm(x, attn, layer.post_attention_layernorm.weight, eps)
            pending = layer.mlp(m, stats) if layer.is_moe else layer.mlp(m)
            if i in capture:  # the drafter reads this layer's output: materialise it
                x, pending = x + pending, None
                caps[i] = x
        if pending is not None:
            x = x + pending
        return forward_out(self, x, caps, capture, want_logits, stats)
