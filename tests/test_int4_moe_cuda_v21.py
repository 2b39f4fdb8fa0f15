"""int4_moe cuda_v21 (cuda_v18 with the cold gate/up launch's weight ring filled by TMA bulk
copies): on the CPU the tile rule, TB1's refusals by name, the ring's bytes and the sm_90 build
of the instances the rule picks (bulk copies in the K loop, no cp.async, no local memory); on
the GPU the op bit for bit cuda_v18's (unhinted REAL shapes, an EP8 rank's hinted calls, eager
and graph-replayed), every stage count the same bits, and the bulk ring re-entered (a cold
expert's second pass, a CTA's second expert). The shared suites (EDGE, REAL, EP8, graph replay)
run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_int4_moe_cuda import _build_mma_instances, _mma_loops
from test_int4_moe_cuda_v10 import _routing, same_bits_eager_and_replayed
from test_int4_moe_cuda_v17 import ep8_rank_matches

from workbench.kernels.int4_moe import cuda_v1, cuda_v4, cuda_v15, cuda_v17, cuda_v18, cuda_v21

KIMI = dict(K=8, D=7168, I=2048)


def test_v21_tiles_are_v18s_with_the_bulk_ring():
    for T, E, hint in ((1, 384, None), (9, 384, None), (128, 384, None), (512, 384, None),
                       (1, 48, 1), (17, 48, 17), (136, 48, 136), (544, 48, 544)):
        want = cuda_v18.tiles(T, E=E, **KIMI, slots=hint) | {"TB1": 3, "PF01": 0, "PF1": 0}
        c = cuda_v21.tiles(T, E=E, **KIMI, slots=hint)
        assert c == want, (T, E, hint)
        assert cuda_v4.check_tb1(c) == 3


@pytest.mark.parametrize("bad, match", [
    ({"TB1": 1}, r"cfg\['TB1'\].*2\.\.8"),
    ({"TB1": 9}, r"cfg\['TB1'\].*2\.\.8"),
    ({"TB1": 3.0}, r"cfg\['TB1'\].*2\.\.8"),
    ({"U1": 2}, r"U1 >= 3.*'U1': 2"),
    ({"PF1": 4}, r"PF1 0.*'PF1': 4"),
    ({"PF01": 2}, r"PF01 0.*'PF01': 2"),
    ({"IT1": 1}, r"IT1 0.*'IT1': 1"),
    ({"TB1": 8, "KW1": 4, "RW1": 4}, r"227 KB"),
])
def test_v21_tb1_refused_by_name(bad, match):
    # why: the bulk ring is unit_block's branch after the U1 < 3 register path, has no L2
    # prefetch and spills with the item list: each would silently run something else
    c = cuda_v21.tiles(128, E=384, **KIMI) | bad
    with pytest.raises(ValueError, match=match):
        cuda_v4.check_tb1(c)


def test_v21_ring_bytes():
    assert cuda_v1.ring_bytes(1, 4, 3, 3) == 4 * 3 * (2048 + 256 + 8)  # words, scales, barrier
    assert cuda_v1.ring_bytes(4, 1, 3, 5) == 4 * 5 * 2312
    assert cuda_v1.ring_bytes(1, 4, 3) == 4 * 3 * 6 * 32 * 16  # the cp.async ring as before
    assert cuda_v1.ring_bytes(2, 2, 2) == 0  # U < 3: registers


def test_v21_instances_extend_cuda_v18s_by_one_template_argument():
    # why: the bulk ring is a twelfth template argument; every instance without it keeps the
    # arguments (and the name ncu and the build cache know it by) it had before
    c18, c21 = (v.tiles(128, E=384, **KIMI) for v in (cuda_v18, cuda_v21))
    base = (0, 1, 0, c18["KW1"], c18["RW1"], c18["NN1"], c18["U1"], c18["XB1"])
    assert cuda_v1.instance(0, 1, False, c18, hout=1, skip=8) == base + (1, 0, 8)
    assert cuda_v1.instance(0, 1, False, c21, hout=1, skip=8, bk=3) == base + (1, 0, 8, 3)
    assert cuda_v1.instance(0, 1, False, c21, hout=1, bk=3) == base + (1, 0, 0, 3)  # hinted
    c1 = cuda_v1.tiles(128, E=384, **KIMI)  # cuda_v1's own down GEMM: 8 arguments
    assert cuda_v1.instance(1, 0, True, c1) == (1, 0, 1, c1["KW2"], c1["RW2"], c1["NN2"],
                                                c1["U2"], c1["XB2"])


def _cold_instances() -> set:
    """The (MODE, POST, KPAD, KW, RW, NN, U, XB, HOUT, ITEMS, SKIP, BK) tuples cuda_v21's cold
    launch compiles at Kimi's shapes: unhinted (cuda_v10's op, SKIP = WT) and an EP8 rank's
    small hinted calls (cuda_v5's launches, no hot launch: SKIP 0)."""
    picks = set()
    for T, E, hint in ((9, 384, None), (128, 384, None), (512, 384, None), (8, 48, 8),
                       (17, 48, 17), (68, 48, 68)):
        c = cuda_v21.tiles(T, E=E, **KIMI, slots=hint)
        skip = 0 if cuda_v15.small_hinted(hint, E) else c["WT"]
        picks.add(cuda_v1.instance(0, 1, False, c, hout=1, items=c["IT1"], skip=skip,
                                   bk=c["TB1"]))
    return picks


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v21_cold_kernels_build_for_sm90_with_bulk_copies_and_no_local_memory(tmp_path):
    # why: the bulk ring must replace the cp.async ring in the K loop (else the form measured is
    # not the one named) and fit the registers __launch_bounds__ gives it without local memory
    picks = _cold_instances()
    assert len(picks) >= 2  # the unhinted and the hinted forms
    log, sass = _build_mma_instances(tmp_path, picks)
    fns = sass.split("Function : ")[1:]
    assert len(fns) == len(picks)
    assert log.count("0 bytes spill stores, 0 bytes spill loads") >= len(picks), log
    for fn in fns:
        assert "LDL" not in fn and "STL" not in fn, fn[:80]
        k_loop = max(_mma_loops(fn), key=lambda b: sum("HMMA" in i for i in b))
        assert any("UBLKCP" in i for i in k_loop), fn[:80]
        assert not any("LDGSTS" in i for i in k_loop), fn[:80]


# ------------------------------------------------------------------ on the H200


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(2, 0.0), (9, 0.0), (65, 1.2), (128, 1.2), (128, 0.0),
                                     (512, 1.2), (512, 0.0)])
