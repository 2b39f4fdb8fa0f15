"""DFlash drafter: materialise + draft against a slow loop formulation, cache hygiene, checkpoint I/O.

Tiny preset (D 64, Hq 4 / Hkv 2, d 16, 2 layers: layer 0 sliding with W = 16, layer 1 full,
block 8 -> L = 7). Contexts are longer than W so the window really cuts. Target features are
random bf16 at the scale the tiny target's captured layers have (RMS ~2); one test feeds the
target's real capture.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import workbench
from workbench import ops
from workbench.config import DrafterConfig, build_target_layer_ids
from workbench.drafter_io import DrafterCheckpointError, load_drafter, save_drafter
from workbench.reference.drafter import build_drafter, draft_topk, empty_drafter
from workbench.reference.layers import linear, lm_head, rmsnorm, swiglu_mlp
from workbench.reference.tree_mla import causal_anc_bits

CFG = workbench.ModelConfig.preset("tiny")
DCFG = CFG.drafter
L, S = DCFG.depth, DCFG.block_size
FEAT = len(DCFG.target_layer_ids) * DCFG.hidden_size  # nT * D
# bf16 activations: the loop formulation sums attention in another fp32 order, so a bf16
# rounding can flip by one ulp (~0.008 at unit RMS) and travel through the rest of the layer.
Z_ATOL, LP_ATOL = 3e-2, 5e-2


@pytest.fixture(scope="module")
def target():
    return workbench.build_model("tiny")


@pytest.fixture(scope="module")
def drafter():
    return build_drafter(CFG, seed=0)


def feats(batch: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (2.0 * torch.randn(batch, n, FEAT, generator=g)).to(torch.bfloat16)  # [B, n, nT*D]


def materialize_all(dr, f, lens, T):
    """Cache [.., B, T, ..] with rows [0, lens[b]) of request b materialised in one call."""
    B, n, _ = f.shape
    cache = dr.new_cache(B, T)
    dr.materialize(cache, f, torch.arange(n).expand(B, n), torch.tensor(lens))
    return cache


# -- the independent formulation ----------------------------------------------------------------
def _rope(x, pos, rope):
    """HF Qwen3 form: x * cos + rotate_half(x) * sin. x [n, H, d], pos [n]."""
    cos, sin = rope.cos_sin(torch.tensor(pos))
    cos, sin = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    x1, x2 = x.float().chunk(2, -1)
    return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


def slow_draft(dr, target, f, P: int, bonus: int, causal_sliding: bool):
    """One request, no cache: context K/V recomputed from scratch for tokens 0..P-1 from the
    features f [P, nT*D], attention one query and one head at a time with an explicit mask.
    Returns z [S, D] and full log-probs [L, V]."""
    c = dr.cfg
    eps, Hq, Hkv, d, W = c.rms_norm_eps, c.num_heads, c.num_kv_heads, c.head_dim, c.sliding_window
    ctx = rmsnorm(linear(f, dr.fc.weight), dr.hidden_norm.weight, eps)  # [P, D]
    x = target.embed(torch.tensor([bonus] + [c.mask_token_id] * L))  # [S, D]
    qpos = [P + i for i in range(S)]
    kpos = list(range(P)) + qpos

    def visible(sliding, qp, j):
        kp, in_block = kpos[j], j >= P
        if sliding and not kp > qp - W:  # left edge of the window
            return False
        if sliding and causal_sliding and in_block and kp > qp:
            return False
        return True

    for layer in dr.layers:
        at = layer.self_attn

        def kv(h, pos, at=at):
            k = linear(h, at.k_proj.weight).view(-1, Hkv, d)
            k = _rope(rmsnorm(k, at.k_norm.weight, eps), pos, dr.rope)
            return k, linear(h, at.v_proj.weight).view(-1, Hkv, d)

        kc, vc = kv(ctx, list(range(P)))
        a = rmsnorm(x, layer.input_layernorm.weight, eps)
        q = linear(a, at.q_proj.weight).view(S, Hq, d)
        q = _rope(rmsnorm(q, at.q_norm.weight, eps), qpos, dr.rope)
        kb, vb = kv(a, qpos)
        K, V = torch.cat([kc, kb]).float(), torch.cat([vc, vb]).float()  # [P+S, Hkv, d]
        o = torch.empty(S, Hq, d)
        for i in range(S):
            ok = torch.tensor([visible(layer.sliding, qpos[i], j) for j in range(len(kpos))])
            for h in range(Hq):
                kvh = h // (Hq // Hkv)
                s = (K[:, kvh] @ q[i, h].float()) / math.sqrt(d)
                s = torch.where(ok, s, -math.inf)
                o[i, h] = torch.softmax(s, 0) @ V[:, kvh]
        x = x + linear(o.to(x.dtype).reshape(S, Hq * d), at.o_proj.weight)
        m = rmsnorm(x, layer.post_attention_layernorm.weight, eps)
        x = x + swiglu_mlp(m, layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight,
                           layer.mlp.down_proj.weight)
    z = rmsnorm(x, dr.norm.weight, eps)
    return z, torch.log_softmax(lm_head(z[1:], target.lm_head.weight), -1)


# -- tests ----------------------------------------------------------------------------------------
def test_build_target_layer_ids():
    assert build_target_layer_ids(61, 6) == [1, 12, 24, 35, 47, 58]
    assert build_target_layer_ids(61, 1) == [30]  # one draft layer: the middle target layer
    assert list(DCFG.target_layer_ids) == build_target_layer_ids(CFG.num_layers, DCFG.num_layers)


def test_registry_points_here():
    assert ops.get("drafter") is draft_topk


def test_real_shape_parameter_count():
    # Kimi K2.6 drafter on the meta device: 6 x 528.5M + fc 308M ~= 3.48B (ddtree.md §1.5)
    dr = empty_drafter(workbench.ModelConfig.preset("kimi-k2.6").drafter, device="meta")
    assert dr.fc.weight.shape == (7168, 43008)
    assert dr.layers[0].self_attn.k_proj.weight.shape == (1024, 7168)
    assert abs(sum(p.numel() for p in dr.parameters()) / 1e9 - 3.48) < 0.01
    assert [ly.sliding for ly in dr.layers] == [True] * 5 + [False]


@pytest.mark.parametrize("causal_sliding", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_draft_matches_slow_formulation(target, causal_sliding, seed):
    dr = build_drafter(dataclasses.replace(DCFG, causal_sliding_in_block=causal_sliding), seed)
    lens = [40, 23]  # both > W = 16: the sliding layer drops the oldest context
    f = feats(2, 40, seed)
    cache = materialize_all(dr, f, lens, T=48)
    bonus, start = torch.tensor([7, 300]), torch.tensor(lens)
    block = torch.cat([bonus[:, None], torch.full((2, L), DCFG.mask_token_id)], 1)
    z = dr.forward_block(cache, block, start, target)
    lp, ids = draft_topk(dr, target, cache, bonus, start, k=8)
    for b, P in enumerate(lens):
        z_ref, lp_ref = slow_draft(dr, target, f[b, :P], P, int(bonus[b]), causal_sliding)
        torch.testing.assert_close(z[b].float(), z_ref.float(), atol=Z_ATOL, rtol=0)
        torch.testing.assert_close(lp[b], lp_ref.gather(-1, ids[b]), atol=LP_ATOL, rtol=0)
        assert torch.equal(ids[b, :, 0], lp_ref.argmax(-1))  # margins here are >> noise


def test_window_and_causal_flag_matter(target, drafter):
    # Guards the test above against vacuity: a wider window or the causal flag changes the draft.
    f, lens = feats(1, 40, 3), [40]
    bonus, start = torch.tensor([11]), torch.tensor(lens)

    def z_of(cfg):
        dr = build_drafter(cfg, seed=0)  # same seed and shapes -> same weights
        block = torch.cat([bonus[:, None], torch.full((1, L), cfg.mask_token_id)], 1)
        return dr.forward_block(materialize_all(dr, f, lens, 40), block, start, target)

    base = z_of(DCFG)
    assert not torch.equal(base, z_of(dataclasses.replace(DCFG, sliding_window=1000)))
    assert not torch.equal(base, z_of(dataclasses.replace(DCFG, causal_sliding_in_block=True)))


def test_incremental_materialize_equals_all_at_once(target, drafter):
    lens_final, T = [45, 31], 48
    f = feats(2, T, 4)
    ref = materialize_all(drafter, f, lens_final, T)
    cache = drafter.new_cache(2, T)
    # prompt: request 0 has 12 tokens, request 1 has 5; rows past count hold NaN features and
    # absurd positions, which must both be ignored.
    P = [12, 5]
    fp = f[:, :12].clone()
    fp[1, 5:] = float("nan")
    pos = torch.arange(12).expand(2, 12).clone()
    pos[1, 5:] = 10**6
    drafter.materialize(cache, fp, pos, torch.tensor(P))
    g = torch.Generator().manual_seed(5)
    chunk = 8  # commits per round are 1..L+1 = 8 rows
    while P != lens_final:
        k = [min(int(torch.randint(1, chunk + 1, (1,), generator=g)), lens_final[b] - P[b])
             for b in range(2)]
        # rows in a permuted order (slot == position, not row index), padded to `chunk` rows
        rows = torch.full((2, chunk), -1, dtype=torch.long)
        for b in range(2):
            rows[b, : k[b]] = P[b] + torch.randperm(k[b], generator=g)
        wide = torch.full((2, chunk, 2 * FEAT), float("nan"), dtype=torch.bfloat16)
        hid = wide[..., ::2]  # non-contiguous features
        for b in range(2):
            hid[b, : k[b]] = f[b, rows[b, : k[b]]]
        drafter.materialize(cache, hid, rows, torch.tensor(k))
        P = [P[b] + k[b] for b in range(2)]
    for b, n in enumerate(lens_final):
        # bitwise: every op is row-wise, so how rows are grouped into calls must not matter
        assert torch.equal(cache.k[:, b, :n], ref.k[:, b, :n])
        assert torch.equal(cache.v[:, b, :n], ref.v[:, b, :n])
        assert cache.k[:, b, n:].isnan().all() and cache.v[:, b, n:].isnan().all()
    bonus, start = torch.tensor([3, 4]), torch.tensor(lens_final)
    a = draft_topk(drafter, target, cache, bonus, start, 6)
    r = draft_topk(drafter, target, ref, bonus, start, 6)
    assert torch.equal(a[0], r[0]) and torch.equal(a[1], r[1])


def test_batch_equals_alone(target, drafter):
    lens = [0, 17, 45, 3]  # empty context (block sees only itself); just past W; long; short
    T = 46
    f = feats(len(lens), T, 6)
    bonus = torch.tensor([9, 100, 511, 0])
    lp, ids = draft_topk(drafter, target, materialize_all(drafter, f, lens, T), bonus,
                         torch.tensor(lens), 5)
    for b, P in enumerate(lens):
        alone = materialize_all(drafter, f[b : b + 1, : max(P, 1)], [P], T=max(P, 1))
        lp1, ids1 = draft_topk(drafter, target, alone, bonus[b : b + 1], torch.tensor([P]), 5)
        torch.testing.assert_close(lp[b : b + 1], lp1, atol=1e-4, rtol=0)
        assert torch.equal(ids[b : b + 1, :, 0], ids1[:, :, 0])


def test_attention_in_request_chunks_equals_whole_batch(target, drafter, monkeypatch):
    """forward_block attends in chunks of requests so float64 temporaries fit the GPU at bs 64 x
    32k; a chunk of one request must give the whole batch's result bitwise."""
    import workbench.reference.drafter as rd

    lens, T = [0, 17, 45, 3], 46
    cache = materialize_all(drafter, feats(len(lens), T, 8), lens, T)
    bonus, start = torch.tensor([9, 100, 511, 0]), torch.tensor(lens)
    whole = draft_topk(drafter, target, cache, bonus, start, 5)
    monkeypatch.setattr(rd, "ATTN_CHUNK_BYTES", 1)  # one request a chunk
    chunked = draft_topk(drafter, target, cache, bonus, start, 5)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_uncommitted_cache_rows_never_leak(target, drafter):
    lens, T = [20, 33], 40
    cache = materialize_all(drafter, feats(2, 40, 7), lens, T)
    for b, P in enumerate(lens):  # only committed rows were written
        assert not cache.k[:, b, :P].isnan().any() and cache.k[:, b, P:].isnan().all()
        assert not cache.v[:, b, :P].isnan().any() and cache.v[:, b, P:].isnan().all()
    bonus, start = torch.tensor([1, 2]), torch.tensor(lens)
    before = [t.clone() for t in cache]
    lp, ids = draft_topk(drafter, target, cache, bonus, start, 4)
    assert torch.isfinite(lp).all()
    for t, t0 in zip(cache, before, strict=True):  # the block's K/V were not written to the cache
        assert torch.equal(t.nan_to_num(7.0), t0.nan_to_num(7.0))
    for t in cache:  # replace the NaN tails with huge finite garbage: same bits out
        for b, P in enumerate(lens):
            t[:, b, P:] = 3e4
    lp2, ids2 = draft_topk(drafter, target, cache, bonus, start, 4)
    assert torch.equal(lp, lp2) and torch.equal(ids, ids2)


