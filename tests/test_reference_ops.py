"""Every reference op against an independent, slower or textbook formulation."""

import math

import pytest
import torch
import torch.nn.functional as F

from workbench import ModelConfig
from workbench.reference.int4 import dequant_int4_g32, pack_int4, quantize_int4_g32, unpack_int4
from workbench.reference.int4_moe import Int4Experts, int4_moe
from workbench.reference.layers import linear, lm_head, rmsnorm, swiglu_mlp
from workbench.reference.moe_route import moe_route
from workbench.reference.rope import Rope, yarn_inv_freq
from workbench.reference.tree_mla import (
    causal_anc_bits,
    mla_naive,
    pack_anc_bits,
    tree_mla,
    unpack_anc_bits,
)

bf16 = torch.bfloat16


def test_rmsnorm_matches_torch():
    x = torch.randn(3, 5, 64).to(bf16)
    w = torch.rand(64).to(bf16) + 0.5
    want = F.rms_norm(x.double(), (64,), w.double(), eps=1e-5).to(bf16)
    assert torch.equal(rmsnorm(x, w, 1e-5), want)


def test_linear_swiglu_lm_head_float64_math():
    x, g, u, d = (torch.randn(4, 32).to(bf16), torch.randn(48, 32).to(bf16),
                  torch.randn(48, 32).to(bf16), torch.randn(32, 48).to(bf16))
    assert torch.equal(linear(x, g), (x.double() @ g.double().T).to(bf16))
    a = F.silu(x.double() @ g.double().T) * (x.double() @ u.double().T)
    assert torch.equal(swiglu_mlp(x, g, u, d), (a @ d.double().T).to(bf16))
    w = torch.randn(1000, 32).to(bf16)  # vocab not a multiple of the chunk
    torch.testing.assert_close(lm_head(x, w, chunk=300), (x.double() @ w.double().T).float())


