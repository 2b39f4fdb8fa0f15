"""Loop benchmark: the decode step by phase, next to each phase's roofline floor, and tokens/s.

Per configuration (mode AR | DDTree budget, C concurrent requests of a `ctx`-token context):
  * phase times (draft, build, verify, walk, commit) of the eager loop, CUDA events around each
    phase on a GPU, wall clock on CPU (a `PhaseTimer` handed to `generate(..., timer=)`);
    host = step wall - the phases (emit, stop rules, the per-step host sync);
  * the whole step from CUDA-graph replay with --cuda-graph (one graph per step, wall per
    step including its one host sync);
  * tau (tokens per step per request, bonus incl.) and distinct routed experts per MoE layer
    per step, both measured from the loop (`GenerateResult` steps); with --acceptance the
    walk is ACCEPTANCE REPLAY (workbench/acceptance.py): mode "ddtree-replay", lengths drawn
    from the trace, tokens not the target's — labelled in every row; tau_cap, the mean
    tokens the trees' deepest paths allowed (a draw is cut there: shallow trees replay a
    lower tau than the trace's);
  * each phase's floor = max(bytes / copy bandwidth, FLOPs / peak) from what the phase must
    touch (below), and tokens/s = C * tau / step time measured and predicted from the floors.

Bytes a phase must move (weights read once per step, whatever the batch):
  draft   drafter weights + the target's LM head (the drafter's head) + drafter KV read +
          drafter logits [C, L, V] fp32 written and read by the top-k
  build   top-k in, tree arrays out (tiny)
  verify  target weights except embeddings and routed experts + (distinct experts per layer,
          MEASURED) x bytes per INT4 expert + LM head + latent cache read [layers, C, ctx, C+R]
          + logits [C, N, V] fp32 written and read by the argmax
  walk    tree arrays and choices (tiny)
  commit  the fixed-shape gather/scatter of N latent rows per layer and request + the
          drafter's context projection (fc, k/v weights) over the path rows
FLOPs: 2 x rows x parameters touched per row (K routed experts per row) + MLA scores/values
(2 H ctx (2C + R) per row and layer); rows = C N in verify, C (L+1) in draft. Defaults: copy
bandwidth 4.26 TB/s (the H200's measured), peak 989 TFLOP/s (H200 dense bf16 spec sheet).
Legend: C requests, N = budget + 1 rows, L draft depth, V vocab, E experts.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import math
import statistics
import time

import torch

from workbench.generate import PHASES, generate

H200_COPY_TBS = 4.26
H200_BF16_TFLOPS = 989.0


class PhaseTimer:
    """phase(name) spans per step: CUDA events on a GPU (read once at the end), else wall."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.steps: list[list[tuple]] = []
        self.cur: list[tuple] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.cur.append((name, a, b))
        else:
            t0 = time.perf_counter()
            yield
            self.cur.append((name, t0, time.perf_counter()))

    def end_step(self) -> None:
        self.steps.append(self.cur)
        self.cur = []

    def ms(self) -> list[dict[str, float]]:
        """Per step: milliseconds per phase (a phase timed twice in a step is summed)."""
        if self.cuda:
            torch.cuda.synchronize()
        out = []
        for spans in self.steps:
            d: dict[str, float] = {}
            for name, a, b in spans:
                t = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
                d[name] = d.get(name, 0.0) + t
            out.append(d)
        return out


