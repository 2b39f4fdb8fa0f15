"""The session-18 and -19 probes stay runnable against the kernels they launch (the
interpreter on CPU: no timing, every launch once): scripts/probe_rope_programs.py and
scripts/probe_small_launches.py print one row per (kernel, rows, option) they were asked for."""

import math

import pytest
from script_module import load


def test_rope_probe_prints_every_rows_and_block(capsys):
    load("probe_rope_programs").main(["--device", "cpu", "--rows", "8,16", "--blocks", "4,32",
                                      "--seconds", "0.01"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [
        (8, 4, 2), (8, 32, 1), (16, 4, 4), (16, 32, 1)]  # rows, rows a program, programs


def test_rope_probe_leaves_the_kernels_default_alone():
    # why: the probe passes block_rows a call; the engine's rope (v1's 32, v2's 4) must not
    # change under a process that ran it
    from workbench.kernels.dense import rope_triton_v1, rope_triton_v2

    load("probe_rope_programs").main(["--device", "cpu", "--rows", "8", "--blocks", "4",
                                      "--seconds", "0.01"])
    assert rope_triton_v1.BLOCK_ROWS == 32 and rope_triton_v2.BLOCK_ROWS == 4


def test_small_launch_probe_runs_every_option(capsys):
    load("probe_small_launches").main(["--device", "cpu", "--rows", "1,3"])
    lines = capsys.readouterr().out.splitlines()[1:]
    seen = [(line[:14].strip(), int(line[14:20]), line[20:34].strip()) for line in lines]
    options = {"rmsnorm": ["warps=1", "warps=2", "warps=4", "warps=8"],
               "add_rmsnorm": ["warps=4", "warps=8", "warps=16"],
               "moe_route": ["warps=1", "warps=2", "warps=4", "warps=8"],
               "int4 combine": [f"BD={b}" for b in (256, 512, 1024, 2048, 4096)]}
    assert seen == [(k, M, o) for M in (1, 3) for k, opts in options.items() for o in opts]
    assert all(math.isnan(float(line.split()[-1])) for line in lines)  # CPU: not timed


def test_profiler_link_probe_prints_the_ranges_and_their_children(capsys):
    load("probe_profiler_links").main(["--device", "cpu"])
    rows = capsys.readouterr().out.splitlines()[1:]
    names = [r.split()[-1] for r in rows]
    assert "op::linear" in names and "op::rope" in names and "aten::mm" in names
    assert any(r.split()[-1] == "aten::matmul" and "op::linear" in r for r in rows)  # parent


def test_moe_route_phase_probe_runs_every_call_and_checks_ids(capsys):
    # why: session 19's probe splits moe_route triton_v2's launch into its phases; each full
    # call must still pick triton_v1's experts (clear margins at these random widths)
    probe = load("probe_moe_route_phases")
    probe.main(["--device", "cpu", "--rows", "1,3"])
    lines = capsys.readouterr().out.splitlines()
    names = ["v1", "v1 gemm", "v2", "v2 no-topk", "v3"] + [
        f"v2 {c}{s}" for c in probe.CFGS for s in ("", " no-topk")]
    assert [(int(line.split()[1]), line[6:28].strip()) for line in lines] == [
        (T, n) for T in (1, 3) for n in names]
    for line in lines:
        want = "None" if ("no-topk" in line or "gemm" in line) else "True"
        assert line.split()[-1] == want, line


def test_l2_prefetch_probe_refuses_unknown_modes():
    import pytest

    with pytest.raises(ValueError, match=r"--modes: expected none / normal / evict_last, "
                                         r"got \['evict_first'\]"):
        load("probe_l2_prefetch").main(["--modes", "none,evict_first"])


def test_l2_prefetch_kernel_asks_l2_with_the_policy_it_names_sm90():
    # why: the probe's answer is only about evict_last if the PTX carries the cache hint
    from sm90_compile import compile_sm90

    out = compile_sm90(
        "import triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "import sys; sys.path.insert(0, 'tests')\n"
        "from script_module import load\n"
        "k = load('probe_l2_prefetch')._prefetch_kernel\n"
        "sig = dict(ptr='*bf16', nbytes='i64', CH='constexpr', BLOCK='constexpr', "
        "EVICT_LAST='constexpr')\n"
        "out = {}\n"
        "for ev in (False, True):\n"
        "    src = ASTSource(k, signature=sig, constexprs=dict(CH=4096, BLOCK=128, "
        "EVICT_LAST=ev))\n"
        "    ptx = triton.compile(src, target=GPUTarget('cuda', 90, 32)).asm['ptx']\n"
        "    out[str(ev)] = [ln.strip() for ln in ptx.splitlines() if 'cp.async.bulk' in ln "
        "or 'createpolicy' in ln]")
    assert out["False"] == ["cp.async.bulk.prefetch.L2.global [%rd1], %r2;"]
    assert out["True"] == ["createpolicy.fractional.L2::evict_last.b64 pol, 1.0;",
                           "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%rd1], %r2, pol;"]


def test_l2_prefetch_probe_step_streams_then_projects():
    # why: session 21 call 2 lost its probe to a torch.sum call only a GPU reached; the step
    # (prefetch skipped at mode none) runs here: the stream's sum lands in the sink
    import torch

    probe = load("probe_l2_prefetch")
    x, w, src = torch.randn(2, 8), torch.randn(4, 8), torch.randn(64).bfloat16()
    sink = torch.zeros(())
    y = probe._step(x, w, src, sink, "none", lambda a, b: a @ b.t())()
    assert torch.equal(y, x @ w.t())
    assert torch.allclose(sink, src.float().sum())
    buf = torch.arange(8.0)
    probe._step(x, w, buf, sink, "none", lambda a, b: a @ b.t(), "copy")()
    assert torch.equal(buf, torch.tensor([0.0, 1, 2, 3, 0, 1, 2, 3]))


def test_pdl_chain_probe_runs_every_mode_with_plains_bits(capsys):
    # why: the probe's answer is only worth its timing if each mode computes the same chain
    # (a race under PDL would change bits on the GPU; here the math against torch)
    probe = load("probe_pdl_chain")
    assert probe.main(["--device", "cpu", "--rows", "1,3", "--layers", "2",
                       "--widths", "128,64"]) == 0
    lines = [r.split() for r in capsys.readouterr().out.splitlines()[1:]]
    assert [(int(r[0]), r[1], r[4]) for r in lines] == [
        (M, m, probe.base_of(m)) for M in (1, 3) for m in probe.MODES]
    assert all(r[5] == "True" and float(r[6]) < 0.05 for r in lines)
    assert {probe.base_of(m) for m in probe.FUSED} == {"fused"}
    with pytest.raises(ValueError, match="mode: expected one of"):
        probe.main(["--device", "cpu", "--modes", "plain,pld"])
    with pytest.raises(ValueError, match="F: expected a multiple of 64"):
        probe.make_chain(1, 128, 48, 1, "plain", "cpu")
    with pytest.raises(ValueError, match="rows: expected 1..64"):
        probe.make_chain(65, 128, 64, 1, "plain", "cpu")


def test_pdl_chain_probe_prefetches_before_it_waits_sm90():
    # why: the prefetch mode's point is the weight stream starting before griddepcontrol.wait;
    # the order of the PTX says whether the compiled GEMV does that
    from sm90_compile import compile_sm90

    out = compile_sm90(
        "import re, sys, triton; from triton.backends.compiler import GPUTarget; "
        "from triton.compiler import ASTSource; sys.path.insert(0, 'tests'); "
        "from script_module import load; p = load('probe_pdl_chain'); out = {}\n"
        "sig = dict(y_ptr='*bf16', w_ptr='*bf16', z_ptr='*bf16', nw_ptr='*bf16', M='i32', "
        "N='i32', K='i32', eps='fp32')\n"
        "for mode in p.MODES:\n"
        "    o = p._options(mode); pdl = o.pop('launch_pdl', False)\n"
        "    c = dict(BM=16, BN=p.BN, BK=p.BK, PREFETCH=mode.endswith('prefetch'), "
        "NORM=mode in p.FUSED, INTERP=False, "
        "PDL=False, EARLY=False, PF_PARTS=p.PF_PARTS) | o\n"
        "    ptx = triton.compile(ASTSource(fn=p._gemv_kernel, signature=sig | {k: 'constexpr' "
        "for k in c}, constexprs=c), target=GPUTarget('cuda', 90, 32), options=dict("
        "num_warps=4, num_stages=3, launch_pdl=pdl)).asm['ptx']\n"
        "    ops = re.findall(r'griddepcontrol\\.(\\w+)|cp\\.async\\.bulk\\.(prefetch)', ptx)\n"
        "    out[mode] = [a or b for a, b in ops]")
    assert out == {"plain": [], "pdl": ["wait", "launch_dependents"],
                   "early": ["launch_dependents", "wait"],
                   "prefetch": ["prefetch", "wait", "launch_dependents"], "fused": [],
                   "fused_prefetch": ["prefetch", "wait", "launch_dependents"]}, out
