"""Run a snippet that compiles kernels for sm_90 in a subprocess without TRITON_INTERPRET (the
test session interprets Triton; Gluon has no interpreter and the sm_90 compile reports need JIT
kernels): the snippet sets `out`, returned through JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_sm90(code: str):
    """Run `code` (which sets `out`) from the repo root without TRITON_INTERPRET; `out`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", f"import json; {code}; print(json.dumps(out))"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