# -- what each phase must touch -------------------------------------------------------------
def model_sizes(target, drafter) -> dict:
    """Bytes and parameter counts of the weight classes the roofline needs."""
    cfg = target.cfg
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    s = {"other_bytes": 0, "other_params": 0, "expert_bytes": 0, "expert_params": 0,
         "lm_head_bytes": nb(target.lm_head.weight),
         "lm_head_params": target.lm_head.weight.numel()}
    for name, t in list(target.named_parameters()) + list(target.named_buffers()):
        if "embed_tokens" in name or name.startswith("lm_head"):
            continue
        if ".mlp.experts." in name:
            s["expert_bytes"] += nb(t)
            s["expert_params"] += t.numel() * (8 if name.endswith("_packed") else 0)
        else:
            s["other_bytes"] += nb(t)
            s["other_params"] += t.numel()
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    n_exp = max(moe_layers * cfg.n_routed_experts, 1)
    s["bytes_per_expert"] = s["expert_bytes"] / n_exp  # INT4 packed + bf16 scales
    s["params_per_expert"] = s["expert_params"] / n_exp
    s["moe_layers"] = moe_layers
    if drafter is not None and hasattr(drafter, "named_parameters"):
        dp = list(drafter.named_parameters())
        s["drafter_bytes"] = sum(nb(t) for _, t in dp)
        s["drafter_params"] = sum(t.numel() for _, t in dp)
        ctx_w = [t for n, t in dp if n.startswith("fc.") or "k_proj" in n or "v_proj" in n]
        s["drafter_ctx_bytes"] = sum(nb(t) for t in ctx_w)
    else:  # a replay drafter has no weights
        s["drafter_bytes"] = s["drafter_params"] = s["drafter_ctx_bytes"] = 0
    return s


