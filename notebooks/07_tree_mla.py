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
# # tree_mla: tree-verify attention over the MLA latent cache, reference vs the Triton kernel
#
# Each tree row i of request b attends to the committed prefix [0, P_b) and to the tree slots
# P_b + j of its ancestors-or-self (bit j of `anc_bits[b, i]`). Absorbed MLA makes this MQA
# with one 576-wide latent K per token whose first 512 columns are V. The kernel
# (`kernels/tree_mla/`, README there) runs the cascade: a mask-free split-KV pass over the
# prefix with heads x rows in the M dimension, the small masked tree block, an LSE merge. On a
# CPU it runs under the Triton interpreter (right, slow, no timing meaning).

# %% tags=["parameters"]
HEADS = 4  # H (K2.6: 64; one TP8 rank: 8)
C, R = 32, 8  # latent and rope widths (K2.6: 512, 64); small for the CPU
PREFIX = 700  # committed tokens: two prefix splits of 512 keys
NODES = 12  # N = budget + 1
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

from workbench import ModelConfig, ops
from workbench.kernels.tree_mla import BEST, _common, register
from workbench.ops.cases import tree_mla_cases, tree_mla_roofline
from workbench.reference.tree_mla import pack_anc_bits, tree_mla, unpack_anc_bits, visible_mask

register()
# the version a preset picks here: BEST (Gluon) on an sm_90 GPU, else PORTABLE (interpreter)
KERNEL = ops.resolve_preset({"tree_mla": BEST})["tree_mla"]
tree_mla_triton = ops.op_spec("tree_mla").variant(KERNEL).load()
device = "cuda" if torch.cuda.is_available() else "cpu"
print("kernel:", KERNEL, "on", device)

# %% [markdown]
# ## A tree and its mask
# A random tree of NODES nodes (parent of node i uniform in [0, i)); the ancestor-or-self
# bitmask packs row i's visible tree slots into int64 words.

# %%
g = torch.Generator().manual_seed(SEED)
parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, NODES)]
vis = torch.eye(NODES, dtype=torch.bool)
for i in range(1, NODES):
    vis[i] |= vis[parents[i]]
anc = pack_anc_bits(vis.unsqueeze(0))  # [1, N, W]
assert torch.equal(unpack_anc_bits(anc, NODES)[0], vis)
P = torch.tensor([PREFIX])
full = visible_mask(P, anc, NODES, PREFIX + NODES)[0]  # [N, T]: what each row may read

fig, ax = plt.subplots(1, 2, figsize=(10, 3), gridspec_kw={"width_ratios": [3, 1]})
ax[0].imshow(full[:, PREFIX - 40:], aspect="auto", cmap="Greys", interpolation="nearest")
ax[0].set_title(f"visible slots {PREFIX - 40}..{PREFIX + NODES - 1} (prefix: all visible)")
ax[0].axvline(39.5, color="r")
ax[1].imshow(vis, cmap="Greys", interpolation="nearest")
ax[1].set_title("tree block: ancestor-or-self")
plt.tight_layout()
print("parents:", parents)

# %% [markdown]
# ## Kernel vs reference
# The cache holds NaN past P + N (it must not leak); outputs are compared to the float64
# reference with the op's tolerances.

# %%
T = PREFIX + NODES + 5
cache = torch.randn(1, T, C + R, generator=g).bfloat16()
cache[:, PREFIX + NODES:] = float("nan")
q = torch.randn(1, NODES, HEADS, C + R, generator=g).bfloat16()
scale = ModelConfig.preset("kimi-k2.6").softmax_scale
args = [t.to(device) if isinstance(t, torch.Tensor) else t for t in (q, cache, P, anc, scale, C)]
o, lse = tree_mla_triton(*args)
ref_o, ref_lse = tree_mla(q, cache, P, anc, scale, C)
err = (o.cpu().double() - ref_o.double()).abs()
rel = (err.norm() / ref_o.double().norm()).item()
print(f"o_lat rel err {rel:.2e} (bf16 output rounding ~4e-3), lse max abs err "
      f"{(lse.cpu() - ref_lse).abs().max().item():.2e}")
