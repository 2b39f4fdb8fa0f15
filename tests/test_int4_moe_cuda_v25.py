"""int4_moe cuda_v25 (cuda_v24 with the TC launch's ring filled by TPW producer warps): on the CPU
the knob check by name and the sm_90a build (TPW 1 is cuda_v24's kernel instruction for
instruction; at TPW 2 / 4 no spill, no serialised wgmma, no write to the A registers of a
wgmma in flight, the stage's bulk copies spread over the producer warps); on the GPU the op
against the reference and cuda_v24's bits at every TPW, graph replay. The shared suites (EDGE,
REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, same_bits_eager_and_replayed
from test_int4_moe_cuda_v19 import _a_register_hazards, _k_loops
from test_int4_moe_cuda_v24 import _sass

from workbench.kernels.int4_moe import cuda_v19, cuda_v24, cuda_v25

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_v25_tiles_are_v24s_with_producer_warps():
    for T in (2, 17, 512):
        assert cuda_v25.tiles(T, **KIMI) == cuda_v24.tiles(T, **KIMI) | {"TPW": 4}


@pytest.mark.parametrize("bad, match", [({"TPW": 3}, r"cfg\['TPW'\]"),
                                        ({"TPW": 8}, r"cfg\['TPW'\]"),
                                        ({"TPW": 0}, r"cfg\['TPW'\]"),
                                        ({"TST": 5}, r"cfg\['TST'\]")])
def test_v25_knobs_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        cuda_v25.check_tc(cuda_v25.tiles(128, **KIMI) | bad, 128 * 8, 384)


def test_v25_sweep_cli_takes_tpw_and_cuda_v24s_refuses_it():
    # why: session 54 call 2's sweep refused TPW=2 rows (no knob of the vocabulary), and a
    # knob cuda_v24 never reads must not time cuda_v24's defaults under its name
    from workbench.kernels.int4_moe import _knobs

    assert "TPW" in _knobs.knobs_read("cuda_v25") and "TPW" not in _knobs.knobs_read("cuda_v24")


def _functions(sass: str) -> dict:
    """{kernel name: its SASS}."""
    return {fn.split("\n")[0].strip(): fn for fn in sass.split("Function : ")[1:]}


def _code(fn: str) -> str:
    """A kernel's SASS without addresses and encodings (two builds' kernels compared)."""
    return re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", fn)


def _producer_copies(fn: str) -> int:
    """The UBLKCP (bulk global -> shared copy) instructions in a kernel's SASS."""
    return len(re.findall(r"\bUBLKCP\b", fn))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v25_producer_warps_build_for_sm90a(tmp_path, monkeypatch):
    # why: TPW 1 must stay cuda_v24's measured kernel (the template default), and more
    # producer warps must not cost the consumers their registers (spill, C751x serialisation)
    # or bring back session 53's A-register race; each producer warp issues its own copies
    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path))
    picks = ((4, 16, 1), (4, 16, 2), (4, 16, 4), (2, 4, 4))
    path, log = cuda_v19.build_cubin(cuda_v24.source(picks))
    assert not re.search(r"C751\d", log), log
    blocks = {b.split("'")[1]: b for b in log.split("Compiling entry function")[1:]}
    for st, nt, pw in picks:
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in blocks[
            cuda_v24.kernel_name(st, nt, pw)]
    fns = _functions(_sass(path))
    v24_path, _ = cuda_v19.build_cubin(cuda_v24.source(((4, 16),)))
    v24 = _functions(_sass(v24_path))
    assert _code(fns["int4_moe_hot_tc_4_16"]) == _code(v24["int4_moe_hot_tc_4_16"])  # TPW 1
    for st, nt, pw in picks:
        name = cuda_v24.kernel_name(st, nt, pw)
        fn = fns[name]
        assert re.search(rf"HGMMA\.64x{8 * nt}x16\.F32\.BF16", fn) and "USETMAXREG" in fn, name
        loops = _k_loops(fn, per_pair=8)  # an instance a pass width up to NTC
        assert len(loops) == {4: 1, 8: 2, 16: 3}[nt], name
        for body in loops:
            assert not any("LDL" in x or "STL" in x for x in body), name
        assert not _a_register_hazards(fn), (name, _a_register_hazards(fn)[:4])
        # the weight / scale copies and the activation pair, whichever warp issues them
        assert _producer_copies(fn) >= 4, (name, _producer_copies(fn))
    assert cuda_v24.kernel_name(4, 16, 4) == "int4_moe_hot_tc_4_16_p4"


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"TPW": 2}, {"TPW": 4, "TNT": 8}, {"TPW": 4, "TST": 2},
                                 {"TPW": 2, "TY": 1}, {"WT": 0}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(17, 1.2), (128, 1.2), (512, 0.0), (512, 1.2)])
def test_v25_is_cuda_v24s_bits_and_the_reference_gpu(real_experts, T, skew, cfg):
    # why: the producer warps copy the same bytes into the same stages; only who issues them
    # and the barrier's arrival count change, so any bit off is a stage read before it landed
    x, ids, w, ex = _routing(real_experts, T, skew, 2800 + T)
    v24_cfg = {k: v for k, v in cfg.items() if k != "TPW"} or None
    got = cuda_v25.int4_moe_cuda(x, ids, w, ex, cfg=cfg or None)
    assert torch.equal(got, cuda_v24.int4_moe_cuda(x, ids, w, ex, cfg=v24_cfg)), cfg
    _close(got, x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (128, 512))
def test_v25_graph_replay_is_eager_gpu(real_experts, T):
    same_bits_eager_and_replayed(cuda_v25.int4_moe_cuda, cuda_v25.int4_moe_cuda, real_experts, T,
                                 1.2, 2900 + T)
