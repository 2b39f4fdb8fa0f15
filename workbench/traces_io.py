"""Benchmark rows on disk: `traces/<name>.csv` and `traces/<name>.jsonl`, plus run metadata.

Long format (Liger-Kernel style): one row per (op, variant or peer, case, run), never rewritten.
Every row carries the GPU name, driver, torch/triton/CUDA versions, git sha + dirty flag, the
command line and a UTC timestamp, so a committed number can be traced to what made it.

Appends are atomic: the new file content (old bytes + new rows) is written to a temporary file
in the same folder, fsynced, then renamed over the old one under an flock. A run that dies at
any point leaves either the old file or the new one, never a torn row.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import io
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# The promised columns first (DESIGN.md §8), then metadata. Fixed order keeps CSV appends
# byte-compatible across runs; a new column triggers a one-off rewrite (see _append_csv).
COLUMNS = ["op", "variant", "kind", "case", "us", "p20_us", "p80_us", "GB/s", "TFLOP/s",
           "pct_ceiling", "x_best_peer", "device"]
META_COLUMNS = ["ok", "note", "bytes", "flops", "floor_us", "eager_us", "kernel_us", "graph",
                "n_iter", "n_sets", "shapes", "copy_GBps", "matmul_TFLOPs", "gpu", "driver", "torch",
                "triton", "cuda", "git_sha", "git_dirty", "command", "timestamp", "host"]
ALL_COLUMNS = COLUMNS + META_COLUMNS


def default_traces_dir() -> Path:
    """`$WORKBENCH_TRACES` if set, else `traces/` at the repository root."""
    env = os.environ.get("WORKBENCH_TRACES")
    return Path(env) if env else REPO / "traces"


def git_state(repo: Path = REPO) -> tuple[str, bool | None]:
    """(sha, dirty) of the checkout; ("unknown", None) outside git. The GPU machine gets a
    copy of the tree without .git, so the caller passes WORKBENCH_GIT_SHA (and
    WORKBENCH_GIT_DIRTY=1/0) from the dev box; those win when set."""
    if os.environ.get("WORKBENCH_GIT_SHA"):
        dirty = os.environ.get("WORKBENCH_GIT_DIRTY")
        return os.environ["WORKBENCH_GIT_SHA"], None if dirty is None else dirty == "1"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    if not sha or status.returncode != 0:
        return "unknown", None
    return sha, bool(status.stdout.strip())


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def _pkg_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


_META_CACHE: dict[str, dict] = {}


def run_metadata(device: str, command: str | None = None) -> dict:
    """Metadata columns shared by every row of one run (cached per device and process)."""
    import torch

    dev = str(device)
    if dev not in _META_CACHE:
        if dev.startswith("cuda"):
            gpu, driver = torch.cuda.get_device_name(torch.device(dev)), _driver_version()
        else:
            gpu, driver = f"cpu: {platform.processor() or platform.machine()}", ""
        sha, dirty = git_state()
        _META_CACHE[dev] = {
            "gpu": gpu, "driver": driver, "torch": torch.__version__,
            "triton": _pkg_version("triton"), "cuda": torch.version.cuda or "",
            "git_sha": sha, "git_dirty": dirty, "host": platform.node(),
        }
    meta = dict(_META_CACHE[dev])
    meta["command"] = command if command is not None else shlex.join(sys.argv)
    meta["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return meta


# ---------------------------------------------------------------------------------------------
# derived columns and the printed table


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """Fill floor_us, GB/s, TFLOP/s, pct_ceiling and x_best_peer from us, bytes, flops and
    the ceilings (x best peer = best correct peer's time / this time, per case)."""
    us = df["us"].astype(float)
    df["floor_us"] = [max(b / (c * 1e3), f / (m * 1e6)) for b, f, c, m in
                      zip(df["bytes"], df["flops"], df["copy_GBps"], df["matmul_TFLOPs"],
                          strict=True)]
    df["GB/s"] = df["bytes"].astype(float) / (us * 1e3)
    df["TFLOP/s"] = df["flops"].astype(float) / (us * 1e6)
    df["pct_ceiling"] = 100.0 * df["floor_us"] / us
    good_peer = (df["kind"] == "peer") & (df["ok"] != False) & us.notna()  # noqa: E712
    best = df[good_peer].groupby("case")["us"].min()
    df["x_best_peer"] = (df["case"].map(best).astype(float) / us).where(df["kind"] != "floor")
    return df


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def format_table(df: pd.DataFrame) -> str:
    """`op variant shape | us | GB/s | TFLOP/s | % ceiling | x best peer`, one line a row; a
    remark in parentheses after it (kernels: the GPU time inside the call's kernels)."""
    head = ["op variant shape", "us", "GB/s", "TFLOP/s", "% ceiling", "x best peer"]
    lines = []
    for r in df.to_dict(orient="records"):
        name = f"{r['op']} {r['variant']}{' (peer)' if r['kind'] == 'peer' else ''} {r['case']}"
        cells = [name, _fmt(r["us"], ".1f"), _fmt(r["GB/s"], ".0f"), _fmt(r["TFLOP/s"], ".2f"),
                 _fmt(r["pct_ceiling"], ".1f"), _fmt(r["x_best_peer"], ".2f")]
        note = r["note"] if isinstance(r["note"], str) else ""
        kus = r.get("kernel_us")
        if r["kind"] != "floor" and isinstance(kus, float) and math.isfinite(kus):
            note = "; ".join(x for x in (f"kernels {kus:.1f} us", note) if x)
        timed = r["us"] is not None and math.isfinite(float(r["us"]))
        if note:  # failures and skips speak plainly; remarks on timed rows in parentheses
            cells[-1] += f"   {note}" if r["ok"] is False or not timed else f"   ({note})"
        lines.append(cells)
    widths = [max(len(c[i]) for c in [head, *lines]) for i in range(5)]
    fmt = [f"{c[0]:<{widths[0]}} | " + " | ".join(f"{x:>{w}}" for x, w in
                                                   zip(c[1:5], widths[1:5], strict=True))
           + f" | {c[5]}" for c in [head, *lines]]
    return "\n".join(fmt)


# ---------------------------------------------------------------------------------------------
# atomic appends


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive flock on the file's folder: concurrent appenders queue instead of losing
    rows (read-modify-rename would otherwise let the last writer win). Locking the folder
    leaves no lock files behind in traces/."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_tmp(tmp: Path, data: bytes) -> None:
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write_tmp(tmp, data)
        os.replace(tmp, path)  # atomic on POSIX within one filesystem
    finally:
        if tmp.exists():
            tmp.unlink()


def append_text(path: str | Path, text: str, header: str = "") -> Path:
    """Append `text` to a text file atomically (same rename dance), writing `header` first if
    the file is new or empty (traces/INDEX.md)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        old = path.read_bytes() if path.exists() else b""
        if not old.strip():
            old = header.encode()
        sep = b"" if not old or old.endswith(b"\n") else b"\n"
        _atomic_write(path, old + sep + text.encode())
    return path


def _clean(v):
    """JSON/CSV-safe scalar: NaN/inf -> None, numpy scalars -> Python."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        with contextlib.suppress(ValueError, TypeError):
            v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    cols = ALL_COLUMNS + sorted(c for c in df.columns if c not in ALL_COLUMNS)
    return df.reindex(columns=cols)


def _append_csv(path: Path, df: pd.DataFrame) -> None:
    old = path.read_bytes() if path.exists() else b""
    header = old.split(b"\n", 1)[0].decode() if old else ""
    buf = io.StringIO()
    if old and header == ",".join(df.columns):
        df.to_csv(buf, index=False, header=False)
        data = old + (b"" if old.endswith(b"\n") else b"\n") + buf.getvalue().encode()
    elif old:  # the schema grew: rewrite once with the union of the columns
        merged = _ordered(pd.concat([pd.read_csv(io.BytesIO(old)), df], ignore_index=True))
        merged.to_csv(buf, index=False)
        data = buf.getvalue().encode()
    else:
        df.to_csv(buf, index=False)
        data = buf.getvalue().encode()
    _atomic_write(path, data)


def _append_jsonl(path: Path, df: pd.DataFrame) -> None:
    old = path.read_bytes() if path.exists() else b""
    lines = [json.dumps({k: _clean(v) for k, v in rec.items()}, allow_nan=False)
             for rec in df.to_dict(orient="records")]
    sep = b"" if not old or old.endswith(b"\n") else b"\n"
    _atomic_write(path, old + sep + ("\n".join(lines) + "\n").encode())


def append_rows(df: pd.DataFrame, traces_dir: str | Path | None = None,
                name: str | None = None) -> tuple[Path, Path]:
    """Append `df` to `<traces_dir>/<name>.csv` and `.jsonl` atomically; returns both paths.

    `name` defaults to the op of the first row.
    """
    if df.empty:
        raise ValueError("df: expected at least one row to append, got an empty frame")
    d = Path(traces_dir) if traces_dir is not None else default_traces_dir()
    d.mkdir(parents=True, exist_ok=True)
    name = name or str(df["op"].iloc[0])
    df = _ordered(df.copy())
    for c in df.columns:  # CSV and JSON agree on missing values: empty / null
        df[c] = df[c].map(_clean).astype(object)
    csv_path, jsonl_path = d / f"{name}.csv", d / f"{name}.jsonl"
    with _locked(csv_path):
        _append_csv(csv_path, df)
        _append_jsonl(jsonl_path, df)
    return csv_path, jsonl_path


def read_rows(path: str | Path) -> pd.DataFrame:
    """All rows of a `.jsonl` (preferred: types survive) or `.csv` file."""
    p = Path(path)
    if p.suffix == ".jsonl":
        with open(p) as fh:
            return pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    return pd.read_csv(p)


def import_rows(jsonl: str | Path, traces_dir: str | Path | None = None) -> list[Path]:
    """Split a combined results file (the GPU suite's `bench.jsonl`) into per-op trace files."""
    df = read_rows(jsonl)
    out = []
    for op, rows in df.groupby("op", sort=False):
        out.extend(append_rows(rows.reset_index(drop=True), traces_dir, str(op)))
    return out
