"""NVTX ranges for the decode loop and the kernels, plus the exact Nsight commands to filter them.

Names (DESIGN.md §8): `ddtree/<phase>` for loop phases (draft, build, verify, walk, commit) and
`ddtree/<op>/<variant>` for kernels, all in the NVTX domain "ddtree".

    with nvtx_range(kernel_range("int4_moe", "triton_v1")):
        out = fn(*args)

    @nvtx_range(phase_range("build"))
    def build(...): ...

Backend, chosen once per process (first use):
  1. the `nvtx` package (NVIDIA, PyPI): a real "ddtree" domain. With no tool attached
     `get_domain` returns a DummyDomain, and we then skip the calls entirely.
  2. `torch.cuda.nvtx` when CUDA is available: default domain only (no "ddtree@" in filters).
  3. a no-op (CPU builds: `torch.cuda.nvtx` raises there at the first call).
`WORKBENCH_NVTX=0` forces the no-op.

When a torch.profiler session is active, each range also opens `record_function(name)`, so
the chrome trace shows it (an `nvtx` range alone is invisible to torch.profiler, and
`record_function` costs ~8 us when no profiler runs, so it is only entered when one does).

Cost of the no-op path, measured on the 2-core CPU box (Python 3.11, 100k iterations, best of
5): `with nvtx_range(name):` ~0.4 us (a bare `with` on an empty object is ~0.3 us there), a
call through a decorated function ~0.45 us over a plain call. `python -m workbench.tracing`
re-measures it on the machine at hand.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import timeit
import types

DOMAIN = "ddtree"
PHASES = ("draft", "build", "verify", "walk", "commit")


def phase_range(phase: str) -> str:
    """`ddtree/<phase>`; phase one of PHASES (a typo would silently make an unfilterable name)."""
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    return f"{DOMAIN}/{phase}"


def kernel_range(op: str, variant: str) -> str:
    """`ddtree/<op>/<variant>`."""
    return f"{DOMAIN}/{op}/{variant}"


# ---------------------------------------------------------------------------------------------
# backends


class _NoOp:
    name = "none"
    domain = None  # ranges go nowhere; filters are moot

    def push(self, msg: str) -> None:
        pass

    def pop(self) -> None:
        pass


class _NvtxPackage:
    """`nvtx` package, domain "ddtree"; event attributes cached per name (registered strings)."""

    name = "nvtx"
    domain = DOMAIN

    def __init__(self, dom):
        self._dom = dom
        self._attrs: dict[str, object] = {}

    def push(self, msg: str) -> None:
        attrs = self._attrs.get(msg)
        if attrs is None:
            attrs = self._attrs[msg] = self._dom.get_event_attributes(message=msg)
        self._dom.push_range(attrs)

    def pop(self) -> None:
        self._dom.pop_range()


class _TorchNvtx:
    """torch.cuda.nvtx: default NVTX domain only, unregistered strings."""

    name = "torch.cuda.nvtx"
    domain = None

    def __init__(self):
        import torch

        self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def push(self, msg: str) -> None:
        self._push(msg)

    def pop(self) -> None:
        self._pop()


_BACKEND = None


def backend():
    """The active backend object: `.name` ("nvtx", "torch.cuda.nvtx", "none", ...) and
    `.domain` ("ddtree", or None for the default domain)."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = _choose_backend()
    return _BACKEND


def _choose_backend():
    if os.environ.get("WORKBENCH_NVTX", "1") == "0":
        return _NoOp()
    try:
        import nvtx
    except ImportError:
        nvtx = None
    if nvtx is not None:
        dom = nvtx.get_domain(DOMAIN)
        if type(dom).__name__ == "DummyDomain":  # no tool attached: decided at process start
            b = _NoOp()
            b.name, b.domain = "nvtx (no tool attached)", DOMAIN
            return b
        return _NvtxPackage(dom)
    import torch

    if torch.cuda.is_available():
        return _TorchNvtx()
    return _NoOp()


def _reset_backend() -> None:
    """Forget the chosen backend (tests swap `nvtx` in and out of sys.modules)."""
    global _BACKEND, _PROFILER_MOD
    _BACKEND = None
    _PROFILER_MOD = None
    _RANGES.clear()


_PROFILER_MOD = None


def _profiler_on() -> bool:
    """True while a torch.profiler/autograd profiler session runs (a module flag, ~40 ns)."""
    global _PROFILER_MOD
    if _PROFILER_MOD is None:
        if "torch" not in sys.modules:  # nothing can be profiling torch without torch
            return False
        import torch.autograd.profiler as prof

        # Private but stable for years; if it moves, ranges just stop showing in torch traces.
        if not hasattr(prof, "_is_profiler_enabled"):
            prof = types.SimpleNamespace(_is_profiler_enabled=False)
        _PROFILER_MOD = prof
    return bool(_PROFILER_MOD._is_profiler_enabled)


