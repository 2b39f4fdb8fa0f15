"""int4_moe cuda_v23 (cuda_v22 with the cold down launch as a persistent grid of (chunk, N
tile) items in one flattened loop): on the CPU the tile rule, the knobs' refusals by name, and
the flat launch itself under the Triton interpreter on triton_v16's op (every partial row
written once, the grid's bits at any program count, with and without hot experts, FL 0 / 1);
on the GPU the op bit for bit cuda_v22's (skewed and uniform REAL shapes, an EP8 rank, eager
and graph-replayed). The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import functools

import pytest
import torch
from sm90_compile import compile_sm90
from test_int4_moe_cuda_v10 import same_bits_eager_and_replayed
from test_int4_moe_kernel import _bits_equal, _hot_case, _poisoned_buffers

from workbench.kernels.int4_moe import cuda_v22, cuda_v23, triton_v16
from workbench.reference.int4_moe import int4_moe

KIMI = dict(K=8, D=7168, I=2048)


def test_v23_tiles_are_v22s_with_the_flat_knobs():
    for T, E, hint in ((1, 384, None), (9, 384, None), (512, 384, None), (17, 48, 17)):
        assert cuda_v23.tiles(T, E=E, **KIMI, slots=hint) == (
            cuda_v22.tiles(T, E=E, **KIMI, slots=hint) | {"FP": 3, "FL": 1, "FS": 4}), (T, E, hint)


def test_v23_flat_knobs_refused_by_name():
    # why: FP sizes the persistent grid and FL picks the loop; a value outside their range
    # must name the knob, not reach the kernel
    c = cuda_v23.tiles(9, E=384, **KIMI)
    for bad in (0, 33, 2.0, None):
        with pytest.raises(ValueError, match=r"cfg\['FP'\]"):
            cuda_v23.flat_programs(c | {"FP": bad}, torch.device("cpu"))
    assert cuda_v23.flat_programs(c | {"FP": 5}, torch.device("cpu")) == 5 * cuda_v23.INTERPRET_SMS

    class R:
        bad = torch.zeros(9)
        max_active = 72

    for bad in (2, -1, True):
        with pytest.raises(ValueError, match=r"cfg\['FL'\]"):
            cuda_v23.flat_launch(2, c | {"FL": bad}, R, 112, (torch.empty(1),), {})
    for bad in (1, 7, 4.0):
        with pytest.raises(ValueError, match=r"cfg\['FS'\]"):
            cuda_v23.flat_launch(2, c | {"FS": bad}, R, 112, (torch.empty(1),), {})
    with pytest.raises(ValueError, match=r"cfg\['KS2'\]"):
        cuda_v23.flat_launch(2, c | {"KS2": 2}, R, 112, (torch.empty(1),), {})


@pytest.mark.parametrize("hot, cfg, why", [
    (5, {}, "experts 1 and 3 hot (cuda_v22's items), 0 / 2 / 4 cold: the flat launch's items"),
    (64, {}, "nothing hot: one flat launch over every expert's chunks (expert 1: 20 slots)"),
    (64, {"FL": 0}, "the same programs with the K loop restarting at each item"),
    (64, {"FP": 32}, "more programs than items: the rest idle"),
    (64, {"FS": 2}, "the flattened loop on two stages"),
    (5, {"HS": 1}, "the hot items beside the flat cold launch"),
])
def test_v23_flat_down_is_the_grid_bit_for_bit(monkeypatch, hot, cfg, why):
    # why: an item is `expert_tile` on one BM chunk over all K tiles, the same tile arithmetic
    # as the grid's program walking the expert's chunks; every cold slot row of the partials
    # must be written by exactly one item (intermediates NaN-filled first), whichever program
    # takes it and however many items a program walks
    _poisoned_buffers(monkeypatch)
    x, ids, w, ex, base = _hot_case(23, hot)  # expert 1: 20 slots, 3: 11, 0 / 2 / 4: 2-3
    base |= {"BM2": 8, "BM2_HOT": 8, "BM1_HOT": 8}  # 8-slot chunks: expert 1 three, 3 two
    T, K, E, D, I = *ids.shape, ex.num_experts, x.shape[1], ex.gate_packed.shape[1]
    assert triton_v16.hot_mode(triton_v16.tiles(T, K, E, D, I) | base, T) == (hot < 20)
    seen = []
    flat = cuda_v23.flat_launch
    monkeypatch.setattr(cuda_v23, "flat_launch", lambda *a: seen.append(a[0]) or flat(*a))
    want = triton_v16.int4_moe_triton(x, ids, w, ex, cfg=base)
    c = cuda_v23.tiles(T, K, E, D, I) | base | cfg
    out = triton_v16.launch_hinted(x, ids, w, ex, None, c, None, triton_v16.tiles,
                                   gemm=cuda_v23.grid_gemm_flat)
    assert seen == [2], seen  # the down GEMM's cold (or only) launch is the flat one
    assert not out.isnan().any()
    assert _bits_equal(out, want), why
    assert torch.allclose(out.float(), int4_moe(x, ids, w, ex).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_v23_flat_kernel_builds_for_sm90_without_spills():
    # why: the flat program adds the chunk search and an item loop around the K loop; at the
    # down launch cuda_v21 makes at uniform T 9 (BN 64, BM2 8, hi + lo, 168 registers) it must
    # build without a spill, its weights still by TMA on the tensor cores, and FL 1 must
    # really fuse the two loops (one loop left) where FL 0 keeps the K loop inside the item
    # loop (the A/B between them is the flattening's)
    out = compile_sm90(
        "import triton; from triton.backends.compiler import GPUTarget; "
        "from triton.compiler import ASTSource; "
        "from workbench.kernels.int4_moe import sm90, triton_v34, cuda_v23; out = {}\n"
        "flat = cuda_v23._gemm_flat_kernel; names = list(flat.arg_names)\n"
        "for k, sig, const, attrs, opts in sm90.capture(triton_v34, *sm90.kimi_like(9)):\n"
        "    if k.__name__ != '_gemm_kernel' or not const['OUT_BY_SLOT'] or out: continue\n"
        "    sig = {n: t.replace('[1,128,', '[1,64,') for n, t in sig.items() if n in names}\n"
        "    attrs = {(names.index(k.arg_names[i[0]]),): v for i, v in attrs.items() "
        "if k.arg_names[i[0]] in names}\n"
        "    for fl in (0, 1):\n"
        "        c = {n: v for n, v in const.items() if n in names} | dict(BN=64, HOT=-1, NT=112, "
        "BLOCK_A=128, FL=bool(fl), FS=4)\n"
        "        s = dict(sig, **{n: 'constexpr' for n in ('HOT', 'NT', 'BLOCK_A', 'FL', 'FS')})\n"
        "        ck = triton.compile(ASTSource(fn=flat, signature=s, constexprs=c, attrs=attrs), "
        "target=GPUTarget('cuda', 90, 32), options=dict(opts, maxnreg=168))\n"
        "        ptx, ir = ck.asm['ptx'], ck.asm['ttgir']\n"
        "        out[fl] = [sm90.ptxas_report(ptx), ptx.count('cp.async.bulk.tensor'), "
        "ptx.count('wgmma.mma_async'), ir, ir.count('ttg.async_copy_global_to_local')]")
    for regs, tma, wgmma, _ir, cp_async in out.values():
        # no spill, the weights by TMA into wgmma, the activations by cp.async (ahead of use)
        assert "0 B spill" in regs and tma > 0 and wgmma > 0 and cp_async > 0, out
    # FL 0: the K loop inside the item loop; FL 1: no loop inside another (the fused loop, and
    # the fallback Triton keeps for an inner loop of no trips)
    assert (_loop_depth(out["0"][3]), _loop_depth(out["1"][3])) == (2, 1), out


def _loop_depth(ttgir: str) -> int:
    """The deepest nesting of scf.for regions in a TTGIR listing (a region opens where a line
    has more '{' than '}'; attribute braces balance within their line)."""
    stack, deepest = [], 0
    for line in ttgir.splitlines():
        net = line.count("{") - line.count("}")
        if net > 0:
            stack += ["for" if "scf.for" in line else "region"] + ["region"] * (net - 1)
        elif net < 0:
            del stack[net:]
        deepest = max(deepest, stack.count("for"))
    return deepest


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, cfg", [(9, 0.0, None), (65, 1.2, None), (128, 1.2, None),
                                          (512, 1.2, None), (512, 0.0, None),
                                          (128, 1.2, {"FL": 0}), (512, 1.2, {"HS": 2}),
                                          (9, 0.0, {"FP": 1})])
def test_v23_is_cuda_v22_bit_for_bit_gpu(real_experts, T, skew, cfg):
    # why: the flat items are the grid's expert tiles in another order of programs; the grid
    # is sized from the device's SMs (graph-safe) and captured like any launch
    op = functools.partial(cuda_v23.int4_moe_cuda, cfg=cfg)
    base = {"HS": 2} if cfg and "HS" in cfg else None
    same_bits_eager_and_replayed(op, functools.partial(cuda_v22.int4_moe_cuda, cfg=base),
                                 real_experts, T, skew, 5600 + T)
