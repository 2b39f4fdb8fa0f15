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
# # The decode loop on 8 ranks: TP8, EP8 and EP4xTP2, token for token
#
# Launch the DDTree loop on 8 ranks (gloo processes on CPU, NCCL where 8 GPUs exist), compare
# its tokens with the single-process loop for three layouts, look at per-rank time, the price
# of the replicated latent cache, and the single-rank emulation's projection of 8-GPU
# tokens/s (at toy size here; `python -m workbench.dist.emulate --preset kimi-k2.6` on an H200
# for real numbers).

# %% tags=["parameters"]
PRESET = "tiny-dist"  # tiny widened so every layout up to 8 ranks divides it
WORLD = 8
LAYOUTS = [{"tp": 8}, {"ep": 8}, {"ep": 4, "tp": 2}]
BUDGET = 8
MAX_NEW_TOKENS = 12
SEED = 0

# %%
import pandas as pd
import torch

import workbench
from workbench.dist.decode import dist_config, dist_generate
from workbench.dist.launch import run_distributed
from workbench.dist.layout import latent_cache_bytes
from workbench.generate import generate
from workbench.replay import ReplayDrafter

gpus = torch.cuda.device_count()
backend = "nccl" if gpus >= WORLD else "gloo"
torch.set_num_threads(1)  # toy shapes are latency-bound
cfg = dist_config(PRESET)
prompts = [[5, 6, 7, 8], list(range(20, 37)), [101, 102, 103]]  # mixed lengths
target = workbench.build_model(cfg, seed=SEED)
ar = generate(target, prompts=prompts, max_new_tokens=MAX_NEW_TOKENS)
seqs = [p + t for p, t in zip(prompts, ar.tokens)]
ref = generate(target, ReplayDrafter(cfg, seqs, hit_prob=0.8, seed=SEED), prompts,
               max_new_tokens=MAX_NEW_TOKENS, budget=BUDGET)
assert ref.tokens == ar.tokens
print(f"{backend} on {WORLD} ranks; single-process DDTree (replay drafter, labelled): "
      f"{len(ref.steps)} steps, {ref.tokens_per_step:.2f} tokens/step")

# %% [markdown]
# ## Eight ranks emit the single-process tokens
# Each rank runs the unchanged `generate()` on its shard; host decisions read all-gathered
# logits, so the ranks stay in lockstep. On CPU the reductions are *exact* (whole dot products,
# `workbench/dist/layout.py`), which makes the comparison token-exact rather than
# "up to reduction order".

# %%
runs = {}
for layout in LAYOUTS:
    out = run_distributed(dist_generate, WORLD, cfg, prompts, budget=BUDGET, drafter="replay",
                          replay=seqs, replay_seed=SEED, max_new_tokens=MAX_NEW_TOKENS,
                          backend=backend, timeout_s=120, **layout)
    assert out["result"].tokens == ar.tokens, out["layout"]
    assert out["result"].accepted == ref.accepted  # same trees, same walks
    runs[out["layout"]] = out
print("token-exact:", list(runs))

# %% [markdown]
# ## Per-rank time
# Compute per phase and time inside collectives, per rank. On a 2-core CPU box 8 processes
# share the cores, so communication (mostly waiting for the slowest rank) dominates; the
# split, not the totals, is what carries over to GPUs.

# %%
rows = [{"layout": name, **r} for name, out in runs.items() for r in out["ranks"]]
timing = pd.DataFrame(rows)[["layout", "rank", "decode_s", "attention_s", "moe_s", "lm_head_s",
                              "comm_s", "comm_calls", "comm_bytes"]]
assert (timing.comm_calls > 0).all() and len(timing) == WORLD * len(LAYOUTS)
timing.groupby("layout")[["decode_s", "attention_s", "moe_s", "lm_head_s", "comm_s"]].mean()

# %%
timing[timing.layout == next(iter(runs))]

# %% [markdown]
# ## The replicated latent cache
# MLA has one latent KV head, so attention TP cannot split the cache: every rank holds all of
# it. Measured here (the tensor `generate()` allocated), then the same formula at K2.6 size.

# %%
out = next(iter(runs.values()))
per_rank = out["cache_bytes_per_rank"]
assert all(r["cache_bytes"] == per_rank for r in out["ranks"])
k26 = workbench.ModelConfig.preset("kimi-k2.6")
per_tok = latent_cache_bytes(k26, 1, 1)
assert per_tok == 61 * 576 * 2
pd.DataFrame([
    {"what": f"{PRESET}, this run", "per rank MB": per_rank / 1e6,
     f"x{WORLD} ranks MB": WORLD * per_rank / 1e6},
    {"what": "kimi-k2.6, 1 token", "per rank MB": per_tok / 1e6,
     f"x{WORLD} ranks MB": WORLD * per_tok / 1e6},
    {"what": "kimi-k2.6, C=64 x 32k ctx", "per rank MB": 64 * 32768 * per_tok / 1e6,
     f"x{WORLD} ranks MB": WORLD * 64 * 32768 * per_tok / 1e6},
])

