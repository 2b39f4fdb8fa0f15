"""int4_moe cuda_v30 (cuda_v28 with 4 gate/up K parts a unit on unhinted calls of 9-17 tokens):
on the CPU the tile rule and that its cold launch's knobs pass the launch checks; on the GPU the
reference at the rule's shapes, cuda_v28's bits outside it and cuda_v28-with-the-knobs' bits
inside it, graph replay. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, same_bits_eager_and_replayed

from workbench.kernels.int4_moe import cuda_v1, cuda_v4, cuda_v18, cuda_v28, cuda_v30, mma_layout

KIMI = dict(K=8, E=384, D=7168, I=2048)


@pytest.mark.parametrize("T, hint, split", [(1, None, False), (8, None, False), (9, None, True),
                                            (12, None, True), (17, None, True),
                                            (18, None, False), (33, None, False),
                                            (512, None, False), (9, 9, False), (17, 17, False),
                                            (136, 136, False)])
def test_v30_tiles_are_v28s_with_ksplit_on_unhinted_9_to_17_tokens(T, hint, split):
    # why: session 57 measured KW1 4 / RW1 1 at unhinted T 9 (uniform -4.3 % on the REAL
    # bench's draw, the wave-tail draws -4.6 / -2.8 % in process, skewed tied) and T 17 (-0.3 %);
    # hinted calls keep cuda_v28's tiles (cuda_v18's own rule already splits the small ones)
    v28 = cuda_v28.tiles(T, **KIMI, slots=hint)
    want = v28 | cuda_v18.KSPLIT if split else v28
    assert cuda_v30.tiles(T, **KIMI, slots=hint) == want
    assert cuda_v30.ksplit(T, hint) is split


@pytest.mark.parametrize("D, I, fits", [(7168, 2048, True), (512, 64, True), (64, 32, False),
                                        (256, 64, False)])
def test_ksplit_only_where_its_k_parts_divide_the_chunk_pairs(D, I, fits):
    # why: `cuda_v1.operands` refuses a KW1 that does not divide the gate/up chunk pairs (the
    # kernel would drop the remainder); tiny (D 64: one pair) runs the optimized loop on the GPU
    # at T 9-17 and tiny-dist's EP ranks take cuda_v18's hinted rule: both keep the rule's KW1
    pairs = mma_layout.dims(I, D, True)[1] // 2
    assert cuda_v18.ksplit_fits(D, I) is fits is (pairs % 4 == 0)
    for c in (cuda_v30.tiles(9, 8, 384, D, I), cuda_v18.tiles(17, 8, 48, D, I, 17)):
        assert (c["KW1"] == 4) is fits and pairs % c["KW1"] == 0, (D, I, c["KW1"])


@pytest.mark.parametrize("T", [9, 17])
def test_v30_split_tiles_pass_the_cold_launch_checks(T):
    # the 4 K parts a unit and the bulk ring fit the CTA (a refusal here would be a runtime
    # ValueError on the GPU, naming the knobs)
    c = cuda_v30.tiles(T, **KIMI)
    cuda_v1.check_cfg(c, (1,))
    assert cuda_v4.check_tb1(c) == 3
    assert (c["KW1"], c["RW1"]) == (4, 1) and (cuda_v28.tiles(T, **KIMI)["KW1"]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(9, 0.0), (9, 1.2), (12, 0.0), (17, 0.0), (17, 1.2)])
def test_v30_matches_the_reference_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 3000 + T)
    _close(cuda_v30.int4_moe_cuda(x, ids, w, ex), x, ids, w, ex)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, cfg", [(9, 0.0, cuda_v18.KSPLIT), (17, 1.2, cuda_v18.KSPLIT),
                                          (1, 0.0, None), (8, 0.0, None), (33, 1.2, None),
                                          (512, 1.2, None)])
def test_v30_is_cuda_v28s_bits_at_its_tiles_gpu(real_experts, T, skew, cfg):
    # inside the rule: cuda_v28 given the knobs (the only change); outside it: cuda_v28 itself
    x, ids, w, ex = _routing(real_experts, T, skew, 3050 + T)
    want = cuda_v28.int4_moe_cuda(x, ids, w, ex, cfg=cfg)
    assert torch.equal(cuda_v30.int4_moe_cuda(x, ids, w, ex), want)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(9, 0.0), (17, 1.2)])
def test_v30_graph_replay_is_eager_gpu(real_experts, T, skew):
    # the split tiles are shapes only: a new routing replays the captured launches bit for bit
    op = cuda_v30.int4_moe_cuda
    same_bits_eager_and_replayed(op, op, real_experts, T, skew, 3080 + T)
