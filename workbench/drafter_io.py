"""DFlash drafter checkpoints in the HF layout: `config.json` + `model.safetensors`.

config.json is `DrafterConfig.to_hf_dict()` (block_size, layer_types, sliding_window at the top
level; target_layer_ids, mask_token_id, causal_sliding_in_block under `dflash_config`); tensor
names are the DFlash checkpoint's (`fc.weight`, `layers.{i}.self_attn.q_proj.weight`, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.config import DrafterConfig
from workbench.reference.drafter import DFlashDrafter, empty_drafter

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


class DrafterCheckpointError(ValueError):
    """A drafter checkpoint is missing a tensor or holds one of the wrong shape or dtype."""


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Write `path/config.json` and `path/model.safetensors`; returns the folder."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    cfg = drafter.cfg.to_hf_dict() | {"torch_dtype": "bfloat16"}
    (p / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
    state = {n: t.detach().contiguous().cpu() for n, t in drafter.state_dict().items()}
    save_file(state, str(p / WEIGHTS_NAME), metadata={"format": "pt"})
    return p


def load_drafter(path: str | Path, device="cpu") -> DFlashDrafter:
    """Read a drafter folder written by `save_drafter` (or a DFlash HF checkpoint of one file).

    Every expected tensor must be present with its exact shape and dtype; extra tensors (e.g. an
    embedding a training run left in) are an error too, so a wrong checkpoint fails loudly.
    """
    p = Path(path)
    for f in (CONFIG_NAME, WEIGHTS_NAME):
        if not (p / f).exists():
            raise FileNotFoundError(f"drafter checkpoint: {p / f} not found")
    cfg = DrafterConfig.from_hf_dict(json.loads((p / CONFIG_NAME).read_text()))
    model = empty_drafter(cfg, device)
    expected = dict(model.state_dict())
    with safe_open(str(p / WEIGHTS_NAME), framework="pt", device="cpu") as f:
        names = set(f.keys())
        missing = sorted(set(expected) - names)
        if missing:
            raise DrafterCheckpointError(
                f"{p / WEIGHTS_NAME}: missing tensor {missing[0]!r}"
                + (f" (and {len(missing) - 1} more: {missing[1:4]}...)" if len(missing) > 1 else ""))
        extra = sorted(names - set(expected))
        if extra:
            raise DrafterCheckpointError(f"{p / WEIGHTS_NAME}: unexpected tensor {extra[0]!r} "
                                         f"(a DFlash drafter has no embedding or LM head)")
        for name, dst in expected.items():
            t = f.get_tensor(name)
            if tuple(t.shape) != tuple(dst.shape):
                raise DrafterCheckpointError(f"{name}: expected shape {tuple(dst.shape)}, "
                                             f"got {tuple(t.shape)}")
            if t.dtype != dst.dtype:
                raise DrafterCheckpointError(f"{name}: expected dtype {dst.dtype}, got {t.dtype}")
            with torch.no_grad():
                dst.copy_(t)
    return model
