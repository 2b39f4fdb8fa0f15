"""NVTX ranges (no-op, nvtx-package and profiler paths), the exact Nsight command strings, and
`trace` writing a chrome trace plus its INDEX.md line."""

import gzip
import json
import sys
import types

import pytest
import torch

from workbench import tracing
from workbench.ops.case import Case
from workbench.ops.registry import OpSpec, Variant


@pytest.fixture
def fresh_backend(monkeypatch):
    """Choose the backend again for this test and again afterwards (it is cached per process)."""
    tracing._reset_backend()
    yield monkeypatch
    monkeypatch.undo()
    tracing._reset_backend()


def test_names():
    assert tracing.phase_range("build") == "ddtree/build"
    assert [tracing.phase_range(p) for p in tracing.PHASES] == [
        "ddtree/draft", "ddtree/build", "ddtree/verify", "ddtree/walk", "ddtree/commit"]
    assert tracing.kernel_range("int4_moe", "triton_v1") == "ddtree/int4_moe/triton_v1"
    with pytest.raises(ValueError, match="phase"):
        tracing.phase_range("bulid")  # a typo would make a range no filter matches


def test_noop_path_nests_decorates_and_propagates(fresh_backend):
    fresh_backend.setitem(sys.modules, "nvtx", None)  # `import nvtx` raises ImportError
    if torch.cuda.is_available():
        fresh_backend.setenv("WORKBENCH_NVTX", "0")
    assert tracing.backend().name == "none"
    seen = []

    @tracing.nvtx_range("ddtree/outer")
    def f(x):
        with tracing.nvtx_range("ddtree/inner"), tracing.nvtx_range("ddtree/inner"):  # recursion
            seen.append(x)
        return x + 1

    assert f(1) == 2 and f.__name__ == "f" and seen == [1]
    with pytest.raises(KeyError):
        with tracing.nvtx_range("ddtree/outer"):
            raise KeyError("propagates")
    assert tracing.nvtx_range("ddtree/outer")._rf == []  # every enter was exited
    assert tracing.nvtx_range("ddtree/x") is tracing.nvtx_range("ddtree/x")  # cached per name


class _FakeDomain:
    def __init__(self, log):
        self.log = log

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return message

    def push_range(self, attrs):
        self.log.append(("push", attrs))

    def pop_range(self):
        self.log.append(("pop",))


def test_nvtx_package_path_pushes_named_ranges_in_the_ddtree_domain(fresh_backend):
    log, domains = [], []

    def get_domain(name):
        domains.append(name)
        return _FakeDomain(log)

    fresh_backend.setitem(sys.modules, "nvtx", types.SimpleNamespace(get_domain=get_domain))
    assert tracing.backend().name == "nvtx" and tracing.backend().domain == "ddtree"
    with tracing.nvtx_range("ddtree/verify"):
        with tracing.nvtx_range("ddtree/tree_mla/reference"):
            pass
    assert domains == ["ddtree"]
    assert log == [("push", "ddtree/verify"), ("push", "ddtree/tree_mla/reference"), ("pop",),
                   ("pop",)]


def test_nvtx_without_a_tool_attached_is_a_noop(fresh_backend):
    class DummyDomain(_FakeDomain):  # what nvtx.get_domain returns when no tool is attached
        pass

    log = []
    fresh_backend.setitem(sys.modules, "nvtx",
                          types.SimpleNamespace(get_domain=lambda name: DummyDomain(log)))
    assert tracing.backend().name == "nvtx (no tool attached)"
    with tracing.nvtx_range("ddtree/draft"):
        pass
    assert log == []  # no calls at all: the cheap path


def test_ranges_show_in_torch_profiler(fresh_backend):
    fresh_backend.setitem(sys.modules, "nvtx", None)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with tracing.nvtx_range("ddtree/walk"):
            torch.ones(3).sum()
    assert "ddtree/walk" in {e.key for e in prof.key_averages()}
    assert not tracing._profiler_on()


def test_noop_overhead_is_small(fresh_backend):
    fresh_backend.setitem(sys.modules, "nvtx", None)
    cost = tracing.measure_overhead(n=5000, repeat=3)
    assert cost["with_ns"] < 20_000  # ~0.4 us on the 2-core box; the bound only catches blunders


def test_ncu_filter_and_command_exact():
    assert tracing.ncu_filter("ddtree/int4_moe/triton_v1") == r"ddtree@ddtree\/int4_moe\/triton_v1/"
    assert tracing.ncu_filter("ddtree/build", domain=None) == r"ddtree\/build/"
    assert tracing.ncu_command("ddtree/int4_moe/reference", "python x.py") == (
        r"ncu --nvtx --nvtx-include 'ddtree@ddtree\/int4_moe\/reference/' --clock-control none "
        "--target-processes all --launch-count 20 python x.py")
    assert tracing.ncu_command("ddtree/verify", "python x.py", out="traces/v", launch_count=5) == (
        r"ncu --nvtx --nvtx-include 'ddtree@ddtree\/verify/' --clock-control none "
        "--target-processes all --launch-count 5 -f -o traces/v python x.py")


def test_nsys_command_exact():
    assert tracing.nsys_command("ddtree/tree_mla/reference", "python x.py") == (
        "nsys profile --trace=cuda,nvtx --capture-range=nvtx "
        "--nvtx-capture=ddtree/tree_mla/reference@ddtree --capture-range-end=stop python x.py")
    assert tracing.nsys_command("ddtree/build", "python x.py", out="o", domain=None) == (
        "nsys profile --trace=cuda,nvtx --capture-range=nvtx --nvtx-capture=ddtree/build "
        "--capture-range-end=stop --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 -f true -o o "
        "python x.py")


def test_trace_writes_chrome_trace_table_and_index_line(tmp_path, fresh_backend):
    from workbench.trace import trace

    fresh_backend.setitem(sys.modules, "nvtx", None)
    spec = OpSpec("axpy", "x + y")
    spec.add(Variant("reference", lambda x, y: x + y))
    case = Case("axpy", "n=64", (torch.randn(64), torch.randn(64)))
    res = trace(spec, cases=[case], device="cpu", out_dir=tmp_path, iters=2, command="test")
    assert res["range"] == "ddtree/axpy/reference"
    raw = res["trace"].read_bytes()
    events = json.loads(gzip.decompress(raw) if res["trace"].suffix == ".gz" else raw)
    names = {e.get("name") for e in events["traceEvents"]}
    assert "ddtree/axpy/reference" in names
    assert "ddtree/axpy/reference" in res["table"].read_text()
    index = (tmp_path / "INDEX.md").read_text().splitlines()
    assert index[0] == "# Saved traces" and index[-1].startswith("| ")
    assert res["trace"].name in index[-1] and "`test`" in index[-1]
    assert "--nvtx-include" in res["ncu"] and "--replay 3" in res["ncu"]
    trace(spec, cases=[case], device="cpu", out_dir=tmp_path, iters=1, command="again")
    lines = (tmp_path / "INDEX.md").read_text().splitlines()
    assert len(lines) == len(index) + 1 and lines.count("# Saved traces") == 1
