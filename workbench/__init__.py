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
    # With the checkout's root first on sys.path (`python -m ...` or `pytest` started there,
    # PYTHONPATH=.), our kernels/ folder is also the top-level module `kernels` and shadows
    # Hugging Face's `kernels`, which transformers imports whenever that distribution is
    # installed: `import transformers` (compressed-tensors does) then fails with "cannot import
    # name 'CUDAProperties' from 'kernels'" (the compressed-tensors parity tests skipped on
    # it). So the root moves to the end of sys.path: installed packages win the names they
    # own, and the root still finds `workbench` where nothing else does (the H200 image runs
    # from a checkout without an install; spawned workers inherit this sys.path).
    import sys as _sys

    def _is_root(entry: str) -> bool:
        try:
            return Path(entry or ".").resolve() == _src
        except OSError:
            return False

    _roots = [p for p in _sys.path if _is_root(p)]
    _sys.path[:] = [p for p in _sys.path if not _is_root(p)] + _roots
    for _name in ("kernels", "reference"):  # imported through the root before we were
        _mod = _sys.modules.get(_name)
        if _mod is not None and str(_src) in str(getattr(_mod, "__file__", "") or ""):
            del _sys.modules[_name]
    del _sys, _is_root, _roots, _name, _mod

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
