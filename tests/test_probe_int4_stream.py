"""scripts/probe_int4_stream.py reads every word and scale of its programs once: its xor folds
equal torch's, for the TMA and the pointer loader, split and unsplit (interpreter on CPU)."""

import pytest
import torch
from script_module import load


def _probe():
    return load("probe_int4_stream")


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("KS", [1, 2])
def test_stream_folds_every_word_and_scale(tma, KS, device):
    probe = _probe()
    g = torch.Generator().manual_seed(KS)
    E, N, W, BN, BOXW = 5, 32, 128, 16, 32  # a scale box needs >= 16 B: BOXW >= 32
    words = torch.randint(-2**31, 2**31 - 1, (E, N, W), dtype=torch.int32, generator=g)
    scales = torch.randn(E, N, W // 4, generator=g).to(torch.bfloat16)
    words, scales = words.to(device), scales.to(device)
    experts = torch.tensor([3, 0, 4], dtype=torch.int32, device=device)
    out = torch.full((KS * 3 * N // BN,), 7, dtype=torch.int32, device=device)
    probe.stream(words, scales, experts, out, BN=BN, BOXW=BOXW, KS=KS, warps=4, stages=2,
                 tma=tma)
    ref = probe.fold_reference(words, scales, experts, BN, KS)
    assert torch.equal(out, ref)
    # one flipped word changes exactly its program's fold
    words[4, 17, W - 1] ^= 1 << 9
    out2 = out.clone()
    probe.stream(words, scales, experts, out2, BN=BN, BOXW=BOXW, KS=KS, warps=4, stages=2,
                 tma=tma)
    changed = (out2 != out).nonzero().flatten().tolist()
    nt, a, ks = 17 // BN, 2, (W - 1) // (W // KS)
    assert changed == [(ks * 3 + a) * (N // BN) + nt]


def test_stream_rejects_shapes_it_cannot_tile(device):
    probe = _probe()
    words = torch.zeros(2, 32, 64, dtype=torch.int32, device=device)
    scales = torch.zeros(2, 32, 16, dtype=torch.bfloat16, device=device)
    ex = torch.zeros(1, dtype=torch.int32, device=device)
    out = torch.empty(8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="BOXW: expected a multiple of 32"):
        probe.stream(words, scales, ex, out, BN=16, BOXW=16, KS=1, warps=4, stages=2, tma=True)
    with pytest.raises(ValueError, match="BN=24"):
        probe.stream(words, scales, ex, out, BN=24, BOXW=32, KS=1, warps=4, stages=2, tma=True)
    with pytest.raises(ValueError, match="scales: expected shape"):
        probe.stream(words, scales[:, :, :8], ex, out, BN=16, BOXW=32, KS=1, warps=4,
                     stages=2, tma=True)