class _Range:
    """One named range. The no-op path costs a `with` plus two attribute reads: ranges stay
    in hot loops without a flag to turn them off."""

    __slots__ = ("name", "_rf", "_b")

    def __init__(self, name: str):
        self.name = name
        self._rf = []  # open record_function contexts, None where the profiler was off
        self._b = backend()

    def __enter__(self):
        prof = _PROFILER_MOD
        if (prof._is_profiler_enabled if prof is not None else _profiler_on()):
            import torch

            rf = torch.profiler.record_function(self.name)
            rf.__enter__()
            self._rf.append(rf)
        else:
            self._rf.append(None)
        self._b.push(self.name)
        return self

    def __exit__(self, *exc):
        self._b.pop()
        rf = self._rf.pop()
        if rf is not None:
            rf.__exit__(*exc)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return inner


_RANGES: dict[str, _Range] = {}


def nvtx_range(name: str) -> _Range:
    """Context manager and decorator for the NVTX range `name` (cached per name).

    Not thread-safe per name: two threads inside the same range name share its record_function
    stack. The decode loop is single-threaded; give threads their own names if that changes.
    """
    r = _RANGES.get(name)
    if r is None:
        r = _RANGES[name] = _Range(name)
    return r


# ---------------------------------------------------------------------------------------------
# Nsight commands


def _escape(name: str) -> str:
    # ncu reads '/' in a filter as the separator of nested push/pop ranges, so a '/' inside one
    # range's name is escaped with a backslash (so are '@', ',', '[', ']', '*', and '\' itself).
    # Seen on the H200 (ncu 2025.3, 2026-11-29), range "ddtree/t/mm" in domain ddtree:
    # "ddtree@ddtree\/t\/mm/" profiled its 1 kernel, "ddtree@ddtree/t/mm/" and
    # "ddtree@ddtree/" none, "regex:ddtree@ddtree\/t\/.*/" both ranges' 2.
    return "".join("\\" + c if c in "\\/@,[]*" else c for c in name)


def ncu_filter(range_name: str, domain: str | None = DOMAIN) -> str:
    """The `--nvtx-include` value for kernels inside the push/pop range `range_name`.

    `domain@` is required for a non-default domain (without it ncu matches nothing); the
    trailing `/` selects a push/pop range (without it ncu looks for a start/end range).
    Pass domain=None for ranges made with torch.cuda.nvtx (default domain).
    """
    prefix = f"{domain}@" if domain else ""
    return f"{prefix}{_escape(range_name)}/"


def ncu_command(range_name: str, script_cmd: str, out: str | None = None,
                domain: str | None = DOMAIN, launch_count: int = 20) -> str:
    """The exact ncu command line profiling the kernels of one range of `script_cmd`.

    `--clock-control none`: measure the card as found (never lock its clocks, METHOD.md);
    `--target-processes all`: pytest/torchrun children too; launch_count caps the replay time.
    """
    parts = ["ncu", "--nvtx", "--nvtx-include", shlex.quote(ncu_filter(range_name, domain)),
             "--clock-control", "none", "--target-processes", "all",
             "--launch-count", str(launch_count)]
    if out:
        parts += ["-f", "-o", shlex.quote(out)]
    return " ".join(parts) + " " + script_cmd


def nsys_command(range_name: str, script_cmd: str, out: str | None = None,
                 domain: str | None = DOMAIN) -> str:
    """The exact nsys command line capturing only while `range_name` is open.

    nsys spells the capture range `range@domain` (the reverse of ncu's `domain@range`).
    torch.cuda.nvtx ranges use unregistered strings in the default domain, which nsys ignores
    for capture unless NSYS_NVTX_PROFILER_REGISTER_ONLY=0.
    """
    capture = f"{range_name}@{domain}" if domain else range_name
    parts = ["nsys", "profile", "--trace=cuda,nvtx", "--capture-range=nvtx",
             f"--nvtx-capture={shlex.quote(capture)}", "--capture-range-end=stop"]
    if not domain:
        parts.append("--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0")
    if out:
        parts += ["-f", "true", "-o", shlex.quote(out)]
    return " ".join(parts) + " " + script_cmd


def measure_overhead(n: int = 200_000, repeat: int = 5) -> dict[str, float]:
    """ns per use of the active backend: a `with` block, and a decorated call vs a plain one."""

    def plain():
        return None

    deco = nvtx_range("ddtree/overhead")(plain)
    r = nvtx_range("ddtree/overhead")

    def with_block():
        with r:
            pass

    def best(fn):
        return min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e9

    base = best(plain)
    return {"backend": backend().name, "plain_call_ns": base, "with_ns": best(with_block),
            "decorated_call_ns": best(deco)}


if __name__ == "__main__":
    print(measure_overhead())
