"""drafter kernels: the DFlash draft step (block forward + LM head + log-softmax + top-k).

Versions (README.md in this folder has the design and the version log), each with the
contract of `workbench.reference.drafter.draft_topk`:
    triton_v1  Triton RMSNorm / q,k-norm+RoPE / split-KV GQA attention / silu*up, cuBLAS
               GEMMs, fused LM head + log-softmax + top-k (no [M, V] logits in HBM)
    triton_v2  v1 with the residual adds folded into the norms, the skinny Triton GEMM for
               o / gate_up / down at decode row counts, a row-split attention combine and LM
               head tiles retuned on the H200
    triton_v3  v2 with every projection on the dense linear op's engine dispatch
               (linear_triton_v5: tuned at EP8-rank widths, where the tensor-parallel
               drafter's shards are): a measured negative (session 58)
    triton_v4  v2 with its projections at <= 16 rows on linear_triton_v4's swap-AB kernel
               with 256-wide K steps (session 58's sweep winners at the TP drafter's shards)
    triton_v5  v4 with the attention in one-tile context splits and a combine that loads
               every split at once (the TP drafter's one kv head a rank left most SMs idle)
    triton_v6  v5 with at most 32 attention splits; its vocab-parallel head's shard top-k in
               Triton (`_shard_topk`: stable_topk's bits in two launches, HEAD_TOPK)
    triton_v7  v6 with the whole vocab-parallel head in four Triton launches around its two
               collectives (`_head_v7.dist_head`, HEAD): the shard stats, the global
               log-softmax constants, the candidates and their merge; engine numerics
Op `drafter_materialize` (the contract of `workbench.reference.drafter.materialize`, i.e.
`DFlashDrafter.materialize`; the decode loop calls it inside its per-step CUDA graph):
    triton_v1 = materialize_v1.py  `materialize_triton(drafter, cache, target_hidden, positions,
                    count)`: cuBLAS fc and one K/V GEMM for all layers, Triton hidden norm and
                    one k-norm + RoPE + masked cache-scatter pass; no host sync (graph-capturable)
Peers (peers.py): the plain PyTorch bf16 step eager, torch.compile'd (two modes), CUDA-graphed.

Importing this package imports no Triton; `register()` adds the variants to the op registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.drafter"
BEST = "triton_v2"  # the "optimized" preset, the decode-loop test and the notebook use it
# the "engine" preset's (kernels/__init__.py; the EP8 emulation's tensor-parallel drafter):
# triton_v5 from session 59 (H100, traces/gpu/session59 calls 1 and 5, the 16-layer EP8 step,
# graph-replayed, 3-4 runs each): C 1 DDTree-16 draft 0.692-0.696 ms against triton_v2's
# 0.743-0.747 and triton_v4's 0.726-0.732, the step's kernels 4.214-4.236 against 4.268-4.276;
# C 8 the draft 0.838-0.840 against 0.848-0.852, the step within the runs' spread. Not BEST:
# the whole drafter (one GPU, 8 kv heads) is not timed under v4's projections or v5's splits
ENGINE = "triton_v5"
MATERIALIZE = f"{_MOD}.materialize_v1:materialize_triton"
VARIANTS: dict[str, dict[str, str]] = {
    "drafter": {"triton_v1": f"{_MOD}.triton_v1:draft_topk_triton",
                "triton_v2": f"{_MOD}.triton_v2:draft_topk_triton",
                "triton_v3": f"{_MOD}.triton_v3:draft_topk_triton",
                "triton_v4": f"{_MOD}.triton_v4:draft_topk_triton",
                "triton_v5": f"{_MOD}.triton_v5:draft_topk_triton",
                "triton_v6": f"{_MOD}.triton_v6:draft_topk_triton",
                "triton_v7": f"{_MOD}.triton_v7:draft_topk_triton"},
    # the first (only) entry is what the "optimized" preset selects (kernels.register_all)
    "drafter_materialize": {"triton_v1": MATERIALIZE},
}
# each `drafter` variant's step without its LM head (bonus, start -> final-normed hidden of
# rows 1..L): the distributed drafter puts its vocab-parallel head on it (workbench/dist/vocab.py)
BLOCK_HIDDEN: dict[str, str] = {v: f"{_MOD}.{v}:block_hidden"
                                 for v in ("triton_v1", "triton_v2", "triton_v3", "triton_v4",
                                           "triton_v5", "triton_v6", "triton_v7")}
# the variants whose block body takes `reduce=` (the sum over ranks of the o_proj and down_proj
# partials: the tensor-parallel drafter, workbench/dist/drafter.py); v1 adds them in place
BLOCK_HIDDEN_TP: dict[str, str] = {v: f"{_MOD}.{v}:block_hidden"
                                    for v in ("triton_v2", "triton_v3", "triton_v4",
                                              "triton_v5", "triton_v6", "triton_v7")}
# the variants whose vocab-parallel head (workbench/dist/vocab.py) takes a kernel's shard top-k
# instead of stable_topk: `dist_topk_logprobs`' shard_topk contract
HEAD_TOPK: dict[str, str] = {"triton_v6": f"{_MOD}._shard_topk:shard_topk"}
# the variants whose vocab-parallel head is a kernel of its own: `dist_topk_logprobs`' whole
# contract (local, vocab_start, k, comm), collectives included (workbench/dist/vocab.py)
HEAD: dict[str, str] = {"triton_v7": f"{_MOD}._head_v7:dist_head"}
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("drafter", "triton_v1"): "Triton norms/RoPE/split-KV attention/SwiGLU epilogue + cuBLAS "
    "GEMMs + fused LM head log-softmax top-k",
    ("drafter", "triton_v2"): "triton_v1 + residual adds in the norms, skinny Triton GEMMs at "
    "<= 64 rows where they beat cuBLAS, row-split attention combine, retuned LM head tiles",
    ("drafter", "triton_v3"): "triton_v2 with every projection on the dense linear op's engine "
    "dispatch (linear_triton_v5), tuned at EP8-rank widths: the tensor-parallel drafter's shards",
    ("drafter", "triton_v4"): "triton_v2 with its projections at <= 16 rows on linear_triton_v4's "
    "swap-AB kernel, BK 256 (the TP drafter's shards at C 1)",
    ("drafter", "triton_v5"): "triton_v4 with the attention in one-tile context splits and a "
    "one-load combine of every split (the TP drafter's one kv head a rank)",
    ("drafter", "triton_v6"): "triton_v5 with at most 32 attention splits and the vocab-parallel "
    "head's shard top-k in Triton (stable_topk's bits, two launches)",
    ("drafter", "triton_v7"): "triton_v6 with the whole vocab-parallel head in four Triton "
    "launches around its two collectives (engine numerics: the log-softmax stats in Triton)",
    ("drafter_materialize", "triton_v1"): "materialize_v1: cuBLAS fc + one K/V GEMM for every "
    "layer, Triton hidden norm and k-norm/RoPE/masked scatter; no host sync (in the step graph)",
}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
