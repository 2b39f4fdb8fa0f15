"""Acceptance report of a trained pair: tau per budget, distinct experts per verify step.

For every (temperature, block size, budget) the whole prompt batch is decoded once with
`workbench.generate` (DDTree, the bf16 model as shipped), next to the AR baseline:
  * tau = tokens emitted per live request per step, bonus included (GenerateResult.accepted);
    tau_first64 = the same over the steps that start within the first 64 new tokens (right
    after a prompt the target's continuation is hardest to draft; later it grows more regular);
  * experts = distinct routed experts per MoE layer touched by ONE request's verify forward
    (its tree rows only), averaged over layers, steps and requests. generate's own
    `distinct_experts` counts the whole batch, which saturates at E for a 64-prompt batch, so
    the rows are read here from a forward hook on the target;
  * greedy rows count the requests whose DDTree tokens equal AR's, and give the top-2 logit
    margin at the first divergence of each differing request. In bf16 they can differ: AR and
    verify run the target on different row counts and batch compositions, reductions round
    differently, and a bf16 ulp can flip a near-tie in the top-k ROUTING, which changes that
    token's MoE output by O(1) (hence margins up to ~1 logit). The reference bf16 forward is
    not batch-invariant either: the same request decoded alone and in a batch can differ the
    same way. So the lossless check is run again with fp32 activations and caches (the very
    same weights, INT4 scales untouched): there DDTree must equal AR on every request.
Block size 4 runs the block-8 drafter with 3 masks instead of 7 (not retrained): a cheap look
at how much the horizon matters, labelled as such, greedy and a few budgets only.

`decode_mode(slack=...)` also works around a bug in workbench/generate.py: a request that
finishes inside an accepted path still advances its committed length by the whole path, and
the batch's later verify steps then write its tree rows up to L - 2 slots past the cache
generate allocated (an IndexError on CPU, a device assert on GPU). Extra slots change no token
(nothing reads past a request's own length); drop the slack once generate allocates it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import time
from pathlib import Path

import torch

from . import EOS_ID, TRAINED_DIR, data, load_pair, pair_paths, pair_size_bytes

BUDGETS = (1, 2, 4, 8, 16, 32, 64)
OTHER_BLOCK_BUDGETS = (8,)
EXACT_BUDGETS = (8, 32)
FIRST = 64  # tau_first64


@contextlib.contextmanager
def decode_mode(target, drafter=None, slack: int = 0, fp32: bool = False):
    """Within the block, new_cache allocates `slack` more slots, and with fp32=True the models
    run with fp32 parameters and caches. Only floating parameters are cast (bf16 -> fp32 is
    exact); the INT4 packed weights and their bf16 scales are buffers and stay as they are, so
    every weight keeps its value and only the activations' rounding changes."""
    mods = [m for m in (target, drafter) if m is not None]
    saved = [[(p, p.data) for p in m.parameters()] for m in mods]

    def make(m):
        def new_cache(b, n):
            c = type(m).new_cache(m, b, n + slack)
            if not fp32:
                return c
            return type(c)(*(x.float() for x in c)) if isinstance(c, tuple) else c.float()
        return new_cache

    try:
        for m in mods:
            if fp32:
                for p in m.parameters():
                    p.data = p.data.float()
            m.new_cache = make(m)
        yield
    finally:
        for m, params in zip(mods, saved):
            for p, d in params:
                p.data = d
            m.__dict__.pop("new_cache", None)


class ExpertCounter:
    """Per-request distinct experts of each decode forward (forward hook + generate's on_step),
    and each step's accepted count with the request's emitted length before it."""

    def __init__(self, target, n_requests: int):
        self.routing = None
        self.per_step: list[float] = []
        self.emitted = [1] * n_requests  # the prefill emits the first token
        self.steps: list[tuple[int, int]] = []  # (emitted before the step, accepted)
        self._h = target.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if out.stats.get("routing"):
            self.routing = out.stats["routing"]  # list over MoE layers of [B, N, K]

    def on_step(self, step: dict, cache, prefix) -> None:
        for b, live in enumerate(step["active"]):
            if live:
                n = step["tree_size"][b]
                d = [torch.unique(r[b, :n]).numel() for r in self.routing]
                self.per_step.append(sum(d) / len(d))
                self.steps.append((self.emitted[b], step["accepted"][b]))
                self.emitted[b] += step["accepted"][b]

    def tau_first(self, n: int) -> float:
        acc = [a for start, a in self.steps if start < n]
        return sum(acc) / max(len(acc), 1)

    def close(self):
        self._h.remove()


