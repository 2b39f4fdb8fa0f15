"""kernels/dense linear_triton_v1 (the skinny decode GEMM), triton_v2 (the same with split-K in
one launch), triton_v3 (v2's kernel on session 10's best decode tiles up to 16 rows, cuBLAS
above), triton_v4 (v2's split-K with the operands swapped for wgmma) and triton_v5 (v4 for
wide outputs, v3 for narrow ones) against the float64 reference through
workbench.check (NaN-filled output, dtype-derived tolerance, inputs untouched): the registry's
EDGE cases here (it is not in a preset yet, so tests/test_equivalence.py's default run does not
take it), the dispatch rule (> 64 rows or non-bf16/fp16 inputs: torch_bf16's cuBLAS GEMM),
and, on the GPU, the REAL widths (single GPU and an EP8 rank's) and per-row batch invariance.
"""

from __future__ import annotations

import pytest
import torch

from workbench import ops
from workbench.check import check, failures
from workbench.kernels.dense import linear_triton_v1 as lt
from workbench.kernels.dense import linear_triton_v2 as lt2
from workbench.kernels.dense import linear_triton_v3 as lt3
from workbench.kernels.dense import linear_triton_v4 as lt4
from workbench.kernels.dense import linear_triton_v5 as lt5
from workbench.kernels.dense.torch_bf16 import linear as linear_torch


def test_registered_with_its_dispatch_described():
    v = ops.op_spec("linear").variant("triton_v1")
    assert "triton" in v.needs and "torch_bf16" in v.description


@pytest.mark.parametrize("variant", ["triton_v1", "triton_v2", "triton_v3", "triton_v4",
                                     "triton_v5"])
def test_edge_cases_match_the_reference(device, variant):
    df = check("linear", variant, shapes="edge", seeds=2, device=device)
    assert len(df) >= 8 and df["pass"].all(), failures(df)


@pytest.mark.parametrize("mod, bn", [(lt2, 16), (lt4, 64)], ids=["v2", "v4"])
@pytest.mark.parametrize("M, N, K, split", [(1, 40, 4096, 8), (17, 200, 1000, 3), (64, 33, 520, 2),
                                            (5, 70, 96, 16), (31, 130, 700, 4)])
def test_split_k_sums_in_slice_order_and_resets_its_counters(device, mod, bn, M, N, K, split):
    """Forced K slices (the last one short; more slices than K has BK steps): the result is the
    unsplit one up to fp32 summation order (one bf16 rounding), a second call gives the same
    bits (the sum order does not follow arrival order), and every ticket counter is back at 0.
    v4 (swap-AB) writes its [BN, BM] tile transposed: rows and columns past M / N masked."""
    g = torch.Generator(device=device).manual_seed(M + N + K)
    x = torch.randn(M, K, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g, device=device) * K**-0.5).to(torch.bfloat16)
    bm = 16 if M <= 16 else 64
    forced = lambda *_: lt2.Tiles(bm, bn, 64, split, 4, 2)  # noqa: E731
    y = mod.linear(x, w, tiles_for=forced)
    ref = x.double() @ w.double().T
    assert ((y.double() - ref).abs() <= 2 * 2.0**-8 * ref.abs() + 1e-3).all()
    assert torch.equal(mod.linear(x, w, tiles_for=forced), y)
    assert int(lt2.counters(x.device, 1).abs().sum()) == 0


@pytest.mark.parametrize("M, N, K", [(1, 2112, 7168), (17, 1536, 1536), (17, 7168, 1024),
                                     (33, 512, 7168), (65, 7168, 256)])
