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
# # drafter: the DFlash draft step, reference vs the Triton kernel
#
# One DDTree round runs the drafter once on the block `[bonus, MASK x L]` per request: it
# attends to the block and to its cache of committed context K/V, and the target's LM head
# turns rows 1..L into L per-depth distributions whose top-K feed the tree build
# (`reference/drafter.py`). `kernels/drafter` (BEST: triton_v2) computes the same step with
# Triton kernels (norms fused with the residual adds, RoPE, split-KV GQA attention, SwiGLU
# epilogue, skinny GEMMs at decode row counts, and an LM head fused with log-softmax + top-K
# that never writes the [B·L, V] logits) and cuBLAS bf16 GEMMs. On a CPU it
# runs under the Triton interpreter: right, but slow, and its timings say nothing about a GPU.

# %% tags=["parameters"]
PRESET = "tiny"
CONTEXT = 20  # committed tokens (<= 63 here); the tiny drafter's window is 16
TOPK = 6
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
import pandas as pd

import workbench
from workbench import ops
from workbench.generate import generate
from workbench.kernels.drafter import BEST
from workbench.reference.drafter import build_drafter

device = "cuda" if torch.cuda.is_available() else "cpu"
target = workbench.build_model(PRESET, seed=SEED, device=device)
drafter = build_drafter(target.cfg, seed=SEED, device=device)
dc = drafter.cfg
print(f"drafter: {dc.num_layers} layers, D {dc.hidden_size}, heads {dc.num_heads}/"
      f"{dc.num_kv_heads} x {dc.head_dim}, L = {dc.depth}, window {dc.sliding_window}")

# %% [markdown]
# ## A prompt's context, materialised
# The target runs the prompt once and captures its layers' hidden states; the drafter's
# `drafter_materialize` (a registry op: the reference here; `triton_v1` in the optimized loop,
# inside the DDTree step's CUDA graph) projects them into per-layer context K/V.

# %%
g = torch.Generator().manual_seed(SEED)
prompt = torch.randint(3, target.cfg.vocab_size - 3, (1, CONTEXT), generator=g).to(device)
cache = drafter.new_cache(1, CONTEXT + dc.block_size + 2)
pos = torch.arange(CONTEXT, device=device).view(1, -1)
kv = target.new_cache(1, CONTEXT + 1)
# causal prefill as a tree: row i sees rows 0..i (ancestor bits, one u64 word for <= 64 rows)
anc = torch.tensor([(1 << (i + 1)) - 1 for i in range(CONTEXT)], device=device).view(1, -1, 1)
out = target.forward(prompt, pos, kv, torch.zeros(1, dtype=torch.long, device=device), anc,
                     capture=dc.target_layer_ids)
ops.get("drafter_materialize")(drafter, cache, out.captured, pos,
                               torch.tensor([CONTEXT], device=device))
bonus = out.logits[:, -1].argmax(-1)  # the target's next token = the round's root
start = torch.tensor([CONTEXT], device=device)
print("bonus token", bonus.tolist())

# %% [markdown]
# ## Per-depth draft distributions: reference vs the kernel (BEST)

