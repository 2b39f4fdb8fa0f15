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
# # int4_moe: routed experts in INT4 (W4A16), reference vs the Triton kernel
#
# One MoE layer's routed experts: for each token t and slot j < K,
# `y[t] += w[t, j] * down(silu(gate x) * up x)` of expert `ids[t, j]`, with weights stored as
# INT4 (group 32, bf16 scales; `reference/int4.py`). Decode is bound by streaming the touched
# experts' weights (24.77 MB each at Kimi shapes), so the question per T is how many experts a
# step touches and how close the kernel gets to the copy bandwidth on those bytes.
# `kernels/int4_moe/` (README there) builds the routing metadata on the GPU (no host sync), fuses
# the dequant into both GEMMs and sums the K slots in a fixed order. On a CPU the kernel runs
# under the Triton interpreter: right, but slow, and its timings say nothing about the GPU.

# %% tags=["parameters"]
T = 24  # tokens
E = 16  # experts
K = 4  # top-k
D = 64  # hidden
I = 32  # expert FFN width
SKEW = 1.2  # hot experts: P(expert e) ~ (e + 1)^-SKEW
SEED = 0
VARIANT = "triton_v1"

# %%
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    torch.set_num_threads(1)

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless in CI; JupyterLab shows the figures inline either way
import matplotlib.pyplot as plt
import pandas as pd

import workbench
from workbench import ops
from workbench.kernels.int4_moe._common import dequant_triton
from workbench.reference.int4 import dequant_int4_g32, pack_int4, quantize_int4_g32
from workbench.reference.int4_moe import Int4Experts, int4_moe

dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(device=dev).manual_seed(SEED)

# %% [markdown]
# ## Routing: uniform vs skewed
# Top-K experts per token, distinct within a row. Uniform routing touches the most experts for a
# given T (the byte-worst case); real routers are skewed.

# %%
def route(skew):
    p = (torch.arange(E, device=dev, dtype=torch.float32) + 1) ** -skew
    ids = torch.multinomial(p.expand(T, E), K, replacement=False, generator=g)
    w = torch.rand(T, K, device=dev, generator=g) + 0.05
    return ids, w / w.sum(-1, keepdim=True) * 2.827


routes = {"uniform": route(0.0), "skewed": route(SKEW)}
fig, ax = plt.subplots(figsize=(6, 3))
for name, (ids, _) in routes.items():
    ax.bar(torch.arange(E) + (0.2 if name == "skewed" else -0.2),
           torch.bincount(ids.flatten().cpu(), minlength=E), width=0.4, label=name)
ax.set_xlabel("expert")
ax.set_ylabel("slots routed")
ax.legend()
for name, (ids, _) in routes.items():
    print(f"{name}: {ids.unique().numel()} of {E} experts touched")

# %% [markdown]
# ## Dequant: the kernel's path equals reference/int4.py bit for bit
# W = bf16((nibble - 8) * scale): the product is exact in fp32, the one rounding is to bf16.

# %%
w_float = torch.randn(48, 128, device=dev, generator=g)
q, s = quantize_int4_g32(w_float)
packed = pack_int4(q)
w_ref = dequant_int4_g32(packed, s)
w_ker = dequant_triton(packed, s)
assert torch.equal(w_ker.view(torch.int16), w_ref.view(torch.int16))
print("dequant bitwise equal; quantisation error RMS",
      f"{(w_ref.float() - w_float).pow(2).mean().sqrt():.4f} of weight RMS "
      f"{w_float.pow(2).mean().sqrt():.4f}")

# %% [markdown]
# ## Reference vs kernel
# Same inputs; the error is measured against the float64 reference in units of its RMS (the
# harness tolerance: `workbench.ops.cases.tolerance`).

