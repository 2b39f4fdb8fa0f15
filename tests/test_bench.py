"""The benchmark harness on CPU: the DataFrame it promises, rows on disk with their metadata,
crash-safe appends, peers that are missing, the roofline arithmetic, and the CLI."""

import math

import pandas as pd
import pytest
import torch

from workbench import bench as B
from workbench import peers, traces_io
from workbench.ops.case import Case
from workbench.ops.registry import OpSpec, Variant


def _axpy_spec():
    """A trivial op: reference, a correct variant, a wrong one, a GPU-only one."""
    spec = OpSpec("axpy", "x + a y")
    spec.add(Variant("reference", lambda x, y, alpha=1.0: x + alpha * y))
    spec.add(Variant("fast", lambda x, y, alpha=1.0: torch.add(x, y, alpha=alpha)))
    spec.add(Variant("wrong", lambda x, y, alpha=1.0: x - y))
    spec.add(Variant("gpu_only", lambda x, y, alpha=1.0: x, needs=("cuda",)))
    spec.roofline = lambda c: {"bytes": 3 * 4 * c.args[0].numel(), "flops": 2 * c.args[0].numel()}
    return spec


def _cases():
    return [Case("axpy", f"n={n}", (torch.randn(n), torch.randn(n)), {"alpha": 2.0})
            for n in (64, 1000)]


@pytest.fixture
def quick(monkeypatch):
    """Known ceilings: no 64 MB copy / matmul measurement in every test."""
    monkeypatch.setitem(B._CEILINGS, "cpu", {"copy_GBps": 10.0, "matmul_TFLOPs": 0.1,
                                             "l2_bytes": 2**20})


def test_bench_cpu_dataframe(quick):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU labelling")
    df = B.bench(_axpy_spec(), cases=_cases(), device="cpu", save=False, max_seconds=1)
    assert list(df.columns[:12]) == ["op", "variant", "kind", "case", "us", "p20_us", "p80_us",
                                     "GB/s", "TFLOP/s", "pct_ceiling", "x_best_peer", "device"]
    assert set(traces_io.META_COLUMNS) <= set(df.columns)
    assert (df["device"] == "cpu").all() and df["gpu"].str.startswith("cpu").all()
    by = {(r.variant, r.case): r for r in df.itertuples()}
    for case in ("n=64", "n=1000"):
        ref, fast = by[("reference", case)], by[("fast", case)]
        assert ref.kind == "reference" and fast.kind == "variant" and fast.ok
        assert ref.p20_us <= ref.us <= ref.p80_us and fast.us > 0
        wrong, gpu = by[("wrong", case)], by[("gpu_only", case)]
        assert wrong.ok is False and math.isnan(wrong.us) and "rel err" in wrong.note  # not timed
        assert gpu.note.startswith("unavailable: needs a CUDA GPU") and math.isnan(gpu.us)
        floor = by[("floor", case)]
        assert floor.kind == "floor" and floor.pct_ceiling == pytest.approx(100.0)
    assert "op variant shape | us | GB/s | TFLOP/s | % ceiling | x best peer" in \
        " ".join(traces_io.format_table(df).splitlines()[0].split())


def test_roofline_arithmetic_by_hand():
    # 8 GB at 4000 GB/s = 2000 us; 8e11 FLOP at 800 TFLOP/s = 1000 us: memory-bound floor 2000
    assert B.floor_us(8e9, 8e11, 4000.0, 800.0) == pytest.approx(2000.0)
    assert B.roofline_pct(8e9, 8e11, 4000.0, 4000.0, 800.0) == pytest.approx(50.0)
    assert B.roofline_pct(1e6, 8e11, 2000.0, 4000.0, 800.0) == pytest.approx(50.0)  # compute
    base = {"op": "o", "case": "c", "bytes": 8e9, "flops": 8e11, "copy_GBps": 4000.0,
            "matmul_TFLOPs": 800.0}
    df = traces_io.derive(pd.DataFrame([
        {**base, "variant": "v", "kind": "variant", "us": 4000.0, "ok": True},
        {**base, "variant": "p", "kind": "peer", "us": 8000.0, "ok": True},
        {**base, "variant": "bad", "kind": "peer", "us": 1000.0, "ok": False},  # wrong: no bar
    ]))
    v = df.iloc[0]
    assert v["GB/s"] == pytest.approx(2000.0) and v["TFLOP/s"] == pytest.approx(200.0)
    assert v["pct_ceiling"] == pytest.approx(50.0) and v["floor_us"] == pytest.approx(2000.0)
    assert v["x_best_peer"] == pytest.approx(2.0) and df.iloc[1]["x_best_peer"] == 1.0


