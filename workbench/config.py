"""Model and drafter configuration: one dataclass each, presets, and Hugging Face config I/O.

Dimension legend (README and every shape comment use it):
    B batch (requests)      N tree nodes / query rows per request (budget + 1)
    T cached length         H attention heads       C latent 512 (kv_lora_rank)
    R rope dims 64          D hidden 7168           E routed experts 384
    K top-k (experts per token, or draft candidates per depth)   V vocab
    L draft depth (block_size - 1)                  I expert FFN width 2048
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

INT4_GROUP = 32  # compressed-tensors group size of the routed experts (along the input dim)


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field, expected and actual."""


def _require(ok: bool, name: str, expected: str, actual) -> None:
    if not ok:
        raise ConfigError(f"{name}: expected {expected}, got {actual!r}")


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers whose outputs feed the DFlash drafter (61, 6 -> [1, 12, 24, 35, 47, 58])."""
    _require(num_target_layers >= 1, "num_target_layers", ">= 1", num_target_layers)
    _require(num_draft_layers >= 1, "num_draft_layers", ">= 1", num_draft_layers)
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DrafterConfig:
    """DFlash block drafter (Qwen3-style layers, no embedding or LM head of its own)."""

    num_layers: int = 6
    hidden_size: int = 7168  # D, equals the target's hidden size
    num_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 18432
    block_size: int = 8  # L + 1: [bonus, MASK x L]
    mask_token_id: int = 163838
    target_layer_ids: tuple[int, ...] = (1, 12, 24, 35, 47, 58)
    layer_types: tuple[str, ...] = ("sliding_attention",) * 5 + ("full_attention",)
    sliding_window: int = 2048
    # SGLang runs sliding layers causally inside the block, the HF reference bidirectionally.
    causal_sliding_in_block: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 50000.0
    rope_factor: float = 64.0
    rope_original_max_position: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0

    def __post_init__(self):
        _require(self.num_layers >= 1, "drafter.num_layers", ">= 1", self.num_layers)
        _require(self.block_size >= 2, "drafter.block_size", ">= 2", self.block_size)
        _require(self.num_heads % self.num_kv_heads == 0, "drafter.num_heads",
                 f"a multiple of num_kv_heads={self.num_kv_heads}", self.num_heads)
        _require(self.head_dim % 2 == 0, "drafter.head_dim", "even (RoPE pairs)", self.head_dim)
        _require(len(self.layer_types) == self.num_layers, "drafter.layer_types",
                 f"{self.num_layers} entries", len(self.layer_types))
        bad = [t for t in self.layer_types if t not in ("sliding_attention", "full_attention")]
        _require(not bad, "drafter.layer_types", "'sliding_attention' or 'full_attention'", bad)
        _require(len(self.target_layer_ids) >= 1, "drafter.target_layer_ids", "non-empty",
                 self.target_layer_ids)

    @property
    def depth(self) -> int:
        """L: draft positions per block."""
        return self.block_size - 1

    def to_hf_dict(self) -> dict:
        """The DFlash HF config.json layout."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "block_size": self.block_size,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "type": "yarn",
                "factor": self.rope_factor,
                "original_max_position_embeddings": self.rope_original_max_position,
                "beta_fast": self.rope_beta_fast,
                "beta_slow": self.rope_beta_slow,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            "dflash_config": {
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
                "causal_sliding_in_block": self.causal_sliding_in_block,
            },
        }

    @classmethod
    def from_hf_dict(cls, d: dict) -> DrafterConfig:
        dfl = d.get("dflash_config", {})
        rs = d.get("rope_scaling") or {}
        n = d["num_hidden_layers"]
        ids = dfl.get("target_layer_ids", d.get("target_layer_ids"))
        _require(ids is not None, "drafter config.json target_layer_ids", "present", None)
        mask_id = dfl.get("mask_token_id", d.get("mask_token_id"))
        _require(mask_id is not None, "drafter config.json mask_token_id", "present", None)
        return cls(
            num_layers=n,
            hidden_size=d["hidden_size"],
            num_heads=d["num_attention_heads"],
            num_kv_heads=d["num_key_value_heads"],
            head_dim=d.get("head_dim", d["hidden_size"] // d["num_attention_heads"]),
            intermediate_size=d["intermediate_size"],
            block_size=d["block_size"],
            mask_token_id=mask_id,
            target_layer_ids=tuple(ids),
            layer_types=tuple(d.get("layer_types", ["full_attention"] * n)),
            sliding_window=d.get("sliding_window") or 0,
            causal_sliding_in_block=dfl.get("causal_sliding_in_block", False),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=d.get("rope_theta", 50000.0),
            rope_factor=rs.get("factor", 1.0),
            rope_original_max_position=rs.get("original_max_position_embeddings", 4096),
            rope_beta_fast=rs.get("beta_fast", 32.0),
            rope_beta_slow=rs.get("beta_slow", 1.0),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Kimi K2.6 text backbone (DeepSeek-V3 architecture with K2 values)."""

    name: str = "kimi-k2.6"
    vocab_size: int = 163840  # V
    hidden_size: int = 7168  # D
    num_layers: int = 61
    first_k_dense: int = 1  # layers [0, first_k_dense) are dense SwiGLU
    dense_intermediate: int = 18432
    num_heads: int = 64  # H
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512  # C
    qk_nope_dim: int = 128
    qk_rope_dim: int = 64  # R
    v_head_dim: int = 128
    n_routed_experts: int = 384  # E
    n_experts_per_tok: int = 8  # K
    n_shared_experts: int = 1
    moe_intermediate: int = 2048  # I
    routed_scaling_factor: float = 2.827
    rope_theta: float = 50000.0
    rope_factor: float = 64.0
    rope_original_max_position: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 1.0
    rope_mscale_all_dim: float = 1.0
    max_position_embeddings: int = 262144
    # One eps for block norms and the latent norms (q_a / kv_a) alike, as vLLM and SGLang do;
    # HF's DeepseekV3Attention would use 1e-6 for the latent norms (notes/kimi_mla.md §3).
    rms_norm_eps: float = 1e-5
    group_size: int = INT4_GROUP
    bos_token_id: int = 163584
    eos_token_id: int = 163585
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def __post_init__(self):
        g = self.group_size
        _require(g == INT4_GROUP, "group_size", f"{INT4_GROUP} (compressed-tensors group)", g)
        _require(self.hidden_size > 0 and self.hidden_size % g == 0, "hidden_size",
                 f"a positive multiple of {g} (INT4 group size)", self.hidden_size)
        _require(self.moe_intermediate > 0 and self.moe_intermediate % g == 0,
                 "moe_intermediate", f"a positive multiple of {g} (INT4 group size)",
                 self.moe_intermediate)
        _require(self.num_layers >= 1, "num_layers", ">= 1", self.num_layers)
        _require(0 <= self.first_k_dense <= self.num_layers, "first_k_dense",
                 f"in [0, num_layers={self.num_layers}]", self.first_k_dense)
        _require(1 <= self.n_experts_per_tok <= self.n_routed_experts, "n_experts_per_tok",
                 f"in [1, n_routed_experts={self.n_routed_experts}]", self.n_experts_per_tok)
        _require(self.qk_rope_dim % 2 == 0, "qk_rope_dim", "even (RoPE pairs)", self.qk_rope_dim)
        _require(self.vocab_size >= 2, "vocab_size", ">= 2", self.vocab_size)
        for name in ("num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim"):
            _require(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        d = self.drafter
        _require(d.hidden_size == self.hidden_size, "drafter.hidden_size",
                 f"the target hidden_size {self.hidden_size}", d.hidden_size)
        _require(0 <= d.mask_token_id < self.vocab_size, "drafter.mask_token_id",
                 f"in [0, vocab_size={self.vocab_size})", d.mask_token_id)
        bad = [i for i in d.target_layer_ids if not 0 <= i < self.num_layers]
        _require(not bad, "drafter.target_layer_ids", f"in [0, num_layers={self.num_layers})", bad)

    # -- derived sizes ---------------------------------------------------------------------
    @property
    def latent_dim(self) -> int:
        """C + R: one latent cache row (576 for K2.6)."""
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    @property
    def yarn_mscale(self) -> float:
        if self.rope_factor <= 1.0:
            return 1.0
        return 0.1 * self.rope_mscale_all_dim * math.log(self.rope_factor) + 1.0

    @property
    def softmax_scale(self) -> float:
        """192^-0.5 * mscale^2 = 0.144680 for K2.6 (not 576^-0.5)."""
        return self.qk_head_dim**-0.5 * self.yarn_mscale**2

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def first_layers(self, n: int) -> ModelConfig:
        """This model cut to its first n target layers, every width kept: the drafter's taps
        rebuilt for n (`build_target_layer_ids`), first_k_dense kept, the name suffixed
        "@nL". For a full-size rank's per-layer work on a card its 61 layers do not fit
        (`workbench.dist.emulate --layers`)."""
        _require(type(n) is int and max(4, self.first_k_dense + 1) <= n <= self.num_layers,
                 "layers", f"an int in [{max(4, self.first_k_dense + 1)}, {self.num_layers}] "
                 "(the drafter's taps need 4, a MoE layer past the dense ones)", n)
        taps = tuple(build_target_layer_ids(n, self.drafter.num_layers))
        return self.replace(name=f"{self.name}@{n}L", num_layers=n,
                            drafter=dataclasses.replace(self.drafter, target_layer_ids=taps))

    # -- Hugging Face config.json ----------------------------------------------------------
    def to_hf_dict(self) -> dict:
        """A Kimi K2.5/K2.6-style config.json (text_config nested, compressed-tensors INT4)."""
        text = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.dense_intermediate,
            "moe_intermediate_size": self.moe_intermediate,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_dim,
            "qk_rope_head_dim": self.qk_rope_dim,
            "v_head_dim": self.v_head_dim,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.n_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "first_k_dense_replace": self.first_k_dense,
            "moe_layer_freq": 1,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "type": "yarn",
                "factor": self.rope_factor,
                "original_max_position_embeddings": self.rope_original_max_position,
                "beta_fast": self.rope_beta_fast,
                "beta_slow": self.rope_beta_slow,
                "mscale": self.rope_mscale,
                "mscale_all_dim": self.rope_mscale_all_dim,
            },
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "attention_bias": False,
            "num_nextn_predict_layers": 0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "bfloat16",
            "quantization_config": quantization_config(self.group_size),
        }
        return {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "workbench_name": self.name,
            # the drafter this target pairs with (a real DFlash drafter ships as its own
            # checkpoint; keeping its shape here makes config.json round-trip exactly)
            "workbench_drafter": self.drafter.to_hf_dict(),
            "text_config": text,
        }

    @classmethod
    def from_hf_dict(cls, d: dict, name: str | None = None) -> ModelConfig:
        t = d.get("text_config", d)  # K2.5/K2.6 nest the backbone under text_config
        missing = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k not in t]
        _require(not missing, "config.json", "keys hidden_size, num_hidden_layers, vocab_size",
                 f"missing {missing}")
        qc = t.get("quantization_config") or d.get("quantization_config")
        group = INT4_GROUP
        if qc is not None:
            group = check_quantization_config(qc)
        n_group = t.get("n_group", 1) or 1
        _require(n_group == 1, "n_group", "1 (K2 has no group-limited routing)", n_group)
        _require(t.get("scoring_func", "sigmoid") == "sigmoid", "scoring_func", "'sigmoid'",
                 t.get("scoring_func"))
        rs = t.get("rope_scaling") or {}
        layers = t["num_hidden_layers"]
        eos = t.get("eos_token_id", 163585)
        kw = dict(
            name=name or d.get("workbench_name", "hf"),
            vocab_size=t["vocab_size"],
            hidden_size=t["hidden_size"],
            num_layers=layers,
            first_k_dense=t.get("first_k_dense_replace", 1),
            dense_intermediate=t.get("intermediate_size", 18432),
            num_heads=t["num_attention_heads"],
            q_lora_rank=t["q_lora_rank"],
            kv_lora_rank=t["kv_lora_rank"],
            qk_nope_dim=t["qk_nope_head_dim"],
            qk_rope_dim=t["qk_rope_head_dim"],
            v_head_dim=t["v_head_dim"],
            n_routed_experts=t["n_routed_experts"],
            n_experts_per_tok=t["num_experts_per_tok"],
            n_shared_experts=t.get("n_shared_experts", 1),
            moe_intermediate=t["moe_intermediate_size"],
            routed_scaling_factor=t.get("routed_scaling_factor", 1.0),
            rope_theta=t.get("rope_theta", 10000.0),
            rope_factor=rs.get("factor", 1.0),
            rope_original_max_position=rs.get("original_max_position_embeddings", 4096),
            rope_beta_fast=rs.get("beta_fast", 32.0),
            rope_beta_slow=rs.get("beta_slow", 1.0),
            rope_mscale=rs.get("mscale", 1.0),
            rope_mscale_all_dim=rs.get("mscale_all_dim", 1.0),
            max_position_embeddings=t.get("max_position_embeddings", 4096),
            rms_norm_eps=t.get("rms_norm_eps", 1e-6),
            group_size=group,
            bos_token_id=t.get("bos_token_id", 0),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
        )
        if "workbench_drafter" in d:
            kw["drafter"] = DrafterConfig.from_hf_dict(d["workbench_drafter"])
        else:  # the Kimi K2.6 drafter shape at this width
            kw["drafter"] = _default_drafter(kw["hidden_size"], layers, kw["vocab_size"])
        return cls(**kw)

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelConfig:
        """Read a checkpoint folder's (or a file's) config.json."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise FileNotFoundError(f"config.json not found at {p}")
        return cls.from_hf_dict(json.loads(p.read_text()))

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        if name not in PRESETS:
            raise ConfigError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
        return PRESETS[name]()


def quantization_config(group_size: int = INT4_GROUP) -> dict:
    """compressed-tensors `pack-quantized` block as Kimi K2.6 ships it (routed experts only)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group_size,
                    "dynamic": False,
                    "actorder": None,
                    "block_structure": None,
                    "observer": "minmax",
                },
            }
        },
        "kv_cache_scheme": None,
        "ignore": [
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*",
            "re:vision_tower.*",
            "re:mm_projector.*",
        ],
    }


def check_quantization_config(qc: dict) -> int:
    """Validate a compressed-tensors block; returns the group size. Only INT4 g32 sym is read."""
    _require(qc.get("quant_method") == "compressed-tensors", "quantization_config.quant_method",
             "'compressed-tensors'", qc.get("quant_method"))
    _require(qc.get("format") == "pack-quantized", "quantization_config.format",
             "'pack-quantized'", qc.get("format"))
    groups = qc.get("config_groups") or {}
    _require(len(groups) >= 1, "quantization_config.config_groups", "one group", groups)
    w = next(iter(groups.values())).get("weights") or {}
    _require(w.get("num_bits") == 4, "quantization weights.num_bits", "4", w.get("num_bits"))
    _require(w.get("type", "int") == "int", "quantization weights.type", "'int'", w.get("type"))
    _require(w.get("symmetric") is True, "quantization weights.symmetric", "true",
             w.get("symmetric"))
    _require(w.get("strategy") == "group", "quantization weights.strategy", "'group'",
             w.get("strategy"))
    _require(w.get("actorder") in (None, False), "quantization weights.actorder", "null",
             w.get("actorder"))
    return int(w.get("group_size", INT4_GROUP))


def _default_drafter(hidden: int, target_layers: int, vocab: int, **kw) -> DrafterConfig:
    n = kw.pop("num_layers", 6)
    return DrafterConfig(
        num_layers=n,
        hidden_size=hidden,
        target_layer_ids=tuple(build_target_layer_ids(target_layers, n)),
        mask_token_id=kw.pop("mask_token_id", vocab - 2),
        layer_types=kw.pop("layer_types", ("sliding_attention",) * (n - 1) + ("full_attention",)),
        **kw,
    )


def _kimi() -> ModelConfig:
    return ModelConfig()


def _small() -> ModelConfig:
    # Real per-layer widths, few layers: one GPU runs the whole loop at real kernel shapes.
    layers = 4
    return ModelConfig(
        name="small",
        num_layers=layers,
        drafter=_default_drafter(7168, layers, 163840, num_layers=2),
    )


def _tiny() -> ModelConfig:
    # Toy widths, every structural feature kept (dense first layer, shared expert, sigmoid+bias
    # routing, absorbed MLA, YaRN, INT4 group 32, a drafter with its own layer ids).
    layers, vocab, hidden = 6, 512, 64
    return ModelConfig(
        name="tiny",
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        dense_intermediate=128,
        num_heads=4,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_dim=16,
        qk_rope_dim=8,
        v_head_dim=16,
        n_routed_experts=16,
        n_experts_per_tok=4,
        moe_intermediate=32,
        # orig 64 so that YaRN's ramp really bends the tiny model's frequencies
        rope_original_max_position=64,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        drafter=_default_drafter(
            hidden, layers, vocab, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, sliding_window=16, rope_original_max_position=64,
        ),
    )


def _tiny_dist() -> ModelConfig:
    # tiny widened so every parallel layout up to 8 ranks divides it: H/8 heads, E/8 experts,
    # I/8 = 32 = one INT4 group for MoE-TP, and the drafter's 8 q heads for its TP split (its 2
    # KV heads then replicated over 4 ranks each; workbench/dist/drafter.py)
    t = _tiny()
    return t.replace(name="tiny-dist", num_heads=8, moe_intermediate=256,
                     drafter=dataclasses.replace(t.drafter, num_heads=8))


PRESETS = {"kimi-k2.6": _kimi, "small": _small, "tiny": _tiny, "tiny-dist": _tiny_dist}
