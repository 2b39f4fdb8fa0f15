"""Checkpoint folders in the exact layout Kimi K2.5/K2.6 ship their text weights.

    DIR/config.json                       cfg.to_hf_dict(): text_config nested, compressed-tensors
    DIR/model.safetensors.index.json      {"metadata": {"total_size": bytes}, "weight_map": {...}}
    DIR/model-0000k-of-0000N.safetensors  one shard per piece: embed, each decoder layer, head

Tensor names are the in-memory model's with K2.5/K2.6's multimodal `language_model.` prefix,
except the routed experts, which the model stacks per layer ([E, out, in/8] int32 and
[E, out, in/32] bf16) and the checkpoint stores one expert at a time (notes/kimi_mla.md §2.2):

    language_model.model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight_packed  int32 [out, in/8]
    language_model.model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight_scale   bf16  [out, in/32]
    language_model.model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight_shape   int32 [2] = [out, in]

Everything else is bf16 except `mlp.gate.e_score_correction_bias` (fp32).

Sharding is by piece (shard 1 embed, one per decoder layer, the last norm + lm_head) rather than
HF's ~5 GB size buckets: writing then never holds more than one layer, and loading a layer
subset (one rank of the 8-GPU model, a per-layer kernel benchmark) opens only the shards it
needs. A kimi-k2.6 layer shard is ~9.5 GB, which safetensors handles fine.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from itertools import chain
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.config import ConfigError, ModelConfig
from workbench.reference.model import KimiModel
from workbench.weights import DEFAULT_LOGIT_SCALE, synthetic_state_chunks

__all__ = ["CheckpointError", "load_model", "read_config", "save_model", "to_checkpoint_tensors",
           "write_synthetic_checkpoint", "INDEX_FILE", "PREFIX"]

PREFIX = "language_model."  # K2.5/K2.6 wrap the text model in a multimodal model
INDEX_FILE = "model.safetensors.index.json"
PACK = 8  # int4 values per int32 word
# in-memory stacked expert buffer -> (layer prefix, proj, packed|scale)
_EXPERT_BUF = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(gate|up|down)_(packed|scale)")
_FIELD = {"packed": "weight_packed", "scale": "weight_scale"}
_SHAPE_DTYPES = (torch.int32, torch.int64)  # K2.5 dump: int32; compressed-tensors writes int64


class CheckpointError(ValueError):
    """A checkpoint folder is malformed; the message names the file or tensor at fault."""


def _shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def to_checkpoint_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """In-memory names -> checkpoint names: add the prefix, unstack routed experts per expert.

    The per-expert tensors are views of the stacked buffers (no copy): safetensors writes
    non-overlapping views of one storage as separate tensors.
    """
    out = {}
    for name, t in state.items():
        m = _EXPERT_BUF.fullmatch(name)
        if m is None:
            out[PREFIX + name] = t
            continue
        base, proj, kind = m.groups()
        t = t.contiguous()  # [E, out, in/8] or [E, out, in/32]
        for e in range(t.shape[0]):
            stem = f"{PREFIX}{base}.{e}.{proj}_proj."
            out[stem + _FIELD[kind]] = t[e]
            if kind == "packed":
                out[stem + "weight_shape"] = torch.tensor([t.shape[1], t.shape[2] * PACK],
                                                          dtype=torch.int32)
    return out


def _write_shard(file: Path, state: dict[str, torch.Tensor]) -> dict[str, int]:
    """One piece -> one shard; returns {checkpoint name: bytes}. Its locals die on return."""
    tensors = to_checkpoint_tensors({name: t.cpu() for name, t in state.items()})
    save_file(tensors, file, metadata={"format": "pt"})  # "pt": what HF loaders expect
    return {name: t.numel() * t.element_size() for name, t in tensors.items()}


def _write_pieces(path, cfg: ModelConfig, pieces, n: int, progress: bool, desc: str) -> Path:
    """Write (label, state dict) pieces one shard each, then the index (which marks completion)."""
    from tqdm.auto import tqdm

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # The index is written last, so a folder holding one is complete; drop a stale one first so
    # an interrupted overwrite cannot pair an old index with new shards.
    (path / INDEX_FILE).unlink(missing_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    weight_map, total, k = {}, 0, 0
    # A plain loop on purpose: iterating through tqdm(...) or enumerate(...) keeps the previous
    # piece referenced while the generator builds the next one (two layers in host memory).
    with tqdm(total=n, disable=not progress, desc=desc) as bar:
        for _, state in pieces:
            k += 1
            shard = _shard_name(k, n)
            sizes = _write_shard(path / shard, state)
            del state  # free this piece before the generator makes the next
            weight_map.update(dict.fromkeys(sizes, shard))
            total += sum(sizes.values())  # HF's total_size: tensor bytes, no headers
            bar.update()
    if k != n:
        raise CheckpointError(f"{path}: expected {n} pieces to write, got {k}")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return path


def _model_pieces(model: KimiModel):
    sd = model.state_dict()  # references to the live tensors, nothing copied
    head = ("model.norm.weight", "lm_head.weight")
    layer_keys = {i: [k for k in sd if k.startswith(f"model.layers.{i}.")]
                  for i in model.layer_ids}
    left = set(sd) - {"model.embed_tokens.weight", *head, *chain(*layer_keys.values())}
    if left:  # a tensor the model grew that no shard would hold: refuse to drop it silently
        raise CheckpointError(f"save_model: no shard assigned to {sorted(left)}")
    yield "embed", {"model.embed_tokens.weight": sd["model.embed_tokens.weight"]}
    for i, keys in layer_keys.items():
        yield f"layer {i}", {k: sd[k] for k in keys}
    yield "head", {k: sd[k] for k in head}


def save_model(model: KimiModel, path, progress: bool = False) -> Path:
    """Write a KimiModel (whatever layer subset it holds) as a K2.6-format checkpoint folder."""
    n = len(model.layer_ids) + 2
    return _write_pieces(path, model.cfg, _model_pieces(model), n, progress, "save_model")


def write_synthetic_checkpoint(cfg_or_preset: ModelConfig | str, path, seed: int = 0,
                               device="cpu", progress: bool = True,
                               logit_scale: float = DEFAULT_LOGIT_SCALE) -> Path:
    """Stream `synthetic_state_chunks` to a checkpoint folder, one layer in host memory at a time.

    The weights equal `build_model(cfg, seed, logit_scale=logit_scale)` bitwise.
    """
    cfg = ModelConfig.preset(cfg_or_preset) if isinstance(cfg_or_preset, str) else cfg_or_preset
    pieces = synthetic_state_chunks(cfg, seed, device=device, logit_scale=logit_scale)
    return _write_pieces(path, cfg, pieces, cfg.num_layers + 2, progress,
                         f"synthetic {cfg.name}")


# -- loading ---------------------------------------------------------------------------------
def read_config(path) -> ModelConfig:
    """ModelConfig of a checkpoint folder; CheckpointError naming config.json when it is bad."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{f}: config.json not found")
    try:
        d = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from e
    text = d.get("text_config", d)
    if (text.get("quantization_config") or d.get("quantization_config")) is None:
        # from_hf_dict would default to INT4 g32; a checkpoint without the block is not ours.
        raise CheckpointError(f"{f}: quantization_config missing (expected compressed-tensors "
                              "pack-quantized INT4 routed experts)")
    try:
        cfg = ModelConfig.from_hf_config(f)
    except (ConfigError, KeyError) as e:  # ConfigError names the field; KeyError the key
        raise CheckpointError(f"{f}: {type(e).__name__}: {e}") from e
    return cfg


