"""int4_moe cuda_v15 (cuda_v14, but cuda_v5 on an EP rank's hinted calls under 3 E slots): the
rule and the dispatch on the CPU; on the H200 each path's bits (cuda_v5's, cuda_v14's) on an
EP8 rank's shapes and unhinted. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _routing

from workbench.kernels.int4_moe import cuda_v5, cuda_v14, cuda_v15


def test_v15_small_hinted_rule():
    # why: the EP8 emulation (sessions 37-38): cuda_v14 slower up to 136 slots on a rank's 48
    # experts, faster from 168; unhinted calls (REAL bench) always cuda_v14
    for hint, small in ((0, True), (17, True), (72, True), (136, True), (143, True),
                        (144, False), (168, False), (2080, False), (None, False), (True, False),
                        (17.0, False)):
        assert cuda_v15.small_hinted(hint, 48) is small, hint
    assert cuda_v15.small_hinted(1151, 384) and not cuda_v15.small_hinted(1152, 384)
    assert not cuda_v15.small_hinted(17, None)  # experts unreadable: cuda_v14 names them


def test_v15_reads_E_from_tuples_and_named_experts():
    # why: the versions take a plain 6-tuple as well as Int4Experts (CI's CPU-tensor test
    # passes a tuple); a non-tuple gives None, so cuda_v14's checks name the argument
    from workbench.reference.int4_moe import Int4Experts

    t = tuple(torch.empty(48, 2, 2) for _ in range(6))
    assert cuda_v15.num_experts(t) == 48 and cuda_v15.num_experts(Int4Experts(*t)) == 48
    assert cuda_v15.num_experts(None) is None and cuda_v15.num_experts(()) is None


@pytest.mark.parametrize("hint, want", [(17, "cuda_v5"), (544, "cuda_v14"), (None, "cuda_v14")])
def test_v15_dispatches_by_hint(monkeypatch, hint, want):
    # why: the path is the hint's and the experts' count only; the call (cfg, hint, checks)
    # reaches the chosen version unchanged
    seen = []
    for name, mod in (("cuda_v5", cuda_v5), ("cuda_v14", cuda_v14)):
        monkeypatch.setattr(mod, "int4_moe_cuda",
                            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n)
    ex = (torch.empty(48, 1, 1, dtype=torch.int32),) * 6  # a plain tuple, as versions take
    assert cuda_v15.int4_moe_cuda("x", "ids", "w", ex, cfg={"KS2": 1},
                                  expected_slots=hint) == want
    (name, args, kw), = seen
    assert args == ("x", "ids", "w", ex)
    assert kw == {"validate": None, "cfg": {"KS2": 1}, "expected_slots": hint}


@pytest.mark.gpu
@pytest.mark.parametrize("T, hint_of", [(17, lambda s: s), (65, lambda s: s), (512, lambda s: s),
                                        (17, lambda s: None)], ids=["h17", "h65", "h512", "T17"])
def test_v15_is_the_chosen_versions_bits_gpu(real_experts, T, hint_of):
    # why: an EP8 rank's call (48 of 384 experts, -1 elsewhere) with the loop's hint: under 3 E
    # = 144 slots cuda_v5's bits, from it cuda_v14's; unhinted cuda_v14's
    x, ids, w, ex = _routing(real_experts, T, 0.0, 3900 + T)
    here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
    ex48 = type(ex)(*(t[:48] for t in ex))
    hint = hint_of(int((here >= 0).sum()))
    want = cuda_v5 if cuda_v15.small_hinted(hint, 48) else cuda_v14
    out = cuda_v15.int4_moe_cuda(x, here, w, ex48, expected_slots=hint)
    assert not out.isnan().any()
    assert torch.equal(out, want.int4_moe_cuda(x, here, w, ex48, expected_slots=hint))