assert torch.isfinite(o.float()).all() and rel < 1e-2
plt.figure(figsize=(6, 2.5))
plt.imshow(err[0].amax(-1).T, aspect="auto", cmap="viridis")
plt.colorbar(label="max |err| over C")
plt.xlabel("tree row")
plt.ylabel("head")
plt.title("kernel - reference")

# %% [markdown]
# ## The split policy: by prefix length only
# A request's prefix is cut into splits whose length depends on P alone, so a row's result
# never depends on how many rows, heads or requests share the launch.

# %%
for p in (0, 1, 512, 513, 4096, 8192, 8193, 32768, 131072):
    print(f"P={p:>6}: split_len {_common.split_len(p):>5}, splits {_common.num_splits(p):>2}")

# %% [markdown]
# ## Roofline against budget and context (one H200: 796 TFLOP/s bf16, 4.26 TB/s)
# From the harness's roofline model (bytes: latent cache once + q + o; FLOPs: the full
# rectangle). 64 heads: compute-bound at every budget; 8 heads: memory-bound at budget 8.

# %%
PEAK, BW = 796e12, 4.26e12
cfg = ModelConfig.preset("kimi-k2.6")
fig, ax = plt.subplots(figsize=(7, 3.5))
for h, style in ((64, "-"), (8, "--")):
    for ctx in (1024, 8192, 32768):
        xs, ys = [], []
        for budget in (1, 8, 16, 32, 64, 128):
            n = budget + 1
            dims = dict(B=1, N=n, H=h, C=cfg.kv_lora_rank, R=cfg.qk_rope_dim, T=ctx + n,
                        P_sum=ctx, W=(n + 63) // 64)
            rf = tree_mla_roofline(type("C", (), {"dims": dims})())
            xs.append(budget)
            ys.append(max(rf["bytes"] / BW, rf["flops"] / PEAK) * 1e6)
        ax.plot(xs, ys, style, marker="o", label=f"H={h} ctx={ctx}")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("budget")
ax.set_ylabel("floor per layer (us)")
ax.legend(fontsize=7)
ax.set_title("tree_mla physical floor")
assert len(tree_mla_cases("real", 0)) > 0  # the REAL shapes the suite benchmarks

# %% [markdown]
# ## At 8 heads (an EP8 / TP8 rank): what the split policy and the merge cost (H200, sessions 15-17)
# Busy µs of one call (attention + merge, CUDA-graph replay) from
# `scripts/sweep_tree_mla_policy.py`, committed under `traces/gpu/session15/` to `session17/`: shorter parts
# shorten the attention kernel (one CTA's tile chain is the cost), and the merge of more parts
# takes it back (kernels/tree_mla/README.md, "Design (v15, v16)"). Measured, not recomputed.

# %%
import pandas as pd

SWEEPS = {"gluon_v13 (v4's merge)": "session15/call1_sweep_policy_g13_h8.csv",
          "gluon_v13 + v8's merge": "session15/call4_sweep_policy_gluon_v13_c8_h8.csv",
          "triton_v16 (transposed, v8's merge)": "session15/call4_sweep_policy_triton_v16_h8.csv",
          "gluon_v18 (one-round merge)": "session16/call1_sweep_policy_g18_h8.csv",
          "gluon_v19 (v13 + reciprocal)": "session17/call2_sweep_policy_gluon_v19_h8.csv",
          "gluon_v18 + reciprocal": "session17/call2_sweep_policy_gluon_v18_rcp_h8.csv"}
root = os.path.join(os.path.dirname(os.path.abspath(ops.__file__)), "..", "..", "traces", "gpu")
found = {k: os.path.join(root, f) for k, f in SWEEPS.items()
         if os.path.exists(os.path.join(root, f))}
if found:  # a checkout with traces/ (an installed wheel has none)
    fig, axes = plt.subplots(1, len(found), figsize=(4.5 * len(found), 3.2), sharey=True)
    for ax, (name, path) in zip(list(axes) if len(found) > 1 else [axes], found.items()):
        df = pd.read_csv(path)
        for (pol, n), g in df[df.N.isin([1, 17])].groupby(["policy", "N"]):
            ax.plot(g.P, g.busy_us, marker="o", label=f"{pol} N={n}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefix P")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=6)
    (list(axes) if len(found) > 1 else [axes])[0].set_ylabel("busy µs (H = 8)")
else:
    print("no traces/gpu/session15-17 here: the sweep CSVs live in the repository checkout")