def test_cold_l2_rotation_sizes():
    call = ((torch.zeros(25),), {})  # 100 bytes
    sets, flush = B._arg_sets(call, "cuda", l2=1000, cold_l2=True)  # clones only: CPU is fine
    assert len(sets) == 20 and flush == 0  # 20 x 100 B >= 2 x L2
    assert sets[1][0][0] is not call[0][0] and torch.equal(sets[1][0][0], call[0][0])
    sets, flush = B._arg_sets(((torch.zeros(2),), {}), "cuda", l2=1000, cold_l2=True)
    assert len(sets) == B.MAX_SETS and flush == 2000  # capped: scratch writes evict instead
    assert B._arg_sets(call, "cpu", 1000, True) == ([call], 0)


def test_rows_appended_with_metadata(tmp_path, quick):
    spec = _axpy_spec()
    B.bench(spec, variants="reference,fast", peers="none", cases=_cases(), device="cpu",
            traces_dir=tmp_path, max_seconds=0.5, command="pytest run 1")
    B.bench(spec, variants="reference", cases=_cases()[:1], device="cpu", traces_dir=tmp_path,
            max_seconds=0.5, command="pytest run 2")
    csv, jsonl = pd.read_csv(tmp_path / "axpy.csv"), traces_io.read_rows(tmp_path / "axpy.jsonl")
    assert len(csv) == len(jsonl) == 2 * 3 + 2  # (ref, fast, floor) x 2 cases + (ref, floor)
    assert (tmp_path / "axpy.csv").read_text().count("op,variant,kind") == 1
    for col in ("gpu", "torch", "git_sha", "git_dirty", "command", "timestamp", "copy_GBps"):
        assert jsonl[col].notna().all(), col
    assert list(jsonl["command"].unique()) == ["pytest run 1", "pytest run 2"]
    assert (jsonl["torch"] == torch.__version__).all()
    assert not list(tmp_path.glob(".*tmp*")) and not list(tmp_path.glob("*.lock"))


def test_crash_mid_append_leaves_earlier_rows_intact(tmp_path, quick, monkeypatch):
    spec = _axpy_spec()
    B.bench(spec, variants="reference", cases=_cases(), device="cpu", traces_dir=tmp_path,
            max_seconds=0.2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def torn_write(tmp, data):  # the process dies half-way through writing the new file
        with open(tmp, "wb") as fh:
            fh.write(data[: len(data) // 2])
        raise OSError("simulated crash")

    monkeypatch.setattr(traces_io, "_write_tmp", torn_write)
    with pytest.raises(OSError, match="simulated"):
        B.bench(spec, variants="reference", cases=_cases(), device="cpu", traces_dir=tmp_path,
                max_seconds=0.2)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file left
    assert len(pd.read_csv(tmp_path / "axpy.csv")) == 4
    assert len(traces_io.read_rows(tmp_path / "axpy.jsonl")) == 4

    def dies(x, y, alpha=1.0):  # a crash mid-run (Ctrl-C in the timing loop)
        raise KeyboardInterrupt

    spec.add(Variant("dies", dies))
    with pytest.raises(KeyboardInterrupt):
        B.bench(spec, variants="reference,dies", cases=_cases(), device="cpu", check=False,
                traces_dir=tmp_path, max_seconds=0.2)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_peer_not_installed_and_broken_peers_report_cleanly(quick):
    spec = _axpy_spec()
    missing = peers.Peer("ghost", "axpy", load=lambda: None, prepare=lambda c: c.args,
                         needs=("no_such_module_for_workbench_tests",))
    reason = missing.unavailable_reason()
    assert "no_such_module_for_workbench_tests" in reason and "ModuleNotFoundError" in reason

    def broken_load():
        raise ImportError("libfoo.so: cannot open shared object file")

    broken = peers.Peer("broken", "axpy", broken_load, prepare=lambda c: c.args)
    good = peers.Peer("torch_add", "axpy", lambda: (lambda x, y: x + 2 * y),
                      prepare=lambda c: c.args)
    for p in (missing, broken, good):
        peers.register_peer(p)
    try:
        df = B.bench(spec, variants="fast", peers="all", cases=_cases()[:1], device="cpu",
                     save=False, max_seconds=0.5)
    finally:
        peers._PEERS.pop("axpy")
    by = {r.variant: r for r in df.itertuples()}
    assert by["ghost"].note.startswith("not installed: package") and math.isnan(by["ghost"].us)
    assert by["broken"].ok is False and "libfoo.so" in by["broken"].note
    assert by["torch_add"].ok and by["torch_add"].x_best_peer == 1.0
    assert by["fast"].x_best_peer > 0


def test_registered_peers_are_listed_and_explain_themselves():
    assert set(peers.peer_names("int4_moe")) == {"humming", "grouped_mm_bf16",
                                                 "triton_fused_moe"}  # kernels/int4_moe
    assert set(peers.peer_names("tree_mla")) == {"sdpa_dense", "flex_attention",
                                                 "sglang_extend_triton"}  # kernels/tree_mla
    assert peers.peer_names("tree_build") == ["cpu_heapq"]
    assert {"torch_eager", "torch_cuda_graph"} <= set(peers.peer_names("drafter"))
    if not torch.cuda.is_available():
        assert "CUDA" in peers.get_peer("int4_moe", "humming").unavailable_reason()
    with pytest.raises(KeyError, match="known"):
        peers.get_peer("int4_moe", "marlin")


def test_moe_align_matches_the_loop_definition():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]])  # T=3, K=2, E=5, block 2
    sorted_ids, expert_ids, total = peers.moe_align(ids, 5, 2)
    # expert 0: slots 1, 4; expert 1: slot 3 + pad; expert 3: slots 0, 2, 5 + pad (pad id = 6)
    assert sorted_ids.tolist() == [1, 4, 3, 6, 0, 2, 5, 6]
    assert expert_ids.tolist() == [0, 1, 3, 3] and int(total) == 8


