"""int4_moe cuda_v14 (cuda_v12 with the down GEMM on h's bf16 hi from 8 E expected slots): the
rule and triton_v7's NH2 knob on the CPU (the interpreter: NH2 1 within int4_moe's tolerance
of the reference, not NH2 2's bits; bad values refused by name); on the H200 the op against
cuda_v12 with NH2 1 (its bits) eager and graph-replayed, and the reference. The shared suites
(EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import types

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _replayed
from test_int4_moe_cuda_v10 import _routing as _real_routing
from test_int4_moe_kernel import _case, _experts, _routing

from workbench.check import compare_outputs
from workbench.kernels.int4_moe import cuda_v12, cuda_v14, triton_v7, triton_v34
from workbench.reference.int4_moe import int4_moe

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v14_tiles_are_v12s_with_half_h_from_8e_slots():
    # why: session 37 call 1 measured NH2 1 faster only at T 512 (uniform -3.4 %, skewed
    # -7.7 %) and a tie at T 9-128; an EP rank's hinted call counts its own slots
    for T in (1, 2, 17, 128, 383, 384, 512, 2080):
        v12, c = cuda_v12.tiles(T, **KIMI), cuda_v14.tiles(T, **KIMI)
        assert {k: c[k] for k in v12} == v12
        assert c.get("NH2", 2) == (1 if T >= 384 else 2), T
    hinted = cuda_v14.tiles(512, **KIMI, slots=512)  # EP8 rank: T K / 8 slots expected
    assert hinted.get("NH2", 2) == 2
    assert cuda_v14.tiles(512, **KIMI, slots=4096)["NH2"] == 1


@pytest.mark.parametrize("bad", [0, 3, 1.0, "1"])
def test_nh2_refused_by_name(bad):
    # why: the knob reaches the down launch through cfg; a value the kernel has no form for
    # must name the knob and the values it takes before anything launches
    p = types.SimpleNamespace(D=64, I=32, Ip=64, c={"NH2": bad}, common={}, r=None, meta=())
    with pytest.raises(ValueError, match=r"cfg\['NH2'\].*1 \(h's bf16 hi\) or 2"):
        triton_v7.down_gemm(p, None, None, None, None, False, {})


def test_nh2_1_within_tolerance_not_nh2_2_bits():
    # why: NH2 1 drops h's lo half from the down GEMM (one bf16 rounding of h): the output must
    # stay within int4_moe's tolerance of the fp64 reference, and differ from hi + lo's bits
    # (else the knob read nothing); outputs NaN-free (the harness poisons its own)
    E, D, I, K, T = 8, 256, 128, 4, 13
    ex = _experts(E, D, I, seed=71)
    ids, w = _routing(T, E, K, seed=72, skew=1.0)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(73)).bfloat16()
    ref = int4_moe(x, ids, w, ex)
    half = triton_v34.int4_moe_triton(x, ids, w, ex, cfg={"NH2": 1})
    full = triton_v34.int4_moe_triton(x, ids, w, ex)
    rep = compare_outputs(ref, half, _case(x, ids, w, ex, "NH2 1"))
    assert rep["pass"], rep["mismatches"]
    assert not torch.equal(half, full)
    assert compare_outputs(ref, full, _case(x, ids, w, ex, "NH2 2"))["rel_err"] <= rep["rel_err"]


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(512, 0.0), (512, 1.2), (128, 1.2)])
def test_v14_is_cuda_v12_with_half_h_gpu(real_experts, T, skew):
    # why: cuda_v14 is cuda_v12's launches with the down GEMM's NH2 from the rule: cuda_v12's
    # bits at that NH2, eager and graph-replayed on a new routing, and the reference; T 128
    # keeps hi + lo (cuda_v12's bits unchanged)
    x, ids, w, ex = _real_routing(real_experts, T, skew, 3700 + T)
    nh2 = {"NH2": 1} if T >= 384 else {}
    a = cuda_v14.int4_moe_cuda(x, ids, w, ex)
    assert torch.equal(a, cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=nh2 or None))
    _close(a, x, ids, w, ex)
    if nh2:
        assert not torch.equal(a, cuda_v12.int4_moe_cuda(x, ids, w, ex))
    out = _replayed(lambda: cuda_v14.int4_moe_cuda(x, ids, w, ex), real_experts, T, skew,
                    3800 + T, x, ids, w)  # a new routing
    assert torch.equal(out, cuda_v12.int4_moe_cuda(x, ids, w, ex, cfg=nh2 or None))