def test_reference_rows_do_not_depend_on_the_batch():
    """Batch invariance: one row alone and among 64 others rounds to the same bf16 bits."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 640, generator=g).to(bf16)
    xs = torch.randn(65, 640, generator=g).to(bf16)
    many = linear(xs, w)
    for i in (0, 17, 64):
        assert torch.equal(linear(xs[i : i + 1], w), many[i : i + 1])
    assert torch.equal(lm_head(xs[:1], w), lm_head(xs, w)[:1])


def test_yarn_frequencies_k26_ramp_and_k2_thinking_step():
    c = ModelConfig.preset("kimi-k2.6")
    base = c.rope_theta ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    inv = yarn_inv_freq(64, c.rope_theta, 64.0, 4096, 32.0, 1.0)
    # K2.5/K2.6: low 8, high 20 -> pairs < 8 keep the base frequency, >= 20 divided by 64
    torch.testing.assert_close(inv[:8], base[:8])
    torch.testing.assert_close(inv[20:], base[20:] / 64)
    assert ((inv[9:20] < base[9:20]) & (inv[9:20] > base[9:20] / 64)).all()  # ramp 0 at pair 8
    # K2-Thinking (beta_fast 1): a hard step, pairs 0-19 kept, 20-31 divided
    hard = yarn_inv_freq(64, c.rope_theta, 64.0, 4096, 1.0, 1.0)
    torch.testing.assert_close(hard[:20], base[:20])
    torch.testing.assert_close(hard[20:], base[20:] / 64)


def test_rope_interleaved_equals_complex_multiplication():
    r = Rope(64, 50000.0, 64.0, 4096, 32.0, 1.0, interleaved=True)
    x = torch.randn(2, 7, 3, 64)  # [B, S, H, R]
    pos = torch.randint(0, 10000, (2, 7))
    got = r.apply(x, pos)
    ang = pos.double().unsqueeze(-1) * r.inv_freq  # [B, S, 32]
    rot = torch.polar(torch.ones_like(ang), ang).to(torch.complex64).unsqueeze(2)
    want = torch.view_as_real(torch.view_as_complex(x.reshape(2, 7, 3, 32, 2)) * rot)
    torch.testing.assert_close(got, want.flatten(-2), atol=1e-5, rtol=1e-5)


def test_rope_half_is_interleaved_up_to_a_permutation():
    a = Rope(16, 10000.0, 4.0, 64, 32.0, 1.0, interleaved=True)
    h = Rope(16, 10000.0, 4.0, 64, 32.0, 1.0, interleaved=False)
    x, pos = torch.randn(5, 16), torch.arange(5)
    perm = torch.cat([torch.arange(0, 16, 2), torch.arange(1, 16, 2)])  # (2i, 2i+1) -> (i, i+8)
    torch.testing.assert_close(h.apply(x[:, perm], pos), a.apply(x, pos)[:, perm])


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_reserved_table_is_the_per_call_math_bit_for_bit(interleaved):
    """A cache reserves a cos/sin table (one gather a call, graph-safe); its rows must be
    the float64-angle values computed per call, so the loops' tokens cannot change."""
    fresh = Rope(64, 50000.0, 32.0, 4096, 32.0, 1.0, 0.707, 0.707, interleaved=interleaved)
    tab = Rope(64, 50000.0, 32.0, 4096, 32.0, 1.0, 0.707, 0.707, interleaved=interleaved)
    tab.reserve(100, "cpu")
    tab.reserve(30, "cpu")  # a smaller cache later keeps the larger table
    assert tab._tables[torch.device("cpu")].shape == (100, 64)
    pos = torch.randint(0, 100, (3, 5))
    for a, b in zip(tab.cos_sin(pos), fresh.cos_sin(pos), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(3, 5, 4, 64, dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(tab.apply(x, pos), fresh.apply(x, pos))


def test_int4_pack_unpack_roundtrip_and_literal_formula():
    q = torch.randint(-8, 8, (6, 64), dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (6, 8)
    assert torch.equal(unpack_int4(packed), q)
    scale = (torch.rand(6, 2) + 0.1).to(bf16)
    w = dequant_int4_g32(packed, scale)
    for o in range(6):  # the DESIGN.md formula, element by element
        for i in range(0, 64, 7):
            word = int(packed[o, i >> 3]) & 0xFFFFFFFF
            v = ((word >> (4 * (i & 7))) & 0xF) - 8
            assert w[o, i].item() == (torch.tensor(float(v)).to(bf16) * scale[o, i >> 5]).item()


def test_quantizer_is_symmetric_group32_minmax():
    w = torch.randn(8, 128) * 0.05
    q, s = quantize_int4_g32(w)
    assert q.min() >= -8 and q.max() <= 7 and s.shape == (8, 4) and s.dtype == bf16
    torch.testing.assert_close(s.float(), (w.abs().reshape(8, 4, 32).amax(-1) / 7.5).to(bf16)
                               .float())
    err = (dequant_int4_g32(pack_int4(q), s).float() - w).abs()
    # half a step, plus the bf16 rounding of the scale (amax may land past 7.5 and clamp) and of q*s
    assert (err <= s.float().repeat_interleave(32, 1) * 0.6).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_int4_g32(torch.randn(4, 40))


def test_moe_route_matches_hf_formulation():
    torch.manual_seed(0)
    T, D, E, K = 9, 64, 16, 4
    h, wg = torch.randn(T, D).to(bf16), (torch.randn(E, D) / 8).to(bf16)
    bias = torch.randn(E) * 0.1
    ids, w = moe_route(h, wg, bias, K, 2.827)
    s = torch.sigmoid(h.float() @ wg.float().T)
    want_ids = torch.topk(s + bias, K, dim=-1).indices
    assert torch.equal(ids.sort(-1).values, want_ids.sort(-1).values)
    ws = s.gather(1, ids)
    torch.testing.assert_close(w, ws / ws.sum(-1, keepdim=True) * 2.827)
    torch.testing.assert_close(w.sum(-1), torch.full((T,), 2.827))


def test_moe_route_ties_lower_index_wins():
    # all-zero router logits: every expert ties, the bias decides only for experts 5 and 9
    h, wg = torch.zeros(2, 32).to(bf16), torch.zeros(8 + 4, 32).to(bf16)
    bias = torch.zeros(12)
    bias[9] = 1.0
    ids, w = moe_route(h, wg, bias, 4, 1.0)
    assert ids.tolist() == [[9, 0, 1, 2]] * 2
    torch.testing.assert_close(w, torch.full((2, 4), 0.25))  # unbiased weights


def _random_experts(E, D, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = []
    for d_out, d_in in ((I, D), (I, D), (D, I)):
        q = torch.randint(-8, 8, (E, d_out, d_in), generator=g, dtype=torch.int8)
        s = (torch.rand(E, d_out, d_in // 32, generator=g) * 0.02 + 0.01).to(bf16)
        parts += [pack_int4(q), s]
    return Int4Experts(*parts)


def test_int4_moe_loop_equals_per_token_dense():
    E, D, I, T, K = 6, 64, 32, 11, 3
    ex = _random_experts(E, D, I)
    x = torch.randn(T, D).to(bf16)
    ids = torch.randint(0, E, (T, K))
    ids[0] = 2  # all slots of one token on one expert (duplicates are legal input)
    w = torch.rand(T, K)
    got = int4_moe(x, ids, w, ex)
    W = {n: dequant_int4_g32(getattr(ex, f"{n}_packed"), getattr(ex, f"{n}_scale")).float()
         for n in ("gate", "up", "down")}
    want = torch.zeros(T, D)
    for t in range(T):
        for j in range(K):
            e, xf = ids[t, j], x[t].float()
            a = F.silu(W["gate"][e] @ xf) * (W["up"][e] @ xf)
            want[t] += w[t, j] * (W["down"][e] @ a)
    torch.testing.assert_close(got.float(), want.to(bf16).float(), atol=1e-2, rtol=1e-2)


def test_anc_bits_pack_unpack_two_words():
    m = torch.rand(3, 100, 100) > 0.5  # > 64 nodes: two u64 words per row
    bits = pack_anc_bits(m)
    assert bits.shape == (3, 100, 2) and bits.dtype == torch.int64
    assert torch.equal(unpack_anc_bits(bits, 100), m)


def _mla_case(B=2, N=5, H=3, dn=16, R=8, C=32, dv=16, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.tensor([7, 0])[:B]  # an empty committed prefix too
    cache = torch.full((B, T, C + R), float("nan")).to(bf16)  # NaN beyond the valid rows
    for b in range(B):
        cache[b, : prefix[b] + N] = torch.randn(int(prefix[b]) + N, C + R, generator=g).to(bf16)
    q_nope = torch.randn(B, N, H, dn, generator=g).to(bf16)
    q_pe = torch.randn(B, N, H, R, generator=g).to(bf16)
    w_kvb = (torch.randn(H * (dn + dv), C, generator=g) / 6).to(bf16)
    mask = torch.tril(torch.rand(B, N, N, generator=g) > 0.4)
    mask |= torch.eye(N, dtype=torch.bool)  # ancestor-or-self
    return q_nope, q_pe, cache, w_kvb, prefix, pack_anc_bits(mask), mask


def test_tree_mla_absorbed_equals_naive_mla():
    H, dn, dv, C = 3, 16, 16, 32
    q_nope, q_pe, cache, w_kvb, prefix, bits, _ = _mla_case()
    scale = 0.3
    w = w_kvb.float().view(H, dn + dv, C)
    q_lat = torch.einsum("bnhd,hdc->bnhc", q_nope.float(), w[:, :dn])
    q = torch.cat([q_lat, q_pe.float()], -1)  # fp32 query: compare the math, not rounding
    o_lat, lse = tree_mla(q, cache, prefix, bits, scale, C)
    o_abs = torch.einsum("bnhc,hdc->bnhd", o_lat, w[:, dn:])
    o_naive = mla_naive(q_nope, q_pe, cache, w_kvb, prefix, bits, scale, dv)
    assert torch.isfinite(o_abs).all()  # the NaN rows past each request's length never leak
    torch.testing.assert_close(o_abs, o_naive.float(), atol=1e-4, rtol=1e-4)


def test_tree_mla_equals_per_row_dense_softmax():
    C = 32
    _, _, cache, _, prefix, bits, mask = _mla_case()
    B, N, H = 2, 5, 3
    q = torch.randn(B, N, H, cache.shape[-1])
    o, lse = tree_mla(q, cache, prefix, bits, 0.2, C)
    for b in range(B):
        P = int(prefix[b])
        for i in range(N):
            keys = list(range(P)) + [P + j for j in range(N) if mask[b, i, j]]
            k = cache[b, keys].float()
            s = q[b, i].float() @ k.T * 0.2  # [H, keys]
            torch.testing.assert_close(lse[b, i], torch.logsumexp(s, -1))
            torch.testing.assert_close(o[b, i], s.softmax(-1) @ k[:, :C])


def test_causal_bits_is_prefill_attention():
    bits = causal_anc_bits(70, batch=2)
    assert bits.shape == (2, 70, 2)
    assert torch.equal(unpack_anc_bits(bits, 70)[0], torch.ones(70, 70, dtype=torch.bool).tril())


def test_softmax_scale_used_not_576():
    c = ModelConfig.preset("kimi-k2.6")
    assert not math.isclose(c.softmax_scale, 576**-0.5)


def test_engine_router_top_k_is_a_stable_sorts_prefix():
    """kernels/dense moe_route picks experts with one int64-key top-k instead of a sort: it
    must be the reference rule (stable descending sort, equal values lowest index first),
    including ties, +-0.0 and negative values."""
    from workbench.kernels.dense.torch_bf16 import stable_topk

    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        x = torch.randn(5, 384, generator=g)
        if trial % 2:
            x = torch.round(x * 4) / 4  # many exact ties
        if trial % 3 == 0:
            x[:, :10], x[:, 10:20] = 0.0, -0.0
        if trial % 5 == 0:
            x = -x.abs()
        for k in (1, 8, 384):
            want = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
            assert torch.equal(stable_topk(x, k), want), (trial, k)