def test_grouped_mm_peer_matches_reference_on_cpu():
    """The bf16 grouped-GEMM peer on a tiny int4_moe case (CPU has a _grouped_mm fallback)."""
    from workbench import ops

    spec = ops.op_spec("int4_moe")
    case = spec.make_inputs("edge", 0, cfg=None, device="cpu")[4]  # T=5 K=E=7
    peer = peers.get_peer("int4_moe", "grouped_mm_bf16")
    out = peer.loaded()(*peer.prepare(case))
    ref = spec.variant("reference").load()(*case.args)
    ok, note = peer.compare(out, ref, case)
    peers.clear_caches("int4_moe")
    assert ok, note


def test_bench_main_cli_and_suite_import(tmp_path, capsys, monkeypatch):
    from workbench.suite import suite_main

    rc = B.bench_main(["moe_route", "--shapes", "edge", "--device", "cpu", "--max-seconds", "0.5",
                       "--traces", str(tmp_path / "run"), "--save-as", "bench"])
    out = capsys.readouterr().out
    assert rc == 0 and "moe_route on cpu" in out and "[CPU: smoke-test numbers" in out
    assert "op variant shape" in out and "moe_route reference" in out
    monkeypatch.setenv("WORKBENCH_TRACES", str(tmp_path / "traces"))
    assert suite_main(["--import-results", str(tmp_path / "run")]) == 0
    rows = traces_io.read_rows(tmp_path / "traces" / "moe_route.jsonl")
    assert len(rows) == len(traces_io.read_rows(tmp_path / "run" / "bench.jsonl"))
    assert (tmp_path / "traces" / "gpu" / "run" / "bench.csv").exists()
    assert B.bench_main(["no_such_op", "--device", "cpu", "--no-save"]) == 1


def test_registered_op_variants_go_through_workbench_check(quick):
    """A variant of a registered op is judged by workbench.check (poisoning, input checks)."""
    from workbench import ops

    spec = ops.op_spec("rmsnorm")
    ref = spec.variant("reference").load()
    spec.add(Variant("test_same", lambda *a, **k: ref(*a, **k)))
    spec.add(Variant("test_off", lambda *a, **k: ref(*a, **k) * 1.01))
    try:
        cases = spec.make_inputs("edge", 0, cfg=None, device="cpu")[:2]
        df = B.bench("rmsnorm", variants="test_same,test_off", peers="none", cases=cases,
                     device="cpu", save=False, max_seconds=0.3)
    finally:
        del spec.variants["test_same"], spec.variants["test_off"]
    same, off = df[df["variant"] == "test_same"], df[df["variant"] == "test_off"]
    assert same["ok"].tolist() == [True, True] and same["us"].notna().all()
    assert off["ok"].tolist() == [False, False] and off["us"].isna().all()
    assert off["note"].str.startswith("workbench.check:").all()


