"""Building models: from a preset with synthetic weights, or from a checkpoint folder."""

from __future__ import annotations

import torch

from workbench.config import ModelConfig
from workbench.reference.model import KimiModel
from workbench.weights import DEFAULT_LOGIT_SCALE, init_synthetic


def resolve_config(config: ModelConfig | str) -> ModelConfig:
    return ModelConfig.preset(config) if isinstance(config, str) else config


def build_model(config: ModelConfig | str = "tiny", seed: int = 0, device="cpu",
                layers: list[int] | None = None, logit_scale: float = DEFAULT_LOGIT_SCALE,
                progress: bool = False) -> KimiModel:
    """A target model with seeded synthetic weights (`config` a ModelConfig or a preset name)."""
    cfg = resolve_config(config)
    with torch.device("meta"):
        model = KimiModel(cfg, layers)
    model = model.to_empty(device=device)
    return init_synthetic(model, seed, logit_scale, progress).eval()
