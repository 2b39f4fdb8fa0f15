"""ddtree-workbench: kernels of DDTree speculative decoding for Kimi K2.6.

Public API (see README): ModelConfig, build_model, load_model, save_model, generate, ops.
"""

from workbench import ops
from workbench.config import ConfigError, DrafterConfig, ModelConfig, build_target_layer_ids
from workbench.models import build_model

__all__ = [
    "ConfigError", "DrafterConfig", "ModelConfig", "build_model", "build_target_layer_ids",
    "ops",
]