def heldout_prompts(tok, n: int, prompt_tokens: int, manifest: dict | None):
    files = data.read_split("heldout", manifest)
    prompts = data.function_prompts(tok, files, n, prompt_tokens)
    if len(prompts) < n:
        raise RuntimeError(f"held-out prompts: wanted {n}, found {len(prompts)} in "
                           f"{len(files)} held-out files")
    return prompts


@torch.no_grad()
def divergence_margin(target, prompt, a, b) -> float:
    """Top-2 logit margin of the target after prompt + a[:i], i = first index a and b differ."""
    from workbench.reference.tree_mla import causal_anc_bits

    i = next(j for j, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y)
    seq = list(prompt) + list(a[:i])
    n, dev = len(seq), target.device
    out = target(torch.tensor([seq], device=dev), torch.arange(n, device=dev).view(1, -1),
                 target.new_cache(1, n), torch.zeros(1, dtype=torch.long, device=dev),
                 causal_anc_bits(n, device=dev))
    top = out.logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def _equality(target, prompts, ar, res, max_margins: int = 8) -> dict:
    eq = [x == y for x, y in zip(ar.tokens, res.tokens)]
    bad = [b for b, e in enumerate(eq) if not e][:max_margins]
    margins = [divergence_margin(target, prompts[b], ar.tokens[b], res.tokens[b]) for b in bad]
    return {"tokens_equal_ar": all(eq), "requests_equal": sum(eq),
            "max_margin_at_divergence": round(max(margins), 4) if margins else ""}


def _run(target, drafter, prompts, max_new, budget, temperature, seed, fp32=False):
    from workbench.generate import generate

    counter = ExpertCounter(target, len(prompts))
    slack = 2 * (drafter.cfg.block_size if drafter is not None else 1)
    t0 = time.perf_counter()
    try:
        with decode_mode(target, drafter, slack, fp32):
            res = generate(target, drafter, prompts, max_new_tokens=max_new, budget=budget,
                           temperature=temperature, seed=seed, stop_tokens=[EOS_ID],
                           on_step=counter.on_step)
    finally:
        counter.close()
    wall = time.perf_counter() - t0
    ex = counter.per_step
    return res, {"precision": "fp32" if fp32 else "bf16", "tau": round(res.tokens_per_step, 4),
                 f"tau_first{FIRST}": round(counter.tau_first(FIRST), 4),
                 "steps": len(res.steps), "tokens": sum(map(len, res.tokens)),
                 "experts_per_layer": round(sum(ex) / max(len(ex), 1), 2),
                 "experts_per_layer_max": round(max(ex, default=0), 2), "wall_s": round(wall, 2)}


def acceptance_report(pair_dir=TRAINED_DIR, csv_path="traces/acceptance_trained.csv",
                      md_path="traces/acceptance_trained.md", n_prompts: int = 64,
                      prompt_tokens: int = 64, max_new: int = 128, budgets=BUDGETS,
                      temperatures=(0.0, 1.0), other_blocks=(4,),
                      other_block_budgets=OTHER_BLOCK_BUDGETS, exact_budgets=EXACT_BUDGETS,
                      exact_max_new: int = 64, device: str = "cpu", seed: int = 0,
                      progress: bool = True):
    """Decode held-out prompts with the pair; write CSV + markdown; return the DataFrame.

    bf16 (as shipped): every budget at each temperature with the trained block size; the
    `other_blocks` greedy at `other_block_budgets`. fp32 activations: AR vs DDTree at
    `exact_budgets` with `exact_max_new` tokens (the lossless check)."""
    import pandas as pd
    from tqdm.auto import tqdm

    target, drafter, tok = load_pair(pair_dir, device=device)
    mpath = pair_paths(pair_dir)["manifest"]
    manifest = data.load_manifest(mpath) if mpath.exists() else None
    prompts = heldout_prompts(tok, n_prompts, prompt_tokens, manifest)
    ids = [p["ids"] for p in prompts]
    none = {"tokens_equal_ar": "", "requests_equal": "", "max_margin_at_divergence": ""}
    base_cfg = drafter.cfg
    bs = base_cfg.block_size
    grid = [(t, bs, b, False) for t in temperatures for b in budgets]
    grid += [(0.0, o, b, False) for o in other_blocks for b in other_block_budgets]
    grid += [(0.0, bs, b, True) for b in exact_budgets]
    rows, ar = [], {}
    for fp32, n_new in ((False, max_new), (True, exact_max_new)):
        if fp32 and not exact_budgets:
            continue
        ar[fp32], row = _run(target, None, ids, n_new, None, 0.0, seed, fp32)
        rows.append({"temperature": 0.0, "block_size": 0, "budget": 0, "mode": "ar", **row,
                     "max_new": n_new, "tokens_equal_ar": True, "requests_equal": len(ids),
                     "max_margin_at_divergence": ""})
    for t, bsz, b, fp32 in tqdm(grid, desc="acceptance", disable=not progress):
        n_new = exact_max_new if fp32 else max_new
        drafter.cfg = dataclasses.replace(base_cfg, block_size=bsz)
        try:
            res, row = _run(target, drafter, ids, n_new, b, t, seed, fp32)
        finally:
            drafter.cfg = base_cfg
        eq = _equality(target, ids, ar[fp32], res) if t == 0 else none
        rows.append({"temperature": t, "block_size": bsz, "budget": b, "mode": "ddtree", **row,
                     "max_new": n_new, **eq})
    df = pd.DataFrame(rows)
    meta = {"prompts": len(ids), "prompt_tokens": prompt_tokens, "max_new_tokens": max_new,
            "pair_mb": round(pair_size_bytes(pair_dir) / 1e6, 2),
            "python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "corpus_python": manifest["python"] if manifest else "this interpreter",
            "files": len({p["path"] for p in prompts})}
    sample = data.decode(tok, ids[0]) + "⟨|⟩" + data.decode(tok, ar[False].tokens[0])
    if csv_path:
        Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(csv_path, index=False)
    if md_path:
        Path(md_path).write_text(to_markdown(df, meta, sample))
    return df


