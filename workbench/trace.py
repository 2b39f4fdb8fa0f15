"""torch.profiler traces of one op variant (or a short decode), and the Nsight commands for it.

    python -m workbench trace int4_moe --variant reference --shapes real
    python -m workbench trace decode                      # tiny preset, DDTree budget 4

Writes `traces/<stem>.trace.json` (gzipped past 5 MB: chrome://tracing and Perfetto read both)
and `traces/<stem>.table.txt` (key_averages), adds one line to traces/INDEX.md, and prints the
exact ncu / nsys command lines for the range `ddtree/<op>/<variant>`. Where `ncu` is on PATH it
also runs the ncu one (hardware counters of the range's kernels; `--no-ncu` skips it). The
command they wrap is this module in `--replay N` mode: one warm-up call outside the range, then
N calls inside it, no torch.profiler, so Nsight sees only the kernels of interest.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from workbench import ops, traces_io, tracing
from workbench.ops.registry import REFERENCE, OpSpec

GZIP_ABOVE = 5 * 2**20
INDEX_HEADER = """# Saved traces

One line per trace (`python -m workbench trace ...` appends; see traces/README.md).

| UTC time | what | case | device | trace | table | git | command |
| --- | --- | --- | --- | --- | --- | --- | --- |
"""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60]


def _device(device) -> str:
    return str(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _pick(cases: list, which) -> tuple[int, object]:
    """A case by index or label (default the first)."""
    if which is None:
        return 0, cases[0]
    if str(which).isdigit():
        return int(which), cases[int(which)]
    for i, c in enumerate(cases):
        if c.label == which:
            return i, c
    raise ValueError(f"case: expected an index or one of {[c.label for c in cases]}, got {which!r}")


def _op_call(op, variant, shapes, case, device, cfg=None, cases=None):
    """(range name, label, fn() running the op once on its case, replay args) for an op."""
    from workbench.bench import _make_cases, clone_inputs

    spec = op if isinstance(op, OpSpec) else ops.op_spec(op)
    if cases is None:
        cases = _make_cases(spec, shapes, 0, cfg, device)
    idx, c = _pick(list(cases), case)
    fn = spec.variant(variant).load()
    args, kwargs = clone_inputs((tuple(c.args), dict(c.kwargs)))
    replay = f"{spec.name} --variant {variant} --shapes {shapes} --case {idx} --device {device}"
    return tracing.kernel_range(spec.name, variant), c.label, lambda: fn(*args, **kwargs), replay


def _decode_call(device, budget: int = 4, max_new_tokens: int = 8):
    from workbench import build_model
    from workbench.generate import generate
    from workbench.reference.drafter import build_drafter

    target = build_model("tiny", seed=0, device=device)
    drafter = build_drafter(target.cfg, seed=0, device=device)

    def run():
        return generate(target, drafter, [[1, 2, 3], [4, 5]], max_new_tokens=max_new_tokens,
                        budget=budget, seed=0)

    replay = f"decode --budget {budget} --max-new-tokens {max_new_tokens} --device {device}"
    return "ddtree/decode", f"tiny B=2 budget={budget} new={max_new_tokens}", run, replay


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_call(fn, range_name: str, device: str, iters: int = 3):
    """Warm up once, then `iters` calls inside the NVTX range under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            with tracing.nvtx_range(range_name):
                fn()
        _sync(device)
    return prof


def save_profile(prof, stem: str, out_dir: Path, device: str) -> tuple[Path, Path]:
    """Chrome trace (gzipped when large) and the key-averages table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / f"{stem}.trace.json"
    prof.export_chrome_trace(str(trace))
    if trace.stat().st_size > GZIP_ABOVE:
        gz = trace.with_name(trace.name + ".gz")
        with open(trace, "rb") as src, gzip.open(gz, "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
        trace = gz
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    table = out_dir / f"{stem}.table.txt"
    table.write_text(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
    return trace, table


def nsight_commands(range_name: str, replay: str, out_dir: Path, stem: str) -> tuple[str, str]:
    """(ncu, nsys) command lines for the range, wrapping this module's replay mode."""
    b = tracing.backend()
    domain = None if b.name == "torch.cuda.nvtx" else tracing.DOMAIN  # torch: default domain
    script = f"{shlex.quote(sys.executable)} -m workbench.trace {replay} --replay 3"
    return (tracing.ncu_command(range_name, script, out=str(out_dir / f"{stem}.ncu"),
                                domain=domain),
            tracing.nsys_command(range_name, script, out=str(out_dir / f"{stem}.nsys"),
                                 domain=domain))


