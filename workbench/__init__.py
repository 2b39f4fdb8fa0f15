"""ddtree-workbench: kernels of DDTree speculative decoding for Kimi K2.6.

Public API (see README): ModelConfig, build_model, load_model, save_model, generate, ops.
"""

from pathlib import Path

# kernels/ and reference/ sit beside this folder (the fixed top-level layout) and are mapped to
# workbench.kernels / workbench.reference by pyproject's package-dir. A wheel carries the mapping;
# a source checkout run without it (PYTHONPATH=., or an older setuptools' editable install, as
# on the H200 image) finds them through this extra search path.
_src = Path(__file__).resolve().parent.parent
if (_src / "pyproject.toml").is_file() and (_src / "kernels" / "__init__.py").is_file():
    __path__.append(str(_src))

from workbench import ops  # noqa: E402
from workbench.config import (  # noqa: E402
    ConfigError,
    DrafterConfig,
    ModelConfig,
    build_target_layer_ids,
)
from workbench.models import build_model  # noqa: E402

__all__ = [
    "ConfigError", "DrafterConfig", "ModelConfig", "build_model", "build_target_layer_ids",
    "ops",
]
