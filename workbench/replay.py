"""Replay drafters: real tree shapes and acceptance without a trained drafter (clearly labelled).

A random drafter agrees with a random target about as often as chance, so every DDTree step
would accept only the bonus and the commit of a multi-token path would never run. A replay
drafter knows the target's own greedy continuation (recorded from an AR run) and places the
true next token at depth d at a random rank of its top-K list (or leaves it out), so the tree,
the walk and the commit see realistic accepted lengths. It does not change what the target
emits: DDTree stays lossless whatever the draft, which is exactly what the tests check.

Used by tests, the demo's "acceptance replay" line and benchmarks at real shapes.
"""

from __future__ import annotations

import torch

from workbench.config import ModelConfig


class ReplayDrafter:
    """Drafts from a recorded continuation: `sequences[b]` = prompt + AR tokens of request b.

    hit_prob: chance that the true token is in the top-K at a depth (given its parent was);
    rank_weights: relative odds of the ranks it lands on (rank 0 most likely by default).
    """

    label = "replay"

    def __init__(self, cfg: ModelConfig, sequences: list[list[int]], hit_prob: float = 0.8,
                 rank_weights=(0.7, 0.2, 0.1), seed: int = 0):
        if not 0.0 <= hit_prob <= 1.0:
            raise ValueError(f"hit_prob: expected a probability in [0, 1], got {hit_prob}")
        self.cfg = cfg.drafter
        self.capture_layers = ()  # needs no target hidden states
        self.vocab = cfg.vocab_size
        self.sequences = [list(s) for s in sequences]
        self.hit_prob = hit_prob
        self.rank_weights = torch.tensor(rank_weights, dtype=torch.float64)
        self.seed = seed
        self.g = torch.Generator().manual_seed(seed)

    # the decode loop's drafter interface -----------------------------------------------
    def new_cache(self, batch: int, max_len: int):
        """Called once per loop: the draws restart from `seed`, so a loop run twice (a routing
        trace replaying a divergent run: workbench.route_trace) drafts the same trees."""
        self.g.manual_seed(self.seed)
        return None

    def materialize(self, cache, target_hidden, positions, count) -> None:
        return None

    def draft_override(self, drafter, target, cache, bonus, start, k):
        """(logprobs fp32 [B, L, k], ids int64 [B, L, k]) with the truth at random ranks."""
        B, L = bonus.shape[0], self.cfg.depth
        k = min(k, self.vocab)
        lp = torch.empty(B, L, k, dtype=torch.float32)
        ids = torch.empty(B, L, k, dtype=torch.long)
        for b in range(B):
            seq, P = self.sequences[b], int(start[b])
            alive = True  # the truth at depth d only matters if depths < d held it too
            for d in range(L):
                pos = P + 1 + d
                truth = seq[pos] if pos < len(seq) else None
                cand = torch.randperm(self.vocab, generator=self.g)[: k + 1].tolist()
                row = [t for t in cand if t != truth][:k]
                hit = alive and truth is not None and torch.rand(1, generator=self.g) < self.hit_prob
                if hit:
                    w = self.rank_weights[: k]
                    r = int(torch.multinomial(w / w.sum(), 1, generator=self.g))
                    row[r] = truth
                alive = bool(hit)
                ids[b, d] = torch.tensor(row)
                # peaked, strictly decreasing log-probs with an occasional exact tie
                gaps = torch.rand(k, generator=self.g) * 2.0
                gaps[torch.rand(k, generator=self.g) < 0.1] = 0.0
                lp[b, d] = -0.05 - torch.cumsum(gaps, 0)
        return lp.to(bonus.device), ids.to(bonus.device)


def record_continuations(target, prompts, max_new_tokens, **kw) -> list[list[int]]:
    """prompt + greedy AR continuation per request: what a ReplayDrafter replays."""
    from workbench.generate import generate

    res = generate(target, prompts=prompts, max_new_tokens=max_new_tokens, **kw)
    return [list(p) + t for p, t in zip(prompts, res.tokens)]
