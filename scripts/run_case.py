"""Call one variant of an op on one of its REAL (or EDGE) harness cases a few times and nothing
else: the process to put under a profiler (Nsight Compute, Nsight Systems) for one shape.

    python3 scripts/run_case.py tree_mla triton_v4 "N=65 H=64 P=8192" --calls 3
    ncu -k regex:_attn_kernel ... python3 scripts/run_case.py tree_mla triton_v4 "N=9 H=8 P=8192"

The label is the harness's (`python -m workbench.bench OP --shapes real` prints them); an
unknown label lists the known ones."""

from __future__ import annotations

import argparse
import os
import sys

import torch

# run as a file (python3 scripts/run_case.py) on a box without the editable install: the
# package is the repo root's
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench import ops  # noqa: E402
from workbench.ops.cases import GENERATORS  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op")
    p.add_argument("variant")
    p.add_argument("label")
    p.add_argument("--shapes", default="real", choices=("real", "edge"))
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    cases = GENERATORS[a.op](a.shapes, 0, device=a.device)
    case = next((c for c in cases if c.label == a.label), None)
    if case is None:
        raise SystemExit(f"label: expected one of {[c.label for c in cases]}, got {a.label!r}")
    with ops.use({a.op: a.variant}):
        fn = ops.get(a.op)
        for _ in range(a.calls):
            fn(*case.args, **case.kwargs)
    if a.device == "cuda":
        torch.cuda.synchronize()
    print(f"{a.op} {a.variant} {a.label!r}: {a.calls} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
