"""int4_moe cuda_v20 (cuda_v19 with the main hot launch's unit on two warps: 128-slot wgmma
passes): on the CPU the tile rule, the knob checks by name and the sm_90a build (wgmma, the K
loops off local memory); on the GPU the forms against the reference, GS 0 bitwise cuda_v19,
the CTA columns changing no bit. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import os
import shutil
import subprocess
import types

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, every_expert_hot_on_edge_cases
from test_int4_moe_cuda_v19 import _a_register_hazards, _k_loops, columns_and_streams_change_no_bit

from workbench.kernels.int4_moe import cuda_v19, cuda_v20

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v20_tiles_are_v19s_with_the_two_warp_unit_launch():
    for T in (2, 17, 128, 512):
        c19 = cuda_v19.tiles(T, **KIMI)
        assert cuda_v20.tiles(T, **KIMI) == c19 | cuda_v20.GS_DEFAULTS
        assert {k: cuda_v20.tiles(T, **KIMI)[k] for k in ("WU", "WNT", "WST")} == {
            k: c19[k] for k in ("WU", "WNT", "WST")}  # the band and GS 0 keep cuda_v19's


@pytest.mark.parametrize("bad, match", [({"SU": 8}, r"cfg\['SU'\]"), ({"SNT": 32}, r"cfg\['SNT'\]"),
                                        ({"SST": 9}, r"cfg\['SST'\]"),
                                        ({"SMB": 2}, r"cfg\['SMB'\]"),
                                        ({"SST": 8}, r"227 KB")])
def test_v20_knobs_refused_by_name(bad, match):
    c = cuda_v20.tiles(128, **KIMI) | bad
    c = c | {w: c[g] for g, w in cuda_v20.GS_KEYS.items()}
    with pytest.raises(ValueError, match=match):
        cuda_v20.check_gs(c, 128 * 8, 384, cuda_v19.SMEM_PAD)
    with pytest.raises(ValueError, match=r"cfg\['GS'\]"):
        cuda_v20.launch_bands_gs({"GS": 2}, types.SimpleNamespace(), None, None, None, 0, 0, None)


def test_v20_defaults_fit_up_to_the_large_verify():
    for T in (17, 128, 512, 2080):
        c = cuda_v20.tiles(T, **KIMI)
        c = c | {w: c[g] for g, w in cuda_v20.GS_KEYS.items()}
        cuda_v20.check_gs(c, T * 8, 384, cuda_v19.SMEM_PAD)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v20_hot_kernel_builds_for_sm90a_with_wgmma_and_no_local_memory_in_its_loops(
        tmp_path, monkeypatch):
    # why: one tile's 64 accumulators a thread at N 128 fit one 8-warp CTA an SM; every n-tile
    # count's K loop (8 HGMMAs a pair: 4 scale groups x 2 k16 steps) stays off local memory
    # and writes no A register of a wgmma in flight
    import re

    import triton

    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path))
    picks = ((4, 16, 4, 1), (2, 16, 4, 2), (4, 8, 5, 1))
    path, log = cuda_v19.build_cubin(cuda_v20.source(picks))
    assert log.count("Compiling entry function") == len(picks) + 1
    dump = shutil.which("cuobjdump") or os.path.join(
        os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([dump, "-sass", path], capture_output=True, text=True).stdout
    for fn in sass.split("Function : ")[1:]:
        name = fn.split("\n")[0].strip()
        if not name.startswith(cuda_v20.PREFIX):
            continue
        assert re.search(r"HGMMA\.64x128x16\.F32\.BF16", fn) or "_8_" in name, name
        loops = _k_loops(fn, per_pair=8)
        assert len(loops) >= 3, name  # n-tile counts 2, 4, 8 (, 16)
        for body in loops:
            assert not any("LDL" in x or "STL" in x for x in body), name
        assert not _a_register_hazards(fn), name  # no A register written under its wgmma


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"WT": 0}, {"SNT": 8, "SST": 5}, {"SU": 2, "SMB": 2},
                                 {"WS": 0}, {"SST": 2}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (128, 0.0), (128, 1.2), (512, 0.0),
                                     (512, 1.2)])
def test_v20_hot_forms_match_reference_gpu(real_experts, T, skew, cfg):
    x, ids, w, ex = _routing(real_experts, T, skew, 2200 + T)
    _close(cuda_v20.int4_moe_cuda(x, ids, w, ex, cfg=cfg or None), x, ids, w, ex)


@pytest.mark.gpu
def test_v20_every_expert_hot_on_edge_cases_gpu():
    # why: WT 0 sends every expert through the two-warp launch: K padding, one expert holding
    # every token, K = E, -1 slots, strided x, padding units (small I)
    every_expert_hot_on_edge_cases(cuda_v20)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 1.2), (512, 1.2)])
def test_v20_gs_off_is_cuda_v19_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 2300 + T)
    assert torch.equal(cuda_v20.int4_moe_cuda(x, ids, w, ex, cfg={"GS": 0}),
                       cuda_v19.int4_moe_cuda(x, ids, w, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("T", (65, 512))
def test_v20_cta_columns_and_streams_change_no_bit_gpu(real_experts, T):
    columns_and_streams_change_no_bit(cuda_v20, real_experts, T, 2400 + T)
