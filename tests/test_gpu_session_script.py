"""scripts/gpu_session.sh's plan runner on this CPU box: a step cut at its limit still leaves
what its pipeline's filters held (session 39 lost a 560 s step's `| tail | tee` output when
`timeout` signalled the whole group), its status is 124, and the next step runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not Path("/proc/self/stat").exists(),
                                reason="needs bash and /proc")


def _run_plan(tmp_path: Path, steps: list[tuple[int, str]]) -> tuple[Path, float]:
    plan = tmp_path / "plan.tsv"
    plan.write_text("# a test plan\n" + "".join(f"{lim}\t{cmd}\n" for lim, cmd in steps))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "STEPS": str(plan), "SUITE_S": "0", "TEST_FILES": ""}
    t0 = time.monotonic()
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh")], env=env, cwd=ROOT,
                   check=True, timeout=120, capture_output=True)
    return out, time.monotonic() - t0


def test_a_step_cut_at_its_limit_keeps_what_its_filters_held(tmp_path):
    py = sys.executable
    slow = (f"{py} -c \"import time; print('first line', flush=True); "
            f"print('second line', flush=True); time.sleep(60)\" | grep -v first | tail -5 "
            f"| tee $OUT/kept.txt")
    out, took = _run_plan(tmp_path, [(2, slow), (5, "echo the next step ran")])
    assert (out / "kept.txt").read_text() == "second line\n"
    log = (out / "steps.log").read_text()
    assert "[gpu_session] rc 124: " + slow in log
    assert "the next step ran" in log and "[gpu_session] rc 0: echo the next step ran" in log
    assert took < 40  # the sleeping step was stopped, not waited for (60 s)


def test_a_lone_command_past_its_limit_is_stopped(tmp_path):
    # bash -c execs a command with no pipeline: the step's own pid is the python
    out, took = _run_plan(tmp_path, [(1, f"{sys.executable} -c \"import time; time.sleep(60)\""),
                                     (5, "exit 3")])
    log = (out / "steps.log").read_text()
    assert "[gpu_session] rc 124: " in log and "[gpu_session] rc 3: exit 3" in log
    assert took < 40


def test_a_step_within_its_limit_keeps_its_status(tmp_path):
    out, _ = _run_plan(tmp_path, [(20, "echo fine"), (20, "false")])
    log = (out / "steps.log").read_text()
    assert "[gpu_session] rc 0: echo fine" in log and "[gpu_session] rc 1: false" in log
