"""tree_mla kernels (README.md in this folder has the design and the version log).

Importing this package imports no Triton; `register()` adds the variants to the op registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.tree_mla"
VARIANTS: dict[str, dict[str, str]] = {"tree_mla": {}}
DESCRIPTIONS: dict[tuple[str, str], str] = {}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