# %% [markdown]
# ## The drafter: replicated, or split like the attention
# By default every rank holds the whole DFlash drafter (only its LM head is vocab-parallel):
# at K2.6 size its layers and fc are ~7 GB that each rank reads on every draft. With
# `drafter_layout="tp"` (`workbench/dist/drafter.py`) a rank holds 1/8 of its q heads, MLP
# width and fc outputs (its 2 KV heads replicated over 4 ranks each here), the o_proj / down
# outputs are reduced across ranks and fc's gathered: the exact layout drafts what the
# replicated drafter drafts, so the trees, walks and accepted lengths are the same.

# %%
dflash = {}
for how in ("replicated", "tp"):
    out = run_distributed(dist_generate, WORLD, cfg, prompts, budget=BUDGET, drafter="dflash",
                          drafter_layout=how, max_new_tokens=MAX_NEW_TOKENS, backend=backend,
                          timeout_s=120, ep=WORLD)
    assert out["result"].tokens == ar.tokens
    dflash[how] = out
assert dflash["tp"]["result"].accepted == dflash["replicated"]["result"].accepted
from workbench.dist.drafter import shard_drafter  # noqa: E402
from workbench.dist.layout import Layout  # noqa: E402
from workbench.reference.drafter import empty_drafter  # noqa: E402

k26_drafter = empty_drafter(k26.drafter, "meta")  # shapes only
k26_shard = shard_drafter(k26_drafter, Layout.make(WORLD, 0, ep=WORLD))
gb = lambda m: sum(t.numel() * t.element_size() for t in m.parameters()) / 1e9  # noqa: E731
assert gb(k26_shard) < gb(k26_drafter) / 4
pd.DataFrame([{"drafter": how, "collectives a rank": o["ranks"][0]["comm_calls"],
               "draft_s rank 0": o["ranks"][0].get("draft_s", float("nan")),
               "K2.6 drafter GB a rank": gb(k26_drafter if how == "replicated" else k26_shard)}
              for how, o in dflash.items()])

# %% [markdown]
# ## Single-rank emulation: projected 8-GPU tokens/s
# Rank 0's real work per step, collectives replaced by stand-ins priced over NVLink 4 and
# PCIe Gen5 (`workbench/dist/emulate.py` states the model). At toy size on a CPU the compute
# column is meaningless; the table's shape and the comm accounting are what this shows.

# %%
from workbench.dist.emulate import emulate

proj = pd.DataFrame(emulate(PRESET, ("tp8", "ep8"), batches=(1, 8), budgets=(None, BUDGET),
                            tau=ref.tokens_per_step, ctx=64, repeats=1, progress=None))
assert (proj.step_ms > proj.compute_ms).all()
nv, pc = proj[proj.link == "NVLink4"], proj[proj.link == "PCIe5x16"]
assert (pc.comm_ms.values > nv.comm_ms.values).all()  # same bytes, slower link
proj.pivot_table(index=["C", "mode"], columns=["layout", "link"], values="tokens_per_s")

# %% [markdown]
# ## The H200 runs at full size
# The same emulation at `kimi-k2.6` size on one H200: AR and budgets 8, 16 in
# `traces/emulate_engine.csv` (session 2), budget 32 in `traces/emulate_engine_b32.csv` (session
# 3, newer kernels; commands and reading in `traces/gpu/session{2_final,3}/README.md`). The
# emulated rank runs eagerly with a device sync per phase per layer, so `step_ms` is mostly host
# launch overhead; the budget-32 rows also carry `kernel_ms`, the sum of the step's kernel times
# (what one CUDA graph of the rank's step would take), and the tokens/s that follow from it.

# %%
from pathlib import Path

traces = Path(workbench.__file__).resolve().parent.parent / "traces"