def phase_floors(target, drafter, C: int, budget: int | None, ctx: int, experts: float,
                 sizes: dict, bw_tbs: float = H200_COPY_TBS,
                 tflops: float = H200_BF16_TFLOPS) -> dict:
    """{phase: floor ms} for one step; `experts` = measured distinct experts per MoE layer."""
    cfg = target.cfg
    V, H, lat = cfg.vocab_size, cfg.num_heads, cfg.latent_dim
    N = 1 if budget is None else budget + 1
    rows = C * N
    cache_row = lat * 2  # bf16 latent row
    attn_flops = 2 * H * ctx * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim) * cfg.num_layers
    verify_bytes = (sizes["other_bytes"] + experts * sizes["moe_layers"] * sizes["bytes_per_expert"]
                    + sizes["lm_head_bytes"] + cfg.num_layers * C * ctx * cache_row
                    + 2 * rows * V * 4)
    per_row = (sizes["other_params"] + sizes["lm_head_params"]
               + cfg.n_experts_per_tok * sizes["moe_layers"] * sizes["params_per_expert"])
    verify_flops = rows * (2 * per_row + attn_flops)
    f = {"verify": (verify_bytes, verify_flops)}
    if budget is not None:
        d = drafter.cfg
        L, K = d.depth, min(budget, V)
        f["draft"] = draft_terms(d, C, ctx, sizes["drafter_bytes"], sizes["drafter_params"],
                                 sizes["lm_head_bytes"], sizes["lm_head_params"], V)
        W = -(-N // 64)
        f["build"] = (C * L * K * 12 + C * N * (6 * 8 + 8 * W), 0)
        f["walk"] = (C * N * 8 * 5, 0)
        f["commit"] = (2 * cfg.num_layers * C * N * cache_row + sizes["drafter_ctx_bytes"]
                       + C * N * len(d.target_layer_ids) * cfg.hidden_size * 2, 0)
    return {p: max(b / (bw_tbs * 1e12), fl / (tflops * 1e12)) * 1e3 for p, (b, fl) in f.items()}


def draft_terms(d, C: int, ctx: int, drafter_bytes: int, drafter_params: int, head_bytes: int,
                head_params: int, V: int) -> tuple[float, float]:
    """(bytes, FLOPs) of one draft forward: the drafter's weights, the LM head (or its vocab
    shard: head_* and V of the shard), the drafter's cached K/V (sliding layers: their window)
    and C x L rows of fp32 logits; d = the drafter config."""
    L = d.depth
    dkv = 0
    for kind in d.layer_types:
        span = min(ctx, d.sliding_window) if kind == "sliding_attention" and d.sliding_window \
            else ctx
        dkv += C * span * 2 * d.num_kv_heads * d.head_dim * 2
    return (drafter_bytes + head_bytes + dkv + 2 * C * L * V * 4,
            2 * C * (L + 1) * drafter_params + 2 * C * L * head_params)


# -- one configuration ----------------------------------------------------------------------
class _Enough(Exception):
    """Raised from on_step to cut the loop after the steps a configuration needs."""


def _random_prompts(target, C: int, ctx: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, target.cfg.vocab_size, (C, ctx), generator=g).tolist()


def _run(target, drafter, prompts, budget, n_steps, kernels, trace, seed, timer=None,
         cuda_graph=False, on_count=None):
    """The first n_steps decode steps' stats; on_count(n) after each step n = 1, 2, ..."""
    steps: list[dict] = []

    def on_step(s, cache, prefix):
        steps.append(s)
        if on_count is not None:
            on_count(len(steps))
        if len(steps) >= n_steps:
            raise _Enough

    depth = 1 if budget is None else drafter.cfg.depth + 1
    with contextlib.suppress(_Enough):
        generate(target, drafter if budget else None, prompts,
                 max_new_tokens=(n_steps + 2) * depth + 1, budget=budget, kernels=kernels,
                 seed=seed, on_step=on_step, cuda_graph=cuda_graph,
                 acceptance=trace if budget else None, timer=timer)
    return steps


def bench_config(target, drafter, budget: int | None, C: int, ctx: int = 32, steps: int = 6,
                 warmup: int = 2, kernels=None, trace=None, cuda_graph: bool = False,
                 bw_tbs: float = H200_COPY_TBS, tflops: float = H200_BF16_TFLOPS,
                 seed: int = 0, sizes: dict | None = None, prompts=None) -> dict:
    """One row: measured phases, step, tau, experts, floors, tokens/s (see module docstring).

    prompts: token-id lists to cycle through (the last `ctx` tokens of each); default C
    random prompts of ctx tokens (real acceptance needs real text: a trained pair's prompts)."""
    dev = target.device
    if prompts is None:
        prompts = _random_prompts(target, C, ctx, seed)
    else:
        prompts = [list(prompts[i % len(prompts)])[-ctx:] for i in range(C)]
        ctx = max(len(p) for p in prompts)
    timer = PhaseTimer(dev)
    eager = _run(target, drafter, prompts, budget, warmup + steps, kernels, trace, seed, timer)
    kept = slice(warmup, None)
    phase_ms = timer.ms()[kept]
    eager = eager[kept]
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    row = {"mode": "ar" if budget is None else "ddtree" if trace is None else "ddtree-replay",
           "budget": budget if budget is not None else 0, "C": C, "ctx": ctx,
           "acceptance": trace.label(budget) if (trace is not None and budget) else "",
           "steps": len(eager)}
    acc = [a for s in eager for a, live in zip(s["accepted"], s["active"]) if live]
    row["tau"] = sum(acc) / max(len(acc), 1)
    # replay: what the trees' deepest paths allowed (a draw past it is cut there), so a replay
    # tau under the trace's mean reads as shallow trees, not as a broken replay
    cap = [m for s in eager for m, live in zip(s.get("max_accept") or (), s["active"]) if live]
    row["tau_cap"] = sum(cap) / len(cap) if cap else float("nan")
    row["experts_per_layer"] = statistics.mean(s["distinct_experts_mean"] for s in eager)
    names = [p for p in PHASES if any(p in d for d in phase_ms)]
    for p in PHASES:
        row[f"{p}_ms"] = med([d.get(p, 0.0) for d in phase_ms]) if p in names else 0.0
    row["step_ms"] = med([s["time_s"] * 1e3 for s in eager])
    row["host_ms"] = max(row["step_ms"] - sum(row[f"{p}_ms"] for p in PHASES), 0.0)
    row["graph_step_ms"] = float("nan")
    if cuda_graph:
        g_steps = _run(target, drafter, prompts, budget, warmup + steps, kernels, trace, seed,
                       cuda_graph=True)[kept]
        row["graph_step_ms"] = med([s["time_s"] * 1e3 for s in g_steps])
    sizes = sizes or model_sizes(target, drafter)
    floors = phase_floors(target, drafter, C, budget, ctx, row["experts_per_layer"], sizes,
                          bw_tbs, tflops)
    for p in PHASES:
        row[f"{p}_floor_ms"] = floors.get(p, 0.0)
    row["floor_step_ms"] = sum(floors.values())
    best = row["graph_step_ms"] if cuda_graph else row["step_ms"]
    row["tokens_per_s"] = C * row["tau"] / (best / 1e3)
    row["tokens_per_s_floor"] = C * row["tau"] / (row["floor_step_ms"] / 1e3)
    row["pct_of_floor"] = 100.0 * row["floor_step_ms"] / best
    row["bw_tbs"], row["peak_tflops"] = bw_tbs, tflops
    return row


def kernel_times(prof, cuda: bool) -> dict[str, list]:
    """{name: [calls, µs]} of a finished torch.profiler run: on a GPU the device time of CUDA
    kernels (their sum is what a graph replay of the same work costs, give or take the
    inter-kernel gaps), on a CPU the self time of ops."""
    cuda_type = torch.autograd.DeviceType.CUDA
    per: dict[str, list] = {}
    for e in prof.key_averages():
        if cuda:
            t = e.self_device_time_total if e.device_type == cuda_type else 0.0
        else:
            t = e.self_cpu_time_total
        if t > 0:
            acc = per.setdefault(e.key, [0, 0.0])
            acc[0] += e.count
            acc[1] += t
    return per


OP_RANGE = "op::"  # the record_function name prefix of `op_ranges`
_RANGES_ON = contextvars.ContextVar("op_ranges_on", default=False)


@contextlib.contextmanager
def op_ranges():
    """While active every registry op call runs inside record_function("op::<name>"), so a
    profiler run sees which op launched each kernel (`op_kernel_times`); so does code that
    names itself with `op_range`. Not for timed runs: on the GPU each range is also a
    device-side annotation spanning its kernels and the gaps between them, which `busy_us`
    would count (session 18 call 12)."""
    from torch.profiler import record_function

    from workbench.ops.registry import wrapping

    def wrap(name, fn):
        def call(*args, **kw):
            with record_function(OP_RANGE + name):
                return fn(*args, **kw)
        return call

    token = _RANGES_ON.set(True)
    try:
        with wrapping(wrap):
            yield
    finally:
        _RANGES_ON.reset(token)


def op_range(name: str):
    """A row of its own in `op_kernel_times` for step code that is not one registry op call
    (the distributed drafter's kernel body, its vocab-parallel head): record_function
    ("op::<name>") while `op_ranges` is active, else nothing. Why: their kernels otherwise
    land in "(glue)" (session 58 call 1: 0.5 of its 0.6 ms at C 1 DDTree-16)."""
    if not _RANGES_ON.get():
        return contextlib.nullcontext()
    from torch.profiler import record_function

    return record_function(OP_RANGE + name)


def op_kernel_times(prof, cuda: bool, by_kernel: dict | None = None) -> dict[str, list]:
    """{op: [calls, µs]} of a profiler run under `op_ranges`. GPU: every kernel's device time
    charged to the innermost device-side "op::<name>" range holding it (the ranges sit on the
    GPU timeline around their own kernels: session 19 call 1's probe), a range on the kernel's
    own stream first where the events name streams (`device_resource_id`: a side stream's
    kernels, e.g. int4_moe's hot launch beside the next op, overlap other streams' ranges in
    time; session 51 read moe_route's 11.4 µs a layer against its 3.9 µs kernel), any stream's
    where none on its own holds it; kernels outside every range to "(glue)"; calls = the op's
    ranges. CPU: each op range's CPU time (nested op ranges count in both). A graph replay's
    kernels carry no ranges: profile an eager call. by_kernel: a dict to fill with every op's
    kernels by name, {op: {kernel: [calls, µs]}} ("(glue)"'s: what the step runs outside the
    registry ops; an op's: which of its launches cost what). GPU kernels only."""
    dev = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    ranges, kernels = [], []
    for e in prof.events():
        if e.device_type != dev or e.time_range.end <= e.time_range.start:
            continue
        span = (e.time_range.start, e.time_range.end, getattr(e, "device_resource_id", None))
        if e.name.startswith(OP_RANGE):
            ranges.append((*span, e.name[len(OP_RANGE):]))
        elif cuda and not getattr(e, "is_user_annotation", False):
            kernels.append((*span, e.name))
    per: dict[str, list] = {}
    for start, end, _, name in ranges:
        acc = per.setdefault(name, [0, 0.0])
        acc[0] += 1
        if not cuda:
            acc[1] += end - start
    ranges.sort(key=lambda r: r[:2])

    def innermost(ks, ke, stream):  # ranges start first: stop at the first one after ks
        best = None
        for rs, re_, rstream, name in ranges:
            if rs > ks:
                break
            if (ke <= re_ and (stream is None or rstream == stream)
                    and (best is None or re_ - rs < best[1] - best[0])):
                best = (rs, re_, name)
        return best

    for ks, ke, stream, kname in kernels:
        best = (innermost(ks, ke, stream) if stream is not None else None) or innermost(
            ks, ke, None)
        op = best[2] if best else "(glue)"
        per.setdefault(op, [0, 0.0])[1] += ke - ks
        if by_kernel is not None:
            acc = by_kernel.setdefault(op, {}).setdefault(kname, [0, 0.0])
            acc[0] += 1
            acc[1] += ke - ks
    return per


def _busy_runs(prof) -> list[list]:
    """The device timeline of a finished profiler run as maximal busy runs, in time order:
    [start, end, first kernel's name, the name of the kernel that ends the run]; kernels and
    copies that overlap (PDL, a side stream) join one run."""
    cuda_type = torch.autograd.DeviceType.CUDA
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == cuda_type and e.time_range.end > e.time_range.start)
    runs: list[list] = []
    for s, e, name in spans:
        if not runs or s > runs[-1][1]:  # a gap: a new run
            runs.append([s, e, name, name])
        elif e > runs[-1][1]:
            runs[-1][1], runs[-1][3] = e, name
    return runs