def test_v21_is_cuda_v18_bit_for_bit_gpu(real_experts, T, skew):
    # why: the bulk copies bring the same pairs to the same registers in the same order; only
    # how the weights arrive differs, so every bit is cuda_v18's (NaN-filled graph output first)
    same_bits_eager_and_replayed(cuda_v21.int4_moe_cuda, cuda_v18.int4_moe_cuda, real_experts, T,
                                 skew, 5100 + T)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(8, 0.0), (17, 0.0), (33, 1.2), (100, 0.0)])
def test_v21_is_cuda_v18_on_an_ep8_rank_gpu(real_experts, T, skew):
    # why: an EP rank's small hinted calls run cuda_v5's launches on cuda_v18's knobs (hinted
    # BN / PF1, KSPLIT): with the bulk ring they are cuda_v18's bits, eager and graph-replayed
    knobs = (cuda_v17.hinted_knobs(48, T) | (cuda_v18.KSPLIT if cuda_v18.ksplit(48, T) else {})
             | cuda_v21.BULK)
    ep8_rank_matches(cuda_v21, real_experts, T, skew, 5200 + T, knobs,
                     same=cuda_v18.int4_moe_cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{"TB1": 2}, {"TB1": 4}, {"TB1": 8},
                                 {"WT": 16},                    # 9-16-slot experts: two passes
                                 {"CU_A_GRID": 7},              # a CTA column: many experts
                                 {"WT": 16, "CU_A_GRID": 5, "TB1": 5}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()))
def test_v21_bulk_ring_forms_change_no_bit_gpu(real_experts, cfg):
    # why: the stage count changes only when a pair lands; a second pass or a second expert
    # re-initialises a warp's barriers (after mbarrier.inval): a stale phase would read a
    # stage before its copy lands, or hang
    x, ids, w, ex = _routing(real_experts, 128, 1.2, 5300)
    base = cfg.get("WT") and {"WT": cfg["WT"]}  # WT moves work between launches: its own twin
    want = cuda_v18.int4_moe_cuda(x, ids, w, ex, cfg=base or None)
    assert torch.equal(cuda_v21.int4_moe_cuda(x, ids, w, ex, cfg=cfg), want)
