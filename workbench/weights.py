"""Seeded synthetic weights at realistic scale, one layer at a time.

Each layer draws from its own generator seeded by (seed, layer), so any layer can be made alone
(a 590 GB kimi-k2.6 checkpoint is written one layer at a time) and a layer subset gets the same
values as the full model. Routed experts are drawn in bf16 and quantized by the real symmetric
group-32 quantizer (compressed-tensors' min-max rule), one expert at a time.

Scales: linear weights ~ N(0, 1/fan_in) so activations keep unit RMS; norm weights near 1; the
LM head is scaled so the logits' std is `logit_scale` (default 10): greedy argmax margins then
dwarf bf16 noise, which is what makes token-exact tests meaningful on random weights.
"""

from __future__ import annotations

import torch

from workbench.config import ModelConfig
from workbench.reference.int4 import pack_int4, quantize_int4_g32

EMBED_LAYER, HEAD_LAYER = -1, -2  # pseudo layer ids for the non-layer tensors
DEFAULT_LOGIT_SCALE = 10.0


def seeded_generator(seed: int, stream: int, device) -> torch.Generator:
    """One independent stream per (seed, layer-like id): any piece can be made alone."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + stream + 7) % (2**63))
    return g


def normal_weight(g, shape, std, device, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)


def norm_weight(g, dim, device):
    """RMSNorm weights near 1 (1 + 0.05 N(0, 1)), as trained norms look."""
    return (1.0 + 0.05 * torch.randn(dim, generator=g, device=device)).to(torch.bfloat16)


_gen, _normal, _norm_weight = seeded_generator, normal_weight, norm_weight  # local short names


def quantized_expert(g, d_in: int, d_out: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One [d_out, d_in] bf16 expert projection, quantized: (packed int32, scale bf16)."""
    w = _normal(g, (d_out, d_in), d_in**-0.5, device)
    q, s = quantize_int4_g32(w)
    return pack_int4(q), s


def layer_state(cfg: ModelConfig, layer: int, seed: int = 0, device="cpu") -> dict:
    """Synthetic tensors of one decoder layer, keyed by the in-memory model's names
    (`model.layers.{layer}.…`, routed experts stacked as `mlp.experts.{gate,up,down}_{packed,scale}`)."""
    g = _gen(seed, layer, device)
    D, H, C = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank
    p = f"model.layers.{layer}."
    st = {
        p + "input_layernorm.weight": _norm_weight(g, D, device),
        p + "post_attention_layernorm.weight": _norm_weight(g, D, device),
        p + "self_attn.q_a_proj.weight": _normal(g, (cfg.q_lora_rank, D), D**-0.5, device),
        p + "self_attn.q_a_layernorm.weight": _norm_weight(g, cfg.q_lora_rank, device),
        p + "self_attn.q_b_proj.weight": _normal(
            g, (H * cfg.qk_head_dim, cfg.q_lora_rank), cfg.q_lora_rank**-0.5, device),
        p + "self_attn.kv_a_proj_with_mqa.weight": _normal(g, (cfg.latent_dim, D), D**-0.5,
                                                           device),
        p + "self_attn.kv_a_layernorm.weight": _norm_weight(g, C, device),
        p + "self_attn.kv_b_proj.weight": _normal(
            g, (H * (cfg.qk_nope_dim + cfg.v_head_dim), C), C**-0.5, device),
        p + "self_attn.o_proj.weight": _normal(g, (D, H * cfg.v_head_dim),
                                               (H * cfg.v_head_dim) ** -0.5, device),
    }
    if not cfg.is_moe_layer(layer):
        F_ = cfg.dense_intermediate
        st[p + "mlp.gate_proj.weight"] = _normal(g, (F_, D), D**-0.5, device)
        st[p + "mlp.up_proj.weight"] = _normal(g, (F_, D), D**-0.5, device)
        st[p + "mlp.down_proj.weight"] = _normal(g, (D, F_), F_**-0.5, device)
        return st
    E, I = cfg.n_routed_experts, cfg.moe_intermediate
    S = I * cfg.n_shared_experts
    st[p + "mlp.gate.weight"] = _normal(g, (E, D), D**-0.5, device)
    st[p + "mlp.gate.e_score_correction_bias"] = (
        0.02 * torch.randn(E, generator=g, device=device)).float()
    st[p + "mlp.shared_experts.gate_proj.weight"] = _normal(g, (S, D), D**-0.5, device)
    st[p + "mlp.shared_experts.up_proj.weight"] = _normal(g, (S, D), D**-0.5, device)
    st[p + "mlp.shared_experts.down_proj.weight"] = _normal(g, (D, S), S**-0.5, device)
    for proj, (d_in, d_out) in (("gate", (D, I)), ("up", (D, I)), ("down", (I, D))):
        packed = torch.empty(E, d_out, d_in // 8, dtype=torch.int32, device=device)
        scale = torch.empty(E, d_out, d_in // cfg.group_size, dtype=torch.bfloat16,
                            device=device)
        for e in range(E):  # one expert at a time keeps the bf16 draft small
            packed[e], scale[e] = quantized_expert(g, d_in, d_out, device)
        st[p + f"mlp.experts.{proj}_packed"] = packed
        st[p + f"mlp.experts.{proj}_scale"] = scale
    return st


def embed_state(cfg: ModelConfig, seed: int = 0, device="cpu") -> dict:
    g = _gen(seed, EMBED_LAYER, device)
    return {"model.embed_tokens.weight": _normal(g, (cfg.vocab_size, cfg.hidden_size), 1.0,
                                                 device)}


def head_state(cfg: ModelConfig, seed: int = 0, device="cpu",
               logit_scale: float = DEFAULT_LOGIT_SCALE) -> dict:
    g = _gen(seed, HEAD_LAYER, device)
    D = cfg.hidden_size
    return {
        "model.norm.weight": _norm_weight(g, D, device),
        "lm_head.weight": _normal(g, (cfg.vocab_size, D), logit_scale * D**-0.5, device),
    }


def synthetic_state_chunks(cfg: ModelConfig, seed: int = 0, layers=None, device="cpu",
                           logit_scale: float = DEFAULT_LOGIT_SCALE):
    """Yield (label, state dict) pieces: embed, each layer, head — one piece in memory at a time."""
    yield "embed", embed_state(cfg, seed, device)
    for i in range(cfg.num_layers) if layers is None else sorted(set(layers)):
        yield f"layer {i}", layer_state(cfg, i, seed, device)
    yield "head", head_state(cfg, seed, device, logit_scale)


def init_synthetic(model, seed: int = 0, logit_scale: float = DEFAULT_LOGIT_SCALE,
                   progress: bool = False):
    """Fill a KimiModel (all its loaded layers) with synthetic weights, in place."""
    from tqdm.auto import tqdm

    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    chunks = synthetic_state_chunks(model.cfg, seed, model.layer_ids, model.device, logit_scale)
    for _, state in tqdm(chunks, total=len(model.layer_ids) + 2, disable=not progress,
                         desc="synthetic weights"):
        for name, t in state.items():
            params[name].data.copy_(t)
    return model
