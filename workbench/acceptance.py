"""Acceptance replay: step times at real shapes with realistic accepted lengths (LABELLED REPLAY).

With synthetic weights a drafter and a target agree about as often as chance, so every DDTree
step accepts only the bonus and a benchmark at real shapes would time the wrong loop (tiny
commits, one token per step). An `AcceptanceTrace` holds a distribution of accepted lengths
per budget (tokens per step per request, bonus included = the τ samples), and
`generate(..., acceptance=trace)` replaces the walk by a draw from it:

    a      = 1 + #{cdf[:-1] < u}               u ~ U(0, 1), inverse CDF of the budget's pmf
    a      = min(a, deepest path of the tree + 1)
    path   = the root-to-deepest-node chain (real tree nodes), its first a nodes accepted
    bonus  = the target's own choice after the last accepted node (a real token)

so the KV commit and the drafter's materialisation move real rows of the real tree, and the
verify forward is the real one. The emitted tokens are NOT the target's continuation (drafted
tokens are accepted whatever the target says): results carry mode "ddtree-replay".

Graph safety: no host sync, no RNG in the step. The uniforms are drawn once on the host
(seeded) into a [B, T] table on the device and read at u = U[b, P_b] (P_b = request b's
committed length, which grows every step): the draw is a pure function of the step's inputs,
so a step stays idempotent (GraphedStep's eager warm-up and the eager loop draw alike) and the
CUDA-graph loop replays exactly the eager loop's lengths for the same seed.

Where a trace comes from:
  * a recorded run: `AcceptanceTrace.from_results({budget: GenerateResult})` (histograms of
    `GenerateResult.accepted`); `record_trained()` records one from the shipped trained pair;
  * a mean the user gives: `AcceptanceTrace.from_mean(4.48, budget=8, depth=7)` — a truncated
    geometric on 1..depth+1: each further depth is accepted with the same probability q given
    its parent was, P(a = k) = (1-q) q^(k-1) for k <= depth, P(a = depth+1) = q^depth, with q
    solved (bisection) so that the mean is the one given.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["AcceptanceTrace", "ReplayWalk", "truncated_geometric", "record_trained"]


def truncated_geometric(mean: float, depth: int) -> list[float]:
    """pmf over accepted lengths 1..depth+1 with the given mean (per-depth acceptance q)."""
    top = depth + 1
    if not 1.0 <= mean <= top:
        raise ValueError(f"mean: expected a tau in [1, depth+1 = {top}], got {mean}")

    if mean >= top - 1e-12:  # every depth accepted: the limit q -> 1
        return [0.0] * depth + [1.0]

    def m(q: float) -> float:  # E[a] = sum_{k<top} q^k
        return float(top) if q >= 1.0 else (1.0 - q ** top) / (1.0 - q)

    lo, hi = 0.0, 1.0
    for _ in range(200):  # m is increasing in q
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if m(mid) < mean else (lo, mid)
    q = (lo + hi) / 2
    pmf = [(1 - q) * q ** (k - 1) for k in range(1, top)] + [q ** depth]
    s = sum(pmf)
    return [p / s for p in pmf]


@dataclass
class AcceptanceTrace:
    """pmf[budget][k-1] = P(a request accepts k tokens in one step, bonus included)."""

    pmf: dict[int, list[float]]
    source: str  # how it was made (recorded run / parametric family + parameters)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.pmf:
            raise ValueError("pmf: expected at least one budget, got none")
        clean = {}
        for b, p in self.pmf.items():
            p = [float(x) for x in p]
            if not p or any(x < 0 or not math.isfinite(x) for x in p) or sum(p) <= 0:
                raise ValueError(f"pmf[{b}]: expected non-negative finite weights, got {p}")
            s = sum(p)
            clean[int(b)] = [x / s for x in p]
        self.pmf = dict(sorted(clean.items()))

    # -- lookups ------------------------------------------------------------------------------
    def budget_for(self, budget: int) -> int:
        """The trace's budget used for `budget`: itself, else the nearest on a log scale."""
        if budget in self.pmf:
            return budget
        return min(self.pmf, key=lambda b: (abs(math.log(b) - math.log(budget)), b))

    def probs(self, budget: int) -> list[float]:
        return self.pmf[self.budget_for(budget)]

    def mean(self, budget: int) -> float:
        return sum(k * p for k, p in enumerate(self.probs(budget), 1))

    def clipped_mean(self, budget: int, max_len: int) -> float:
        """E[min(a, max_len)]: what a tree whose deepest path accepts max_len tokens realises."""
        return sum(min(k, max_len) * p for k, p in enumerate(self.probs(budget), 1))

    def std(self, budget: int) -> float:
        m = self.mean(budget)
        return math.sqrt(sum((k - m) ** 2 * p for k, p in enumerate(self.probs(budget), 1)))

    def label(self, budget: int) -> str:
        b = self.budget_for(budget)
        at = "" if b == budget else f" (trace budget {b})"
        return f"replay tau {self.mean(budget):.2f}{at}: {self.source}"

    # -- builders -------------------------------------------------------------------------------
    @classmethod
    def from_results(cls, results: dict, source: str, meta: dict | None = None):
        """{budget: GenerateResult (or a list of accepted lengths)} -> histogram trace."""
        pmf = {}
        for b, r in results.items():
            acc = list(r.accepted) if hasattr(r, "accepted") else list(r)
            if not acc:
                raise ValueError(f"results[{b}]: no accepted lengths recorded")
            c = Counter(int(a) for a in acc)
            pmf[int(b)] = [c.get(k, 0) / len(acc) for k in range(1, max(c) + 1)]
        counts = {str(b): len(r.accepted if hasattr(r, "accepted") else r)
                  for b, r in results.items()}
        return cls(pmf, source, {**(meta or {}), "samples": counts})

    @classmethod
    def from_mean(cls, tau: float | dict, budget: int | None = None, depth: int = 7):
        """A truncated geometric on 1..depth+1 matched to tau (one budget) or {budget: tau}."""
        taus = tau if isinstance(tau, dict) else {budget or 8: tau}
        pmf = {int(b): truncated_geometric(float(t), depth) for b, t in taus.items()}
        given = ", ".join(f"{t:g} at budget {b}" for b, t in taus.items())
        return cls(pmf, f"truncated geometric on 1..{depth + 1} matched to tau {given}",
                   {"family": "truncated_geometric", "depth": depth,
                    "tau": {int(b): float(t) for b, t in taus.items()}})

    # -- files --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"kind": "acceptance_trace", "source": self.source, "meta": self.meta,
                "mean": {str(b): self.mean(b) for b in self.pmf},
                "pmf": {str(b): p for b, p in self.pmf.items()}}

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path):
        d = json.loads(Path(path).read_text())
        if d.get("kind") != "acceptance_trace":
            raise ValueError(f"{path}: expected an acceptance_trace JSON, got kind "
                             f"{d.get('kind')!r}")
        return cls({int(b): p for b, p in d["pmf"].items()}, d["source"], d.get("meta", {}))