def busy_us(prof) -> float:
    """Microseconds the GPU ran at least one kernel or copy in a finished torch.profiler run:
    the union of their intervals. Unlike `kernel_times`' sum, kernels that overlap count once
    (tree_mla's combine is launched early with PDL and waits inside for the attention kernel,
    so its device time includes the attention's tail: the sum counted that twice)."""
    return float(sum(e - s for s, e, _, _ in _busy_runs(prof)))


def idle_gaps(prof, top: int = 5) -> dict:
    """The idle time inside a finished profiler run's device timeline (its span from the
    first kernel's start to the last one's end, less `busy_us`): {"idle_us", "gaps" (how
    many), "longest": the `top` longest as (µs, the kernel before, the kernel after),
    "by_next": the `top` kernels whose launch waited longest in all, as (name, gaps, µs)}.
    Why: a graph replay's wall is the busy time plus these gaps (each dependent node's launch
    latency, waits across streams); session 60 call 1 read drafter triton_v6's step 74 µs
    less busy than v5's yet ~0.1 ms longer to replay: the gaps moved, and this names where."""
    runs = _busy_runs(prof)
    gaps = [(b[0] - a[1], a[3], b[2]) for a, b in zip(runs, runs[1:])]
    by_next: dict[str, list] = {}
    for us, _, nxt in gaps:
        acc = by_next.setdefault(nxt, [0, 0.0])
        acc[0] += 1
        acc[1] += us
    return {"idle_us": float(sum(g[0] for g in gaps)), "gaps": len(gaps),
            "longest": [(float(us), a, b) for us, a, b in sorted(gaps, key=lambda g: -g[0])[:top]],
            "by_next": sorted(((k, n, float(us)) for k, (n, us) in by_next.items()),
                              key=lambda r: -r[2])[:top]}


