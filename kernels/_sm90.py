"""What every kernel folder's `sm90.py` shares: ptxas's verdict on a kernel compiled for sm_90a,
and where nvcc is (the CUDA C++ kernels built for sm_90a: int4_moe cuda_v19 / v20).

The folders compile their Triton kernels for Hopper on a CPU box (`triton.compile(...,
target=GPUTarget("cuda", 90, 32))`, DESIGN.md §10) and hand the PTX here: ptxas (shipped with
Triton) reports registers and spill bytes, which decide occupancy before any GPU time is spent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile


def nvcc_path() -> str | None:
    """The nvcc on PATH, else $CUDA_HOME/bin's (default /usr/local/cuda), else None."""
    path = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                                "bin", "nvcc")
    return path if os.path.exists(path) else None


def ptxas_stats(ptx: str) -> tuple[str, str]:
    """(registers, spill-store bytes) of the PTX's kernel as ptxas -v reports them ("?" if not)."""
    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([exe, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    return (regs.group(1) if regs else "?"), (spill.group(1) if spill else "?")


def ptxas_report(ptx: str) -> str:
    """"<regs> regs, <bytes> B spill" for a table cell."""
    regs, spill = ptxas_stats(ptx)
    return f"{regs} regs, {spill} B spill"