def test_from_target_capture(target, drafter):
    # The real producer: a causal prefill of the target, capturing the drafter's layers.
    B, n = 2, 24
    ids = torch.randint(0, CFG.vocab_size, (B, n), generator=torch.Generator().manual_seed(8))
    out = target(ids, torch.arange(n).expand(B, n), target.new_cache(B, n),
                 torch.zeros(B, dtype=torch.long), causal_anc_bits(n, B),
                 capture=DCFG.target_layer_ids, want_logits=False)
    assert out.captured.shape == (B, n, FEAT)
    cache = drafter.new_cache(B, n)
    drafter.materialize(cache, out.captured, torch.arange(n).expand(B, n), torch.tensor([n, 19]))
    lp, _ = draft_topk(drafter, target, cache, ids[:, -1], torch.tensor([n, 19]), 3)
    assert torch.isfinite(lp).all()


def test_topk_output(target, drafter):
    lens = [21, 9]
    cache = materialize_all(drafter, feats(2, 21, 9), lens, 21)
    bonus, start = torch.tensor([5, 6]), torch.tensor(lens)
    k = 16
    lp, ids = draft_topk(drafter, target, cache, bonus, start, k)
    assert lp.shape == ids.shape == (2, L, k) and lp.dtype == torch.float32
    assert ids.dtype == torch.int64
    assert (lp[..., 1:] <= lp[..., :-1]).all() and (lp <= 0).all()
    block = torch.cat([bonus[:, None], torch.full((2, L), DCFG.mask_token_id)], 1)
    z = drafter.forward_block(cache, block, start, target)
    full = torch.log_softmax(lm_head(z[:, 1:], target.lm_head.weight), -1)  # [B, L, V]
    assert torch.equal(lp, full.gather(-1, ids))
    assert torch.equal(lp[..., 0], full.max(-1).values)
    # k = V: the whole distribution, which normalises
    lp_all, ids_all = draft_topk(drafter, target, cache, bonus, start, CFG.vocab_size + 5)
    assert lp_all.shape[-1] == CFG.vocab_size  # k clamps to V
    torch.testing.assert_close(lp_all.logsumexp(-1), torch.zeros(2, L), atol=1e-5, rtol=0)
    assert torch.equal(ids_all.sort(-1).values, torch.arange(CFG.vocab_size).expand(2, L, -1))