class ReplayWalk:
    """The walk of a replay step: (tree, choice) -> (acc_idx [B, N], acc_len [B], bonus [B],
    max_len [B]) with accepted lengths drawn from `trace` (see the module docstring).

    B requests, T >= the largest committed length the loop reaches (the cache length)."""

    def __init__(self, trace: AcceptanceTrace, budget: int, batch: int, max_len: int,
                 device, seed: int = 0):
        self.trace, self.budget = trace, budget
        probs = torch.tensor(trace.probs(budget), dtype=torch.float64)
        self.cdf = torch.cumsum(probs, 0)[:-1].to(device=device, dtype=torch.float32)  # [M-1]
        g = torch.Generator().manual_seed(seed)
        # drawn [T, B] and transposed: u[b, P] depends on (seed, b, P) only, not on T
        self.u = torch.rand(max_len, batch, generator=g).t().contiguous().to(device)  # [B, T]

    def __call__(self, tree, choice: torch.Tensor):
        B, N = tree.tokens.shape
        dev = tree.tokens.device
        idx = torch.arange(N, device=dev)
        valid = idx.view(1, -1) < tree.node_count.view(-1, 1)  # [B, N]
        dep = torch.where(valid, tree.depths, -1)
        deepest = dep.argmax(1)  # [B] first node of the largest depth
        # the deepest node's ancestor bitmask row is its root path; parents[i] < i, so index
        # order along the path is depth order
        words = tree.anc_bits.gather(1, deepest.view(-1, 1, 1).expand(
            -1, 1, tree.anc_bits.shape[-1])).squeeze(1)  # [B, W]
        on = (words.gather(1, (idx // 64).view(1, -1).expand(B, -1)) >> (idx % 64)) & 1
        key = torch.where(on.bool(), idx, N + idx)  # path nodes first, by index = by depth
        path = key.argsort(1)  # [B, N]: path[:, d] = path node at depth d (d <= max depth)
        max_len = dep.max(1).values + 1  # [B] tokens the deepest path can accept (bonus incl.)
        P = tree.positions[:, 0].clamp(0, self.u.shape[1] - 1)  # the root sits at position P
        u = self.u.gather(1, P.view(-1, 1)).squeeze(1)  # [B]
        a = 1 + (u.view(-1, 1) > self.cdf.view(1, -1)).sum(1)  # [B] drawn length
        acc_len = torch.minimum(a, max_len)
        acc_idx = torch.where(idx.view(1, -1) < acc_len.view(-1, 1), path, -1)
        last = path.gather(1, (acc_len - 1).view(-1, 1))  # [B, 1]
        bonus = choice.gather(1, last).squeeze(1).to(torch.int64)
        return acc_idx, acc_len, bonus, max_len


@torch.no_grad()
def record_trained(budgets=(1, 2, 4, 8, 16, 32, 64), n_prompts: int = 4,
                   prompt_tokens: int = 64, max_new_tokens: int = 64, pair=None,
                   progress=print) -> AcceptanceTrace:
    """A trace recorded from the shipped trained pair (greedy, fp32 activations on CPU: the
    lossless mode, so every run emits AR's tokens): held-out prompts, one run per budget."""
    from workbench.generate import generate
    from workbench.train import EOS_ID, TRAINED_DIR, data, load_pair
    from workbench.train.report import decode_mode, heldout_prompts

    pair = Path(pair) if pair else TRAINED_DIR
    target, drafter, tok = load_pair(pair)
    man = pair / "corpus.json"
    manifest = data.load_manifest(man) if man.exists() else None
    prompts = [p["ids"] for p in heldout_prompts(tok, n_prompts, prompt_tokens, manifest)]
    results = {}
    # slack: report.py's workaround for requests that stop inside a path (kept for safety)
    with decode_mode(target, drafter, slack=drafter.cfg.block_size, fp32=True):
        for b in budgets:
            results[b] = generate(target, drafter, prompts, max_new_tokens=max_new_tokens,
                                  budget=b, stop_tokens=[EOS_ID])
            if progress:
                progress(f"budget {b}: tau {results[b].tokens_per_step:.2f} over "
                         f"{len(results[b].accepted)} request-steps")
    src = (f"trained pair ({pair.name}), greedy fp32 on CPU, {n_prompts} held-out prompts of "
           f"{prompt_tokens} tokens, {max_new_tokens} new tokens, stop at eos")
    return AcceptanceTrace.from_results(results, src, {
        "budgets": list(budgets), "n_prompts": n_prompts, "prompt_tokens": prompt_tokens,
        "max_new_tokens": max_new_tokens, "depth": drafter.cfg.block_size - 1,
        "command": "python -m workbench.acceptance record"})


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m workbench.acceptance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record a trace from the shipped trained pair (CPU)")
    r.add_argument("--budgets", default="1,2,4,8,16,32,64")
    r.add_argument("--prompts", type=int, default=4)
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--out", default="traces/acceptance_trained_replay.json")
    g = sub.add_parser("geometric", help="a truncated-geometric trace matched to a given tau")
    g.add_argument("--tau", type=float, required=True)
    g.add_argument("--budget", type=int, default=8)
    g.add_argument("--depth", type=int, default=7)
    g.add_argument("--out", required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.cmd == "record":
        from workbench.traces_io import run_metadata

        t = record_trained([int(x) for x in a.budgets.split(",")], a.prompts,
                           max_new_tokens=a.max_new_tokens)
        t.meta.update(run_metadata("cpu"))
    else:
        t = AcceptanceTrace.from_mean(a.tau, a.budget, a.depth)
    t.save(a.out)
    for b in t.pmf:
        print(f"budget {b}: mean {t.mean(b):.3f}, pmf {[round(x, 3) for x in t.pmf[b]]}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