# %%
def experts():
    def proj(o, i):
        packed = torch.randint(-(2**31), 2**31, (E, o, i // 8), device=dev, generator=g,
                               dtype=torch.int32)
        scale = (i**-0.5 / 4.64) * (1 + 0.1 * torch.rand(E, o, i // 32, device=dev, generator=g))
        return packed, scale.bfloat16()

    return Int4Experts(*proj(I, D), *proj(I, D), *proj(D, I))


ex = experts()
x = torch.randn(T, D, device=dev, generator=g).bfloat16()
rows = []
for name, (ids, w) in routes.items():
    ref = int4_moe(x, ids, w, ex)
    with ops.use(int4_moe=VARIANT):
        out = ops.get("int4_moe")(x, ids, w, ex)
    err = (out.double() - ref.double()).abs()
    rows.append({"routing": name, "max_abs / rms(ref)": (err.max() / ref.double().pow(2).mean()
                                                          .sqrt()).item(),
                 "rel_err": (err.norm() / ref.double().norm()).item()})
    assert (err <= 0.0079 * ref.double().abs() + 0.05 * ref.double().pow(2).mean().sqrt()).all()
pd.DataFrame(rows)

# %% [markdown]
# ## Bandwidth vs T against the floor and the peers, one run
# Effective GB/s on touched-expert bytes against the copy-bandwidth floor and the peers, from
# `traces/int4_moe.csv` (written by `python -m workbench bench int4_moe --shapes real
# --variants ... --peers humming` on the GPU), uniform routing on the left and the bench's
# skewed routing (Zipf 1.2) on the right. The rows are those of ONE run (its command on one
# card, within the hour it started), so every line was measured beside the others (the file
# keeps every run, from H200s and H100s alike): of the BEST version's REAL runs the one with
# the most cases (a knob A/B on a few `--case`s, session 57, is not the table), then the
# latest; the BEST version drawn thick, the card in the title. A BEST whose changes reach only
# an EP rank's hinted calls (cuda_v17, cuda_v18: the REAL bench's unhinted calls run cuda_v16's
# launches) has no REAL run of its own: the latest widest REAL run stands in, its versions
# named in the legend. Without that file the plot shows the H200's floor.

# %%
from workbench.kernels.int4_moe import BEST

csv = Path(workbench.__file__).resolve().parents[1] / "traces" / "int4_moe.csv"
bench = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
if not bench.empty:  # the run: the BEST version's latest REAL bench, all its rows
    real = bench[(bench["ok"] != False) & (bench["device"] != "cpu")  # noqa: E712
                 & bench["case"].str.contains("E=384")]
    mine = real[real["variant"] == BEST]
    # a run = one command on one card within its hour; the widest one (most REAL cases), then
    # the latest: a knob A/B on three cases (`--case ...`, session 57) is not the table
    runs = (mine if not mine.empty else real).assign(hour=lambda d: d["timestamp"].str[:13])
    width = runs.groupby(["command", "gpu", "hour"])["case"].transform("nunique")
    last = runs.assign(width=width).sort_values(["width", "timestamp"]).iloc[-1]
    run = real[(real["command"] == last["command"]) & (real["gpu"] == last["gpu"])
               & (real["timestamp"].str[:13] == last["hour"])]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for ax, routing in zip(axes, ("uniform", "skewed")):
    if not bench.empty:
        sel = run[run["case"].str.endswith(routing)].copy()
        sel["T"] = sel["case"].str.extract(r"T=(\d+)").astype(int)
        ax.set_title(f"{routing} routing, {last['gpu']}", fontsize=9)
        for variant, grp in sel.groupby("variant"):
            if variant == "reference":
                continue
            grp = grp.groupby("T")["GB/s"].median()
            ax.plot(grp.index, grp.values, marker="o", label=variant,
                    lw=3 if variant == BEST else 1, ls="--" if variant == "floor" else "-")
    else:
        ts = [1, 9, 17, 33, 65, 128, 512]
        ax.plot(ts, [4260.0] * len(ts), label="floor: measured H200 copy bandwidth")
        ax.set_title(f"{routing} routing", fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("T tokens")
    ax.legend(fontsize=6, ncol=2)
axes[0].set_ylabel("GB/s on touched-expert bytes")

# %% [markdown]
# ## T 1's weight stream alone (H200, session 17)
# `scripts/probe_int4_stream.py` walks each program's K loop as the kernels do (TMA word and
# scale boxes, or cp.async pointers) and only xor-folds what it loaded: how fast the grid, box,
# warps and stages can stream T 1's bytes with no arithmetic. The kernels' GEMMs take
# 68.4 µs on the grids that stream in 34.3 + 18.9 µs (kernels/int4_moe/README.md). Measured,
# from `traces/gpu/session17/call3_probe_int4_stream.csv`; skipped without the checkout.

# %%
probe = Path(workbench.__file__).resolve().parents[1] / "traces" / "gpu" / "session17" / \
    "call3_probe_int4_stream.csv"
if probe.exists():
    pr = pd.read_csv(probe)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    for ax, (matrix, grp) in zip(axes, pr.groupby("matrix", sort=False)):
        for (loader, boxw), g in grp.groupby(["loader", "BOXW"]):
            ax.scatter(g["programs"], g["pct_copy"], s=12 * g["stages"],
                       marker="o" if loader == "tma" else "x",
                       label=f"{loader}, {boxw}-word box (size: stages)")
        v18 = grp[(grp.loader == "tma") & (grp.BN == 128) & (grp.BOXW == 32)
                  & (grp.warps == 4) & (grp.stages == 3) & (grp.KS == 1)]
        ax.scatter(v18["programs"], v18["pct_copy"], s=120, facecolors="none",
                   edgecolors="k", label="the kernels' grid")
        ax.set_xscale("log")
        ax.set_xlabel("programs")
        ax.set_title(f"{matrix} ({grp['bytes'].iloc[0] / 1e6:.1f} MB)", fontsize=9)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("% of copy bandwidth")
else:
    print("no traces/gpu/session17 here: the probe's CSV lives in the repository checkout")