# %%
ref_lp, ref_ids = ops.get("drafter")(drafter, target, cache, bonus, start, TOPK)
with ops.use(drafter=BEST):
    lp, ids = ops.get("drafter")(drafter, target, cache, bonus, start, TOPK)

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, (name, v) in zip(axes, [("reference (float64 acc.)", ref_lp), (BEST, lp)]):
    im = ax.imshow(v[0].exp().cpu(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set(title=name, xlabel="rank", ylabel="depth - 1")
fig.colorbar(im, ax=axes, label="probability")

agree = (ids == ref_ids).float().mean(-1)[0]  # [L] share of ranks with the same id
table = pd.DataFrame({"depth": range(1, dc.depth + 1),
                      "top-1 ref": ref_ids[0, :, 0].tolist(), "top-1 kernel": ids[0, :, 0].tolist(),
                      "p1 ref": ref_lp[0, :, 0].exp().tolist(),
                      "max |d logprob|": (lp - ref_lp).abs().amax(-1)[0].tolist(),
                      "top-K id agreement": agree.tolist()})
print(table.round(4).to_string(index=False))
# bf16 GEMMs vs the reference's float64 accumulation: log-probs agree to bf16 noise, top-1 ids
# agree wherever the top-2 margin is clear
assert (lp - ref_lp).abs().max() < 0.5
clear = (ref_lp[..., 0] - ref_lp[..., 1]) > 0.5
assert torch.equal(ids[..., 0][clear], ref_ids[..., 0][clear])

# %% [markdown]
# ## Swapped into the decode loop
# DDTree with the kernel drafter emits exactly the autoregressive tokens (lossless), and the same
# tokens as the reference loop.

# %%
prompts = [prompt[0, :8].tolist()]
ar = generate(target, prompts=prompts, max_new_tokens=4)
dd = generate(target, drafter, prompts, max_new_tokens=4, budget=4,
                        kernels={"drafter": BEST})
assert dd.tokens == ar.tokens
print("tokens", dd.tokens[0], "accepted per step", dd.accepted)

# %% [markdown]
# ## Speed
# With `traces/drafter.csv` present (the H200 suite), µs per step of every variant and peer
# against the weight-streaming floor; without it there is nothing meaningful to plot on a CPU.

# %%
from pathlib import Path

csv = Path(workbench.__file__).resolve().parents[1] / "traces" / "drafter.csv"
rows = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
gpu_rows = rows[rows.get("device", pd.Series(dtype=str)) != "cpu"] if len(rows) else rows
if len(gpu_rows):  # per (case, variant) its latest timed row: the grid was measured over
    # several runs (`bench --case LABEL`, sessions 9-10), so the plot mixes runs; compare
    # speed-ups within one run (traces/gpu/session<N>/README.md)
    gpu_rows = (gpu_rows[gpu_rows.us.notna()].sort_values("timestamp")
                .groupby(["case", "variant"]).tail(1))
    order = {c: tuple(int(f.split("=")[1]) for f in c.split()) for c in gpu_rows.case.unique()}
    gpu_rows = gpu_rows.assign(key=gpu_rows.case.map(order)).sort_values("key")
fig, ax = plt.subplots(figsize=(7, 3.5))
if len(gpu_rows):
    cases = list(dict.fromkeys(gpu_rows.case))
    for variant, grp in gpu_rows[gpu_rows.variant != "floor"].groupby("variant"):
        ax.plot([cases.index(c) for c in grp.case], grp.us, marker="o", ls="", label=variant)
    floor = gpu_rows[gpu_rows.variant == "floor"].set_index("case").us.reindex(cases)
    # rows of session 9's calls 4 and 6 past P 2048 carry the floor before its window fix:
    # that session's corrected floors replace them (traces/gpu/session9/README.md)
    fixed = csv.parent / "gpu" / "session9" / "drafter_grid_floors.csv"
    if fixed.exists():
        corr = pd.read_csv(fixed).drop_duplicates("case", keep="last").set_index("case").floor
        floor = corr.reindex(cases).fillna(floor)
    ax.plot(range(len(cases)), floor.values, "k:", label="floor")
    pct = (100 * floor / gpu_rows[gpu_rows.variant == BEST].set_index("case").us).dropna()
    print(f"{BEST}, % of the floor per case:", pct.round(1).to_dict())
    ax.set_xticks(range(len(cases)), cases, fontsize=7)
    ax.set(yscale="log", ylabel="µs per draft step", title="drafter on the GPU")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=8)
else:
    ax.text(0.5, 0.5, "no traces/drafter.csv yet (run scripts/gpu_suite.sh on the H200)",
            ha="center", va="center")
    ax.set_axis_off()
fig.tight_layout()