def test_v2_tiles_fill_the_gpu_with_whole_k_steps(M, N, K):
    t = lt2.tiles(M, N, K)
    assert t.BM >= min(M, lt.MAX_ROWS) and 16 <= t.BN <= 64 and 1 <= t.SPLIT <= 16
    assert t.SPLIT == 1 or -(-K // t.SPLIT) >= 2 * t.BK  # a slice is >= 2 K steps


@pytest.mark.parametrize("M, N, K", [(1, 2112, 7168), (17, 1536, 1536), (17, 7168, 1024),
                                     (33, 512, 7168), (64, 7168, 256)])
def test_v4_tiles_are_one_wave_of_whole_k_steps(M, N, K):
    t = lt4.tiles(M, N, K)
    assert t.BM >= M and t.BM in (16, 32, 64) and t.BN == 64 and 1 <= t.SPLIT <= 16
    assert -(-N // t.BN) * t.SPLIT <= lt.SMS
    assert t.SPLIT == 1 or -(-K // t.SPLIT) >= 2 * t.BK  # a slice is >= 2 K steps


def test_v4_compiles_to_pipelined_wgmma_sm90():
    # why: the point of v4 is the swapped operands: 64 output columns on the wgmma's M at any
    # row tile (v2's 16 / 32-row tiles are mma.sync), its K tiles in flight by cp.async, and
    # no spills at the EP8 rank's decode shapes (1 / 17 / 33 rows)
    from sm90_compile import compile_sm90

    shapes = [(1, 2112, 7168), (17, 7168, 1024), (17, 1536, 1536), (33, 512, 7168)]
    reports = compile_sm90("from workbench.kernels.dense import linear_triton_v4 as v; "
                           f"out = [v.sm90_report(*s) for s in {shapes}]")
    for s, r in zip(shapes, reports):
        assert r["spill"] == "0" and int(r["regs"]) <= 128, (s, r)
        assert r["wgmma"] > 0 and r["mma_sync"] == 0 and r["cp_async"] > 0, (s, r)


@pytest.mark.parametrize("name, N, K, best", [
    ("q_a | kv_a", 2112, 7168, (64, 256, 4)), ("o", 7168, 1024, (64, 128, 1)),
    ("q_b", 1536, 1536, (16, 256, 1)), ("gate | up", 512, 7168, (32, 128, 8)),
    ("down", 7168, 256, (64, 128, 1))])
def test_v3_tiles_are_the_sweeps_best_at_decode(name, N, K, best):
    # why: v3's rule is session 10's sweep read back (traces/gpu/session10/sweep_linear.csv:
    # the fastest (BN, BK, SPLIT) at 1 and 9 rows for each EP8-rank projection)
    for M in (1, 9, 16):
        t = lt3.tiles(M, N, K)
        assert (t.BM, t.BN, t.BK, t.SPLIT) == (16, *best), (name, M, t)


def test_v3_runs_cublas_past_16_rows(device, monkeypatch):
    calls = []
    monkeypatch.setattr(lt3.torch_bf16, "linear", lambda x, w: calls.append(x.shape) or
                        linear_torch(x, w))
    w = torch.randn(8, 32, device=device).to(torch.bfloat16)
    lt3.linear(torch.randn(17, 32, device=device).to(torch.bfloat16), w)
    lt3.linear(torch.randn(2, 9, 32, device=device).to(torch.bfloat16), w)  # 18 rows
    assert calls == [(17, 32), (2, 9, 32)]
    y = lt3.linear(torch.randn(2, 8, 32, device=device).to(torch.bfloat16), w)  # 16: kernel
    assert len(calls) == 2 and y.shape == (2, 8, 8)
    with pytest.raises(ValueError, match=r"weight: expected \[N, 32\], got \(8, 31\)"):
        lt3.linear(torch.randn(3, 32, device=device).to(torch.bfloat16),
                   torch.zeros(8, 31, device=device, dtype=torch.bfloat16))


@pytest.mark.parametrize("M, N, K", [(1, 40, 24), (17, 2112, 96), (64, 33, 300)])
def test_tiles_cover_every_row_and_column(M, N, K):
    BM, BN, BK = lt.tiles(M, N, K)
    assert BM >= min(M, lt.MAX_ROWS) and BM in (16, 32, 64) and 16 <= BN <= 128
    assert BK >= 16 and (BK >= K or BK == 256)
    if N >= 2 * lt.SMS * 16:  # wide outputs keep at least one program per SM
        assert -(-N // BN) >= lt.SMS


def test_v5_takes_v4_for_wide_outputs_and_v3_for_narrow_ones(device, monkeypatch):
    # why: session 20's cold sweep: v4's 64-column tiles win q_a | kv_a, o and down (N >= 2048)
    # at 1-17 rows and lose q_b and gate | up, where v3's rule (its kernel to 16 rows, cuBLAS
    # above) stays
    calls = []
    monkeypatch.setattr(lt5.linear_triton_v4, "linear", lambda x, w: calls.append(
        ("v4", w.shape[0])) or linear_torch(x, w))
    monkeypatch.setattr(lt5.linear_triton_v3, "linear", lambda x, w: calls.append(
        ("v3", w.shape[0])) or linear_torch(x, w))
    x = torch.randn(17, 32, device=device).to(torch.bfloat16)
    for n in (lt5.WIDE_N, 2112, lt5.WIDE_N - 1, 512):
        y = lt5.linear(x, torch.randn(n, 32, device=device).to(torch.bfloat16))
        assert y.shape == (17, n)
    assert calls == [("v4", 2048), ("v4", 2112), ("v3", 2047), ("v3", 512)]


def test_more_rows_and_wide_inputs_take_cublas(device, monkeypatch):
    calls = []
    monkeypatch.setattr(lt.torch_bf16, "linear", lambda x, w: calls.append(x.shape) or
                        linear_torch(x, w))
    w = torch.randn(8, 32, device=device).to(torch.bfloat16)
    lt.linear(torch.randn(65, 32, device=device).to(torch.bfloat16), w)  # > 64 rows
    lt.linear(torch.randn(3, 32, device=device, dtype=torch.float64), w)  # ACC rows
    assert calls == [(65, 32), (3, 32)]
    lt.linear(torch.randn(64, 32, device=device).to(torch.bfloat16), w)  # the kernel's
    assert len(calls) == 2


def test_bad_arguments_raise_naming_the_argument(device):
    x = torch.randn(3, 32, device=device).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"weight: expected \[N, 32\], got \(8, 31\)"):
        lt.linear(x, torch.zeros(8, 31, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"x: expected a float tensor"):
        lt.linear(x.int(), torch.zeros(8, 32, device=device))


@pytest.mark.gpu
def test_real_widths_match_the_reference():
    df = check("linear", "triton_v1", shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton_v3", "triton_v5"])
def test_decode_dispatch_real_widths_match_the_reference(variant):
    df = check("linear", variant, shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)


@pytest.mark.gpu
@pytest.mark.parametrize("variant, mod", [("triton_v2", lt2), ("triton_v4", lt4)])
def test_split_k_real_widths_and_graph_replay(variant, mod):
    df = check("linear", variant, shapes="real", seeds=2, device="cuda")
    assert df["pass"].all(), failures(df)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(17, 7168, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(2112, 7168, generator=g, device="cuda") * 7168**-0.5).to(torch.bfloat16)
    assert mod.tiles(17, 2112, 7168).SPLIT > 1
    eager = mod.linear(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod.linear(x, w)
    for _ in range(3):  # the counters reset in-kernel: every replay sums every slice once
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.gpu
def test_a_rows_result_does_not_depend_on_the_row_count():
    # why: no split-K and a fixed K order: row 0 alone equals row 0 among 17 or 64 rows
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 7168, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(2112, 7168, generator=g, device="cuda") * 7168**-0.5).to(torch.bfloat16)
    one = lt.linear(x[:1], w)
    for m in (9, 17, 33, 64):
        assert torch.equal(lt.linear(x[:m], w)[:1], one), m


@pytest.mark.parametrize("N, K", [(7168, 1024), (2112, 7168), (12288, 1536), (163840, 7168),
                                  (512, 7168), (7168, 256)])
def test_tiles_fit_shared_memory_at_every_row_count(N, K):
    """Session 10: v2's default tiles at 33-64 rows asked for 256 KB (BM = BN = 64, BK 256, 4
    stages) and the launch raised OutOfResources on the H200; the pipelined tiles must fit."""
    for M in range(1, lt.MAX_ROWS + 1):
        BM, BN, BK = lt.tiles(M, N, K)
        BK1, st1 = lt.fit_smem(BM, BN, BK, 4)
        t, t4 = lt2.tiles(M, N, K), lt4.tiles(M, N, K)
        for bm, bn, bk, st in ((BM, BN, BK1, st1), (t.BM, t.BN, t.BK, t.stages),
                               (t4.BM, t4.BN, t4.BK, t4.stages)):
            assert (bm + bn) * bk * 2 * st <= lt.SMEM_BYTES and st >= 2 and bk >= 16
        assert t.stages == 4 or t.BM + t.BN > 96  # only the widest tiles give up a stage


def test_drafter_skinny_table_fits_shared_memory():
    from workbench.kernels.drafter import _gemm

    for (_, bucket), (BN, BK, _, stages) in _gemm.SKINNY.items():
        assert (bucket + BN) * BK * 2 * stages <= lt.SMEM_BYTES