def step_bars(ax, ms, ylabel: str = "EP8 rank kernel ms a step"):
    """ms [(C, mode) x run] kernel ms a step as grouped bars (the session sections below)."""
    ms.plot.bar(ax=ax, rot=0)
    ax.set_xticklabels([f"C {c}\n{m}" for c, m in ms.index], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def graph_runs(folder, runs: dict):
    """(rows, ms) of `emulate --graph` tables {label: csv in folder}: their NVLink4 rows with a
    "run" column (every step captured in a graph), and kernel ms [(C, mode) x run] in the
    dict's order (the session 20 and 21 sections)."""
    g = pd.concat({k: pd.read_csv(folder / f) for k, f in runs.items()})
    g = g.reset_index(level=0, names="run").query("link == 'NVLink4'")
    assert (g.kernel_timing == "graph").all()  # every step captured
    ms = g.pivot_table(index=["C", "mode"], columns="run", values="kernel_ms")[list(runs)]
    return g, ms


runs = [traces / "emulate_engine.csv", traces / "emulate_engine_b32.csv"]
if all(p.exists() for p in runs):
    full = pd.concat([pd.read_csv(p) for p in runs], ignore_index=True)
    assert set(full.layout) == {"EP8", "TP8"} and full.step_ms.gt(0).all()
    for p in runs:
        r = pd.read_csv(p)
        print(p.name, "|", r.gpu.iloc[0], "| git", str(r.git_sha.iloc[0])[:7], "| kernels",
              r.kernels.iloc[0])
    table = full.pivot_table(index=["C", "mode"], columns=["layout", "link"],
                             values="tokens_per_s").round(1)
    graphed = full.dropna(subset=["kernel_ms"]).pivot_table(
        index=["C", "mode"], columns=["layout", "link"], values="kernel_tokens_per_s").round(1)
    print("tokens/s from the kernel sums (graph-replay estimate):\n" + graphed.to_string())
else:
    table = "traces/emulate_engine*.csv not in this checkout"
table

# %% [markdown]
# ## Measured collectives: the emulator's link model against two H200s
# `python -m workbench.dist.commbench --device cuda --world 2` times all_reduce, all_gather and
# all_to_all over NCCL (NVLink multicast off) and fits the emulator's `Link` (one latency, one
# bandwidth) to them; `emulate --measured-link CSV` prices the logged collectives with it.
# Session 5's rows (`traces/commbench_h200x2.csv`, nvidia-h200-x2) timed each call alone: the
# host's launch and the other rank's arrival are inside, i.e. what an eager loop pays. At 8 ranks
# the latency is not measured yet (no x8 machine lent).

# %%
import matplotlib

matplotlib.use("Agg")  # headless in CI; JupyterLab shows the figures inline either way
import matplotlib.pyplot as plt

from workbench.dist.commbench import compare, read_link
from workbench.dist.emulate import NVLINK4

cb_path = traces / "commbench_h200x2.csv"
if cb_path.exists():
    cb = pd.read_csv(cb_path)
    measured = read_link(str(cb_path))
    rows = pd.DataFrame(compare(cb[["kind", "nbytes", "world", "seconds"]].to_dict("records"),
                                (NVLINK4, measured)))
    assert measured.alpha_us > NVLINK4.alpha_us  # eager collectives: the model's 10 us is low
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, grp in rows.groupby("kind"):
        ax.loglog(grp.nbytes, grp.measured_us, marker="o", label=f"{kind} (measured)")
    one = rows[rows.kind == "all_to_all"]
    ax.loglog(one.nbytes, one.NVLink4_us, "k--", label="model NVLink4 (all_to_all)")
    ax.loglog(one.nbytes, one.measured_us * one.measured_ratio, "k:", label="fitted link")
    ax.set_xlabel("bytes (Link convention)")
    ax.set_ylabel("µs a collective")
    ax.legend(fontsize=7)
    print(measured)
    # the toy emulation above, re-priced with the measured link next to the model's
    repriced = pd.DataFrame(emulate(PRESET, ("ep8",), batches=(1,), budgets=(None, BUDGET),
                                    tau=ref.tokens_per_step, ctx=64, repeats=1, progress=None,
                                    links=(NVLINK4, measured)))
    by_link = repriced.set_index(["mode", "link"]).comm_ms.unstack()
    assert (by_link["measured"] > by_link["NVLink4"]).all()
    by_link
else:
    "traces/commbench_h200x2.csv not in this checkout"

# %% [markdown]
# ## The emulated rank against its roofline (session 7)
# `traces/emulate_engine_session7.csv`: EP8 rank 0 of `kimi-k2.6` on one H200, engine preset +
# tree_mla v7 (`traces/gpu/session7/README.md` has the command). Each row carries the rank's
# floor per phase (`floors.rank_terms`, priced by `floors.price_phases`: the shard's weights,
# the local experts the step's routing touches, the latent cache, the drafter and LM-head
# shard) and `x_floor`, the
# graph-replay estimate (kernel sum + modelled comm) over the floor: issue #12 asks for 1.3 at
# C = 1, budget 16.

# %%
s7 = traces / "emulate_engine_session7.csv"
if s7.exists():
    e = pd.read_csv(s7)
    e = e[e.link == "NVLink4"].reset_index(drop=True)
    assert (e.floor_ms > 0).all() and (e.x_floor > 1).all()
    assert (e.floor_tokens_per_s > e.kernel_tokens_per_s).all()
    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(len(e))
    ax.bar([i - 0.2 for i in x], e.kernel_step_ms, 0.4, label="kernels + comm (graph estimate)")
    ax.bar([i + 0.2 for i in x], e.floor_ms, 0.4, label="roofline floor")
    ax.set_xticks(list(x), [f"C {c}\n{m}" for c, m in zip(e.C, e["mode"])], fontsize=8)
    ax.set_ylabel("ms a step (EP8 rank 0)")
    ax.legend(fontsize=8)
    print(e.gpu.iloc[0], "| git", str(e.git_sha.iloc[0])[:7], "| kernels", e.kernels.iloc[0])
    view = e[["C", "mode", "kernel_step_ms", "floor_ms", "x_floor", "kernel_tokens_per_s",
              "floor_tokens_per_s"]].round(2)
else:
    view = "traces/emulate_engine_session7.csv not in this checkout"
view

# %% [markdown]
# ## Session 8: the same rank after fusing the glue
# `traces/emulate_engine_session8.csv` (`traces/gpu/session8/README.md` has the command): kernel
# ms is now the GPU's busy time (the union of kernel intervals). Left: x floor per configuration,
# session 7 against session 8. Right: where the C 1, budget 16 step's GPU time goes, by kind of
# work (`workbench.dist.kernel_classes`), from the two sessions' kernel tables.

# %%
from workbench.dist.kernel_classes import by_class

s8 = traces / "emulate_engine_session8.csv"
tables = {"session 7": traces / "gpu/session7/emulate_kernels_e_moe_route_triton_v1.csv.gz",
          "session 8": traces / "gpu/session8/emulate_kernels_e.csv.gz"}
if s8.exists() and s7.exists() and all(p.exists() for p in tables.values()):
    new = pd.read_csv(s8)
    new = new[new.link == "NVLink4"]
    old = pd.read_csv(s7)
    old = old[old.link == "NVLink4"]
    both = new.merge(old[["C", "mode", "x_floor"]], on=["C", "mode"], suffixes=("", "_s7"))
    assert (both.x_floor < both.x_floor_s7).all()  # every configuration both ran got closer
    classes = pd.concat({k: by_class(pd.read_csv(p)).query("C == 1 and mode == 'DDTree-16'")
                         .set_index("cls").ms for k, p in tables.items()}, axis=1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    x = range(len(both))
    a1.bar([i - 0.2 for i in x], both.x_floor_s7, 0.4, label="session 7")
    a1.bar([i + 0.2 for i in x], both.x_floor, 0.4, label="session 8")
    a1.axhline(1.3, color="k", lw=0.8, ls="--", label="bar (C 1, budget 16)")
    a1.set_xticks(list(x), [f"C {c}\n{m}" for c, m in zip(both.C, both["mode"])], fontsize=8)
    a1.set_ylabel("(kernels + comm) / floor")
    a1.legend(fontsize=8)
    classes.T.plot.bar(stacked=True, ax=a2, rot=0)
    a2.set_ylabel("ms of GPU time, C 1, budget 16")
    a2.legend(fontsize=7)
    view = classes.round(2)
else:
    view = "traces/emulate_engine_session8.csv or the kernel tables not in this checkout"
view

# %% [markdown]
# ## Session 10: experts on the replicated stream (no all-to-all)
# `traces/gpu/session10/call4/` (`traces/gpu/session10/README.md` has the commands): the same
# rank with the two EP dispatches, interleaved per batch in one call. "local": each rank runs its
# own experts on every token's slots that name them (-1 elsewhere; int4_moe v11 told to expect
# T K / 8 routed slots) and the routed partials join the shared expert's all-reduce. It is the
# default dispatch since: lower x floor at every C and mode measured.

# %%
s10 = traces / "gpu/session10/call4"
if s10.exists():
    runs = pd.concat([pd.read_csv(p) for p in sorted(s10.glob("emulate_*_c*.csv"))])
    runs = runs[runs.link == "NVLink4"]
    x = runs.pivot_table(index=["C", "mode"], columns="ep_dispatch", values="x_floor")
    assert (x["local"] < x["all_to_all"]).all()
    ax = x.plot.bar(figsize=(8, 4), rot=0)
    ax.axhline(1.3, color="k", lw=0.8, ls="--", label="bar (C 1, budget 16)")
    ax.set_ylabel("(kernels + comm) / floor")
    ax.legend(fontsize=8)
    view = runs.pivot_table(index=["C", "mode"], columns="ep_dispatch",
                            values=["kernel_ms", "comm_ms", "kernel_tokens_per_s"]).round(2)
else:
    view = "traces/gpu/session10/call4 not in this checkout"
view

# %% [markdown]
# ## Session 18: the step is launches; RoPE's rows a program
# `traces/gpu/session18/README.md` has the commands. Left: rope triton_v1's kernel µs on the
# H200 against the (position, head) rows each program takes, at the EP8 rank's q_pe row counts
# (`scripts/probe_rope_programs.py`, call 6): a program's time grows with its rows while more
# programs cost nothing, so rope triton_v2 takes 4 rows a program. Right: the EP8 rank's kernel
# ms a step at the session's start (call 2) and end (call 11: int4_moe triton_v22, rope v2,
# rmsnorm v2 in the engine preset).

# %%
s18 = traces / "gpu/session18"
probe, start, end = (s18 / "call6_probe_rope_programs.txt", s18 / "call2_emulate_engine.csv",
                     s18 / "call11_emulate_engine_end.csv")
if probe.exists() and start.exists() and end.exists():
    rope = pd.read_csv(probe, sep=r"\s+")  # rows, BLOCK_ROWS, programs, kernel_us, graph_us
    steps = pd.concat({"start": pd.read_csv(start), "end": pd.read_csv(end)})
    steps = steps[steps.link == "NVLink4"].reset_index(level=0, names="when")
    ms = steps.pivot_table(index=["C", "mode"], columns="when", values="kernel_ms")
    assert (ms["end"] < ms["start"]).all()  # every configuration measured got faster
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    for rows, g in rope.groupby("rows"):
        a1.plot(g.BLOCK_ROWS, g.kernel_us, "o-", label=f"{rows} rows")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("(position, head) rows a program")
    a1.set_ylabel("kernel µs (H200)")
    a1.legend(fontsize=8)
    step_bars(a2, ms[["start", "end"]])
    view = ms.round(2)
else:
    view = "traces/gpu/session18 not in this checkout"
view

# %% [markdown]
# ## Session 19: the engine's decode attention follows the launch's shape
# `traces/gpu/session19/README.md` has the commands. Left: one 8-head tree_mla call at P 4096 (busy
# µs, `scripts/sweep_tree_mla_policy.py --batch`) by (B, N): gluon_v19 (v4's 8 parts of 512
# keys, BEST: batch-invariant), the short parts gluon_v20 takes where they fit one wave, and the
# transposed 64-key-part decode gluon_v21 adds for N H <= 16. Right: the EP8 rank's kernel ms a
# step through the session: the engine preset with tree_mla gluon_v19 (call 1), gluon_v20
# (call 2), gluon_v21 (call 4), then gluon_v22 with linear triton_v3 / swiglu_mlp triton_v4
# (call 7: the preset at the session's end).

# %%
s19 = traces / "gpu/session19"
sweeps = {"gluon_v19": ("call1_sweep_g19_v4.csv", "v4"),
          "short parts (v20)": ("call1_sweep_g18rcp_v7.csv", "v7"),
          "transposed, 64-key (v21)": ("call3_sweep_t15c17_v7_s64.csv", "s64")}
steps = {"gluon_v19": "call1_emulate_engine_g19.csv",
         "gluon_v20": "call2_emulate_engine_g20wave.csv",
         "gluon_v21": "call4_emulate_engine_g21.csv",
         "gluon_v22, linear v3": "call7_emulate_engine_g22.csv"}
if all((s19 / f).exists() for f, _ in sweeps.values()) and all(
        (s19 / f).exists() for f in steps.values()):
    busy = pd.concat({k: pd.read_csv(s19 / f).query("policy == @pol")
                      for k, (f, pol) in sweeps.items()}).reset_index(level=0, names="launch")
    busy = busy[(busy.P == 4096) & (busy.B <= 2)]
    table = busy.pivot_table(index=["B", "N"], columns="launch", values="busy_us")
    assert table.loc[(1, 1)].idxmin() == "transposed, 64-key (v21)"  # decode: v21's launch
    runs = pd.concat({k: pd.read_csv(s19 / f) for k, f in steps.items()})
    runs = runs.reset_index(level=0, names="tree_mla").query("link == 'NVLink4'")
    ms = runs.pivot_table(index=["C", "mode"], columns="tree_mla", values="kernel_ms")
    ms = ms[list(steps)]  # in the session's order
    assert ms.loc[(1, "AR"), "gluon_v21"] < ms.loc[(1, "AR"), "gluon_v19"]
    end, start = ms["gluon_v22, linear v3"], ms["gluon_v19"]
    assert (end.loc[1] < start.loc[1]).all()  # C 1: every mode faster
    assert (end <= start + 0.3).all()  # elsewhere within the runs' spread (~0.2-0.3 ms)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    table.plot.bar(ax=a1, rot=0)
    a1.set_xticklabels([f"B {b}\nN {n}" for b, n in table.index], fontsize=8)
    a1.set_ylabel("busy µs, one call (H200, H 8, P 4096)")
    a1.legend(fontsize=8)
    step_bars(a2, ms)
    view = pd.concat({"busy µs": table.round(1)}, axis=1)
else:
    view = "traces/gpu/session19 not in this checkout"
view

# %% [markdown]
# ## Session 20: where the step's time goes by op, and the step as a CUDA-graph replay
# `traces/gpu/session20/README.md` has the commands. Left: the EP8 rank's C 1 DDTree-16 step
# (the #12 bar's configuration) by registry op (`emulate --op-table`: each kernel charged to
# the innermost op range holding it; "(glue)" is mostly the drafter's forward), at the
# session's start (call 1) and with its committed engine preset (call 8: int4_moe triton_v24,
# tree_mla gluon_v24, linear triton_v5, swiglu_mlp triton_v6, the shared expert on a side
# stream). Right: kernel ms a step from CUDA-graph replays (`emulate --graph`) for the engine
# preset at the start (call 3), with gluon_v23 and linear v5 (call 3), with the shared expert
# beside the routed experts (call 3), and the committed preset (call 8).

# %%
s20 = traces / "gpu/session20"
op_runs = {"session start": "call1_emulate_ops_engine.csv",
           "session-20 preset": "call8_emulate_ops_final.csv"}
runs20 = {"engine": "call3_emulate_graph_engine.csv",
          "+ gluon_v23, linear v5": "call3_emulate_graph_g23_lin5.csv",
          "+ shared expert beside": "call3_emulate_graph_g23_lin5_side.csv",
          "session-20 preset": "call8_emulate_graph_final.csv"}
if all((s20 / f).exists() for f in [*op_runs.values(), *runs20.values()]):
    ops_ = pd.concat({k: pd.read_csv(s20 / f).query("C == 1 and mode == 'DDTree-16'")
                      for k, f in op_runs.items()}).reset_index(level=0, names="run")
    by_op = ops_.pivot_table(index="op", columns="run", values="us").fillna(0) / 1e3
    by_op = by_op.sort_values("session start", ascending=False)
    assert by_op.index[0] == "int4_moe"  # the routed experts lead the step
    ms = graph_runs(s20, runs20)[1].dropna()  # the configurations every run measured (C 1 and 8)
    assert (ms["session-20 preset"] <= ms["engine"] + 0.1).all()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    by_op.plot.barh(ax=a1)
    a1.invert_yaxis()
    a1.set_xlabel("ms a step (EP8 rank, C 1, DDTree-16)")
    step_bars(a2, ms, "kernel ms a step, graph-replayed")
    view = pd.concat({"ms a step by op": by_op.round(2)}, axis=1)
else:
    view = "traces/gpu/session20 not in this checkout"
view

# %% [markdown]
# ## Session 21: the attention side stream and int4_moe triton_v25
# `traces/gpu/session21/README.md` has the commands. Kernel ms a step from CUDA-graph replays
# of the EP8 rank: the session-20 schedule (call 1, `--attn-stream off`), the latent cache
# write and q_pe's RoPE beside q's path (call 1, `--attn-stream on`, the default from this
# session), the session-21 preset (call 4: int4_moe BEST triton_v25, whose 64-row decode
# tiles reach the C 1 DDTree-16 verify of an EP8 rank), and the session's end (call 7: the
# step also captured one stream priority above its side streams, `--main-priority -1`), and
# the shared expert forked after the route (call 11, `--shared-fork after-route`: C 1 and 8).
# Between calls a configuration moves by up to ~0.25 ms at C 1 DDTree-16 and ~1.8 at C 32.

# %%
s21 = traces / "gpu/session21"
runs21 = {"attn-stream off": "call1_emulate_graph_attn_off.csv",
          "attn-stream on": "call1_emulate_graph_attn_on.csv",
          "session-21 preset": "call4_emulate_graph_final.csv",
          "+ main priority": "call7_emulate_graph_end.csv",
          "+ shared fork after route": "call11_emulate_graph_fork_after.csv"}
if all((s21 / f).exists() for f in runs21.values()):
    g, ms = graph_runs(s21, runs21)
    assert (ms["attn-stream on"] < ms["attn-stream off"]).all()  # faster in all six
    fig, ax = plt.subplots(figsize=(8, 4))
    step_bars(ax, ms, "kernel ms a step, graph-replayed")
    x_floor = g.query("run == '+ main priority'").set_index(["C", "mode"]).x_floor
    view = pd.concat({"kernel ms": ms.round(2), "x floor (call 7)": x_floor.round(2)}, axis=1)
else:
    view = "traces/gpu/session21 not in this checkout"
view

# %% [markdown]
# ## Session 22: the router's local ids, and the routing + permute in one int4 launch
# `traces/gpu/session22/README.md` has the commands. Left: kernel ms a step from CUDA-graph
# replays of the EP8 rank, int4_moe triton_v26 against triton_v28 (the routing and the
# activations' permute in one launch at decode, T <= 8: BEST from this session) in ABBA order
# in one call (call 5). Right: what v27 (the same launch up to 64 tokens) did to the step's
# int4 kernels in calls 3 and 4: the routing + permute kernels lost ~110 µs a step, the GEMMs
# after them gained 45-265 (same launches, same data), so v27 slowed the verify.

# %%
s22 = traces / "gpu/session22"
runs22 = {"v26 (A1)": "call5_emulate_graph_a1_v26.csv", "v28 (B1)": "call5_emulate_graph_b1_v28.csv",
          "v28 (B2)": "call5_emulate_graph_b2_v28.csv", "v26 (A2)": "call5_emulate_graph_a2_v26.csv"}
ab27 = {"v26 (call 3)": "call3_emulate_kernels_graph_v26.csv",
        "v27 (call 3)": "call3_emulate_kernels_graph_v27.csv",
        "v27 (call 4)": "call4_emulate_kernels_graph_end.csv",
        "v26 (call 4)": "call4_emulate_kernels_graph_v26_after.csv"}


def int4_kernels(path) -> pd.DataFrame:
    """µs a step of the int4 op's routing + permute kernels and of its GEMMs, by (C, mode)."""
    k = pd.read_csv(path)
    part = k.kernel.map(lambda n: "routing + permute" if n.startswith("_route")
                        or n == "_permute_kernel" else "GEMMs" if n == "_gemm_kernel" else None)
    return k.assign(part=part).dropna(subset=["part"]).pivot_table(
        index=["C", "mode"], columns="part", values="us", aggfunc="sum")


if all((s22 / f).exists() for f in [*runs22.values(), *ab27.values()]):
    g, ms = graph_runs(s22, runs22)
    c1ar = ms.loc[(1, "AR")]
    assert max(c1ar["v28 (B1)"], c1ar["v28 (B2)"]) < min(c1ar["v26 (A1)"], c1ar["v26 (A2)"])
    parts = pd.concat({k: int4_kernels(s22 / f) for k, f in ab27.items()}, axis=1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4))
    step_bars(a1, ms, "kernel ms a step, graph-replayed")
    a1.set_ylim(0, ms.max().max() * 1.1)
    (parts.xs("routing + permute", axis=1, level=1) / 1e3).plot.bar(ax=a2, rot=0)
    a2.set_xticklabels([f"C {c}\n{m}" for c, m in parts.index], fontsize=8)
    a2.set_ylabel("routing + permute kernels, ms a step")
    view = pd.concat({"kernel ms (call 5)": ms.round(2),
                      "GEMM µs a step (calls 3-4)": parts.xs("GEMMs", axis=1, level=1).round(0)},
                     axis=1)
else:
    view = "traces/gpu/session22 not in this checkout"
view

# %% [markdown]
# ## Session 23: the int4 GEMMs' worst-case grids and their occupancy
# `traces/gpu/session23/README.md` has the commands. Left: kernel ms a step from CUDA-graph
# replays of the EP8 rank at C 1, int4_moe triton_v30 (the decode's K-split grids sized by the
# experts expected active, the idle programs last) against triton_v32 (v30 with 96 registers,
# five CTAs an SM, where the gate/up grid is expected past 1.5 waves: the budget-16 verify) in
# ABBA order (call 4). Right: the int4 GEMMs' µs a step in the same runs: v32 changes only the
# verify's, AR and DDTree-8 run v30's kernels.

# %%
s23 = traces / "gpu/session23"
runs23 = {"v30 (A1)": "call4_emulate_graph_a1_v30.csv", "v32 (B1)": "call4_emulate_graph_b1_v32.csv",
          "v32 (B2)": "call4_emulate_graph_b2_v32.csv", "v30 (A2)": "call4_emulate_graph_a2_v30.csv"}
kern23 = {k: f.replace("emulate_graph", "emulate_kernels_graph") for k, f in runs23.items()}
if all((s23 / f).exists() for f in [*runs23.values(), *kern23.values()]):
    g, ms = graph_runs(s23, runs23)
    verify = ms.loc[(1, "DDTree-16")]
    assert max(verify["v32 (B1)"], verify["v32 (B2)"]) < min(verify["v30 (A1)"],
                                                              verify["v30 (A2)"])
    gemms = pd.concat({k: int4_kernels(s23 / f)["GEMMs"] for k, f in kern23.items()}, axis=1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4))
    step_bars(a1, ms, "kernel ms a step, graph-replayed")
    step_bars(a2, gemms / 1e3, "int4 GEMMs, ms a step")
    view = pd.concat({"kernel ms": ms.round(3), "int4 GEMM µs": gemms.round(0)}, axis=1)