def profile_config(target, drafter, budget: int | None, C: int, ctx: int = 32, steps: int = 3,
                   warmup: int = 2, kernels=None, trace=None, seed: int = 0,
                   top: int = 25) -> list[dict]:
    """Where one configuration's eager step spends its time: torch.profiler over `steps`
    decode steps after `warmup` (prefill and compiles excluded), kernels grouped by name.
    Rows {kernel, calls_per_step, us_per_step, pct}, largest first (`top` of them, then one
    "(other)" row). On a GPU: device time of CUDA kernels; on a CPU: self CPU time of ops."""
    from torch.profiler import ProfilerActivity, profile

    for name, v in (("steps", steps), ("warmup", warmup)):  # warm-up >= 1: compiles stay out
        if v < 1:
            raise ValueError(f"{name}: expected >= 1, got {v}")
    dev = target.device
    cuda = dev.type == "cuda"
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))

    def on_count(n):  # the profiled window: after step `warmup` to the end of the last step
        if n in (warmup, warmup + steps):
            if cuda:
                torch.cuda.synchronize(dev)
            if n == warmup:
                prof.start()
            else:
                prof.stop()

    seen = _run(target, drafter, _random_prompts(target, C, ctx, seed), budget,
                warmup + steps, kernels, trace, seed, on_count=on_count)
    if len(seen) < warmup + steps:
        raise RuntimeError(f"profile: the loop ended after {len(seen)} steps, "
                           f"expected {warmup + steps} (raise max_new_tokens or lower steps)")
    per = kernel_times(prof, cuda)
    total = sum(v[1] for v in per.values()) or 1.0
    ranked = sorted(per.items(), key=lambda kv: -kv[1][1])
    rows = [{"kernel": k, "calls_per_step": n / steps, "us_per_step": t / steps,
             "pct": 100.0 * t / total} for k, (n, t) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        t = sum(v[1] for _, v in rest)
        rows.append({"kernel": f"(other: {len(rest)} names)",
                     "calls_per_step": sum(v[0] for _, v in rest) / steps,
                     "us_per_step": t / steps, "pct": 100.0 * t / total})
    return rows


def loopbench(target, drafter, budgets=(None, 8, 16, 32, 64), batches=(1, 8, 32, 64),
              kernels=None, trace=None, cuda_graph=False, progress=print, on_rows=None,
              **kw) -> list[dict]:
    """Rows for every (budget, C); `best_budget_for_C` marks each C's fastest mode."""
    sizes = model_sizes(target, drafter)
    rows = []
    for C in batches:
        for b in budgets:
            r = bench_config(target, drafter, b, C, kernels=kernels, trace=trace,
                             cuda_graph=cuda_graph, sizes=sizes, **kw)
            rows.append(r)
            if progress:
                progress(f"C={C} {r['mode']} {b or ''}: step {r['step_ms']:.2f} ms "
                         f"(floor {r['floor_step_ms']:.3f}), tau {r['tau']:.2f}, "
                         f"{r['tokens_per_s']:.0f} tok/s")
            if on_rows is not None:
                on_rows(rows)
    for C in batches:
        mine = [r for r in rows if r["C"] == C]
        top = max(mine, key=lambda r: r["tokens_per_s"])
        for r in mine:
            r["best_budget_for_C"] = r is top
    return rows


def best_per_C(df):
    """C -> the mode and budget with the most measured tokens/s, and the floors' choice."""
    import pandas as pd

    out = []
    for C, g in df.groupby("C"):
        m, f = g.loc[g.tokens_per_s.idxmax()], g.loc[g.tokens_per_s_floor.idxmax()]
        out.append({"C": C, "best_measured": f"{m['mode']} {int(m['budget']) or ''}".strip(),
                    "tokens_per_s": m.tokens_per_s,
                    "best_predicted": f"{f['mode']} {int(f['budget']) or ''}".strip(),
                    "tokens_per_s_floor": f.tokens_per_s_floor})
    return pd.DataFrame(out)


def _trace_arg(text: str | None):
    """A JSON path, or tau=4.48[@budget][:depth] for a truncated geometric."""
    from workbench.acceptance import AcceptanceTrace

    if not text:
        return None
    if text.startswith("tau="):
        spec, _, depth = text[4:].partition(":")
        tau, _, b = spec.partition("@")
        return AcceptanceTrace.from_mean(float(tau), int(b or 8), int(depth or 7))
    return AcceptanceTrace.load(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.loopbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="synthetic weights of this preset")
    p.add_argument("--pair", action="store_true", help="the shipped trained pair instead")
    p.add_argument("--budgets", default="ar,8,16,32,64")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--kernels", default=None, help="optimized | reference | op=variant,...")
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--acceptance", help="trace JSON, or tau=4.48@8[:7] (REPLAY: labelled)")
    p.add_argument("--ctx", type=int, default=32, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bw-tbs", type=float, default=H200_COPY_TBS)
    p.add_argument("--tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", help="write the rows here (with run provenance)")
    p.add_argument("--profile", metavar="TXT",
                   help="instead of timing: torch.profiler of each configuration's eager "
                        "steps, the top kernels by device time per step, written to TXT")
    a = p.parse_args(argv)
    import pandas as pd

    from workbench.__main__ import _kernels
    from workbench.traces_io import run_metadata

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # toy shapes: threaded small GEMMs spin on small boxes
    if a.pair:
        from workbench.train import load_pair

        target, drafter, _ = load_pair(device=device) if _accepts_device() else load_pair()
        source = "trained pair"
    else:
        import workbench
        from workbench.reference.drafter import build_drafter

        target = workbench.build_model(a.preset, seed=a.seed, device=device)
        drafter = build_drafter(target.cfg, seed=a.seed, device=device)
        source = f"{a.preset} (synthetic weights)"
    trace = _trace_arg(a.acceptance)
    meta = {**run_metadata(device), "model": source, "kernels": a.kernels or "reference",
            "cuda_graph": a.cuda_graph}

    def save(rows):
        if a.csv:
            pd.DataFrame([{**r, **meta} for r in rows]).to_csv(a.csv, index=False)

    budgets = [None if x == "ar" else int(x) for x in a.budgets.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    if a.profile:
        return _profile_main(a, target, drafter, budgets, batches, _kernels(a.kernels), trace,
                             meta)
    rows = loopbench(target, drafter,
                     budgets, batches, kernels=_kernels(a.kernels),
                     trace=trace, cuda_graph=a.cuda_graph, on_rows=save, ctx=a.ctx,
                     steps=a.steps, warmup=a.warmup, bw_tbs=a.bw_tbs, tflops=a.tflops,
                     seed=a.seed)
    save(rows)  # again, with best_budget_for_C
    df = pd.DataFrame(rows)
    cols = ["mode", "budget", "C", "tau", "experts_per_layer"] + [f"{p}_ms" for p in PHASES] + [
        "host_ms", "step_ms", "graph_step_ms", "floor_step_ms", "tokens_per_s",
        "tokens_per_s_floor"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if trace is not None:
        print(f"ddtree-replay rows: ACCEPTANCE REPLAY ({trace.source}); tokens are not the "
              "target's")
    print(best_per_C(df).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if a.csv:
        print(f"wrote {a.csv}")
    return 0 if all(math.isfinite(r["step_ms"]) for r in rows) else 1


def _profile_main(a, target, drafter, budgets, batches, kernels, trace, meta) -> int:
    import pandas as pd

    out = [f"# loopbench --profile: top kernels per eager decode step ({a.steps} steps after "
           f"{a.warmup} warm-up), model {meta['model']}, kernels {meta['kernels']}, "
           f"ctx {a.ctx}", "# " + ", ".join(f"{k} {meta[k]}" for k in ("gpu", "torch", "git_sha")
                                             if k in meta), ""]
    for C in batches:
        for b in budgets:
            rows = profile_config(target, drafter, b, C, ctx=a.ctx, steps=a.steps,
                                  warmup=a.warmup, kernels=kernels, trace=trace, seed=a.seed)
            total = sum(r["us_per_step"] for r in rows)
            out += [f"## C={C} {'AR' if b is None else f'DDTree budget {b}'}: "
                    f"{total / 1e3:.3f} ms of kernels per step",
                    pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.1f}",
                                                 max_colwidth=70), ""]
            with open(a.profile, "w") as f:  # rewritten per configuration: a cut run keeps them
                f.write("\n".join(out) + "\n")
            print("\n".join(out[-3:]))
    print(f"wrote {a.profile}")
    return 0


def _accepts_device() -> bool:
    import inspect

    from workbench.train import load_pair

    return "device" in inspect.signature(load_pair).parameters


if __name__ == "__main__":
    raise SystemExit(main())
