"""tree_build kernels: the DDTree best-first build and its greedy walk on the GPU.

Versions (README.md has the design and the version log), each bit-identical to
`workbench.reference.tree_build.build_ddtree`:
    triton_v1  slot-array heap, one warp per request, one tuple reduction per pop
    triton_v2  v1 with a redux.sync cascade pop, L1-prefetched log-probs
    triton_v3  v1's pop, nothing else in the loop: rows kept in registers, stored at the end
    triton_v4  v3 with the next pop chosen while the reduction runs (lookahead)
    triton_v5  v4 with integer score keys and three scalar row stores per pop (not yet timed)
    triton_v6  v2's redux pop decided on the score's high word, rows in registers, no store in
               the loop, loads before the tie branch
    triton_v7  v6 with each slot carrying its entry's sibling and child keys, precomputed: the
               float64 work and the loads leave the pop-to-pop chain (not yet timed)
    triton_v8  v6 with one redux level per pop (a 32-bit key carrying its slot, the winner's
               fields by shfl) and each pop's slot and row writes done in the next pop's
               redux shadow
    triton_v9  v8's pop in a third fewer instructions: per-node fields written once, static
               blocks of 32 pops (one plane per node / row write), each pop's writes behind
               the next pop's redux
The walk (`triton_v1.walk_tree_triton`, `walk_commit_triton`) is shared by all of them; so is
`_common.py` (host checks, allocation, launch arguments, and the @jit helpers outside the pop
loops).
Importing this package imports no Triton; `register()` adds the variants to the op registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.tree_build"
# the fastest measured at the bar's shape (bs 64 x budget 64, H200: README.md); the decode-loop
# test and the notebook use it
BEST = "triton_v9"
VARIANTS = {
    "tree_build": {f"triton_v{v}": f"{_MOD}.triton_v{v}:build_ddtree_triton" for v in (1, 2, 3, 4, 5, 6, 7, 8, 9)},
    "tree_walk": {"triton_v1": f"{_MOD}.triton_v1:walk_tree_triton"},
}
DESCRIPTIONS = {
    ("tree_build", "triton_v1"): "Triton slot-array heap, one warp per request, tuple-reduction pop",
    ("tree_build", "triton_v2"): "v1 with a redux.sync cascade pop and L1-prefetched log-probs",
    ("tree_build", "triton_v3"): "v1's pop with the rows kept in registers (no stores in the loop)",
    ("tree_build", "triton_v4"): "v3 with the next pop chosen while the reduction runs",
    ("tree_build", "triton_v5"): "v4 with integer score keys and three row stores per pop",
    ("tree_build", "triton_v6"): "v2's redux pop on the score's high word, no store in the loop",
    ("tree_build", "triton_v7"): "v6 with successor keys precomputed per slot (float64 off the chain)",
    ("tree_build", "triton_v8"): "v6 with one redux level per pop, writes in the next redux's shadow",
    ("tree_build", "triton_v9"): "v8's pop with per-node fields and static 32-pop blocks (a third fewer instructions)",
    ("tree_walk", "triton_v1"): "Triton greedy walk, one warp per request, no host sync",
}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