def test_clone_inputs_copies_tensors_but_shares_modules():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    (x2, layer2), kw = B.clone_inputs(((x, layer), {"k": x}))
    assert layer2 is layer and x2 is not x and torch.equal(x2, x) and kw["k"] is not x
    assert B.tensor_bytes(((x, layer), {"again": x})) == 3 * 4 * 4 + (16 + 4) * 4  # x once


def test_cuda_timing_keeps_kernel_time_through_the_graph_retiming(monkeypatch):
    """time_calls' CUDA path with the device parts stubbed (no GPU here): the profiler's kernel
    time measured on the eager calls must survive the graph re-timing that replaces the
    Timing (session 5's first H200 run lost it: kernel_us came back null)."""
    monkeypatch.setattr(B, "_sync", lambda device: None)
    monkeypatch.setattr(B, "_run_events", lambda calls, n, flush: [10.0] * n)
    monkeypatch.setattr(B, "kernel_time_us", lambda calls, n, flush=None: 7.5)
    monkeypatch.setattr(B, "_syncs", lambda call: False)
    monkeypatch.setattr(B, "capture_replays", lambda calls: calls)
    monkeypatch.delenv("WORKBENCH_NO_KERNEL_TIME", raising=False)
    t = B.time_calls(lambda: None, [((), {})], "cuda", budget_s=0.01, graph="on")
    assert t.graph and t.us == 10.0 and t.eager_us == 10.0 and t.kernel_us == 7.5
    monkeypatch.setenv("WORKBENCH_NO_KERNEL_TIME", "1")
    assert math.isnan(B.time_calls(lambda: None, [((), {})], "cuda", 0.01, "on").kernel_us)


def test_lazy_case_inputs_are_built_once_and_released():
    """Big REAL inputs are built when a case runs and dropped after it (the drafter's 26 GB
    caches): args is built on first use, the same object until release(), then rebuilt."""
    built = []

    def make():
        built.append(torch.randn(4))
        return (built[-1], torch.randn(4))

    c = Case("axpy", "lazy", make, {"alpha": 2.0})
    assert built == []  # nothing before first use
    a = c.args
    assert len(built) == 1 and c.args is a  # built once
    c.release()
    assert c.args is not a and len(built) == 2  # rebuilt after release
    c.args = (torch.ones(2), torch.ones(2))  # assigning replaces the builder
    c.release()
    assert torch.equal(c.args[0], torch.ones(2))


def test_bench_only_picks_cases_and_names_unknown_labels(quick):
    lazy = Case("axpy", "n=7 lazy", lambda: (torch.randn(7), torch.randn(7)), {"alpha": 2.0})
    cases = _cases() + [lazy]
    df = B.bench(_axpy_spec(), variants="reference,fast", peers="none", cases=cases,
                 device="cpu", save=False, max_seconds=1, only=["n=1000", "n=7 lazy"])
    assert set(df["case"]) == {"n=1000", "n=7 lazy"}
    assert lazy._built is None  # released once its case was timed
    with pytest.raises(ValueError, match=r"only: expected case labels .*got \['n=5'\]"):
        B.bench(_axpy_spec(), cases=_cases(), device="cpu", save=False, only="n=5")


def test_rounds_interleave_implementations_and_report_the_median_round(quick, monkeypatch):
    # why: two implementations timed a minute apart on the H200 differ by up to 10 % on the
    # same launches (session 16); with rounds the case's implementations are timed in turn,
    # round after round, and each row takes its median round, listing every round in its note
    order, us = [], iter([5.0, 50.0, 1.0, 30.0, 3.0, 40.0])  # reference, fast, x 3 rounds

    def fake_time(fn, sets, device, budget_s, graph, flush):
        order.append(fn)
        u = next(us)
        return B.Timing(u, u, u, 10, len(sets))

    monkeypatch.setattr(B, "time_calls", fake_time)
    df = B.bench(_axpy_spec(), variants="reference,fast", peers="none", cases=_cases()[:1],
                 device="cpu", save=False, max_seconds=1, rounds=3)
    ref_fn, fast_fn = order[0], order[1]
    assert order == [ref_fn, fast_fn] * 3 and ref_fn is not fast_fn  # interleaved
    by = {r.variant: r for r in df.itertuples()}
    assert by["reference"].us == 3.0 and by["fast"].us == 40.0  # medians of (5, 1, 3), (50, 30, 40)
    assert "median of 3 interleaved rounds: 50.0 30.0 40.0" in by["fast"].note
    with pytest.raises(ValueError, match=r"rounds: expected an int >= 1, got 0"):
        B.bench(_axpy_spec(), cases=_cases(), device="cpu", save=False, rounds=0)
