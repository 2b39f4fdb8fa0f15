"""Comparing a distributed run's tokens with the single-process loop's, with a stated tie rule.

A greedy divergence is accepted only where the single-process reference itself was undecided:
its top-2 logit margin at that position (teacher-forced over the reference tokens) is below
TIE_MARGIN. Every divergence is reported with its request, position and margin.
"""

from __future__ import annotations

import torch

from workbench.reference.tree_mla import causal_anc_bits

# Logits have std ~10 on the synthetic weights (weights.DEFAULT_LOGIT_SCALE); an fp32
# reduction-order change moves a logit by ~1e-5, one flipped bf16 rounding in the residual by
# ~0.05-0.5 (measured, engine mode). Exact mode is bit-exact, so only a true tie may differ.
TIE_MARGIN = 0.01


@torch.no_grad()
def reference_margins(target, prompts, tokens) -> list[list[float]]:
    """Top-2 logit margin of the single-process model before each generated token."""
    out, dev = [], target.device  # inputs on the model's device (a GPU run's margins too)
    for p, toks in zip(prompts, tokens):
        seq = list(p) + list(toks)
        L = len(seq)
        cache = target.new_cache(1, L + 1)
        lg = target(torch.tensor([seq], device=dev), torch.arange(L, device=dev).view(1, -1),
                    cache, torch.zeros(1, dtype=torch.long, device=dev),
                    causal_anc_bits(L).to(dev)).logits[0]
        top2 = lg[len(p) - 1 : L - 1].topk(2, -1).values  # [len(toks), 2]
        out.append((top2[:, 0] - top2[:, 1]).tolist())
    return out


def divergences(ref_tokens, got_tokens, margins) -> list[dict]:
    """First divergence per request: {request, position, ref, got, margin}."""
    found = []
    for b, (r, g) in enumerate(zip(ref_tokens, got_tokens)):
        n = next((i for i, (x, y) in enumerate(zip(r, g)) if x != y), None)
        if n is None and len(r) != len(g):
            n = min(len(r), len(g))
        if n is not None:
            m = margins[b][n] if n < len(margins[b]) else float("nan")
            found.append({"request": b, "position": n, "ref": r[n] if n < len(r) else None,
                          "got": g[n] if n < len(g) else None, "margin": m})
    return found


def check_tokens(ref_tokens, got_tokens, margins, tie: float = TIE_MARGIN) -> list[dict]:
    """Raise AssertionError unless every divergence sits on a reference tie; return them."""
    found = divergences(ref_tokens, got_tokens, margins)
    bad = [d for d in found if not d["margin"] < tie]
    if bad:
        raise AssertionError("greedy divergence where the reference was decided (tie margin "
                             f"{tie}): " + "; ".join(
                                 f"request {d['request']} position {d['position']}: ref "
                                 f"{d['ref']} got {d['got']}, reference margin "
                                 f"{d['margin']:.4f}" for d in bad))
    return found