def trace(what, variant: str = REFERENCE, shapes: str = "real", case=None, device=None,
          iters: int = 3, out_dir=None, cfg=None, cases=None, command: str | None = None) -> dict:
    """Profile an op variant (what = op name or OpSpec) or "decode"; returns the paths, range
    and commands. An INDEX.md line is added for the trace."""
    device = _device(device)
    out = Path(out_dir) if out_dir is not None else traces_io.default_traces_dir()
    if what == "decode":
        rng, label, fn, replay = _decode_call(device)
    else:
        rng, label, fn, replay = _op_call(what, variant, shapes, case, device, cfg, cases)
    ts = _dt.datetime.now(_dt.timezone.utc)
    stem = _slug(f"{rng.removeprefix('ddtree/').replace('/', '-')}-{label}") + \
        ts.strftime("-%Y%m%dT%H%M%SZ")
    prof = profile_call(fn, rng, device, iters)
    trace_path, table_path = save_profile(prof, stem, out, device)
    ncu, nsys = nsight_commands(rng, replay, out, stem)
    meta = traces_io.run_metadata(device, command)
    sha = f"{meta['git_sha'][:10]}{'+dirty' if meta['git_dirty'] else ''}"
    line = (f"| {meta['timestamp']} | {rng} | {label} | {meta['gpu']} | [{trace_path.name}]"
            f"({trace_path.name}) | [{table_path.name}]({table_path.name}) | {sha} | "
            f"`{meta['command']}` |\n")
    traces_io.append_text(out / "INDEX.md", line, INDEX_HEADER)
    return {"range": rng, "trace": trace_path, "table": table_path, "ncu": ncu, "nsys": nsys,
            "stem": stem, "out_dir": out}


def _replay(a) -> int:
    device = _device(a.device)
    if a.what == "decode":
        rng, _, fn, _ = _decode_call(device, a.budget, a.max_new_tokens)
    else:
        rng, _, fn, _ = _op_call(a.what, a.variant, a.shapes, a.case, device, a.preset)
    fn()  # warm-up outside the range: compiles and autotuning stay out of the profile
    _sync(device)
    for _ in range(a.replay):
        with tracing.nvtx_range(rng):
            fn()
        _sync(device)  # close the range only after its kernels ran (timelines read it)
    return 0


def trace_main(argv: list[str] | None = None) -> int:
    """`python -m workbench trace <op|decode> [--variant v] [--shapes real|edge] ...`."""
    p = argparse.ArgumentParser(prog="python -m workbench trace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", help="a registered op, or 'decode'")
    p.add_argument("--variant", default=REFERENCE)
    p.add_argument("--shapes", default="real", choices=["real", "edge"])
    p.add_argument("--case", default=None, help="case index or label (default: the first)")
    p.add_argument("--device", default=None)
    p.add_argument("--preset", default=None, help="ModelConfig preset for REAL shapes")
    p.add_argument("--iters", type=int, default=None,
                   help="profiled calls (default 3 for an op, 1 for decode)")
    p.add_argument("--out", default=None, help="folder (default traces/)")
    p.add_argument("--no-ncu", action="store_true", help="print the ncu command, don't run it")
    p.add_argument("--replay", type=int, default=0, help=argparse.SUPPRESS)  # Nsight target
    p.add_argument("--budget", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--max-new-tokens", type=int, default=8, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if _device(a.device) == "cpu":
        torch.set_num_threads(1)  # toy shapes: threaded MKL small GEMMs spin on a 2-core box
    if a.replay:
        return _replay(a)
    command = "python -m workbench trace " + shlex.join(argv if argv is not None else sys.argv[1:])
    iters = a.iters or (1 if a.what == "decode" else 3)
    res = trace(a.what, a.variant, a.shapes, a.case, a.device, iters, a.out, a.preset,
                command=command)
    print(f"range {res['range']}\ntrace {res['trace']}\ntable {res['table']}")
    print(f"\nNsight Compute (kernels of the range):\n  {res['ncu']}")
    print(f"Nsight Systems (timeline of the range):\n  {res['nsys']}")
    if shutil.which("ncu") and not a.no_ncu and _device(a.device).startswith("cuda"):
        log = res["out_dir"] / f"{res['stem']}.ncu.txt"
        print(f"\nrunning ncu -> {log}")
        try:
            r = subprocess.run(res["ncu"], shell=True, capture_output=True, text=True,
                               timeout=int(os.environ.get("WORKBENCH_NCU_TIMEOUT", "600")))
            log.write_text(r.stdout + r.stderr)
            print(f"ncu exit {r.returncode}; report {res['stem']}.ncu.ncu-rep")
        except subprocess.TimeoutExpired:
            print("ncu timed out (WORKBENCH_NCU_TIMEOUT)")
    return 0


if __name__ == "__main__":
    sys.exit(trace_main())
