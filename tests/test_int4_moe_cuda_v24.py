"""int4_moe cuda_v24 (cuda_v21 with the hot experts past WB on a warp-specialised 256 x 128
wgmma tile fed by TMA bulk copies of gathered activations): on the CPU the tile rule, the knob
checks by name, the gathered layout against the swizzled stage image the wgmma reads, and the
sm_90a build (one consumer instance a kernel, no spill, no serialised wgmma); on the GPU the
gather kernel bitwise its twin, the op against the reference, TC 0 bitwise cuda_v21, the CTA
columns and streams changing no bit, graph replay. The shared suites (EDGE, REAL, EP8, graph
replay) run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import types

import pytest
import torch
from test_int4_moe_cuda_v10 import (
    _close,
    _routing,
    every_expert_hot_on_edge_cases,
    same_bits_eager_and_replayed,
)
from test_int4_moe_cuda_v19 import _a_register_hazards, _k_loops

from workbench.kernels.int4_moe import cuda_v19, cuda_v21, cuda_v24, mma_layout

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v24_tiles_are_v21s_with_the_tc_launch():
    for T in (2, 17, 128, 512):
        assert cuda_v24.tiles(T, **KIMI) == cuda_v21.tiles(T, **KIMI) | cuda_v24.TC_DEFAULTS


@pytest.mark.parametrize("bad, match", [({"TST": 5}, r"cfg\['TST'\]"), ({"TST": 1}, r"cfg\['TST'\]"),
                                        ({"TNT": 12}, r"cfg\['TNT'\]"), ({"TY": -1}, r"cfg\['TY'\]"),
                                        ({"TC": 2}, r"cfg\['TC'\]")])
def test_v24_knobs_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        cuda_v24.check_tc(cuda_v24.tiles(128, **KIMI) | bad, 128 * 8, 384)
    if "TC" in bad:  # the hook names it before anything else
        with pytest.raises(ValueError, match=match):
            cuda_v24.launch_bands_tc(bad, types.SimpleNamespace(), None, None, None, 0, 0, None)


def test_v24_defaults_fit_up_to_the_large_verify():
    for T in (17, 128, 512, 2080):
        cuda_v24.check_tc(cuda_v24.tiles(T, **KIMI), T * 8, 384)
    assert cuda_v24.smem_bytes(4, 0) == 1024 + 4 * 51200  # the ring's 50 KB stages


def _meta(ids: torch.Tensor, E: int):
    """The routing metadata `_common`'s kernel writes (slots grouped by expert in ascending id
    order, stable; active experts' ids, first positions and counts; their number), built with
    torch for the layout tests."""
    flat = ids.reshape(-1)
    ok = (flat >= 0) & (flat < E)
    key = torch.where(ok, flat, E)
    slots = torch.sort(key, stable=True).indices[: int(ok.sum())]
    counts = torch.bincount(flat[ok], minlength=E)
    act = torch.nonzero(counts).flatten()
    starts = torch.cumsum(counts, 0) - counts
    i32 = dict(dtype=torch.int32)
    return (slots.to(**i32), act.to(**i32), starts[act].to(**i32), counts[act].to(**i32),
            torch.tensor([act.numel()], **i32))


def _plan(ids, E, D):
    S = ids.numel()
    return types.SimpleNamespace(S=S, E=E, K=ids.shape[1], D=D, meta=_meta(ids, E))


@pytest.mark.parametrize("T, D, ht, nt", [(40, 256, 4, 16), (33, 96, 0, 4), (64, 200, 9, 8)])
def test_v24_gathered_rows_are_the_stage_image_of_every_pass(T, D, ht, nt):
    # why: the TC launch bulk-copies rows start + p0 .. of each chunk into a stage and reads
    # them through wgmma's 128-byte swizzle (16-byte word w of stage row r at w ^ (r & 7),
    # cuda_v19's activation layout): every pass's rows must hold, in that image, its slots'
    # activations in logical-k order (zeros past D), with r counted from the pass's first
    # slot; K padding (D 96 / 200) and passes past the first (40 slots on one expert) included
    g = torch.Generator().manual_seed(T)
    E, K = 12, 4
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    ids[: T // 2, 0] = 3  # one hot expert past every threshold
    x = torch.randn(T, D + 8, generator=g).to(torch.bfloat16)[:, :D]
    KP = -(-D // 128) * 128
    p = _plan(ids, E, D)
    xg = cuda_v24.xgather_reference(x, p, ht, KP)
    xp = cuda_v19.xperm_reference(x, D, KP)
    slots, _, starts, cnts, n_act = p.meta
    P, C = 8 * nt, KP // mma_layout.CHUNK
    hot_rows = 0
    for a in range(int(n_act[0])):
        start, cnt = int(starts[a]), int(cnts[a])
        rows = xg[:, start:start + cnt]
        if cnt <= ht:
            assert rows.isnan().all()  # not this launch's expert: never written
            continue
        for p0 in range(0, cnt, P):
            for r in range(min(P, cnt - p0)):
                s = start + p0 + r
                stage_row = xg[:, s].view(C, 8, 8)  # [chunk][physical word][8 inputs]
                logical = stage_row[:, torch.arange(8) ^ (r & 7)]  # word w at w ^ (r & 7)
                token = int(slots[s]) // K
                assert torch.equal(logical.reshape(C * 64), xp[token]), (a, p0, r)
                hot_rows += 1
    assert hot_rows > 0 and xg[:, p.S:].isnan().all()  # the padding rows: never written


def _sass(path: str) -> str:
    import triton

    dump = shutil.which("cuobjdump") or os.path.join(
        os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    return subprocess.run([dump, "-sass", path], capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v24_tc_kernels_build_for_sm90a_without_spills_or_serialised_wgmma(tmp_path, monkeypatch):
    # why: 128 accumulators a consumer thread fit 240 registers only with one accumulator
    # array shared by the pass widths' instances and no lane-0 branch between the wgmmas
    # (C7512 / C7513 otherwise: ptxas serialises every wgmma, silently slow); setmaxnreg must
    # be in the SASS, each instance's group loop off local memory and free of writes to the A
    # registers of a wgmma in flight
    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path))
    picks = ((4, 16), (3, 16), (4, 8), (2, 4))
    path, log = cuda_v19.build_cubin(cuda_v24.source(picks))
    assert not re.search(r"C751\d", log), log
    blocks = {b.split("'")[1]: b for b in log.split("Compiling entry function")[1:]}
    for st, nt in picks:
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in blocks[
            cuda_v24.kernel_name(st, nt)]
    assert "0 bytes spill stores" in blocks["int4_moe_xgather"]
    for fn in _sass(path).split("Function : ")[1:]:
        name = fn.split("\n")[0].strip()
        if not name.startswith("int4_moe_hot_tc"):
            continue
        nt = int(name.split("_")[-1])
        assert re.search(rf"HGMMA\.64x{8 * nt}x16\.F32\.BF16", fn) and "HMMA" not in fn, name
        assert "USETMAXREG" in fn, name
        # the scale-group loop, two groups a trip (its two A buffers): gate / up x 2 k16 x 2
        loops = _k_loops(fn, per_pair=8)
        assert len(loops) == {4: 1, 8: 2, 16: 3}[nt], name  # an instance a pass width up to NTC
        for body in loops:
            assert not any("LDL" in x or "STL" in x for x in body), name
        # session 53: one A buffer in a rolled loop let the next group's dequant overwrite the
        # registers of wgmmas still in flight (wrong sums at N 64 / 128, timing-dependent)
        assert not _a_register_hazards(fn), (name, _a_register_hazards(fn)[:4])
    assert cuda_v19.build_cubin(cuda_v24.source(picks))[0] == path  # cached by source


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("T, D, ht", [(17, 7168, 16), (512, 7168, 16), (33, 96, 0), (40, 200, 3)])
def test_v24_xgather_kernel_is_its_twin_bitwise_gpu(T, D, ht):
    # why: the gather is exact data movement into the stage image; any bit off is a wrong
    # product. Strided x, K padding, the hot threshold, passes past the first included
    g = torch.Generator().manual_seed(T + D)
    E, K = (384, 8) if D == 7168 else (12, 4)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    ids[: T // 2, 0] = 3
    x = torch.randn(T, D + 8, generator=g).to(torch.bfloat16)[:, :D]
    KP = -(-D // 128) * 128
    p = _plan(ids, E, D)
    want = cuda_v24.xgather_reference(x, p, ht, KP)
    pg = types.SimpleNamespace(S=p.S, E=E, K=K, D=D, meta=tuple(t.cuda() for t in p.meta))
    xg = cuda_v24.xg_empty(pg, KP, "cuda").fill_(float("nan"))
    got = cuda_v24.xgather(x.cuda(), pg, ht, KP, xg).cpu()
    assert torch.equal(got.isnan(), want.isnan())  # the same rows written
    written = ~want.isnan()
    assert torch.equal(got[written], want[written])


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"TNT": 8}, {"TNT": 4, "TST": 2}, {"TST": 3}, {"TY": 1},
                                 {"WS": 0}, {"WT": 0}, {"WB": 0}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (128, 0.0), (128, 1.2), (512, 0.0),
                                     (512, 1.2)])
def test_v24_tc_forms_match_reference_gpu(real_experts, T, skew, cfg):
    x, ids, w, ex = _routing(real_experts, T, skew, 2400 + T)
    _close(cuda_v24.int4_moe_cuda(x, ids, w, ex, cfg=cfg or None), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v24_every_expert_past_wt_is_cuda_v21s_bits_gpu(real_experts, T):
    # why: at WT 0 every expert past the band takes the TC launch here and cuda_v10's hot launch
    # in cuda_v21; the TC rows of h came out equal to cuda_v10's bit for bit (session 53 call 3,
    # scripts/int4_moe_tc_debug.py: 306 experts at skewed T 17-512), so the ops' outputs must
    # be too. Session 53 call 4 found them unequal at T 512: the cold launch also ran at WT 0
    # (SKIP 0 is "skip none") and wrote the same rows on another stream (cuda_v4, fixed)
    x, ids, w, ex = _routing(real_experts, T, 1.2, 2400 + T)
    assert torch.equal(cuda_v24.int4_moe_cuda(x, ids, w, ex, cfg={"WT": 0}),
                       cuda_v21.int4_moe_cuda(x, ids, w, ex, cfg={"WT": 0}))


@pytest.mark.gpu
def test_v24_every_expert_hot_on_edge_cases_gpu():
    # why: WT 0 (and no band at these sizes) sends every expert through the TC launch: K
    # padding, one expert holding every token, K = E, -1 slots, strided x, padding units
    every_expert_hot_on_edge_cases(cuda_v24)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 1.2), (512, 1.2)])
def test_v24_tc_off_is_cuda_v21_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 2500 + T)
    assert torch.equal(cuda_v24.int4_moe_cuda(x, ids, w, ex, cfg={"TC": 0}),
                       cuda_v21.int4_moe_cuda(x, ids, w, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("T", (65, 512))
def test_v24_cta_columns_and_streams_change_no_bit_gpu(real_experts, T):
    # why: an item is one CTA's whole K: neither the CTA columns (TY) nor the side stream (WS)
    # may change a bit
    x, ids, w, ex = _routing(real_experts, T, 1.2, 2600 + T)
    a = cuda_v24.int4_moe_cuda(x, ids, w, ex)
    for cfg in ({"TY": 1}, {"TY": 3}, {"WS": 0}):
        assert torch.equal(a, cuda_v24.int4_moe_cuda(x, ids, w, ex, cfg=cfg)), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v24_graph_replay_is_eager_gpu(real_experts, T):
    same_bits_eager_and_replayed(cuda_v24.int4_moe_cuda, cuda_v24.int4_moe_cuda, real_experts, T,
                                 1.2, 2700 + T)
