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
# # tree_build: the DDTree best-first heap, reference vs the Triton kernel
#
# The drafter gives, per request and per depth d = 1..L, its top-K log-probs. The tree is the
# `budget` best prefixes by factorised probability, popped from a heap keyed on
# `(-score, rank tuple)` with float64 scores (`reference/tree_build.py`). The kernel
# (`kernels/tree_build/`, README there) builds the same tree, every field bit for bit, in one
# GPU launch. On a CPU it runs under the Triton interpreter: right, but slow, and its timings
# say nothing about the GPU.

# %% tags=["parameters"]
BATCH = 2
DEPTH = 4  # L
TOPK = 3  # K
BUDGET = 12
VOCAB = 50
SEED = 0

# %%
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    torch.set_num_threads(1)

import matplotlib

matplotlib.use("Agg")  # headless in CI; JupyterLab shows the figures inline either way
import matplotlib.pyplot as plt

from workbench import ops
from workbench.kernels.tree_build import BEST, register
from workbench.kernels.tree_build.__main__ import FIELDS, tree_mismatches
from workbench.kernels.tree_build.triton_v1 import walk_commit_triton
from workbench.reference.tree_build import build_ddtree, format_tree, topk_logprobs, walk_tree

register()  # the tree_build variants, until workbench.ops registers them itself
build_ddtree_triton = ops.op_spec("tree_build").variant(BEST).load()  # the current best version
print("kernel:", BEST)

device = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(SEED)
logits = torch.randn(BATCH, DEPTH, VOCAB, generator=g) * 2.5  # [B, L, V]
roots = torch.tensor([7, 8][:BATCH])
prefix = torch.tensor([100, 2000][:BATCH])


def trees(budget, k):
    lp, ids = topk_logprobs(logits, k)  # [B, L, K] float32 sorted, int64
    ref = build_ddtree(lp, ids, budget, roots, prefix)
    out = build_ddtree_triton(lp.to(device), ids.to(device), budget, roots.to(device),
                              prefix.to(device))
    return ref, out


ref, out = trees(BUDGET, TOPK)
assert not tree_mismatches(ref, out), tree_mismatches(ref, out)
print(format_tree(out, 0))

# %% [markdown]
# ## Every field, side by side
# Rows are in pop order (best first), so depths interleave; `anc_bits` is the ancestor-or-self
# bitmask the verify attention reads (one int64 word per 64 rows).

# %%
import pandas as pd

b = 0
table = pd.DataFrame({name: getattr(out, name)[b].cpu().tolist() for name in FIELDS
                      if name not in ("node_count", "anc_bits")})
table["anc_bits"] = [format(w[0] & (2**64 - 1), f"0{BUDGET + 1}b")[::-1]
                     for w in out.anc_bits[b].cpu().tolist()]
assert (table.parents[1:] < table.index[1:]).all()  # parents come first
table

# %% [markdown]
# ## Sliders: budget and top-K
# Moving a slider rebuilds both trees, asserts they are identical and redraws request 0.
# K = 1 gives the draft's argmax chain; a budget above the number of prefixes leaves padding.

# %%
import ipywidgets as widgets
from IPython.display import display

out_box = widgets.Output()
budget_slider = widgets.IntSlider(value=BUDGET, min=1, max=24, description="budget")
k_slider = widgets.IntSlider(value=TOPK, min=1, max=6, description="top-K")


def redraw(change=None):
    r, o = trees(budget_slider.value, k_slider.value)
    assert not tree_mismatches(r, o), tree_mismatches(r, o)
    out_box.clear_output()
    with out_box:
        print(format_tree(o, 0))
    return o


budget_slider.observe(redraw, names="value")
k_slider.observe(redraw, names="value")
display(widgets.VBox([budget_slider, k_slider, out_box]))
redraw()
k_slider.value = 1  # what a user's drag does: the chain of rank-0 tokens
assert redraw().parents[0, 1 : DEPTH + 1].tolist() == list(range(DEPTH))
budget_slider.value = 20  # more than the L = 4 nodes a K = 1 table has: padding rows
assert int(redraw().node_count[0]) == DEPTH + 1
k_slider.value = TOPK

# %% [markdown]
# ## Exact ties
# With every log-prob 0.0, all scores tie at 0 and the rank tuples alone order the heap,
# lexicographically: (0,) < (0,0) < (0,0,0) < (0,0,1) < (0,1) < ... < (1,) < (1,0): a prefix
# before its extensions, lower ranks first. The kernel keys each tuple as fixed-position
# 7-bit digits; that is exact because a prefix and its own extension are never in the heap
# together (README.md).

# %%
tie_lp = torch.zeros(1, 3, 2)
tie_ids = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
tie_ref = build_ddtree(tie_lp, tie_ids, 9)
tie_out = build_ddtree_triton(tie_lp.to(device), tie_ids.to(device), 9)
assert not tree_mismatches(tie_ref, tie_out)
assert tie_out.parents[0].tolist() == [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8]
print(format_tree(tie_out))

# %% [markdown]
# ## The greedy walk on the GPU
# The target's choice after each node; the walk follows matching children from the root and
# returns the accepted path, its length (bonus included) and the tokens to emit.

# %%
target = torch.gather(out.tokens, 1, out.first_child.clamp_min(0))  # always take child 1
walk = walk_commit_triton(out, target)
acc, lens, bonus = walk_tree(ref, target.cpu())
assert torch.equal(walk.accepted_indices.cpu(), acc) and torch.equal(walk.accept_lens.cpu(), lens)
print("path", walk.accepted_indices[0].tolist(), "emitted", walk.emitted[0].tolist())

# %% [markdown]
# ## Speed
# With `traces/tree_build.csv` present (the H200 benchmark), its GPU rows are plotted; without
# it, a small CPU timing of the interpreter is shown instead, labelled as such.

# %%
import time
from pathlib import Path

import workbench

csv = Path(workbench.__file__).resolve().parents[1] / "traces" / "tree_build.csv"
fig, ax = plt.subplots(figsize=(6, 3.5))
rows = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
gpu_rows = rows[rows.get("device", pd.Series(dtype=str)) != "cpu"] if len(rows) else rows
if len(gpu_rows):
    dims = gpu_rows.case.str.extract(r"B=(?P<B>\d+) budget=(?P<budget>\d+)").astype(float)
    gpu_rows = gpu_rows.join(dims).dropna(subset=["budget"])
    for (variant, B), grp in gpu_rows.groupby(["variant", "B"]):
        grp = grp.groupby("budget").us.median()
        ax.plot(grp.index, grp.values, marker="o", label=f"{variant} bs {int(B)}")
    ax.set(xscale="log", yscale="log", xlabel="budget", ylabel="µs per build",
           title=f"tree_build on {gpu_rows.gpu.iloc[0] if 'gpu' in gpu_rows else 'GPU'}")
    ax.axhline(15, color="gray", ls=":", label="bar: bs 64 x budget 64")
else:
    budgets, ms = [2, 4, 8, 16], []
    lp, ids = topk_logprobs(logits, 4)
    for n in budgets:
        t0 = time.perf_counter()
        build_ddtree_triton(lp.to(device), ids.to(device), n)
        ms.append((time.perf_counter() - t0) * 1e3)
    assert all(m > 0 for m in ms)
    ax.plot(budgets, ms, marker="o", label=f"bs {BATCH}")
    ax.set(xlabel="budget", ylabel="ms per build",
           title="Triton INTERPRETER on CPU (not GPU performance)")
ax.legend(fontsize=8)
fig.tight_layout()
