"""Op registry: `get(op)` for the model, `use(...)` to switch variants, specs for the harness.

    with workbench.ops.use(int4_moe="triton_v1"):
        workbench.generate(...)

Ops the model calls (the four mission ops first): int4_moe, tree_mla, tree_build, drafter,
then the loop's tree_walk and drafter_materialize, and the supporting ops rmsnorm, linear,
add_rmsnorm, swiglu_mlp, moe_route, lm_head, mla_q_absorb, mla_v_up, rope, mla_kv_write, ep_plan, ep_combine.
"""

from . import cases as _cases
from .registry import (
    PORTABLE,
    PRESETS,
    REFERENCE,
    OpSpec,
    UnknownOpError,
    Variant,
    VariantUnavailable,
    get,
    list_ops,
    op_spec,
    register_op,
    resolve_preset,
    resolve_selection,
    selected,
    use,
)

_R = "workbench.reference"
# Harness hooks (seeded EDGE/REAL inputs, the checker's compare, roofline) live in cases.py;
# it imports the references lazily, so registering here imports no op code.
_H = _cases.hooks

register_op("int4_moe", "Routed experts of one MoE layer, INT4 W4A16 (gate/up, SiLU*mul, down, "
            "weighted top-k combine)", f"{_R}.int4_moe:int4_moe", **_H("int4_moe"))
register_op("tree_mla", "Absorbed-MLA attention over the latent cache with an ancestor bitmask",
            f"{_R}.tree_mla:tree_mla", **_H("tree_mla"))
register_op("tree_build", "Best-first DDTree from per-depth top-K log-probs",
            f"{_R}.tree_build:build_ddtree", **_H("tree_build"))
register_op("tree_walk", "Greedy / sample-and-walk of a verified tree: accepted path, lengths, "
            "bonus", f"{_R}.tree_build:walk_tree", **_H("tree_walk"))
register_op("drafter", "DFlash block drafter forward: block + context -> per-depth top-K",
            f"{_R}.drafter:draft_topk", **_H("drafter"))
register_op("drafter_materialize", "DFlash drafter context K/V of committed tokens, written into "
            "the drafter cache (fc, hidden norm, per-layer k/v, k norm, RoPE)",
            f"{_R}.drafter:materialize", **_H("drafter_materialize"))
register_op("rmsnorm", "RMSNorm", f"{_R}.layers:rmsnorm", **_H("rmsnorm"))
register_op("add_rmsnorm", "Residual add and the next RMSNorm: (x + r, rmsnorm(x + r))",
            f"{_R}.layers:add_rmsnorm", **_H("add_rmsnorm"))
register_op("linear", "bf16 linear (fp32 accumulate)", f"{_R}.layers:linear", **_H("linear"))
register_op("swiglu_mlp", "Dense SwiGLU MLP (layer 0, shared expert)", f"{_R}.layers:swiglu_mlp",
            **_H("swiglu_mlp"))
register_op("moe_route", "Sigmoid + bias top-k router", f"{_R}.moe_route:moe_route",
            **_H("moe_route"))
register_op("lm_head", "Final LM head to fp32 logits", f"{_R}.layers:lm_head", **_H("lm_head"))
register_op("mla_q_absorb", "Absorbed-MLA query: q_nope x W_UK per head -> latent query",
            f"{_R}.layers:mla_q_absorb", **_H("mla_q_absorb"))
register_op("mla_v_up", "Absorbed-MLA output: latent o x W_UV^T per head -> value heads",
            f"{_R}.layers:mla_v_up", **_H("mla_v_up"))
register_op("rope", "Target MLA RoPE (q_pe, k_pe): x at int positions rotated with the reserved "
            "fp32 cos|sin table, interleaved or rotate-half pairs", f"{_R}.rope:rope",
            **_H("rope"))
register_op("mla_kv_write", "MLA latent rows of one layer into its cache, in place: RMSNorm of "
            "the latent, RoPE of k_pe, written at slot prefix + row", f"{_R}.layers:mla_kv_write",
            **_H("mla_kv_write"))
register_op("ep_plan", "One rank's expert-parallel exchange plan from the replicated routing: "
            "sent rows by destination, the inverse order, split sizes, received rows",
            f"{_R}.ep_plan:ep_plan", **_H("ep_plan"))
register_op("ep_combine", "The EP owner's combine: expert outputs back in send order -> its "
            "padded slice, tp partials then weighted slots in fixed order",
            f"{_R}.ep_plan:ep_combine", **_H("ep_combine"))

__all__ = [
    "PORTABLE", "PRESETS", "REFERENCE", "OpSpec", "UnknownOpError", "Variant",
    "VariantUnavailable", "get", "list_ops", "op_spec", "register_op", "resolve_preset",
    "resolve_selection", "selected", "use",
]

# optimized variants: each kernel folder registers its numbered versions (lazy imports)
from workbench.kernels import register_all as _register_kernels  # noqa: E402

_register_kernels()
