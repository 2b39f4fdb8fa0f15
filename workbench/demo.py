"""`python -m workbench demo`: AR vs DDTree on the tiny preset, tokens equal, acceptance shown."""

from __future__ import annotations

import time
from collections import Counter


def run_demo(preset: str = "tiny", budget: int = 8, max_new_tokens: int = 32, seed: int = 0,
             device: str = "cpu") -> int:
    from workbench import build_model
    from workbench.generate import generate
    from workbench.reference.drafter import build_drafter
    from workbench.reference.tree_build import format_tree

    target = build_model(preset, seed=seed, device=device)
    drafter = build_drafter(target.cfg, seed=seed, device=device)
    cfg = target.cfg
    prompts = [[(seed * 31 + 7 * i + j) % cfg.vocab_size for j in range(n)]
               for i, n in enumerate((5, 17, 9))]
    print(f"preset {preset}: {cfg.num_layers} layers, D {cfg.hidden_size}, "
          f"{cfg.n_routed_experts} experts top-{cfg.n_experts_per_tok}, V {cfg.vocab_size}; "
          f"drafter {cfg.drafter.num_layers} layers, block {cfg.drafter.block_size}")
    print(f"batch of {len(prompts)} prompts (lengths {[len(p) for p in prompts]}), "
          f"{max_new_tokens} new tokens each, greedy\n")

    t0 = time.perf_counter()
    ar = generate(target, prompts=prompts, max_new_tokens=max_new_tokens)
    t_ar = time.perf_counter() - t0
    t0 = time.perf_counter()
    dd = generate(target, drafter, prompts, max_new_tokens=max_new_tokens, budget=budget)
    t_dd = time.perf_counter() - t0

    same = ar.tokens == dd.tokens
    print(f"AR      : {len(ar.steps):3d} steps, {ar.tokens_per_step:.2f} tokens/step, {t_ar:.2f} s")
    print(f"DDTree B={budget}: {len(dd.steps):3d} steps, {dd.tokens_per_step:.2f} tokens/step, "
          f"{t_dd:.2f} s")
    print(f"tokens equal: {same}")
    for b, toks in enumerate(dd.tokens):
        print(f"  request {b}: {toks[:16]}{' ...' if len(toks) > 16 else ''}")
    hist = Counter(dd.accepted)
    print("\naccepted tokens per step (bonus included):")
    for k in sorted(hist):
        print(f"  {k:2d} | {'#' * min(hist[k], 60)} {hist[k]}")
    experts = [s["distinct_experts_mean"] for s in dd.steps]
    ar_experts = [s["distinct_experts_mean"] for s in ar.steps]
    print(f"\ndistinct routed experts per MoE layer per step: AR {sum(ar_experts) / len(ar_experts):.1f}, "
          f"DDTree {sum(experts) / len(experts):.1f} (of {cfg.n_routed_experts})")
    print("\nfirst step's tree, request 0 (index: token, depth, score):")
    print(format_tree(dd.first_tree, 0))
    same_trained = _trained_pair_demo(budget, device)
    if not (same and same_trained):
        print("ERROR: DDTree tokens differ from AR greedy tokens")
        return 1
    return 0


CODE_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
)


def _trained_pair_demo(budget: int, device: str, max_new_tokens: int = 48) -> bool:
    """The shipped trained pair (workbench/assets/trained): real text, real acceptance."""
    from workbench.generate import generate
    from workbench.train import load_pair, pair_present

    if not pair_present():
        print("\n(no trained pair shipped in workbench/assets/trained: skipping its demo)")
        return True
    target, drafter, tok = load_pair(device=device)
    prompts = [tok.encode(p).ids for p in CODE_PROMPTS]
    ar = generate(target, prompts=prompts, max_new_tokens=max_new_tokens)
    dd = generate(target, drafter, prompts, max_new_tokens=max_new_tokens, budget=budget)
    same = ar.tokens == dd.tokens
    print(f"\ntrained pair (stdlib-trained target + DFlash drafter), DDTree B={budget}: "
          f"{dd.tokens_per_step:.2f} tokens/step over {max_new_tokens} tokens, "
          f"tokens equal to AR: {same}")
    for p, toks in zip(CODE_PROMPTS, dd.tokens):
        print("-" * 60)
        print(p + tok.decode(toks))
    return same
