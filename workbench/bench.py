"""The one timing protocol (DESIGN.md §8): correctness first, then time, against the roofline.

    df = bench("int4_moe", variants="all", peers="all", shapes="real")   # pandas DataFrame
    python -m workbench.bench int4_moe --shapes real --variants all --peers all

Per (case, variant or peer):
  1. correctness: `workbench.check.check(..., cases=...)` when that helper takes cases, else
     the op's `compare` hook (or a generic one) against the reference on cloned inputs.
     A variant that fails is not timed. Peers are timed either way but a wrong peer never
     sets the bar (see peers.py).
  2. warm-up (compiles, autotunes, JIT), then per-call CUDA events (perf_counter on CPU);
     median and p20/p80.
  3. cold L2: the inputs are cloned into enough sets to cover 2x the L2 and the calls rotate
     through them; if even 32 sets stay under that (tiny inputs), a 2xL2 scratch buffer is
     written before each timed call (outside the events).
  4. calls whose eager median is under 1 ms are re-timed as CUDA-graph replays when they
     capture (the decode loop replays every step from a graph, and Python launch costs of
     ~20-80 us per Triton launch would otherwise hide the kernels); the eager time stays in
     `eager_us`. Calls that sync with the host (found with torch's sync debug mode) are never
     captured: they stay eager, with a note.
  5. `kernel_us`: the GPU time inside the call's kernels alone (profiler activity records,
     the same rotation and flush), i.e. without the ~2-4 us a lone graph replay spends
     launching; a bar stated as "GPU time" reads this column (WORKBENCH_NO_KERNEL_TIME=1 skips
     it, e.g. under nsys or ncu).
Ceilings are measured in the same process (device-to-device copy, bf16 matmul), so % ceiling
= max(bytes / copy_bw, flops / matmul_peak) / measured time; x best peer = best peer's time /
this row's time (> 1: faster than every correct peer). Rows go to traces/<op>.csv/.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import os
import shlex
import sys
import time

import numpy as np
import pandas as pd
import torch

from workbench import bench_knobs, ops, traces_io, tracing
from workbench import peers as peer_registry
from workbench.ops.registry import REFERENCE, OpSpec

GRAPH_BELOW_US = 1000.0  # eager median under this: launch overhead matters, try graph replay
KERNEL_TIME_BELOW_US = 20_000.0  # profile kernel time below this (the slow references: skip)
MAX_SETS = 32
DEFAULT_L2 = 50 * 2**20  # H200 datasheet; torch reports the real value where it can


# --------------------------------------------------------------------------------------------
# inputs: sizes and clones


def tensor_bytes(obj) -> int:
    """Bytes of all distinct tensor storages reachable from obj (shared storage counted once)."""
    seen, total = set(), 0
    for t in peer_registry.leaves(obj):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def clone_inputs(obj):
    """Deep copy of every tensor in obj, structure kept (tuples, NamedTuples, dicts, dataclasses).
    nn.Modules (a peer's prepared layers) are shared, not rebuilt: some are dataclasses whose
    constructor would return a fresh, untransformed layer."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, dict):
        return {k: clone_inputs(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple
        return type(obj)(*(clone_inputs(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_inputs(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: clone_inputs(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


# --------------------------------------------------------------------------------------------
# ceilings and roofline

_CEILINGS: dict[str, dict] = {}


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def _median_s(fn, device: str, reps: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def ceilings(device: str) -> dict:
    """Measured once per process and device: copy GB/s (bytes read + written), matmul TFLOP/s
    (bf16 8192^3 on CUDA; fp32 1024^3 on CPU, where bf16 matmuls are not representative), and
    the L2 size used for cold-cache rotation. Random data: zeros run faster (METHOD.md)."""
    dev = str(device)
    if dev in _CEILINGS:
        return _CEILINGS[dev]
    cuda = dev.startswith("cuda")
    nbytes = 2**30 if cuda else 64 * 2**20
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = _median_s(lambda: dst.copy_(src), dev)
    n, dt = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    mm_s = _median_s(lambda: a @ b, dev)
    l2 = DEFAULT_L2
    if cuda:
        l2 = getattr(torch.cuda.get_device_properties(torch.device(dev)), "L2_cache_size", 0) or l2
    _CEILINGS[dev] = {"copy_GBps": 2 * nbytes / copy_s / 1e9,
                      "matmul_TFLOPs": 2 * n**3 / mm_s / 1e12, "l2_bytes": int(l2)}
    return _CEILINGS[dev]


def floor_us(nbytes: float, flops: float, copy_GBps: float, matmul_TFLOPs: float) -> float:
    """The roofline floor: the larger of moving the bytes and doing the FLOPs, in us."""
    return max(nbytes / (copy_GBps * 1e3), flops / (matmul_TFLOPs * 1e6))


def roofline_pct(nbytes: float, flops: float, us: float, copy_GBps: float,
                 matmul_TFLOPs: float) -> float:
    """100 * floor / measured: 100 means at the measured ceiling."""
    return 100.0 * floor_us(nbytes, flops, copy_GBps, matmul_TFLOPs) / us


# --------------------------------------------------------------------------------------------
# timing


@dataclasses.dataclass
class Timing:
    us: float
    p20_us: float
    p80_us: float
    n_iter: int
    n_sets: int
    graph: bool = False
    eager_us: float = math.nan
    note: str = ""
    kernel_us: float = math.nan  # GPU time in the call's kernels (profiler), CUDA only


def _stats(times_us: list[float]) -> tuple[float, float, float]:
    p20, p50, p80 = np.percentile(np.asarray(times_us), [20, 50, 80])
    return float(p50), float(p20), float(p80)


def _run_events(calls, n: int, flush) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush is not None:
            flush.zero_()  # evicts the previous set; enqueued before the start event
        starts[i].record()
        calls[i % len(calls)]()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]


def kernel_time_us(calls, n: int, flush=None) -> float:
    """Mean GPU time inside the kernels (and copies) of one call, from the profiler (CUPTI
    activity records): no launch gaps, no graph-launch latency, the figure a "GPU time" bar
    means. Calls rotate as in timing; the scratch flush is profiled alone as often and
    subtracted. Kernels that overlap (PDL) count in full. CUDA only."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def gpu_us(fns) -> float:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for f in fns:
                f()
            torch.cuda.synchronize()
        return sum(e.time_range.elapsed_us() for e in prof.events()
                   if e.device_type == DeviceType.CUDA)

    zero = flush.zero_ if flush is not None else None
    total = gpu_us([f for i in range(n) for f in (zero, calls[i % len(calls)]) if f])
    if zero:
        total -= gpu_us([zero] * n)
    return total / n


def graph_us(fn, reps: int = 10, rounds: int = 5) -> float:
    """Median µs of one `fn()` from CUDA-graph replays of `reps` back-to-back calls (no input
    rotation, no flush: for sweeps whose operands already exceed the L2, e.g. weight streams;
    scripts/profile_drafter.py, scripts/sweep_linear.py)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    out = replay_us(g.replay, rounds)
    return sorted(out)[len(out) // 2] / reps


def replay_us(replay, rounds: int) -> list[float]:
    """µs of each of `rounds` event-timed calls of `replay` (a captured CUDA graph's replay;
    synced after each): graph_us' timing loop, and emulate --graph's."""
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def capture_replays(calls, priority: int = 0) -> list:
    """Each of `calls` captured in a CUDA graph of its own, after one warm call of each on a
    side stream (as torch.cuda.graph wants): their replay callables, in order. priority: the
    CUDA stream priority to capture on (0 default, lower is higher): PyTorch instantiates with
    cudaGraphInstantiateFlagUseNodePriority, so each kernel node keeps the priority of the
    stream it was captured on, and work forked onto a default-priority side stream inside
    `calls` yields the SMs to it when both have CTAs waiting."""
    graphs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm the side stream as torch.cuda.graph wants
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    capture = torch.cuda.Stream(priority=priority) if priority else None
    for c in calls:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=capture):
            c()
        graphs.append(g.replay)
    torch.cuda.synchronize()
    return graphs


def kernel_us(fn, device: str, budget_s: float) -> float:
    """A probe's kernel µs of fn(): `time_calls`' kernel time of graph replays (the replay µs
    where none was measured); on a CPU fn runs once (a smoke test) and the answer is NaN."""
    if not str(device).startswith("cuda"):
        fn()
        return float("nan")
    t = time_calls(lambda: fn(), [((), {})], device, budget_s, "on")
    return t.kernel_us if t.kernel_us is not None else t.us


def time_calls(fn, arg_sets: list[tuple[tuple, dict]], device: str, budget_s: float = 2.0,
               graph: str = "auto", flush_bytes: int = 0, max_iter: int = 200) -> Timing:
    """Median/p20/p80 of fn(*args, **kwargs) rotating over arg_sets [(args, kwargs), ...].

    graph: "auto" (replay when eager < GRAPH_BELOW_US and capture works) | "on" | "off".
    """
    calls = [lambda a=a, k=k: fn(*a, **k) for a, k in arg_sets]
    cuda = str(device).startswith("cuda")
    t0 = time.perf_counter()
    calls[0]()  # first call: compile / JIT / autotune
    _sync(device)
    first_s = time.perf_counter() - t0
    slow = first_s > budget_s / 5  # e.g. the int4_moe reference at REAL shapes: seconds a call
    for c in calls[1 : 2 if slow else 3]:
        c()
    _sync(device)
    n = int(min(max_iter, max(3 if slow else 10, budget_s / max(first_s, 1e-6))))
    if not cuda:
        times = []
        for i in range(n):
            t = time.perf_counter()
            calls[i % len(calls)]()
            times.append((time.perf_counter() - t) * 1e6)
        return Timing(*_stats(times), n, len(calls))  # perf_counter, warm caches: CPU smoke only
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes else None
    times = _run_events(calls, n, flush)
    t = Timing(*_stats(times), n, len(calls))
    if t.us < KERNEL_TIME_BELOW_US and not os.environ.get("WORKBENCH_NO_KERNEL_TIME"):
        try:  # CUPTI has one subscriber: under nsys / ncu the profiler may not start
            t.kernel_us = kernel_time_us(calls, min(n, 50), flush)
        except RuntimeError as e:
            t.note = f"no kernel time ({type(e).__name__})"
    if graph == "on" or (graph == "auto" and t.us < GRAPH_BELOW_US):
        if _syncs(calls[0]):  # a host round trip cannot be captured; trying may poison CUDA
            t.note = "host sync in the call: eager timing"
            return t
        try:
            gt = _run_events(capture_replays(calls), max(n, 50), flush)
        except Exception as e:  # dynamic shapes, unsupported ops: stay eager
            t.note = f"graph capture failed ({type(e).__name__}): eager timing"
        else:
            t = Timing(*_stats(gt), max(n, 50), len(calls), True, t.us, t.note,
                       t.kernel_us)
    return t


def _syncs(call) -> bool:
    """True if the call synchronizes with the host (.item(), .cpu(), nonzero, ...)."""
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode(prev)
    torch.cuda.synchronize()
    return False


def _arg_sets(call: tuple[tuple, dict], device: str, l2: int, cold_l2: bool):
    """Enough clones of (args, kwargs) to exceed 2xL2 (capped), and the flush size still needed."""
    if not cold_l2 or not str(device).startswith("cuda"):
        return [call], 0
    size = max(tensor_bytes(call), 1)
    n = 1 if size >= 2 * l2 else min(MAX_SETS, math.ceil(2 * l2 / size))
    sets = [call] + [clone_inputs(call) for _ in range(n - 1)]
    return sets, (2 * l2 if n * size < 2 * l2 else 0)


# --------------------------------------------------------------------------------------------
# correctness


def _ok_of(report) -> bool | None:
    """Pass/fail out of whatever a checker returned: a bool, (bool, note), an object with .ok,
    a dict or DataFrame with "ok"/"pass", or workbench.check's tier dict ("pass"/"FAIL"/"-")."""
    if isinstance(report, bool):
        return report
    if isinstance(report, tuple) and report and isinstance(report[0], bool):
        return report[0]
    if isinstance(report, pd.DataFrame):
        col = next((c for c in ("ok", "pass") if c in report), None)
        return bool(report[col].all()) if col else None
    if isinstance(report, dict):
        for key in ("ok", "pass"):
            if key in report:
                return bool(report[key])
        verdicts = [v for v in report.values() if v in ("pass", "FAIL")]
        return ("FAIL" not in verdicts) if verdicts else None
    if hasattr(report, "ok"):
        return bool(report.ok)
    return None


def _fail_note(report) -> str:
    if isinstance(report, pd.DataFrame) and "pass" in report:
        bad = report[report["pass"] == False]  # noqa: E712
        cols = [c for c in ("case", "seed", "mismatches", "error") if c in bad]
        return "; ".join(" ".join(str(v) for v in r) for r in bad[cols].head(3).values)[:300]
    if isinstance(report, dict) and report.get("mismatches"):
        return str(report["mismatches"])[:300]
    return str(report)[:300]


def _module_check(spec: OpSpec, variant: str, cases, device: str) -> dict | None:
    """{case label: (ok, note)} from workbench.check.check(op, variant, cases=...) when that
    helper exists and takes cases (it NaN-poisons outputs and checks inputs stay unmodified,
    which a plain compare does not), else None."""
    try:
        from workbench import check as chk
    except ImportError:
        return None
    fn = getattr(chk, "check", None)
    if fn is None or "cases" not in inspect.signature(fn).parameters:
        return None
    report = fn(spec.name, variant=variant, cases=cases)
    if isinstance(report, pd.DataFrame) and "case" in report:
        return {label: (_ok_of(rows), "" if _ok_of(rows) else
                        f"workbench.check: {_fail_note(rows)}")
                for label, rows in report.groupby("case", sort=False)}
    ok = _ok_of(report)
    return {c.label: (ok, "" if ok else f"workbench.check: {_fail_note(report)}") for c in cases}


def _call(fn, case_call):
    args, kwargs = clone_inputs(case_call)
    return fn(*args, **kwargs)


def _direct_check(spec: OpSpec, fn, ref_out, case, case_call) -> tuple[bool | None, str]:
    out = _call(fn, case_call)
    if spec.compare is not None:
        report = spec.compare(ref_out, out, case)
        ok = _ok_of(report)
        return ok, "" if ok else f"compare: {_fail_note(report)}"
    return peer_registry.generic_compare(out, ref_out)


# --------------------------------------------------------------------------------------------
# the benchmark


def _make_cases(spec: OpSpec, shapes: str, seed: int, cfg, device: str) -> list:
    if spec.make_inputs is None:
        raise ValueError(f"op {spec.name!r} has no make_inputs hook yet; pass cases=[Case(...)]")
    from workbench.config import ModelConfig

    if cfg is None:  # REAL shapes of the real model on a GPU; the tiny preset's on a CPU
        cfg = "kimi-k2.6" if str(device).startswith("cuda") else "tiny"
    if isinstance(cfg, str):
        cfg = ModelConfig.preset(cfg)
    return list(spec.make_inputs(shapes, seed, cfg=cfg, device=device))


def _names(which, known: list[str], what: str) -> list[str]:
    if which in (None, "all"):
        return list(known)
    if which == "none":
        return []
    names = which.split(",") if isinstance(which, str) else list(which)
    bad = [n for n in names if n not in known]
    if bad:
        raise ops.UnknownOpError(f"unknown {what} {bad}; known: {sorted(known)}")
    return names


def _variant_names(which, spec: OpSpec) -> list[str]:
    """_names of the variants, where each may carry knobs (`bench_knobs`: "cuda_v28@TB1=4",
    checked here by name and form, their values by the op at the call)."""
    if which in (None, "all", "none"):
        return _names(which, list(spec.variants), f"variants of {spec.name!r}")
    names = which.split(",") if isinstance(which, str) else list(which)
    _names([bench_knobs.split(n)[0] for n in names], list(spec.variants),
           f"variants of {spec.name!r}")
    return names


def bench(op, variants="all", peers="all", shapes: str = "real", cfg=None, device=None, *,
          cases=None, only=None, seed: int = 0, max_seconds: float = 60.0,
          graph: str = "auto", rounds: int = 1,
          cold_l2: bool = True, check: bool = True, save: bool = True, traces_dir=None,
          save_as: str | None = None, command: str | None = None) -> pd.DataFrame:
    """Benchmark the variants (and peers) of `op` on its cases; one row per (case, impl).

    op: a registered name or an OpSpec; variants / peers: "all", "none" or a list / "a,b"
    (a variant may carry knobs, `workbench/bench_knobs.py`: "cuda_v28@TB1=4");
    shapes: "real" | "edge" (make_inputs(shapes, seed, cfg, device)); cfg: ModelConfig or a
    preset name (default kimi-k2.6 on CUDA, tiny on CPU); cases: explicit Case list instead;
    only: case labels (a list, or one label) to keep of those, e.g. "B=1 k=8 P=1024".
    max_seconds caps the op's total timing budget (split evenly over cases x implementations).
    rounds > 1: a case's implementations are timed in turn, `rounds` times over (each round a
    1 / rounds share of the budget; their input sets are held at once, not one at a time),
    and each row reports its median round (its note lists
    them all): an A/B within one stretch of the run, so clock and thermal drift fall on every
    implementation alike (session 16: the same launches read 476.0 and 501.5 µs, timed a
    minute apart). rounds = 1 times each implementation once, in order, as before.
    Returns columns traces_io.ALL_COLUMNS; rows that were timed or failed are appended to
    traces/<op>.csv/.jsonl unless save=False.
    """
    spec = op if isinstance(op, OpSpec) else ops.op_spec(op)
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cases = list(cases) if cases is not None else _make_cases(spec, shapes, seed, cfg, device)
    if only is not None:  # labels the caller picked, in the op's order
        only = [only] if isinstance(only, str) else list(only)
        known = [c.label for c in cases]
        missing = [x for x in only if x not in known]
        if missing:
            raise ValueError(f"only: expected case labels of {spec.name!r} ({shapes}) among "
                             f"{known}, got {missing}")
        cases = [c for c in cases if c.label in only]
    vnames = _variant_names(variants, spec)
    plist = [peer_registry.get_peer(spec.name, n)
             for n in _names(peers, peer_registry.peer_names(spec.name), f"peers of {spec.name!r}")]
    ceil = ceilings(device)
    meta = traces_io.run_metadata(device, command)
    budget = max_seconds / max(1, len(cases) * (len(vnames) + len(plist)))
    ref_fn = spec.variant(REFERENCE).load()
    frames = []
    for i, case in enumerate(cases):
        # Checked case by case, just before its timing (not all cases up front): a float64
        # reference at REAL shapes takes seconds per case, and a run cut by its time limit
        # must still leave the rows of the cases it finished (appended per case below).
        print(f"[bench] {spec.name} case {i + 1}/{len(cases)}: {case.label}", file=sys.stderr)
        checked = {}
        for v in vnames if check else ():  # (a knob variant: the direct compare below)
            if (v != REFERENCE and v in spec.variants
                    and spec.variant(v).unavailable_reason() is None):
                try:
                    checked[v] = _module_check(spec, v, [case], device)
                except Exception as e:  # a broken checker must not hide the direct compare
                    checked[v] = None
                    print(f"workbench.check raised for {v}: {e!r}; direct compare", file=sys.stderr)
        rows = []
        roof = spec.roofline(case) if spec.roofline is not None else {}
        nbytes, flops = float(roof.get("bytes", math.nan)), float(roof.get("flops", math.nan))
        call = (tuple(case.args), dict(case.kwargs))
        ref_out = None
        base = {"op": spec.name, "case": case.label, "device": device, "shapes": case.kind,
                "bytes": nbytes, "flops": flops, **meta,
                "copy_GBps": ceil["copy_GBps"], "matmul_TFLOPs": ceil["matmul_TFLOPs"]}
        impls = [(v, "reference" if v == REFERENCE else "variant", None) for v in vnames]
        impls += [(p.name, "peer", p) for p in plist]
        timed = []  # (row, name, fn, arg sets, flush): checked, to time in rounds
        for name, kind, peer in impls:
            row = {**base, "variant": name, "kind": kind, "ok": None, "note": ""}
            rows.append(row)
            vname, knobs = bench_knobs.split(name)
            why = (peer.unavailable_reason() if peer else spec.variant(vname).unavailable_reason())
            if why:
                row["note"] = f"{'not installed' if 'package' in why else 'unavailable'}: {why}"
                continue
            try:
                fn = peer.loaded() if peer else bench_knobs.with_knobs(
                    spec.variant(vname).load(), knobs, name)
                pcall = (tuple(peer.prepare(case)), {}) if peer else call
                if check and name != REFERENCE:
                    verdict = (checked.get(name) or {}).get(case.label) if not peer else None
                    if verdict is None and ref_out is None:
                        ref_out = _call(ref_fn, call)
                    if peer:
                        row["ok"], row["note"] = peer.compare(_call(fn, pcall), ref_out, case)
                    elif verdict is not None:
                        row["ok"], row["note"] = verdict
                    else:
                        row["ok"], row["note"] = _direct_check(spec, fn, ref_out, case, call)
                    if row["ok"] is False and not peer:
                        continue  # correctness first: a wrong variant is not timed
                elif name == REFERENCE:
                    row["ok"] = True
                sets, flush = _arg_sets(pcall, device, ceil["l2_bytes"], cold_l2)
            except Exception as e:
                row["ok"], row["note"] = False, f"error: {type(e).__name__}: {str(e)[:300]}"
                continue
            timed.append((row, name, fn, sets, flush))
            if rounds == 1:  # one at a time: at most one implementation's inputs held
                _time_rows(timed, spec.name, device, budget, graph, 1)
                timed.clear()
        _time_rows(timed, spec.name, device, budget, graph, rounds)
        del timed
        fl = floor_us(nbytes, flops, ceil["copy_GBps"], ceil["matmul_TFLOPs"])
        rows.append({**base, "variant": "floor", "kind": "floor", "us": fl, "p20_us": fl,
                     "p80_us": fl, "ok": True, "note": ""})
        del ref_out
        df = traces_io.derive(pd.DataFrame(rows).reindex(columns=traces_io.ALL_COLUMNS))
        frames.append(df)
        keep = df["us"].notna() | (df["ok"] == False)  # noqa: E712 (object column)
        if save and keep.any():  # per case: a run killed later (suite timeout) keeps these
            traces_io.append_rows(df[keep], traces_dir, save_as or spec.name)
        case.release()  # lazily built REAL inputs: one case in memory at a time
    if plist:
        peer_registry.clear_caches(spec.name)
    return pd.concat(frames, ignore_index=True) if frames else \
        pd.DataFrame(columns=traces_io.ALL_COLUMNS)


def _time_rows(timed: list, op: str, device: str, budget: float, graph: str,
               rounds: int) -> None:
    """Time each (row, name, fn, arg sets, flush) of `timed`, all of them in turn `rounds`
    times over, each round a 1 / rounds share of `budget`; fill each row from its median
    round (an implementation that raises gets its error, the others go on)."""
    seen: dict[int, list] = {id(row): [] for row, *_ in timed}
    raised: set[int] = set()
    for _ in range(rounds):
        for row, name, fn, sets, flush in timed:
            if id(row) in raised:
                continue
            try:
                with tracing.nvtx_range(tracing.kernel_range(op, name)):
                    seen[id(row)].append(time_calls(fn, sets, device, budget / rounds, graph,
                                                    flush))
            except Exception as e:
                row["ok"], row["note"] = False, f"error: {type(e).__name__}: {str(e)[:300]}"
                raised.add(id(row))
    for row, *_ in timed:
        ts = sorted(seen[id(row)], key=lambda t: t.us)
        if id(row) in raised or not ts:
            continue
        t = ts[(len(ts) - 1) // 2]  # the median round (the lower of two middles)
        spread = (f"median of {rounds} interleaved rounds: "
                  + " ".join(f"{x.us:.1f}" for x in seen[id(row)])) if rounds > 1 else ""
        row.update(us=t.us, p20_us=t.p20_us, p80_us=t.p80_us, n_iter=t.n_iter,
                   n_sets=t.n_sets, graph=t.graph, eager_us=t.eager_us,
                   kernel_us=t.kernel_us,
                   note="; ".join(x for x in (row["note"], t.note, spread) if x))


def bench_main(argv: list[str] | None = None) -> int:
    """`python -m workbench bench <op|all> ...`; exit 1 when a variant fails its check."""
    p = argparse.ArgumentParser(prog="python -m workbench bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", help="a registered op, or 'all'")
    p.add_argument("--shapes", default="real", choices=["real", "edge"])
    p.add_argument("--variants", default="all",
                   help="all | v1,v2; a variant with knobs: v1@KNOB=VALUE+KNOB=VALUE")
    p.add_argument("--peers", default="all", help="all | none | p1,p2")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--preset", default=None, help="ModelConfig preset for REAL shapes "
                   "(default kimi-k2.6 on CUDA, tiny on CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=60.0, help="timing budget per op")
    p.add_argument("--graph", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--rounds", type=int, default=1,
                   help="time a case's implementations in turn this many times over and "
                        "report each one's median round (an interleaved A/B)")
    p.add_argument("--no-save", action="store_true", help="print only, append nothing")
    p.add_argument("--traces", default=None, help="folder for <op>.csv/.jsonl (default traces/)")
    p.add_argument("--save-as", default=None, help="file stem instead of the op name")
    p.add_argument("--case", action="append", default=None, dest="only", metavar="LABEL",
                   help="run only this case (its label, e.g. 'B=1 k=8 P=1024'); repeatable")
    a = p.parse_args(argv)
    if (a.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu":
        torch.set_num_threads(1)  # toy shapes: threaded MKL small GEMMs spin on a 2-core box
    command = "python -m workbench bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    names = ops.list_ops() if a.op == "all" else [a.op]
    failed = False
    for name in names:
        try:
            df = bench(name, a.variants, a.peers, a.shapes, a.preset, a.device, only=a.only,
                       seed=a.seed, max_seconds=a.max_seconds, graph=a.graph,
                       rounds=a.rounds, save=not a.no_save,
                       traces_dir=a.traces, save_as=a.save_as, command=command)
        except (ValueError, ops.UnknownOpError) as e:
            print(f"{name}: {e}", file=sys.stderr)
            failed = True
            continue
        dev = df["device"].iloc[0]
        label = "" if dev.startswith("cuda") else "  [CPU: smoke-test numbers, not performance]"
        print(f"\n{name} on {df['gpu'].iloc[0]} ({dev}){label}")
        print(traces_io.format_table(df))
        failed |= bool(((df["kind"] != "peer") & (df["ok"] == False)).any())  # noqa: E712
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(bench_main())
