"""Optimized kernels, one folder per op (imported as workbench.kernels).

Each folder's `__init__.py` names its numbered versions in `VARIANTS` ({op: {name: "module:fn"}})
with one-line `DESCRIPTIONS`, imports no Triton, and exposes `register()` built on
`register_variants` below; `workbench.ops` calls every folder's `register()` in `FOLDERS` order.
"""

from __future__ import annotations

FOLDERS = ("tree_build", "int4_moe", "tree_mla", "drafter", "dense")


def register_variants(variants: dict, descriptions: dict, needs=("triton",)) -> list[str]:
    """Add `variants` ({op: {name: target}}) to the op registry (idempotent); ops not registered
    are skipped. `needs` is the default; a description given as (text, needs) overrides it.
    Returns the `op=name` strings added. (Peers written in a folder live in its `peers.py`,
    which `workbench.peers` imports.)"""
    from workbench.ops.registry import UnknownOpError, Variant, op_spec

    added = []
    for op, named in variants.items():
        try:
            spec = op_spec(op)
        except UnknownOpError:
            continue
        for name, target in named.items():
            if name in spec.variants:
                continue
            desc = descriptions[op, name]
            text, var_needs = desc if isinstance(desc, tuple) else (desc, needs)
            spec.add(Variant(name, target, needs=tuple(var_needs), description=text))
            added.append(f"{op}={name}")
    return added


def register_all() -> list[str]:
    """Every kernel folder's variants (what `workbench.ops` runs at import), and the registry
    presets "optimized" (each mission folder's `BEST`; tree_build's folder also gives the
    walk: a token-exact loop on the GPU), "invariant" (optimized with each folder's
    `INVARIANT` version where BEST is not batch/position-invariant: DDTree's tokens are AR's
    bit for bit on the GPU, tests/test_exact_gpu.py) and "engine" (optimized with each
    folder's batch-variant `ENGINE` version where it names one, + the engine-style supporting
    ops of kernels/dense: what the full-size emulation times). A folder whose BEST cannot run
    everywhere (tree_mla's Gluon kernel: sm_90 only) also names PORTABLE, which a preset
    selects on machines without it (registry.PORTABLE)."""
    import importlib

    from workbench.ops.registry import PORTABLE, PRESETS

    added, best, invariant, engine = [], {}, {}, {}
    for folder in FOLDERS:
        mod = importlib.import_module(f"{__name__}.{folder}")
        added += mod.register()
        if not hasattr(mod, "BEST"):  # kernels/dense: engine-style ops, not token-exact
            continue
        for op, named in mod.VARIANTS.items():
            choice = mod.BEST if op == folder else next(iter(named), None)
            if choice in named:
                best[op] = choice
        if getattr(mod, "INVARIANT", None):
            invariant[folder] = mod.INVARIANT
        if getattr(mod, "ENGINE", None):  # batch-variant, faster: the engine preset only
            engine[folder] = mod.ENGINE
        if getattr(mod, "PORTABLE", None):  # BEST needs hardware the interpreter lacks
            PORTABLE[folder] = mod.PORTABLE
    PRESETS["optimized"] = best
    PRESETS["invariant"] = {**best, **invariant}
    from . import dense

    PRESETS["engine"] = {**best, **engine, **dense.ENGINE}
    return added
