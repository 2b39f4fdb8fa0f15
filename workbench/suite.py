"""The GPU suite: one command on the H200 that produces the evidence a performance claim rests on.

    bash scripts/gpu_suite.sh [--sanitizer memcheck] ...      # on the GPU machine
    python -m workbench suite --import-results DIR            # back here: into traces/

Steps, each logged and summarised (a failing step does not stop the later ones):
  1. environment: GPU, driver, versions, NVTX backend, which peers can load;
  2. `pytest -m gpu` with a junit xml;
  3. `bench <op> --shapes real --peers all` for every registered op, mission ops first, each in
     its own process (a hung kernel or a leaked GB cannot take the next op down) with a
     timing budget and a hard timeout, all within the suite's total budget;
  4. optionally compute-sanitizer memcheck / racecheck over the gpu tests.
Results go to one folder (default $OUT, else traces/gpu/<UTC time>) as at most 8 files, the
device tool's limit: summary.txt, bench.csv, bench.jsonl, bench.log, pytest_gpu.xml,
pytest_gpu.log, sanitizer_<tool>.log.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workbench import traces_io

MISSION_OPS = ("int4_moe", "tree_mla", "tree_build", "drafter")


def _run(cmd: list[str], log: Path, timeout: float, env=None) -> tuple[int | str, float]:
    """Run cmd, stdout+stderr appended to log; (exit code or "timeout", seconds)."""
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            fh.write(f"\n[suite] killed after {timeout:.0f} s\n")
    return rc, time.time() - t0


def _environment() -> list[str]:
    import torch

    from workbench import peers, tracing

    lines = [f"python {sys.version.split()[0]}  torch {torch.__version__}  cuda "
             f"{torch.version.cuda}  triton {traces_io._pkg_version('triton') or '-'}"]
    if torch.cuda.is_available():
        lines.append(f"gpu {torch.cuda.get_device_name()}  driver {traces_io._driver_version()}"
                     f"  sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    else:
        lines.append("gpu: none (CUDA not available)")
    lines.append(f"nvtx backend: {tracing.backend().name}  ncu: {shutil.which('ncu') or '-'}  "
                 f"compute-sanitizer: {shutil.which('compute-sanitizer') or '-'}")
    for op in peers._PEERS:
        for name in peers.peer_names(op):
            why = peers.get_peer(op, name).unavailable_reason()
            lines.append(f"peer {op}/{name}: {'ok' if why is None else why}")
    sha, dirty = traces_io.git_state()
    lines.append(f"git {sha}{' (dirty)' if dirty else ''}")
    return lines


def _bench_summary(jsonl: Path) -> list[str]:
    """Per op: the best time of each implementation kind and failures, from bench.jsonl."""
    if not jsonl.exists():
        return ["no benchmark rows"]
    df = traces_io.read_rows(jsonl)
    out = []
    for op, rows in df.groupby("op", sort=False):
        bad = rows[(rows["ok"] == False) & (rows["kind"] != "peer")]  # noqa: E712
        out.append(f"{op}: {rows['case'].nunique()} cases, {len(rows)} rows"
                   + (f", {len(bad)} FAILED ({', '.join(sorted(set(bad['variant'])))})"
                      if len(bad) else ""))
        timed = rows[rows["us"].notna() & (rows["kind"] != "floor")]
        for v, r in timed.groupby("variant", sort=False):
            pct = r["pct_ceiling"].astype(float)
            out.append(f"  {v:18s} median over cases {r['us'].astype(float).median():10.1f} us, "
                       f"% ceiling {pct.min():.1f}..{pct.max():.1f}")
    return out


def run_suite(out: Path, ops_: list[str], shapes: str, peers: str, per_op_s: float,
              total_s: float, sanitizer: list[str], tests: bool, test_timeout: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    py = sys.executable
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    steps: list[tuple[str, object, float]] = []
    env_lines = _environment()
    print("\n".join(env_lines), flush=True)
    if tests:
        rc, dt = _run([py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                       f"--junitxml={out / 'pytest_gpu.xml'}"], out / "pytest_gpu.log",
                      test_timeout, env)
        steps.append(("pytest -m gpu", "no gpu tests" if rc == 5 else rc, dt))
        print(f"pytest -m gpu: {steps[-1][1]} ({dt:.0f} s)", flush=True)
    for op in ops_:
        left = total_s - (time.time() - t_start)
        if left < 30:
            steps.append((f"bench {op}", "skipped: suite budget spent", 0.0))
            continue
        timeout = min(left, 2 * per_op_s + 120)  # inputs, ceilings, reference checks, compile
        cmd = [py, "-m", "workbench.bench", op, "--shapes", shapes, "--peers", peers,
               "--max-seconds", str(per_op_s), "--traces", str(out), "--save-as", "bench"]
        rc, dt = _run(cmd, out / "bench.log", timeout, env)
        steps.append((f"bench {op}", rc, dt))
        print(f"bench {op}: {rc} ({dt:.0f} s)", flush=True)
    for tool in sanitizer:
        left = total_s - (time.time() - t_start)
        cmd = ["compute-sanitizer", "--tool", tool, "--target-processes", "all",
               "--error-exitcode", "99", py, "-m", "pytest", "-m", "gpu", "-q", "-x",
               "-p", "no:cacheprovider"]
        if not shutil.which("compute-sanitizer"):
            steps.append((f"sanitizer {tool}", "compute-sanitizer not on PATH", 0.0))
        elif left < 60:
            steps.append((f"sanitizer {tool}", "skipped: suite budget spent", 0.0))
        else:
            rc, dt = _run(cmd, out / f"sanitizer_{tool}.log", left, env)
            steps.append((f"sanitizer {tool}", rc, dt))
    summary = ["# GPU suite", f"command: {shlex.join(sys.argv)}",
               f"finished: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}"
               f" after {time.time() - t_start:.0f} s", "", *env_lines, "", "steps:"]
    summary += [f"  {name:24s} {rc!s:28s} {dt:6.0f} s" for name, rc, dt in steps]
    summary += ["", *_bench_summary(out / "bench.jsonl")]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    bad = [s for s in steps if s[1] not in (0, "no gpu tests")]
    return 1 if bad else 0


def import_results(src: Path, traces_dir: Path | None = None) -> int:
    """Back on the dev box: split src/bench.jsonl into traces/<op>.csv/.jsonl and copy the
    small files into traces/gpu/<folder name>/ for the commit."""
    traces_dir = traces_dir or traces_io.default_traces_dir()
    if (src / "bench.jsonl").exists():
        for p in traces_io.import_rows(src / "bench.jsonl", traces_dir):
            print(f"appended {p}")
    dest = traces_dir / "gpu" / src.name
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, dest / f.name)
    print(f"copied {src} -> {dest}")
    return 0


def suite_main(argv: list[str] | None = None) -> int:
    """`python -m workbench suite ...` (see the module docstring)."""
    from workbench import ops

    p = argparse.ArgumentParser(prog="python -m workbench suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="results folder (default $OUT, else "
                   "traces/gpu/<UTC time>)")
    p.add_argument("--ops", default="all", help="all | op1,op2")
    p.add_argument("--shapes", default="real", choices=["real", "edge"])
    p.add_argument("--peers", default="all")
    p.add_argument("--per-op-seconds", type=float, default=30.0, help="timing budget per op")
    p.add_argument("--total-seconds", type=float, default=480.0,
                   help="wall budget of the whole suite (the device allows 600 s a command)")
    p.add_argument("--sanitizer", default="none", choices=["none", "memcheck", "racecheck", "both"])
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--test-timeout", type=float, default=180.0)
    p.add_argument("--import-results", default=None, metavar="DIR",
                   help="append DIR/bench.jsonl to traces/ and copy DIR into traces/gpu/")
    a = p.parse_args(argv)
    if a.import_results:
        return import_results(Path(a.import_results))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(a.out or os.environ.get("OUT") or traces_io.default_traces_dir() / "gpu" / stamp)
    known = ops.list_ops()
    names = [o for o in MISSION_OPS if o in known] + [o for o in known if o not in MISSION_OPS]
    if a.ops != "all":
        names = a.ops.split(",")
    tools = {"none": [], "both": ["memcheck", "racecheck"]}.get(a.sanitizer, [a.sanitizer])
    return run_suite(out, names, a.shapes, a.peers, a.per_op_seconds, a.total_seconds, tools,
                     not a.skip_tests, a.test_timeout)


if __name__ == "__main__":
    sys.exit(suite_main())
