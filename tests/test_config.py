"""ModelConfig presets, derived values, HF config I/O and validation errors."""

import json
import math

import pytest

from workbench import ConfigError, ModelConfig, build_target_layer_ids
from workbench.config import quantization_config


def test_kimi_preset_matches_design_table():
    c = ModelConfig.preset("kimi-k2.6")
    assert (c.num_layers, c.hidden_size, c.num_heads, c.vocab_size) == (61, 7168, 64, 163840)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim) == (
        1536, 512, 128, 64, 128)
    assert (c.n_routed_experts, c.n_experts_per_tok, c.moe_intermediate) == (384, 8, 2048)
    assert c.latent_dim == 576
    assert c.softmax_scale == pytest.approx(0.144680, abs=5e-7)  # not 576 ** -0.5
    assert c.drafter.target_layer_ids == (1, 12, 24, 35, 47, 58)
    assert c.drafter.mask_token_id == 163838


def test_small_keeps_real_widths():
    k, s = ModelConfig.preset("kimi-k2.6"), ModelConfig.preset("small")
    for f in ("hidden_size", "num_heads", "n_routed_experts", "latent_dim", "vocab_size"):
        assert getattr(s, f) == getattr(k, f), f
    assert s.num_layers < k.num_layers


def test_tiny_keeps_every_structural_feature():
    t = ModelConfig.preset("tiny")
    assert t.first_k_dense == 1 and t.num_layers > 1  # a dense first layer, then MoE
    assert t.n_shared_experts == 1 and t.rope_factor > 1  # shared expert, YaRN
    assert t.hidden_size % 32 == 0 and t.moe_intermediate % 32 == 0  # INT4 group 32
    assert "sliding_attention" in t.drafter.layer_types
    assert all(0 <= i < t.num_layers for i in t.drafter.target_layer_ids)


def test_build_target_layer_ids():
    assert build_target_layer_ids(61, 6) == [1, 12, 24, 35, 47, 58]
    assert build_target_layer_ids(61, 1) == [30]


def test_unknown_preset_lists_known():
    with pytest.raises(ConfigError, match="kimi-k2.6.*small.*tiny"):
        ModelConfig.preset("huge")


@pytest.mark.parametrize("field,value,match", [
    ("hidden_size", 100, "hidden_size: expected a positive multiple of 32"),  # INT4 groups
    ("moe_intermediate", 48, "moe_intermediate"),
    ("n_experts_per_tok", 17, "n_experts_per_tok"),
    ("qk_rope_dim", 7, "qk_rope_dim"),  # RoPE needs pairs
    ("first_k_dense", 99, "first_k_dense"),
])
def test_validation_names_field_expected_actual(field, value, match):
    with pytest.raises(ConfigError, match=match) as e:
        ModelConfig.preset("tiny").replace(**{field: value})
    assert repr(value) in str(e.value)


def test_hf_roundtrip_nested_and_flat(tmp_path):
    for name in ("tiny", "small", "kimi-k2.6"):
        c = ModelConfig.preset(name)
        d = c.to_hf_dict()
        assert "text_config" in d  # K2.5/K2.6 nesting
        (tmp_path / "config.json").write_text(json.dumps(d))
        back = ModelConfig.from_hf_config(tmp_path)
        assert back == c  # the drafter shape round-trips too
        flat = ModelConfig.from_hf_dict(d["text_config"], name=name)
        assert flat.replace(drafter=c.drafter) == c


def test_hf_config_rejects_other_quantization(tmp_path):
    d = ModelConfig.preset("tiny").to_hf_dict()
    d["text_config"]["quantization_config"]["format"] = "float-quantized"
    with pytest.raises(ConfigError, match="format.*pack-quantized.*float-quantized"):
        ModelConfig.from_hf_dict(d)
    d["text_config"]["quantization_config"] = quantization_config()
    d["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"][
        "symmetric"] = False
    with pytest.raises(ConfigError, match="symmetric"):
        ModelConfig.from_hf_dict(d)


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_hf_config(tmp_path)


def test_yarn_mscale_formula():
    c = ModelConfig.preset("kimi-k2.6")
    assert c.yarn_mscale == pytest.approx(0.1 * math.log(64) + 1)
    assert c.replace(rope_factor=32.0).softmax_scale == pytest.approx(0.130861, abs=5e-7)