def test_bad_inputs_fail(target, drafter):
    cache = drafter.new_cache(1, 8)
    with pytest.raises(ValueError, match="positions must lie in the cache"):
        drafter.materialize(cache, feats(1, 2, 0), torch.tensor([[7, 8]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="target_hidden"):
        drafter.materialize(cache, feats(1, 2, 0)[..., :-1], torch.tensor([[0, 1]]),
                            torch.tensor([2]))
    with pytest.raises(ValueError, match="start must lie"):
        draft_topk(drafter, target, cache, torch.tensor([1]), torch.tensor([9]), 2)
    with pytest.raises(ValueError, match="sliding_window"):
        build_drafter(dataclasses.replace(DCFG, sliding_window=0))


# -- checkpoint I/O -------------------------------------------------------------------------------
def test_save_load_roundtrip(tmp_path, target):
    cfg = dataclasses.replace(DCFG, causal_sliding_in_block=True)  # a non-default flag survives
    dr = build_drafter(cfg, seed=3)
    save_drafter(dr, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["block_size"] == 8 and hf["sliding_window"] == 16
    assert hf["layer_types"] == ["sliding_attention", "full_attention"]
    assert hf["dflash_config"]["target_layer_ids"] == list(DCFG.target_layer_ids)
    assert hf["dflash_config"]["mask_token_id"] == DCFG.mask_token_id
    back = load_drafter(tmp_path)
    assert back.cfg == cfg
    sd, sd2 = dr.state_dict(), back.state_dict()
    assert sd.keys() == sd2.keys()
    assert all(torch.equal(sd[n], sd2[n]) and sd2[n].dtype == torch.bfloat16 for n in sd)


@pytest.mark.parametrize("break_it, message", [
    ("missing", "missing tensor 'layers.1.self_attn.k_norm.weight'"),
    ("shape", "fc.weight: expected shape (64, 128), got (64, 127)"),
    ("dtype", "layers.0.mlp.up_proj.weight: expected dtype torch.bfloat16, got torch.float32"),
    ("extra", "unexpected tensor 'embed_tokens.weight'"),
])
def test_load_errors_name_the_tensor(tmp_path, drafter, break_it, message):
    save_drafter(drafter, tmp_path)
    st = load_file(tmp_path / "model.safetensors")
    if break_it == "missing":
        del st["layers.1.self_attn.k_norm.weight"]
    elif break_it == "shape":
        st["fc.weight"] = st["fc.weight"][:, :-1].contiguous()
    elif break_it == "dtype":
        st["layers.0.mlp.up_proj.weight"] = st["layers.0.mlp.up_proj.weight"].float()
    else:
        st["embed_tokens.weight"] = torch.zeros(4, 64, dtype=torch.bfloat16)
    save_file(st, tmp_path / "model.safetensors")
    with pytest.raises(DrafterCheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_drafter(tmp_path)


def test_load_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_drafter(tmp_path)


def test_hf_config_roundtrip():
    assert DrafterConfig.from_hf_dict(DCFG.to_hf_dict()) == DCFG
