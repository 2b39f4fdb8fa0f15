"""Summarise an Nsight Compute source-page CSV (scripts/ncu_source.sh): the warp-stall samples
by reason over the whole kernel, and the instructions that hold the most samples.

    python3 scripts/ncu_hot.py traces/gpu/session6/ncu_src_tree_mla_v4_sass.csv --top 25

A name ending in .gz is read through gzip (the larger committed pages are compressed).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    opener = gzip.open if a.csv.endswith(".gz") else open
    with opener(a.csv, "rt", newline="") as f:
        lines = list(csv.reader(f))
    head = next(i for i, r in enumerate(lines) if r and r[0] == "Address")
    cols = lines[head]
    rows = [dict(zip(cols, r)) for r in lines[head + 1:] if len(r) == len(cols)]
    if not rows:
        raise SystemExit(f"csv: expected a source page with an 'Address' header, got {a.csv}")
    stalls = [c for c in cols if c.startswith("stall_") and "(Not Issued)" not in c]
    total = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    print(f"{len(rows)} SASS instructions, {total:.0f} warp samples")
    by = sorted(((sum(_num(r[c]) for r in rows), c) for c in stalls), reverse=True)
    print("stall reasons (% of samples): " + ", ".join(
        f"{c.removeprefix('stall_')} {100 * v / total:.1f}" for v, c in by if v > 0))
    hot = sorted(rows, key=lambda r: -_num(r["Warp Stall Sampling (All Samples)"]))[: a.top]
    print(f"top {a.top} instructions (% of samples, executed, top stall):")
    for r in hot:
        s = _num(r["Warp Stall Sampling (All Samples)"])
        top = max(stalls, key=lambda c: _num(r[c]))
        print(f"  {r['Address']:>6} {100 * s / total:5.1f}%  x{_num(r['Instructions Executed']):>9.0f}"
              f"  {top.removeprefix('stall_'):<14} {r['Source'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