else:
    view = "traces/gpu/session23 not in this checkout"
view

# %% [markdown]
# ## Session 59: each op against its own floor
# `traces/gpu/session59/README.md` has the commands. The op table now carries every op's own
# roofline floor (`workbench/dist/floors.py`: the step's bytes and FLOPs charged to the op that
# reads them, priced at the H200's ceilings) beside its µs (the 16-layer EP8 rank at C 1
# DDTree-16, drafter triton_v2, on an H100). The MoE sits near its floor; the rest of the layer
# is per-launch cost: tree_mla, the router, the absorption, the norms are many times their
# bytes, and the vocab head's top-k (no floor of its own) costs more than the LM-head GEMM it
# follows. `python -m workbench.dist.floors --layers 16 --op-table <ops.csv>` prints the same
# table for any op table, no GPU needed.

# %%
ops59 = traces / "gpu/session59/call1/emulate_ops_v2.csv.gz"
if ops59.exists():
    t = pd.read_csv(ops59).query("C == 1 and mode == 'DDTree-16'").set_index("op")
    assert t.loc["int4_moe", "floor_us"] == t.floor_us.max()  # the bytes are the experts'
    x = (t.us / t.floor_us).dropna()
    assert x["tree_mla"] > 5 * x["int4_moe"]  # the attention is launch-bound, not byte-bound
    t = t.sort_values("us")
    fig, ax = plt.subplots(figsize=(9, 5))
    y = range(len(t))
    ax.barh([i + 0.2 for i in y], t.us, 0.4, label="µs (H100)")
    ax.barh([i - 0.2 for i in y], t.floor_us.fillna(0), 0.4, label="floor µs (H200 ceilings)")
    ax.set_yticks(list(y), t.index, fontsize=8)
    ax.set_xlabel("µs a step, EP8 rank 0, 16 layers, C 1 DDTree-16")
    ax.legend(fontsize=8)
    view = t.assign(x_floor=t.us / t.floor_us)[["calls", "us", "floor_us", "x_floor"]].round(1)
