"""int4_moe cuda_v27 (cuda_v26 with the down GEMM's experts of MID + 1 .. HOT slots on a launch of
BM2_MID-slot chunks): on the CPU the tile rule, the knobs refused by name, the hook's launches
and where it stays cuda_v26's, and the band launch itself under the Triton interpreter on
triton_v16's op (at BM2_MID = BM2 the cold launch's bits; at a wider chunk every row written
once, within the reference's tolerance), its sm_90 build; on the GPU the reference and graph
replay, MID 0 = cuda_v26's bits. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from sm90_compile import compile_sm90
from test_int4_moe_cuda_v10 import _close, _routing, same_bits_eager_and_replayed
from test_int4_moe_kernel import _bits_equal, _hot_case, _poisoned_buffers

from workbench.kernels.int4_moe import _knobs, cuda_v26, cuda_v27, triton_v16
from workbench.reference.int4_moe import int4_moe

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v27_tiles_are_v26s_with_the_middle_launch():
    for T, hint in ((1, None), (9, None), (128, None), (512, None), (17, 17), (544, 544)):
        assert cuda_v27.tiles(T, **KIMI, slots=hint) == (
            cuda_v26.tiles(T, **KIMI, slots=hint) | {"MID": 16, "BM2_MID": 64, "MID_GRID": 32})


@pytest.mark.parametrize("knob, bad", [("MID", -1), ("MID", 64), ("MID", 2.0), ("MID", True),
                                       ("BM2_MID", 4), ("BM2_MID", 48), ("BM2_MID", 64.0),
                                       ("MID_GRID", 0), ("MID_GRID", 1.5)])
def test_v27_knobs_refused_by_name(knob, bad):
    # why: MID at or past HOT would hand the band launch experts the hot launch also takes
    # (two writers of y's rows); a chunk that is no power of two from 8 has no MMA tile
    c = cuda_v27.tiles(512, **KIMI)
    with pytest.raises(ValueError, match=rf"cfg\['{knob}'\]"):
        cuda_v27.check_mid(c | {knob: bad})
    assert cuda_v27.check_mid(c) == 16 and cuda_v27.check_mid(c | {"MID": 0}) == 0


def test_v27_middle_programs_within_what_the_slots_allow():
    c = cuda_v27.tiles(512, **KIMI)  # S_EXP 4096
    assert cuda_v27.mid_programs(c, 384) == 32
    assert cuda_v27.mid_programs(c | {"MID_GRID": 500}, 384) == 4096 // 17
    assert cuda_v27.mid_programs(c | {"MID_GRID": 500}, 100) == 100
    assert cuda_v27.mid_programs(c | {"S_EXP": 3}, 384) == 1


class _R:  # the router's result as the hook reads it: T rows of bad flags
    bad = torch.zeros(512)
    max_active = 384


def test_v27_hook_launches_cold_band_hot_and_else_cuda_v26s(monkeypatch):
    # why: each slot row of y must come from exactly one launch: the cold one takes counts
    # <= MID, the band MID + 1 .. HOT (at BM2_MID), the hot one past HOT; where triton_v16
    # makes no hot launch (T <= HOT, a split K), at MID 0, or for the gate/up GEMM, cuda_v26's
    # hook
    seen = []
    monkeypatch.setattr(cuda_v27, "grid_gemm_idle_last", lambda n, *a: seen.append(("v26", n)))
    monkeypatch.setattr(cuda_v27, "grid_gemm", lambda n, c, r, NT, a, kw: seen.append(
        ("cold", kw["HOT"], kw["BM"])))

    def hot_launch(n, c, r, args, kw, kernel=None, programs=None):
        band = kernel is cuda_v27._gemm_band_kernel
        seen.append(("band", c["BM2_HOT"], kw["LO"], programs) if band else
                    ("hot", c["BM2_HOT"], "LO" in kw, programs))

    monkeypatch.setattr(cuda_v27, "hot_launch", hot_launch)
    c = cuda_v27.tiles(512, **KIMI)
    cuda_v27.grid_gemm_mid(2, c, _R, 56, ("args",), {"BM": 16})
    assert seen == [("cold", 16, 16), ("band", 64, 16, 32), ("hot", 64, False, None)]
    seen.clear()
    for n, other in ((2, {"MID": 0}), (2, {"KS2": 2}), (1, {})):
        cuda_v27.grid_gemm_mid(n, c | other, _R, 56, (), {"BM": 16})

    class Small(_R):
        bad = torch.zeros(64)  # T 64 = HOT: no expert can pass it

    cuda_v27.grid_gemm_mid(2, c, Small, 56, (), {"BM": 16})
    assert seen == [("v26", 2), ("v26", 2), ("v26", 1), ("v26", 2)]
    with pytest.raises(ValueError, match=r"cfg\['MID'\]"):  # refused even where no band runs
        cuda_v27.grid_gemm_mid(2, c | {"MID": 64}, Small, 56, (), {"BM": 16})


@pytest.mark.parametrize("mid, bm, exact, why", [
    (2, 8, True, "BM2_MID = BM2 and BN_HOT = BN: expert 3 (11 slots) and the 3-slot experts "
                 "move launch, same tiles: the cold launch's bits"),
    (2, 16, False, "16-slot chunks: expert 3 in one chunk, not two; within tolerance"),
    (0, 8, True, "MID 0: no band launch at all"),
])
def test_v27_band_launch_on_triton_v16s_op(monkeypatch, mid, bm, exact, why):
    # why: the band launch is `expert_tile` at another chunk; every slot row of the partials
    # must be written by exactly one of the three launches (intermediates NaN-filled first)
    _poisoned_buffers(monkeypatch)
    x, ids, w, ex, cfg = _hot_case(27, 12)  # expert 1: 20 slots (hot), 3: 11, 0 / 2 / 4: 2-3
    cfg |= {"BM2": 8, "MID": mid, "BM2_MID": bm, "MID_GRID": 2, "S_EXP": 40, "BN": 64,
            "BN_HOT": 64}
    T, K, E, D, I = *ids.shape, ex.num_experts, x.shape[1], ex.gate_packed.shape[1]
    assert triton_v16.hot_mode(triton_v16.tiles(T, K, E, D, I) | cfg, T)
    want = triton_v16.int4_moe_triton(x, ids, w, ex, cfg=cfg)
    out = triton_v16.launch_hinted(x, ids, w, ex, None, cfg, None, triton_v16.tiles,
                                   gemm=cuda_v27.grid_gemm_mid)
    assert not out.isnan().any(), why
    assert _bits_equal(out, want) or not exact, why
    assert torch.allclose(out.float(), int4_moe(x, ids, w, ex).float(), rtol=2e-2, atol=2e-2)


def test_v27_sweep_cli_reads_the_middle_knobs_and_cuda_v26_does_not():
    for knob in ("MID", "BM2_MID", "MID_GRID"):
        assert knob in _knobs.knobs_read("cuda_v27") and knob not in _knobs.knobs_read("cuda_v26")


@pytest.mark.slow
def test_v27_band_kernel_builds_for_sm90_as_the_hot_kernel_does():
    # why: the band program is the hot program with a second bound; at the hot launch's tiles
    # (BN_HOT 64, a 64-slot chunk, NH 1) it must keep the hot kernel's registers, no spill and
    # its shared memory (at BN 128 a 64-slot chunk spills at 4 warps)
    out = compile_sm90(
        "import triton; from triton.backends.compiler import GPUTarget; "
        "from triton.compiler import ASTSource; "
        "from workbench.kernels.int4_moe import sm90, triton_v34, cuda_v27; out = {}\n"
        "for k, sig, const, attrs, opts in sm90.capture(triton_v34, *sm90.kimi_like(512)):\n"
        "    if k.__name__ == '_gemm_hot_kernel' and const['NH'] == 2:\n"
        "        const = dict(const, NH=1)\n"
        "        band = dict(sig, HI=sig['HOT']); band.pop('HOT')\n"
        "        band = {kk: band[kk] for kk in cuda_v27._gemm_band_kernel.arg_names if kk in band}\n"
        "        for fn, sg, cs in ((k, sig, const), (cuda_v27._gemm_band_kernel, band, "
        "dict(const, LO=16))):\n"
        "            ck = triton.compile(ASTSource(fn=fn, signature=sg, constexprs=cs, "
        "attrs=attrs), target=GPUTarget('cuda', 90, 32), options=opts)\n"
        "            out[fn.__name__] = [sm90.ptxas_report(ck.asm['ptx']), ck.metadata.shared, "
        "ck.asm['ptx'].count('wgmma.mma_async') > 0, [const['BN'], const['BM']]]")
    hot, band = out["_gemm_hot_kernel"], out["_gemm_band_kernel"]
    assert band[3] == [64, 64], out
    assert band == hot and "0 B spill" in band[0] and band[2], out


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, {"BM2_MID": 32}, {"MID": 32}, {"MID_GRID": 1}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in (c or {}).items()) or "default")
@pytest.mark.parametrize("T, skew", [(128, 1.2), (512, 0.0), (512, 1.2)])
def test_v27_matches_the_reference_gpu(real_experts, T, skew, cfg):
    x, ids, w, ex = _routing(real_experts, T, skew, 2700 + T)
    _close(cuda_v27.int4_moe_cuda(x, ids, w, ex, cfg=cfg), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(128, 1.2), (512, 1.2), (512, 0.0)])
def test_v27_mid_0_is_cuda_v26s_bits_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 2750 + T)
    assert torch.equal(cuda_v27.int4_moe_cuda(x, ids, w, ex, cfg={"MID": 0}),
                       cuda_v26.int4_moe_cuda(x, ids, w, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v27_graph_replay_is_eager_gpu(real_experts, T):
    same_bits_eager_and_replayed(cuda_v27.int4_moe_cuda, cuda_v27.int4_moe_cuda, real_experts, T,
                                 1.2, 2780 + T)