def _eq_cell(r, n: int) -> str:
    import pandas as pd

    if r["requests_equal"] == "" or pd.isna(r["requests_equal"]):
        return ""
    cell = f"{int(r['requests_equal'])}/{n}"
    m = r["max_margin_at_divergence"]
    if m != "" and not pd.isna(m):
        cell += f" ({float(m):.3f})"
    return cell


def to_markdown(df, meta: dict, sample: str) -> str:
    n = meta["prompts"]
    ar = df[(df["mode"] == "ar") & (df["precision"] == "bf16")].iloc[0]
    lines = ["# Acceptance of the trained pair (workbench/assets/trained)", "",
             f"{n} held-out prompts (the first {meta['prompt_tokens']} tokens of a function of a "
             f"held-out stdlib file; {meta['files']} files), {meta['max_new_tokens']} new tokens "
             f"each, stop at <|eos|>; pair {meta['pair_mb']} MB; corpus of Python "
             f"{meta['corpus_python']}; run on {meta['device']}, Python {meta['python']}, torch "
             f"{meta['torch']}. Written by `python -m workbench.train report`.", "",
             f"tau: tokens per step per request, bonus included; tau first {FIRST}: over the "
             f"steps that start within the first {FIRST} new tokens; experts: distinct routed "
             "experts per MoE layer touched by one request's verify forward (mean, max); "
             "requests = AR: requests whose greedy tokens equal AR's (largest top-2 logit margin "
             "at a first divergence). See workbench/train/report.py for why bf16 runs can "
             f"differ. AR: tau 1, {ar['experts_per_layer']} experts per layer per step.", ""]
    sections = []
    dd = df[df["mode"] == "ddtree"]
    bs = int(dd["block_size"].max())
    for t in sorted(dd["temperature"].unique()):
        label = "greedy" if t == 0 else f"temperature {t:g}"
        sections.append((f"{label}, block size {bs}, bf16 (as shipped)",
                         dd[(dd["temperature"] == t) & (dd["block_size"] == bs)
                            & (dd["precision"] == "bf16")]))
    for o in sorted(set(dd["block_size"]) - {bs}):
        sections.append((f"greedy, block size {o} (the block-{bs} drafter run with {o - 1} "
                         "masks, not retrained), bf16", dd[dd["block_size"] == o]))
    exact = dd[dd["precision"] == "fp32"]
    if len(exact):
        sections.append((f"lossless check: greedy, fp32 activations, same weights, "
                         f"{int(exact['max_new'].iloc[0])} new tokens", exact))
    for title, sub in sections:
        lines += [f"## {title}", "",
                  f"| budget | tau | tau first {FIRST} | steps | experts/layer | max | "
                  "requests = AR | s |", "|---:|---:|---:|---:|---:|---:|:---:|---:|"]
        for _, r in sub.iterrows():
            lines.append(f"| {r['budget']} | {r['tau']:.2f} | {r[f'tau_first{FIRST}']:.2f} | "
                         f"{r['steps']} | {r['experts_per_layer']:.1f} | "
                         f"{r['experts_per_layer_max']:.0f} | {_eq_cell(r, n)} | "
                         f"{r['wall_s']:.1f} |")
        lines.append("")
    lines += ["## A sample (prompt ⟨|⟩ greedy continuation)", "", "```python", sample, "```", ""]
    return "\n".join(lines)