else:
    view = "traces/gpu/session59 not in this checkout"
view

# %% [markdown]
# ## Session 60: what the bar leaves the kernels once the comm is paid
# `traces/gpu/session60/README.md` has the commands. The floors hold no communication; the
# step (kernels + the link model's collectives) does. At C 1 DDTree-16 the NVLink4 model's 48
# collectives (10 µs each + bytes) take most of the bar's 30 % slack: the kernels would have to
# run at ~1.0x their floor (`floors.bar_budget`; `python -m workbench.dist.floors --emulate-csv
# <emulate.csv>` prints it). Left: the bar's step split into comm and the kernel budget, beside
# the measured kernels (H100, drafter triton_v6). Right: the same at C 8.

# %%
from workbench.dist.floors import bar_budget

e60 = traces / "gpu/session60/call1/emulate_v6_a.csv.gz"
if e60.exists():
    b = bar_budget(pd.read_csv(e60)).query("link == 'NVLink4'").set_index("C")
    assert (b.kernel_budget_ms + b.comm_ms - b.bar_ms).abs().max() < 1e-9
    assert b.loc[1, "budget_x_floor"] < 1.05  # the comm alone is the bar's slack at C 1
    fig, axes = plt.subplots(1, len(b), figsize=(5 * len(b), 4))
    for ax, (C, r) in zip(axes, b.iterrows()):
        ax.bar(0, r.kernel_budget_ms, label="kernel budget")
        ax.bar(0, r.comm_ms, bottom=r.kernel_budget_ms, label="comm (NVLink4 model)")
        ax.bar(1, r.kernel_ms, label="kernels measured (H100)")
        ax.axhline(r.floor_ms, color="k", lw=0.8, ls="--", label="floor")
        ax.set_xticks([0, 1], ["the bar's step", "measured"])
        ax.set_title(f"C {C}, {r['mode']}")
        ax.set_ylabel("ms a step, EP8 rank 0, 16 layers")
        ax.legend(fontsize=7)
    view = b[["floor_ms", "comm_ms", "bar_ms", "kernel_budget_ms", "budget_x_floor",
              "kernel_ms", "cut_ms"]].round(3)
else:
    view = "traces/gpu/session60 not in this checkout"
view
