# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Quickstart: AR vs DDTree on the tiny Kimi K2.6 model
#
# Build the `tiny` preset (every structural feature of Kimi K2.6 at toy widths), decode a batch
# autoregressively and with DDTree, check the tokens are identical, then look at a tree and at
# accepted lengths. Runs the same on CPU and GPU.

# %% tags=["parameters"]
PRESET = "tiny"
BUDGET = 8
MAX_NEW_TOKENS = 24
SEED = 0

# %%
import matplotlib

matplotlib.use("Agg")  # headless in CI; JupyterLab shows the figures inline either way
import matplotlib.pyplot as plt
import torch

import workbench
from workbench.generate import generate
from workbench.reference.drafter import build_drafter
from workbench.reference.tree_build import format_tree
from workbench.replay import ReplayDrafter

device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":
    torch.set_num_threads(1)  # toy shapes are latency-bound
target = workbench.build_model(PRESET, seed=SEED, device=device)
drafter = build_drafter(target.cfg, seed=SEED, device=device)
cfg = target.cfg
prompts = [[5, 6, 7, 8], list(range(20, 37)), [101, 102, 103]]
print(cfg.name, cfg.num_layers, "layers;", cfg.n_routed_experts, "experts; vocab", cfg.vocab_size)

# %% [markdown]
# ## AR and DDTree emit the same tokens
# The random-weight DFlash drafter agrees with the random target about as often as chance, so
# its trees are mostly rejected after the root: acceptance near 1 is the honest number here.

# %%
ar = generate(target, prompts=prompts, max_new_tokens=MAX_NEW_TOKENS)
dd = generate(target, drafter, prompts, max_new_tokens=MAX_NEW_TOKENS, budget=BUDGET)
assert dd.tokens == ar.tokens, "DDTree must be lossless"
print(f"AR {len(ar.steps)} steps; DDTree {len(dd.steps)} steps, {dd.tokens_per_step:.2f} tokens/step")

# %% [markdown]
# ## Acceptance replay (labelled)
# A `ReplayDrafter` plants the target's own greedy continuation at random ranks of its top-K,
# so multi-token paths are accepted, walked and committed, still token-exact.

# %%
seqs = [p + t for p, t in zip(prompts, ar.tokens)]
rows = []
for budget in (1, 2, 4, 8, 16, 32):
    rep = ReplayDrafter(cfg, seqs, hit_prob=0.8, seed=SEED)
    r = generate(target, rep, prompts, max_new_tokens=MAX_NEW_TOKENS, budget=budget)
    assert r.tokens == ar.tokens
    rows.append({"budget": budget, "tokens_per_step": r.tokens_per_step, "steps": len(r.steps)})
import pandas as pd

sweep = pd.DataFrame(rows)
sweep

# %%
fig, ax = plt.subplots(1, 2, figsize=(9, 3))
ax[0].plot(sweep.budget, sweep.tokens_per_step, marker="o")
ax[0].set(xscale="log", xlabel="budget", ylabel="tokens / step (replay)", title="τ vs budget")
replay8 = generate(target, ReplayDrafter(cfg, seqs, hit_prob=0.8, seed=SEED), prompts,
                   max_new_tokens=MAX_NEW_TOKENS, budget=8)
pd.Series(replay8.accepted).value_counts().sort_index().plot.bar(ax=ax[1])
ax[1].set(xlabel="accepted tokens per step (bonus incl.)", ylabel="steps", title="budget 8")
fig.tight_layout()
assert sweep.tokens_per_step.max() > 1.5

# %% [markdown]
# ## The first step's tree, with a budget slider

# %%
import ipywidgets as widgets
from IPython.display import display

out = widgets.Output()
slider = widgets.IntSlider(value=BUDGET, min=1, max=64, description="budget")


def show(change=None):
    r = generate(target, ReplayDrafter(cfg, seqs, hit_prob=0.8, seed=SEED), prompts[:1],
                 max_new_tokens=4, budget=slider.value)
    out.clear_output()
    with out:
        print(format_tree(r.first_tree, 0))
    return r.first_tree


slider.observe(show, names="value")
display(widgets.VBox([slider, out]))
tree = show()
slider.value = 16  # what a user's drag does; the callback redraws
assert int(show().node_count[0]) == 17