def _read_index(path: Path) -> dict[str, str]:
    f = path / INDEX_FILE
    if not f.is_file():
        raise CheckpointError(f"{f}: {INDEX_FILE} not found (an interrupted write leaves none)")
    try:
        weight_map = json.loads(f.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{f}: expected JSON with a 'weight_map' object ({e!r})") from e
    return weight_map


def _slots(model: KimiModel) -> dict[str, tuple]:
    """Checkpoint name -> (destination view or None, shape, allowed dtypes, expected value)."""
    slots = {}
    for name, t in chain(model.named_parameters(), model.named_buffers()):
        m = _EXPERT_BUF.fullmatch(name)
        if m is None:
            slots[PREFIX + name] = (t, tuple(t.shape), (t.dtype,), None)
            continue
        base, proj, kind = m.groups()
        for e in range(t.shape[0]):
            stem = f"{PREFIX}{base}.{e}.{proj}_proj."
            slots[stem + _FIELD[kind]] = (t[e], tuple(t.shape[1:]), (t.dtype,), None)
            if kind == "packed":  # the [out, in] the config implies, checked, not stored
                slots[stem + "weight_shape"] = (None, (2,), _SHAPE_DTYPES,
                                                [t.shape[1], t.shape[2] * PACK])
    return slots


def _fill(name: str, t: torch.Tensor, slot: tuple) -> None:
    dst, shape, dtypes, value = slot
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise CheckpointError(f"{name}: expected dtype {want}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise CheckpointError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if value is not None and t.tolist() != value:
        raise CheckpointError(f"{name}: expected [out, in] = {value} from config.json, "
                              f"got {t.tolist()}")
    if dst is not None:
        dst.copy_(t)


def _layers_held(weight_map: dict) -> list[int]:
    pat = re.compile(re.escape(PREFIX) + r"model\.layers\.(\d+)\.")
    return sorted({int(m.group(1)) for n in weight_map if (m := pat.match(n))})


@torch.no_grad()
def load_model(path, device="cpu", layers: list[int] | None = None,
               progress: bool = False) -> KimiModel:
    """Load a K2.6-format checkpoint folder into a KimiModel (`layers`: a subset, default all).

    Only the shards holding the requested layers (plus embed and head) are opened; tensors are
    read lazily one at a time. Tensors of other layers, the vision tower or anything outside
    the requested layers are ignored; an unknown tensor inside a requested layer is an error
    (a zero point, g_idx or bias we would silently drop means the model computes wrongly).
    """
    from tqdm.auto import tqdm

    path = Path(path)
    cfg = read_config(path)
    weight_map = _read_index(path)
    with torch.device("meta"):
        model = KimiModel(cfg, layers)
    model = model.to_empty(device=device)
    slots = _slots(model)

    missing = [n for n in slots if n not in weight_map]
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]} ({len(missing)} missing; "
                              f"the index holds layers {_layers_held(weight_map)})")
    prefixes = tuple(f"{PREFIX}model.layers.{i}." for i in model.layer_ids)
    extra = sorted(n for n in weight_map if n.startswith(prefixes) and n not in slots)
    if extra:
        raise CheckpointError(f"{path}: unexpected tensor {extra[0]} in a loaded layer "
                              f"({len(extra)} unexpected: {extra[:4]})")
    by_shard = defaultdict(list)
    for name in slots:
        by_shard[weight_map[name]].append(name)
    for shard, names in by_shard.items():  # fail before reading anything
        if not (path / shard).is_file():
            raise CheckpointError(f"{path / shard}: shard missing (the index puts {names[0]} "
                                  "there)")

    for shard in tqdm(sorted(by_shard), disable=not progress, desc="load_model"):
        # Reads land on the host one tensor at a time, then copy_ moves them to `device`.
        with safe_open(path / shard, framework="pt", device="cpu") as f:
            keys = set(f.keys())
            for name in by_shard[shard]:
                if name not in keys:
                    raise CheckpointError(f"{name}: missing tensor (the index puts it in "
                                          f"{shard}, which does not hold it)")
                _fill(name, f.get_tensor(name), slots[name])
    return model.eval()
