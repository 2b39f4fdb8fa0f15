"""tree_mla kernels: absorbed-MLA verify attention with an ancestor bitmask (README.md in this
folder has the design, the split policy and the version log).

Versions, each with the reference's signature and outputs (o_lat q.dtype, lse fp32):
    triton_v1  two launches: mask-free split-KV prefix pass (heads x rows in M) + tree block
               with the LSE merge fused in

Importing this package imports no Triton; `register()` adds the variants to the op registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.tree_mla"
# the version the decode-loop test and the notebook use
BEST = "triton_v1"
VARIANTS: dict[str, dict[str, str]] = {
    "tree_mla": {"triton_v1": f"{_MOD}.triton_v1:tree_mla_triton"},
}
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("tree_mla", "triton_v1"): "Triton cascade: split-KV prefix (heads x rows in M, no mask), "
    "tree block under the ancestor bits + LSE merge",
}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
