"""int4_moe cuda_v26 (cuda_v25 with the TC launch on half its columns past TYH items a column, and
only from 512 slots a call): on the CPU the tile rule, the knob check by name, the sm_90a build
(no spill, no serialised wgmma, no A-register hazard, TYH 0 cuda_v25's kernel); on the GPU
cuda_v25's bits at any TYH (the same items on fewer columns), cuda_v21's bits below 512 slots,
the reference, graph replay. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, same_bits_eager_and_replayed
from test_int4_moe_cuda_v19 import _a_register_hazards, _k_loops
from test_int4_moe_cuda_v24 import _sass
from test_int4_moe_cuda_v25 import _functions

from workbench.kernels.int4_moe import _knobs, cuda_v19, cuda_v21, cuda_v24, cuda_v25, cuda_v26

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v26_tiles_are_v25s_with_tyh_and_the_tc_rule():
    for T, tc in ((1, 0), (17, 0), (63, 0), (64, 1), (65, 1), (512, 1)):
        c = cuda_v26.tiles(T, **KIMI)
        assert c == cuda_v25.tiles(T, **KIMI) | {"TYH": 3, "TLO": 0, "TC": tc}, T
    # the slot hint (an EP rank's share) decides, not T K
    assert cuda_v26.tiles(512, **KIMI, slots=100)["TC"] == 0
    assert cuda_v26.tiles(17, **KIMI, slots=600)["TC"] == 1


@pytest.mark.parametrize("bad", [-1, 1024, 2.0])
def test_v26_tyh_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"cfg\['TYH'\]"):
        cuda_v26.check_tc(cuda_v26.tiles(512, **KIMI) | {"TYH": bad}, 4096, 384)


@pytest.mark.parametrize("T, bad", [(512, 16), (512, 3), (128, 8), (512, -1), (512, 32.0)])
def test_v26_tlo_refused_by_name(T, bad):
    # why: the middle tier takes WB (WT where WB is 0) + 1 .. TLO slots; a TLO at or below
    # that would hand the TC launch experts the band launch also computes (two writers of h)
    with pytest.raises(ValueError, match=r"cfg\['TLO'\]"):
        cuda_v26.check_tc(cuda_v26.tiles(T, **KIMI) | {"TLO": bad}, T * 8, 384)
    cuda_v26.check_tc(cuda_v26.tiles(T, **KIMI) | {"TLO": 33}, T * 8, 384)


def test_v26_sweep_cli_reads_tyh_and_tlo_and_cuda_v25_does_not():
    for knob in ("TYH", "TLO"):
        assert knob in _knobs.knobs_read("cuda_v26") and knob not in _knobs.knobs_read("cuda_v25")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v26_halving_kernels_build_for_sm90a(tmp_path, monkeypatch):
    # why: the early exit of the idle columns comes after hot_items' CTA barriers and before
    # setmaxnreg; it must leave the consumers' registers, loops and A buffers as they were
    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path))
    picks = ((4, 16, 4, 3), (2, 4, 4, 1))
    path, log = cuda_v19.build_cubin(cuda_v24.source(picks))
    assert not re.search(r"C751\d", log), log
    blocks = {b.split("'")[1]: b for b in log.split("Compiling entry function")[1:]}
    fns = _functions(_sass(path))
    for st, nt, pw, tyh in picks:
        name = cuda_v24.kernel_name(st, nt, pw, tyh)
        assert name.endswith(f"_p{pw}_h{tyh}"), name
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in blocks[name]
        fn = fns[name]
        assert re.search(rf"HGMMA\.64x{8 * nt}x16\.F32\.BF16", fn) and "USETMAXREG" in fn, name
        loops = _k_loops(fn, per_pair=8)
        assert len(loops) == {4: 1, 8: 2, 16: 3}[nt], name
        for body in loops:
            assert not any("LDL" in x or "STL" in x for x in body), name
        assert not _a_register_hazards(fn), (name, _a_register_hazards(fn)[:4])
    assert cuda_v24.kernel_name(4, 16, 4, 0) == "int4_moe_hot_tc_4_16_p4"  # TYH 0: cuda_v25's


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"TYH": 1}, {"TYH": 0}, {"TYH": 1, "TY": 3}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(128, 1.2), (512, 0.0), (512, 1.2)])
def test_v26_is_cuda_v25s_bits_and_the_reference_gpu(real_experts, T, skew, cfg):
    # why: fewer columns deal the same items (each one CTA's whole K) to fewer CTAs: no bit may
    # change (TYH 1 halves the columns at every T here, TY 3 halves to 1 column)
    x, ids, w, ex = _routing(real_experts, T, skew, 3000 + T)
    got = cuda_v26.int4_moe_cuda(x, ids, w, ex, cfg=cfg or None)
    v25_cfg = {k: v for k, v in cfg.items() if k != "TYH"} or None
    assert torch.equal(got, cuda_v25.int4_moe_cuda(x, ids, w, ex, cfg=v25_cfg)), cfg
    _close(got, x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(128, 1.2), (512, 0.0), (512, 1.2)])
def test_v26_middle_tier_gpu(real_experts, T, skew):
    # why: TLO past every count puts every expert past WB (WT) on cuda_v10's hot launch at the
    # hot knobs: cuda_v21's launches, so its bits; TLO 32 splits them between that launch and
    # the TC launch, each expert's rows of h written by exactly one of them
    x, ids, w, ex = _routing(real_experts, T, skew, 3300 + T)
    assert torch.equal(cuda_v26.int4_moe_cuda(x, ids, w, ex, cfg={"TLO": 2**14}),
                       cuda_v21.int4_moe_cuda(x, ids, w, ex))
    _close(cuda_v26.int4_moe_cuda(x, ids, w, ex, cfg={"TLO": 32}), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (9, 17, 33))
def test_v26_below_512_slots_is_cuda_v21s_bits_gpu(real_experts, T):
    x, ids, w, ex = _routing(real_experts, T, 1.2, 3100 + T)
    assert torch.equal(cuda_v26.int4_moe_cuda(x, ids, w, ex), cuda_v21.int4_moe_cuda(x, ids, w, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v26_graph_replay_is_eager_gpu(real_experts, T):
    same_bits_eager_and_replayed(cuda_v26.int4_moe_cuda, cuda_v26.int4_moe_cuda, real_experts, T,
                                 1.2, 3200 + T)
