"""K2.6-format checkpoints: round trips, the synthetic writer, layer subsets, INT4 parity with
compressed-tensors, and malformed folders that must fail naming the tensor or file at fault.

All on the `tiny` preset (6 layers, layer 0 dense, 16 experts, group 32), CPU only.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import weakref

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import workbench.checkpoint as ck
from workbench.checkpoint import (
    INDEX_FILE,
    PREFIX,
    CheckpointError,
    load_model,
    save_model,
    write_synthetic_checkpoint,
)
from workbench.config import ConfigError, ModelConfig
from workbench.models import build_model
from workbench.reference.int4 import dequant_int4_g32, pack_int4, unpack_int4
from workbench.reference.tree_mla import causal_anc_bits

CFG = ModelConfig.preset("tiny")
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def k26_table(cfg: ModelConfig) -> dict[str, tuple[torch.dtype, list[int]]]:
    """Every checkpoint tensor with its dtype and shape: notes/kimi_mla.md §2.2, from the config."""
    D, H, V, E, I = (cfg.hidden_size, cfg.num_heads, cfg.vocab_size, cfg.n_routed_experts,
                     cfg.moe_intermediate)
    C, R, dn, dv, S = cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.qk_nope_dim, cfg.v_head_dim, I
    t = {"model.embed_tokens.weight": (BF16, [V, D]), "model.norm.weight": (BF16, [D]),
         "lm_head.weight": (BF16, [V, D])}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        t |= {p + "input_layernorm.weight": (BF16, [D]),
              p + "post_attention_layernorm.weight": (BF16, [D]),
              p + "self_attn.q_a_proj.weight": (BF16, [cfg.q_lora_rank, D]),
              p + "self_attn.q_a_layernorm.weight": (BF16, [cfg.q_lora_rank]),
              p + "self_attn.q_b_proj.weight": (BF16, [H * (dn + R), cfg.q_lora_rank]),
              p + "self_attn.kv_a_proj_with_mqa.weight": (BF16, [C + R, D]),
              p + "self_attn.kv_a_layernorm.weight": (BF16, [C]),
              p + "self_attn.kv_b_proj.weight": (BF16, [H * (dn + dv), C]),
              p + "self_attn.o_proj.weight": (BF16, [D, H * dv])}
        if not cfg.is_moe_layer(n):
            F_ = cfg.dense_intermediate
            t |= {p + "mlp.gate_proj.weight": (BF16, [F_, D]),
                  p + "mlp.up_proj.weight": (BF16, [F_, D]),
                  p + "mlp.down_proj.weight": (BF16, [D, F_])}
            continue
        t |= {p + "mlp.gate.weight": (BF16, [E, D]),
              p + "mlp.gate.e_score_correction_bias": (F32, [E]),  # the one fp32 tensor
              p + "mlp.shared_experts.gate_proj.weight": (BF16, [S, D]),
              p + "mlp.shared_experts.up_proj.weight": (BF16, [S, D]),
              p + "mlp.shared_experts.down_proj.weight": (BF16, [D, S])}
        for e in range(E):
            for proj, (o, i) in (("gate", (I, D)), ("up", (I, D)), ("down", (D, I))):
                q = f"{p}mlp.experts.{e}.{proj}_proj."
                t |= {q + "weight_packed": (I32, [o, i // 8]),
                      q + "weight_scale": (BF16, [o, i // 32]),
                      q + "weight_shape": (I32, [2])}
    return {PREFIX + k: v for k, v in t.items()}


def tensors_of(model) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def assert_same_tensors(a, b):
    ta, tb = tensors_of(a), tensors_of(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k


def forward_logits(model, seed: int = 0) -> torch.Tensor:
    B, N = 2, 5  # a causal chain of 5 rows per request, empty cache
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (B, N), generator=g)
    cache = model.new_cache(B, N)
    out = model(ids, torch.arange(N).expand(B, N), cache, torch.zeros(B, dtype=torch.long),
                causal_anc_bits(N, B))
    assert torch.isfinite(out.logits).all()
    return out.logits


def rewrite(folder, name: str, fn) -> None:
    """Apply fn to the dict of the shard that holds `name`; keep the index in step with it."""
    index = json.loads((folder / INDEX_FILE).read_text())
    shard = index["weight_map"][name]
    tensors = load_file(folder / shard)
    fn(tensors)
    save_file(tensors, folder / shard)
    wm = {n: s for n, s in index["weight_map"].items() if s != shard}
    index["weight_map"] = wm | dict.fromkeys(tensors, shard)
    (folder / INDEX_FILE).write_text(json.dumps(index))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_synthetic_checkpoint("tiny", tmp_path_factory.mktemp("ckpt"), seed=0,
                                      progress=False)


@pytest.fixture(scope="module")
def reference_model():
    return build_model(CFG, seed=0)


@pytest.fixture
def ckpt(synthetic, tmp_path):
    """A private copy of the synthetic checkpoint that a test may damage."""
    return shutil.copytree(synthetic, tmp_path / "ckpt")


# -- round trips -------------------------------------------------------------------------------
def test_save_load_round_trip_is_bitwise_and_forward_equal(tmp_path):
    model = build_model(CFG, seed=1)
    loaded = load_model(save_model(model, tmp_path / "m"))
    assert loaded.layer_ids == model.layer_ids and loaded.cfg == model.cfg
    assert_same_tensors(loaded, model)
    assert torch.equal(forward_logits(loaded), forward_logits(model))


def test_save_load_layer_subset_model(tmp_path):
    # why: save_model writes only the layers a (rank's) model holds
    model = build_model(CFG, seed=2, layers=[1, 4])
    path = save_model(model, tmp_path / "m")
    assert len(list(path.glob("model-*-of-00004.safetensors"))) == 4  # embed, 2 layers, head
    assert_same_tensors(load_model(path, layers=[1, 4]), model)
    with pytest.raises(CheckpointError, match=r"missing tensor .*layers\.0\..*layers \[1, 4\]"):
        load_model(path)


def test_synthetic_checkpoint_equals_build_model(synthetic, reference_model):
    loaded = load_model(synthetic)
    assert_same_tensors(loaded, reference_model)
    assert torch.equal(forward_logits(loaded), forward_logits(reference_model))


def test_synthetic_checkpoint_layout_matches_k26_table(synthetic):
    n = CFG.num_layers + 2
    shards = sorted(p.name for p in synthetic.glob("*.safetensors"))
    assert shards == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    index = json.loads((synthetic / INDEX_FILE).read_text())
    table, seen, total = k26_table(CFG), {}, 0
    for shard in shards:
        with safe_open(synthetic / shard, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                seen[name] = (t.dtype, list(t.shape))
                total += t.numel() * t.element_size()
                assert index["weight_map"][name] == shard, name
                if name.endswith("weight_shape"):  # [out, in] of the unpacked weight
                    assert t.tolist() == [table[name.replace("shape", "packed")][1][0],
                                          table[name.replace("shape", "packed")][1][1] * 8]
    assert seen == table
    assert sorted(index["weight_map"]) == sorted(table)
    assert index["metadata"]["total_size"] == total
    # one decoder layer per shard: layer 3 lives alone in shard 5 (1 = embed)
    layer3 = {s for k, s in index["weight_map"].items() if ".layers.3." in k}
    assert layer3 == {f"model-00005-of-{n:05d}.safetensors"}
    cfgj = json.loads((synthetic / "config.json").read_text())
    assert cfgj == CFG.to_hf_dict()


def test_k26_table_has_the_real_shapes():
    # the table above, at the real config, is notes/kimi_mla.md §2.2 and §2.5
    t = k26_table(ModelConfig.preset("kimi-k2.6"))
    e = PREFIX + "model.layers.1.mlp.experts.383."
    assert t[e + "gate_proj.weight_packed"] == (I32, [2048, 896])
    assert t[e + "up_proj.weight_scale"] == (BF16, [2048, 224])
    assert t[e + "down_proj.weight_packed"] == (I32, [7168, 256])
    assert t[e + "down_proj.weight_scale"] == (BF16, [7168, 64])
    a = PREFIX + "model.layers.60.self_attn."
    assert t[a + "q_b_proj.weight"][1] == [12288, 1536]
    assert t[a + "kv_a_proj_with_mqa.weight"][1] == [576, 7168]
    assert t[a + "kv_b_proj.weight"][1] == [16384, 512]
    assert t[a + "o_proj.weight"][1] == [7168, 8192]
    assert t[PREFIX + "model.layers.0.mlp.down_proj.weight"][1] == [7168, 18432]
    nbytes = sum(torch.Size(s).numel() * d.itemsize for d, s in t.values())
    assert abs(nbytes / 1e9 - 594.2) < 0.1  # "whole text model: 594.2 GB"


def test_writer_streams_one_piece_at_a_time(tmp_path, monkeypatch):
    # why: a kimi-k2.6 checkpoint is 594 GB; the writer may hold one layer, never two
    real, n, out = ck.synthetic_state_chunks, CFG.num_layers + 2, tmp_path / "s"
    made = []

    def spy(*args, **kw):
        k = 0  # not enumerate(): its cached result tuple would keep the last piece alive
        for label, state in real(*args, **kw):
            k += 1
            refs = [weakref.ref(t) for t in state.values()]
            yield label, state
            del state
            # the writer asks for piece k + 1: piece k is on disk and nothing holds it
            assert (out / f"model-{k:05d}-of-{n:05d}.safetensors").is_file(), label
            assert all(r() is None for r in refs), f"{label} still referenced"
            made.append(label)

    monkeypatch.setattr(ck, "synthetic_state_chunks", spy)
    write_synthetic_checkpoint(CFG, out, seed=0, progress=False)
    assert len(made) == n  # the loop asks once more after the last piece, so all n are checked


# -- layer subsets -----------------------------------------------------------------------------
def test_layer_subset_opens_only_its_shards(ckpt, reference_model):
    n = CFG.num_layers + 2
    keep = [0, 3]
    for layer in set(range(CFG.num_layers)) - set(keep):  # shard 1 is embed, layer i is i + 2
        (ckpt / f"model-{layer + 2:05d}-of-{n:05d}.safetensors").unlink()
    sub = load_model(ckpt, layers=keep)
    assert sub.layer_ids == keep and sorted(sub.model.layers.keys()) == ["0", "3"]
    full = tensors_of(reference_model)
    got = tensors_of(sub)
    assert all(k.startswith(("model.layers.0.", "model.layers.3.")) or "layers" not in k
               for k in got)
    for k, t in got.items():
        assert torch.equal(t, full[k]), k
    assert torch.equal(forward_logits(sub), forward_logits(build_model(CFG, 0, layers=keep)))
    with pytest.raises(CheckpointError, match=r"model-00003-of-00008\.safetensors: shard missing"):
        load_model(ckpt)


# -- INT4 parity with compressed-tensors -------------------------------------------------------
def _ct_helpers():
    """compressed-tensors' packing helpers; skip only where the library is not installed (a dev
    dependency): an import that fails inside it is an error, not a skip (its transformers
    import once failed on a shadowed `kernels` module and these tests skipped unseen)."""
    import importlib.util

    if importlib.util.find_spec("compressed_tensors") is None:
        pytest.skip("compressed-tensors is not installed (pip install -e '.[dev]')")
    from compressed_tensors.compressors.pack_quantized import helpers

    return helpers


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", [(7, 32), (48, 96), (3, 5, 64)], ids=["odd-rows", "2d", "3d"])
def test_int4_matches_compressed_tensors(seed, shape):
    helpers = _ct_helpers()
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, shape, generator=g).to(torch.int8)
    q.view(-1)[:2] = torch.tensor([-8, 7], dtype=torch.int8)  # both ends of the range
    ours = pack_int4(q)
    assert (ours < 0).any()  # a sign-bit word: the logical-shift case is exercised
    assert torch.equal(ours, helpers.pack_to_int32(q, 4))
    assert torch.equal(unpack_int4(ours), q)
    assert torch.equal(helpers.unpack_from_int32(ours, 4, q.shape), q)

    scale = (torch.rand(*shape[:-1], shape[-1] // 32, generator=g) + 0.01).to(BF16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                            group_size=32)
    theirs = dequantize(q, scale, args=args, dtype=BF16)
    by_hand = q.to(BF16) * scale.repeat_interleave(32, -1)  # compressed-tensors' _dequantize
    assert torch.equal(dequant_int4_g32(ours, scale), theirs)
    assert torch.equal(theirs, by_hand)


def test_checkpoint_experts_unpack_like_compressed_tensors(synthetic, reference_model):
    helpers = _ct_helpers()
    index = json.loads((synthetic / INDEX_FILE).read_text())["weight_map"]
    stem = PREFIX + "model.layers.2.mlp.experts.5.down_proj."
    with safe_open(synthetic / index[stem + "weight_packed"], framework="pt") as f:
        packed, scale = f.get_tensor(stem + "weight_packed"), f.get_tensor(stem + "weight_scale")
        shape = torch.Size(f.get_tensor(stem + "weight_shape").tolist())
    q = helpers.unpack_from_int32(packed, 4, shape)
    w = q.to(BF16) * scale.repeat_interleave(32, -1)
    experts = reference_model.model.layers["2"].mlp.experts
    assert torch.equal(w, dequant_int4_g32(experts.down_packed[5], experts.down_scale[5]))


# -- malformed checkpoints ---------------------------------------------------------------------
L = PREFIX + "model.layers."


def test_int64_weight_shape_accepted(ckpt, reference_model):
    # why: compressed-tensors writes torch.tensor(shape) (int64); the K2.5 dump has int32
    name = L + "4.mlp.experts.7.up_proj.weight_shape"

    def to_int64(ts):
        for k in [k for k in ts if k.endswith("weight_shape")]:
            ts[k] = ts[k].long()

    rewrite(ckpt, name, to_int64)
    shard = json.loads((ckpt / INDEX_FILE).read_text())["weight_map"][name]
    with safe_open(ckpt / shard, framework="pt") as f:
        assert f.get_tensor(name).dtype == torch.int64
    assert_same_tensors(load_model(ckpt), reference_model)


def _set(name, fn):
    return lambda ts: ts.__setitem__(name, fn(ts[name]))


I_, D_, C_ = CFG.moe_intermediate, CFG.hidden_size, CFG.kv_lora_rank
MALFORMED = {
    "missing-tensor": (L + "2.self_attn.o_proj.weight",
                       lambda ts: ts.pop(L + "2.self_attn.o_proj.weight"),
                       r"missing tensor .*layers\.2\.self_attn\.o_proj\.weight"),
    "missing-last-expert": (L + "5.mlp.experts.15.down_proj.weight_scale",
                            lambda ts: ts.pop(L + "5.mlp.experts.15.down_proj.weight_scale"),
                            r"missing tensor .*layers\.5\.mlp\.experts\.15\.down_proj"),
    "wrong-shape": (L + "1.self_attn.kv_a_layernorm.weight",
                    _set(L + "1.self_attn.kv_a_layernorm.weight", lambda t: t[:-1].clone()),
                    rf"kv_a_layernorm\.weight: expected shape \[{C_}\], got \[{C_ - 1}\]"),
    "wrong-shape-scale": (L + "3.mlp.experts.0.gate_proj.weight_scale",
                          _set(L + "3.mlp.experts.0.gate_proj.weight_scale",
                               lambda t: t.repeat(1, 2)),
                          r"experts\.0\.gate_proj\.weight_scale: expected shape"),
    "bias-bf16": (L + "3.mlp.gate.e_score_correction_bias",
                  _set(L + "3.mlp.gate.e_score_correction_bias", lambda t: t.to(BF16)),
                  r"e_score_correction_bias: expected dtype torch.float32, got torch.bfloat16"),
    "embed-fp32": (PREFIX + "model.embed_tokens.weight",
                   _set(PREFIX + "model.embed_tokens.weight", lambda t: t.float()),
                   r"embed_tokens\.weight: expected dtype torch.bfloat16, got torch.float32"),
    "weight-shape-swapped": (L + "4.mlp.experts.7.down_proj.weight_shape",
                             _set(L + "4.mlp.experts.7.down_proj.weight_shape",
                                  lambda t: t.flip(0).contiguous()),
                             rf"experts\.7\.down_proj\.weight_shape: expected \[out, in\] = "
                             rf"\[{D_}, {I_}\] from config\.json, got \[{I_}, {D_}\]"),
    "zero-point-extra": (L + "2.mlp.gate.weight",
                         lambda ts: ts.__setitem__(L + "2.mlp.experts.0.gate_proj.weight_zero_point",
                                                   torch.zeros(I_, D_ // 32, dtype=torch.int8)),
                         r"unexpected tensor .*experts\.0\.gate_proj\.weight_zero_point"),
    "in-index-not-in-shard": (L + "1.input_layernorm.weight", None,
                              r"layers\.1\.input_layernorm\.weight: missing tensor"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_tensor_fails_naming_it(ckpt, case):
    name, fn, pattern = MALFORMED[case]
    if fn is None:  # drop it from the shard file only: the index still points there
        index = (ckpt / INDEX_FILE).read_text()
        rewrite(ckpt, name, lambda ts: ts.pop(name))
        (ckpt / INDEX_FILE).write_text(index)
    else:
        rewrite(ckpt, name, fn)
    with pytest.raises(CheckpointError, match=pattern):
        load_model(ckpt)


def test_extra_tensors_outside_loaded_layers_are_ignored(ckpt, reference_model):
    # why: real K2.5/K2.6 folders also hold vision_tower.* and mm_projector.*
    rewrite(ckpt, PREFIX + "lm_head.weight",
            lambda ts: ts.__setitem__("vision_tower.patch_embed.weight", torch.ones(3, 3)))
    assert_same_tensors(load_model(ckpt), reference_model)
    rewrite(ckpt, L + "5.input_layernorm.weight",
            lambda ts: ts.__setitem__(L + "5.mlp.experts.0.up_proj.weight_g_idx", torch.ones(3)))
    sub = load_model(ckpt, layers=[0, 3])  # layer 5's odd tensor is not in a loaded layer
    assert sub.layer_ids == [0, 3]
    with pytest.raises(CheckpointError, match=r"unexpected tensor .*layers\.5\..*weight_g_idx"):
        load_model(ckpt, layers=[5])


def _edit_config(ckpt, fn):
    d = json.loads((ckpt / "config.json").read_text())
    fn(d)
    (ckpt / "config.json").write_text(json.dumps(d))


def test_bad_quantization_config_fails_naming_config_json(ckpt):
    _edit_config(ckpt, lambda d: d["text_config"]["quantization_config"].update(
        format="float-quantized"))
    with pytest.raises(CheckpointError, match=r"config\.json: .*format.*float-quantized") as e:
        load_model(ckpt)
    assert isinstance(e.value.__cause__, ConfigError)


def test_missing_quantization_config_fails(ckpt):
    _edit_config(ckpt, lambda d: d["text_config"].pop("quantization_config"))
    with pytest.raises(CheckpointError, match=r"config\.json: quantization_config missing"):
        load_model(ckpt)


def test_missing_files_fail_naming_them(ckpt):
    (ckpt / "model-00004-of-00008.safetensors").unlink()  # layer 2
    with pytest.raises(CheckpointError, match=r"model-00004-of-00008\.safetensors: shard missing"):
        load_model(ckpt)
    (ckpt / INDEX_FILE).write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"index\.json: expected JSON with a 'weight_map'"):
        load_model(ckpt)
    (ckpt / INDEX_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json not found"):
        load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json not found"):
        load_model(ckpt)


# -- config.json -------------------------------------------------------------------------------
def test_config_round_trips_through_the_folder(synthetic, ckpt):
    got = ModelConfig.from_hf_config(synthetic)
    d = json.loads((synthetic / "config.json").read_text())
    assert "text_config" in d and "num_hidden_layers" not in d  # K2.5/K2.6 nesting
    assert d["text_config"]["quantization_config"]["format"] == "pack-quantized"
    # The drafter is not in the target's config.json (it ships as its own checkpoint), so
    # from_hf_config builds a default one; everything else, the name included, round-trips.
    assert got.name == CFG.name
    assert dataclasses.replace(got, drafter=CFG.drafter) == CFG
    # a flat (DeepseekV3ForCausalLM-style, un-nested) config.json reads too; its name is "hf"
    (ckpt / "config.json").write_text(json.dumps(d["text_config"]))
    flat = ModelConfig.from_hf_config(ckpt)
    assert dataclasses.replace(flat, name=CFG.name, drafter=CFG.drafter) == CFG
    assert load_model(ckpt, layers=[1]).cfg == flat
