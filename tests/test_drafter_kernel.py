"""drafter kernels (kernels/drafter/ triton_v1 .. triton_v7) against the reference drafter.

The reference accumulates in float64 and rounds each op to bf16; triton_v1 runs bf16 GEMMs with
fp32 accumulation, so whole-step log-probs agree within a dtype-derived tolerance and ids agree
bitwise wherever the reference's neighbouring log-probs are further apart than that margin.
The parts with an exact spec are tested tightly on their own: the fused LM head + log-softmax +
top-k (fp32 vs float64 logits of the same z: 1e-4, ties in the reference's order) and the
split-KV attention (float64 torch attention with the reference's mask). On CPU the kernels run
under the Triton interpreter (conftest.py); `gpu` tests use kimi-k2.6 drafter widths.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from workbench.config import ModelConfig
from workbench.kernels.drafter import (
    BEST,
    register,
    triton_v1,
    triton_v2,
    triton_v3,
    triton_v4,
    triton_v5,
    triton_v6,
)
from workbench.kernels.drafter._attention import block_attention
from workbench.kernels.drafter._gemm import SKINNY, proj
from workbench.kernels.drafter._lm_head_topk import lm_head_topk, tiles_v1, tiles_v2
from workbench.kernels.drafter.triton_v1 import draft_topk_triton
from workbench.reference.drafter import build_drafter, draft_topk
from workbench.reference.layers import lm_head
from workbench.reference.tree_build import topk_logprobs

BF16_U = torch.finfo(torch.bfloat16).eps / 2


def _setup(cfg: ModelConfig, starts, seed=0, device="cpu", window_cfg=None):
    """(drafter, target, cache, bonus, start): cache slots >= start[b] hold NaN."""
    from workbench.models import build_model

    target = build_model(cfg, seed=seed, device=device, layers=[])
    drafter = build_drafter(cfg, seed=seed, device=device)
    dc = cfg.drafter
    g = torch.Generator(device=device).manual_seed(seed + 1)
    B = len(starts)
    cache = drafter.new_cache(B, max(starts) + dc.block_size + 2)
    for b, p in enumerate(starts):
        shape = (dc.num_layers, p, dc.num_kv_heads, dc.head_dim)
        cache.k[:, b, :p] = torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)
        cache.v[:, b, :p] = torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)
    bonus = torch.randint(0, cfg.vocab_size, (B,), generator=g, device=device)
    return drafter, target, cache, bonus, torch.tensor(starts, device=device)


# triton_v3 (a measured negative) is checked on one case below (test_v3_...)
STEPS = {"triton_v1": triton_v1.draft_topk_triton, "triton_v2": triton_v2.draft_topk_triton,
         "triton_v4": triton_v4.draft_topk_triton, "triton_v5": triton_v5.draft_topk_triton,
         "triton_v6": triton_v6.draft_topk_triton}


@pytest.fixture(params=sorted(STEPS))
def step(request):
    """Each version's whole draft step (same contract)."""
    return STEPS[request.param]


def _assert_close_to_reference(args, k, step=draft_topk_triton, out=None):
    """Log-probs within 6 sigma of the bf16 noise of the logits; ids where margins are clear."""
    drafter, target = args[0], args[1]
    V = target.lm_head.weight.shape[0]
    ref_lp1, ref_ids = draft_topk(*args, min(k + 1, V))  # rank k + 1: the last rank's neighbour
    ref_lp, ref_ids = ref_lp1[..., :k], ref_ids[..., :k]
    lp, ids = out if out is not None else step(*args, k)
    assert lp.shape == ref_lp.shape and ids.shape == ref_ids.shape
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.isfinite(lp).all()
    # noise of one logit: sqrt(m) bf16 roundings (m as cases.tolerance counts them) scaled by the
    # logits' RMS (the log-probs inherit the logits' absolute error)
    B, L = ref_lp.shape[:2]
    blk = torch.cat([args[3].view(B, 1).long(), torch.full((B, L), drafter.cfg.mask_token_id,
                                                           device=args[3].device)], 1)
    z = drafter.forward_block(args[2], blk, args[4], target)[:, 1:]
    rms_logits = lm_head(z, target.lm_head.weight).pow(2).mean().sqrt().item()
    sigma = math.sqrt(6 * drafter.cfg.num_layers + 2) * BF16_U * rms_logits
    err = (lp - ref_lp).abs()
    assert err.max().item() <= 6 * sigma, f"max |d logprob| {err.max():.3g} > 6 sigma {6 * sigma:.3g}"
    # ids: rank r is checked where the reference's gap to both neighbours exceeds 4 sigma
    inf = torch.full_like(ref_lp[..., :1], math.inf)
    nxt = torch.cat([ref_lp1, -inf], -1)[..., 1 : k + 1]  # [B, L, k]: rank r + 1 (-inf past V)
    prv = torch.cat([inf, ref_lp[..., :-1]], -1)
    clear = (prv - ref_lp > 4 * sigma) & (ref_lp - nxt > 4 * sigma)
    bad = clear & (ids != ref_ids)
    assert not bad.any(), f"ids differ at clear ranks {bad.nonzero()[:5].tolist()}"
    # the kernel's own order: log-prob descending, equal log-probs lower id first
    assert (lp[..., :-1] >= lp[..., 1:]).all()
    tie = lp[..., :-1] == lp[..., 1:]
    assert (ids[..., :-1][tie] < ids[..., 1:][tie]).all()
    return clear[..., 0].float().mean().item()  # share of depths whose top-1 was checked


# ---------------------------------------------------------------- EDGE, whole step (CPU)


@pytest.fixture(scope="module")
def tiny():
    return ModelConfig.preset("tiny")


@pytest.mark.parametrize("starts,k,why", [
    ((0,), 8, "empty context: the block attends only to itself"),
    ((5,), 4, "context shorter than the sliding window (16)"),
    ((41,), 16, "context longer than the window: sliding layers drop the oldest keys, several "
                "KV splits + the combine kernel"),
    ((0, 7, 40), 4, "mixed lengths in one batch (empty, short, past the window)"),
])
def test_step_edge(tiny, step, starts, k, why):
    args = _setup(tiny, starts, seed=len(starts) + k)
    assert _assert_close_to_reference(args, k, step) >= 0.5  # the id check is not vacuous


@pytest.mark.parametrize("block_size", [2, 16])
def test_step_block_size(tiny, step, block_size):
    # why: L = 1 (one draft depth) and L = 15 (block of 16 rows: BLOCK_Q = 32 query rows;
    # v2: 32 rows of 2 requests, past the skinny GEMM's 16-row bucket)
    cfg = tiny.replace(drafter=dataclasses.replace(tiny.drafter, block_size=block_size))
    _assert_close_to_reference(_setup(cfg, (3, 20), seed=block_size), 4, step)


def test_step_causal_sliding(tiny, step):
    # why: SGLang's causal sliding layers inside the block (config flag)
    dc = dataclasses.replace(tiny.drafter, causal_sliding_in_block=True)
    _assert_close_to_reference(_setup(tiny.replace(drafter=dc), (18,), seed=3), 4, step)


def test_step_errors(tiny, step):
    d, t, cache, bonus, start = _setup(tiny, (3,))
    with pytest.raises(ValueError, match="start"):
        step(d, t, cache, bonus, start.view(1, 1), 4)
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        step(d, t, cache, bonus, start, 0)
    with pytest.raises(ValueError, match="cache.k"):
        step(d, t, type(cache)(cache.k.float(), cache.v), bonus, start, 4)


def test_v2_is_v1_up_to_gemm_order(tiny):
    """triton_v2 changes launches, tiles and GEMM kernels, not rounding points: a moved
    rounding point shows as a bf16 ulp somewhere in z. At tiny widths under the interpreter
    (fp32 dots of bf16 values) v1's and v2's GEMM sums round alike, so z is compared bitwise."""
    args = _setup(tiny, (0, 9, 41), seed=11)
    z1 = triton_v1.block_hidden(*args)
    z2 = triton_v2.block_hidden(*args)
    assert torch.equal(z1, z2)
    lp1, ids1 = triton_v1.draft_topk_triton(*args, 4)
    lp2, ids2 = triton_v2.draft_topk_triton(*args, 4)
    assert torch.equal(ids1, ids2) and (lp1 - lp2).abs().max().item() < 1e-5


def test_block_hidden_is_the_step_without_its_head(tiny):
    """What the distributed drafter runs under its vocab-parallel head: the fused step's head
    input exactly, and the reference's final-normed hidden within bf16 noise."""
    from workbench.kernels.drafter.triton_v1 import block_hidden

    d, t, cache, bonus, start = args = _setup(tiny, (0, 9, 41), seed=5)
    z = block_hidden(d, t, cache, bonus, start)  # [B*L, D]
    B, L, D = 3, tiny.drafter.depth, tiny.hidden_size
    assert z.shape == (B * L, D) and z.dtype == torch.bfloat16
    lp, ids = draft_topk_triton(*args, 4)
    lp2, ids2 = lm_head_topk(z, t.lm_head.weight, 4)
    assert torch.equal(lp.view(B * L, 4), lp2) and torch.equal(ids.view(B * L, 4), ids2)
    blk = torch.cat([bonus.view(B, 1), torch.full((B, L), tiny.drafter.mask_token_id)], 1)
    ref = d.forward_block(cache, blk, start, t)[:, 1:].reshape(B * L, D).float()
    sigma = math.sqrt(6 * tiny.drafter.num_layers + 2) * BF16_U * ref.pow(2).mean().sqrt()
    assert (z.float() - ref).abs().max() <= 6 * sigma + 2 * BF16_U * ref.abs().max()
    with pytest.raises(ValueError, match="bonus"):
        block_hidden(d, t, cache, bonus.view(B, 1), start)
    empty = type(cache)(cache.k[:, :0], cache.v[:, :0])
    assert block_hidden(d, t, empty, bonus[:0], start[:0]).shape == (0, D)


# ---------------------------------------------------------------- parts with an exact spec


@pytest.mark.parametrize("tiles", [tiles_v1, tiles_v2], ids=["v1", "v2"])
@pytest.mark.parametrize("M,V,D,k,sort", [
    (7, 300, 64, 8, False),  # V not a multiple of the 128-wide tile
    (14, 512, 64, 1, False),  # k = 1
    (3, 256, 32, 8, True),  # the bitonic top-k (the GPU's path), two tiles, a merge round
    (2, 100, 32, 100, None),  # k = V: the whole vocabulary, sorted (bitonic: K > 16)
    (20, 700, 32, 3, False),  # two M tiles, six vocab tiles
    (70, 200, 32, 4, False),  # v2: the 128-row tile (one M tile), rows past M masked
])
def test_lm_head_topk_exact(M, V, D, k, sort, tiles):
    g = torch.Generator().manual_seed(M * V + k)
    z = torch.randn(M, D, generator=g).to(torch.bfloat16)
    w = (torch.randn(V, D, generator=g) * 0.3).to(torch.bfloat16)
    w[V // 2 + 1] = w[V // 2]  # exact logit ties: the lower id must come first
    w[V - 1] = w[3]
    z[1] = z[0]
    ref_lp, ref_ids = topk_logprobs(lm_head(z, w).unsqueeze(0), k)
    lp, ids = lm_head_topk(z, w, k, sort=sort, tiles=tiles)
    assert (lp - ref_lp[0]).abs().max().item() < 1e-4
    gap = (ref_lp[0, :, :-1] - ref_lp[0, :, 1:]).abs()
    inf = torch.full((M, 1), math.inf)
    clear = (torch.cat([inf, gap], 1) > 1e-4) & (torch.cat([gap, inf], 1) > 1e-4)
    assert torch.equal(ids[clear], ref_ids[0][clear])
    tie = lp[:, :-1] == lp[:, 1:]
    assert (ids[:, :-1][tie] < ids[:, 1:][tie]).all()


def _attn_reference(q, kb, vb, kc, vc, start, sliding, W, causal):
    """float64 attention with the reference drafter's mask (reference/drafter.py `_mask`)."""
    B, S, Hq, d = q.shape
    G = Hq // kc.shape[2]
    out = torch.empty(B, S, Hq, d, dtype=torch.float64)
    for b in range(B):
        P = int(start[b])
        k = torch.cat([kc[b, :P], kb[b]]).double().repeat_interleave(G, 1)  # [P+S, Hq, d]
        v = torch.cat([vc[b, :P], vb[b]]).double().repeat_interleave(G, 1)
        qp = P + torch.arange(S).view(S, 1)
        kp = torch.cat([torch.arange(P), P + torch.arange(S)]).view(1, -1)
        ok = torch.ones(S, P + S, dtype=torch.bool)
        if sliding:
            ok = (qp - kp < W) & (qp - kp > -W)
            if causal:
                ok[:, P:] &= (qp - kp)[:, P:] >= 0
        s = torch.einsum("shd,thd->hst", q[b].double(), k) / math.sqrt(d)
        p = s.masked_fill(~ok, -math.inf).softmax(-1)
        out[b] = torch.einsum("hst,thd->shd", p, v)
    return out


@pytest.mark.parametrize("opts", [{}, {"combine_rows": 16},
                                  {"min_tiles": 1, "one_load": True},
                                  {"min_tiles": 2, "one_load": True}],
                         ids=["v1", "v2", "v5", "tiles2-one-load"])
@pytest.mark.parametrize("starts,sliding,causal,n_sm", [
    ((0, 3), False, False, 1),  # empty context; one split: the kernel writes o itself
    ((50, 9), True, False, 64),  # window 16 cuts request 0's context; splits + combine
    ((30, 1), True, True, 64),  # causal inside the block on sliding layers
    ((130,), False, False, 64),  # several key tiles per split
])
def test_block_attention(starts, sliding, causal, n_sm, opts):
    g = torch.Generator().manual_seed(sum(starts))
    B, S, Hq, Hkv, d, W = len(starts), 8, 4, 2, 16, 16
    T = max(starts) + 4

    def rnd(*s):
        return torch.randn(*s, generator=g).to(torch.bfloat16)

    q, kb, vb = rnd(B, S, Hq, d), rnd(B, S, Hkv, d), rnd(B, S, Hkv, d)
    kc, vc = rnd(B, T, Hkv, d), rnd(B, T, Hkv, d)
    for b, p in enumerate(starts):  # never-committed slots hold NaN
        kc[b, p:] = math.nan
        vc[b, p:] = math.nan
    start = torch.tensor(starts)
    o = block_attention(q, kb, vb, kc, vc, start, sliding, W, causal, n_sm, **opts)
    ref = _attn_reference(q, kb, vb, kc, vc, start, sliding, W, causal)
    assert torch.isfinite(o).all()
    assert (o.double() - ref).abs().max().item() < 1e-5


def test_split_and_one_load_combine_rules():
    """The splits (`splits_for`: ~2 programs an SM, no split under min_tiles key tiles) and
    the one-load combine's tiles (`combine_tiles`: parts padded to a power of two, rows a
    program within ONE_LOAD_ELEMS, the serial merge past it) at the Kimi drafter's TP8 rank
    (one kv head, 64 query rows, d 128) and the whole drafter (8 kv heads)."""
    from workbench.kernels.drafter._attention import ONE_LOAD_ELEMS, combine_tiles, splits_for

    assert splits_for(1, 1, 2047, 64, 132) == 8 and splits_for(1, 1, 4096, 64, 132) == 16
    assert splits_for(1, 1, 2047, 64, 132, 1) == 32 and splits_for(1, 1, 4096, 64, 132, 1) == 64
    assert splits_for(1, 8, 4096, 64, 132, 1) == 33  # 8 kv heads: ~2 programs an SM
    assert splits_for(1, 1, 10, 64, 132, 1) == 1  # one tile of context: one split
    for n, want in ((2, (2, 32)), (16, (16, 4)), (33, (64, 1)), (64, (64, 1)), (65, (0, 1))):
        assert combine_tiles(n, 64, 128) == want, n
    for n in range(1, 80):
        parts, rows = combine_tiles(n, 64, 128)
        assert parts == 0 or (parts >= n and parts * rows * 128 <= ONE_LOAD_ELEMS
                              and rows & (rows - 1) == 0)
    assert combine_tiles(3, 8, 16) == (4, 8)  # rows never past the program's query rows


def _one_request_attention(seed: int, d: int, P: int):
    """(q, kb, vb, kc, vc, start) of one request, 4 block rows, 2 query heads on one kv head,
    P context keys in a cache of P + 10 slots."""
    g = torch.Generator().manual_seed(seed)
    q, kb, vb = (torch.randn(1, 4, n, d, generator=g).to(torch.bfloat16) for n in (2, 1, 1))
    kc, vc = (torch.randn(1, P + 10, 1, d, generator=g).to(torch.bfloat16) for _ in range(2))
    return q, kb, vb, kc, vc, torch.tensor([P])


def test_split_cap():
    """max_splits caps `splits_for` (triton_v6: 32 at the TP8 rank's full layer, where one-tile
    splits make 64) and the capped attention is still the reference's."""
    from workbench.kernels.drafter._attention import splits_for

    assert splits_for(1, 1, 4096, 64, 132, 1, 32) == 32
    assert splits_for(1, 1, 2047, 64, 132, 1, 32) == 32 and splits_for(1, 1, 100, 64, 132, 1, 32) == 2
    assert splits_for(1, 1, 4096, 64, 132, 1, None) == 64
    args = _one_request_attention(11, d=16, P=690)
    o = block_attention(*args, False, 1, False, 64, min_tiles=1, one_load=True,
                        max_splits=4)  # 11 one-tile splits capped at 4
    ref = _attn_reference(*args, False, 1, False)
    assert (o.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("R,V,k", [(3, 2500, 16), (2, 40, 8), (1, 1024, 1), (2, 9, 9),
                                   (4, 3000, 128)])
def test_shard_topk_is_stable_topk(R, V, k):
    """The vocab-parallel head's shard top-k (kernels/drafter/_shard_topk, triton_v6's) is
    `stable_topk((local - M) - log_s, k)` bit for bit: rows full of ties (quarter steps), -inf,
    both signs of zero, a NaN of each sign, chunks shorter than k, k = V, k = MAX_K."""
    from workbench.dist.vocab import stable_topk
    from workbench.kernels.drafter._shard_topk import MAX_K, shard_topk

    g = torch.Generator().manual_seed(R * V + k)
    x = (torch.randn(R, V, generator=g) * 4).round() / 4
    x[0, : min(5, V)] = -math.inf
    x[-1, -3:] = -0.0
    x[-1, 0] = 0.0
    if V > 20:
        x[0, 7] = math.nan  # a positive-sign NaN: stable_topk ranks it first
        x[-1, 11] = -math.nan  # a negative-sign one: last
    M = torch.nan_to_num(x, nan=-math.inf).amax(-1)
    log_s = torch.log(torch.exp(x - M[:, None]).nan_to_num(0.0).sum(-1))
    vals, ids = shard_topk(x, M, log_s, k)
    want_v, want_i = stable_topk((x - M[:, None]) - log_s[:, None], k)
    assert torch.equal(ids, want_i), (ids, want_i)
    assert torch.equal(vals.view(torch.int32), want_v.view(torch.int32))
    assert k <= MAX_K


@pytest.mark.gpu
@pytest.mark.parametrize("R,k", [(7, 16), (56, 16), (7, 128), (448, 8)])
def test_gpu_shard_topk_is_stable_topk_at_the_k26_shard(R, k):
    """At K2.6's vocab shard (163840 / 8 = 20480 ids a rank), R = B x 7 draft rows: the
    kernel's bits are stable_topk's on the GPU too (bf16-rounded logits: many exact ties)."""
    from workbench.dist.vocab import stable_topk
    from workbench.kernels.drafter._shard_topk import shard_topk

    g = torch.Generator(device="cuda").manual_seed(R + k)
    x = (torch.randn(R, 20480, generator=g, device="cuda") * 3).to(torch.bfloat16).float()
    x[0, :100] = -math.inf
    M = x.amax(-1)
    log_s = torch.log(torch.exp(x - M[:, None]).sum(-1))
    vals, ids = shard_topk(x, M, log_s, k)
    want_v, want_i = stable_topk((x - M[:, None]) - log_s[:, None], k)
    assert torch.equal(ids, want_i)
    assert torch.equal(vals.view(torch.int32), want_v.view(torch.int32))


def test_shard_topk_refuses_bad_arguments_by_name():
    from workbench.kernels.drafter._shard_topk import MAX_K, shard_topk

    x, m = torch.zeros(2, 300), torch.zeros(2)
    with pytest.raises(ValueError, match=r"k: expected an int in 1\.\.128"):
        shard_topk(x, m, m, MAX_K + 1)
    with pytest.raises(ValueError, match="k: expected"):
        shard_topk(x, m, m, 0)
    with pytest.raises(ValueError, match="local: expected a \\[R, V\\] fp32"):
        shard_topk(x.double(), m, m, 4)
    with pytest.raises(ValueError, match=r"log_s: expected \[2\] fp32"):
        shard_topk(x, m, torch.zeros(3), 4)
    vals, ids = shard_topk(torch.zeros(0, 300), torch.zeros(0), torch.zeros(0), 4)
    assert vals.shape == (0, 4) and ids.shape == (0, 4)


@pytest.mark.parametrize("B,L,V,k", [(2, 3, 2500, 16), (1, 2, 40, 8), (1, 1, 1024, 1),
                                     (2, 2, 3000, 128), (1, 7, 700, 129), (1, 2, 9, 16)])
def test_head_v7_is_the_reference_head_within_ulps(B, L, V, k):
    """triton_v7's whole vocab-parallel head (kernels/drafter/_head_v7) against
    `dist_topk_logprobs` (the reference head) on one rank: the same ids, ties in id order
    (quarter-step logits: many exact ties, which one constant a row keeps tied), -inf logits,
    chunks shorter than k, k = MAX_K; log-probs within fp32 ulps (Triton's exp and sum order in
    the log-softmax constants). Past MAX_K (k 129) and a shard under k (V 9): the reference
    head with v6's shard top-k, bit for bit (documented dispatch)."""
    from workbench.dist.comm import Comm
    from workbench.dist.vocab import dist_topk_logprobs
    from workbench.kernels.drafter._head_v7 import dist_head
    from workbench.kernels.drafter._shard_topk import MAX_K

    g = torch.Generator().manual_seed(B * V + k)
    x = (torch.randn(B, L, V, generator=g) * 4).round() / 4
    x[0, 0, : min(5, V)] = -math.inf
    want_v, want_i = dist_topk_logprobs(x, 1000, k, Comm())
    vals, ids = dist_head(x, 1000, k, Comm())
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, want_i), (ids, want_i)
    if k > MAX_K or V < k:
        assert torch.equal(vals.view(torch.int32), want_v.view(torch.int32))
    else:
        torch.testing.assert_close(vals, want_v, rtol=1e-6, atol=1e-5)


def test_head_v7_poisons_a_row_with_a_nan_logit_and_refuses_bad_arguments():
    """A NaN logit (an upstream kernel's fault) shows as NaN log-probs in its row, never as a
    clean-looking answer; the other rows are untouched. Bad shapes and k: errors by name."""
    from workbench.dist.comm import Comm
    from workbench.dist.vocab import dist_topk_logprobs
    from workbench.kernels.drafter._head_v7 import dist_head

    x = torch.randn(1, 2, 300, generator=torch.Generator().manual_seed(1))
    x[0, 0, 17] = math.nan
    vals, ids = dist_head(x, 0, 4, Comm())
    assert vals[0, 0].isnan().all()
    want_v, want_i = dist_topk_logprobs(x[:, 1:], 0, 4, Comm())
    assert torch.equal(ids[:, 1:], want_i)
    torch.testing.assert_close(vals[:, 1:], want_v, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="local: expected a float \\[B, L, V/world\\]"):
        dist_head(x[0], 0, 4, Comm())
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        dist_head(x, 0, 0, Comm())


@pytest.mark.gpu
@pytest.mark.parametrize("B,k", [(1, 16), (8, 16), (1, 128), (64, 8)])
def test_gpu_head_v7_at_the_k26_shard(B, k):
    """At K2.6's vocab shard (20480 ids a rank), B x 7 draft rows of bf16-rounded logits (many
    exact ties): the reference head's ids, log-probs within fp32 ulps, on the GPU."""
    from workbench.dist.comm import Comm
    from workbench.dist.vocab import dist_topk_logprobs
    from workbench.kernels.drafter._head_v7 import dist_head

    g = torch.Generator(device="cuda").manual_seed(B + k)
    x = (torch.randn(B, 7, 20480, generator=g, device="cuda") * 3).to(torch.bfloat16).float()
    x[0, 0, :100] = -math.inf
    want_v, want_i = dist_topk_logprobs(x, 40960, k, Comm())
    vals, ids = dist_head(x, 40960, k, Comm())
    assert torch.equal(ids, want_i)
    torch.testing.assert_close(vals, want_v, rtol=1e-6, atol=1e-5)


def test_one_load_combine_with_many_parts():
    """The one-load combine at 48 splits padded to 64 parts, two rows a program (P 3100 at
    d 64; 128-key chunks cover the context by split 24, so splits 25-47 hold no context key:
    m = -inf, l = 0): the reference's rows."""
    args = _one_request_attention(7, d=64, P=3100)
    o = block_attention(*args, False, 1, False, 24, min_tiles=1, one_load=True)
    ref = _attn_reference(*args, False, 1, False)
    assert (o.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("name,M,N,K", [
    ("o", 1, 48, 300),  # one row; K not a multiple of the 256-wide K tile
    ("gate_up", 16, 200, 64),  # the 16-row bucket's last row count; N past the column tile
    ("down", 17, 64, 520),  # the 64-row bucket
    ("down", 64, 33, 16),
    ("qkv", 8, 40, 64),  # no skinny entry: cuBLAS (torch on CPU)
    ("o", 65, 16, 32),  # past 64 rows: cuBLAS
])
def test_proj(name, M, N, K):
    """triton_v2's projections: within one bf16 rounding of the float64 product."""
    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    y = proj(x, w, name)
    ref = x.double() @ w.double().T
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    bucket = 16 if M <= 16 else (64 if M <= 64 else None)
    assert ((name, bucket) in SKINNY) == (name != "qkv" and (M <= 16 or name == "down")
                                          and M <= 64)
    err = (y.double() - ref).abs()
    assert (err <= 2 * BF16_U * ref.abs() + 1e-3).all(), f"max |d| {err.max():.3g}"


@pytest.mark.parametrize("M,N,K", [
    (8, 1280, 64),  # N < WIDE_N: linear_triton_v3's rule (the TP8 qkv shard's side)
    (8, 2304, 48),  # N >= WIDE_N: v4's swap-AB split-K kernel (o / down / gate_up shards)
    (64, 2100, 32),  # the last row count the Triton kernels serve
    (65, 40, 16),  # past 64 rows: cuBLAS (torch on CPU)
])
def test_proj_v3(M, N, K):
    """triton_v3's projections are linear_triton_v5's, whatever the name, within one bf16
    rounding of the float64 product."""
    from workbench.kernels.dense import linear_triton_v5

    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    y = triton_v3.proj(x, w, "o")
    assert torch.equal(y, linear_triton_v5.linear(x, w))
    assert torch.equal(y, triton_v3.proj(x, w, "qkv"))
    ref = x.double() @ w.double().T
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    err = (y.double() - ref).abs()
    assert (err <= 2 * BF16_U * ref.abs() + 1e-3).all(), f"max |d| {err.max():.3g}"


def test_v3_v4_are_v2_but_their_projections(tiny):
    """triton_v3 / v4 are triton_v2's step on another projection rule (`triton_v2.on_proj`):
    on v2's own projections that step is v2's bit for bit, v4's is on_proj(v4's proj)'s; v3's
    whole step is within the reference's tolerance (v4's: test_step_edge)."""
    from workbench.kernels.drafter import _gemm

    args = _setup(tiny, (0, 9, 41), seed=13)
    _, v2_again = triton_v2.on_proj(_gemm.proj)
    assert torch.equal(v2_again(*args), triton_v2.block_hidden(*args))
    assert torch.equal(triton_v4.block_hidden(*args), triton_v2.on_proj(triton_v4.proj)[1](*args))
    assert _assert_close_to_reference(args, 4, triton_v3.draft_topk_triton) >= 0.5


@pytest.mark.parametrize("M,N,K", [
    (8, 1280, 600),  # the qkv shard's side: v4's SPLIT > 1 needs K >= 512
    (16, 96, 48),  # BK 256 past K: masked steps
    (17, 64, 40),  # past 16 rows: triton_v2's rule (cuBLAS for qkv; torch on CPU)
])
def test_proj_v4(M, N, K):
    """triton_v4's projections: the swap-AB kernel at BK 256 up to 16 rows, v2's rule above;
    within one bf16 rounding of the float64 product."""
    from workbench.kernels.dense import linear_triton_v4

    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    y = triton_v4.proj(x, w, "qkv")
    if M <= triton_v4.MAX_ROWS:
        assert triton_v4.tiles(M, N, K)[:3] == (16, 64, 256)  # BM, BN, BK
        assert torch.equal(y, linear_triton_v4.linear(x, w, tiles_for=triton_v4.tiles))
    else:
        assert torch.equal(y, proj(x, w, "qkv"))
    ref = x.double() @ w.double().T
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    err = (y.double() - ref).abs()
    assert (err <= 2 * BF16_U * ref.abs() + 1e-3).all(), f"max |d| {err.max():.3g}"


# ---------------------------------------------------------------- registry and decode loop


def test_registered():
    from workbench import ops
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    register()
    assert ops.op_spec("drafter").variant(BEST).load() is triton_v2.draft_topk_triton
    assert ops.op_spec("drafter").variant("triton_v1").load() is draft_topk_triton
    assert ops.op_spec("drafter").variant("triton_v3").load() is triton_v3.draft_topk_triton
    assert ops.op_spec("drafter").variant("triton_v4").load() is triton_v4.draft_topk_triton
    assert ops.op_spec("drafter").variant("triton_v5").load() is triton_v5.draft_topk_triton
    assert ops.op_spec("drafter").variant("triton_v6").load() is triton_v6.draft_topk_triton
    # triton_v7: v6's one-GPU step; its own vocab-parallel head only (HEAD, _head_v7)
    assert ops.op_spec("drafter").variant("triton_v7").load() is triton_v6.draft_topk_triton
    # the engine preset's drafter (the EP8 emulation's TP drafter, session 59), BEST elsewhere
    assert ops.PRESETS["engine"]["drafter"] == "triton_v5"
    assert ops.PRESETS["optimized"]["drafter"] == BEST
    assert ops.op_spec("drafter_materialize").variant("triton_v1").load() is materialize_triton
    assert ops.PRESETS["optimized"]["drafter_materialize"] == "triton_v1"


def test_decode_token_exact_with_drafter_kernel(tiny_target):
    # DDTree with the kernel drafter emits exactly the AR tokens, and the reference loop's
    from workbench.generate import generate

    register()
    drafter = build_drafter(tiny_target.cfg, seed=0)
    prompts = [[5, 6, 7, 8], [20, 21, 22]]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=5)
    ref = generate(tiny_target, drafter, prompts, max_new_tokens=5, budget=6)
    dd = generate(tiny_target, drafter, prompts, max_new_tokens=5, budget=6,
                  kernels={"drafter": BEST})
    assert dd.tokens == ar.tokens == ref.tokens


# ---------------------------------------------------------------- GPU (kimi-k2.6 widths)


@pytest.fixture(scope="module")
def kimi_drafter():
    cfg = ModelConfig.preset("kimi-k2.6")
    return cfg, _setup(cfg, (1,), seed=0, device="cuda")[:2]


def _kimi_case(kimi_drafter, starts, seed):
    cfg, (drafter, target) = kimi_drafter
    dc = cfg.drafter
    g = torch.Generator(device="cuda").manual_seed(seed)
    B = len(starts)
    cache = drafter.new_cache(B, max(starts) + dc.block_size + 2)
    for b, p in enumerate(starts):
        shape = (dc.num_layers, p, dc.num_kv_heads, dc.head_dim)
        cache.k[:, b, :p] = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
        cache.v[:, b, :p] = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
    bonus = torch.randint(0, cfg.vocab_size, (B,), generator=g, device="cuda")
    return drafter, target, cache, bonus, torch.tensor(starts, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("starts,k", [
    ((1024,), 8), ((8192, 1024, 3000, 2049), 32), ((32768,), 16), ((1024,) * 32, 8),
])
def test_gpu_real(kimi_drafter, step, starts, k):
    args = _kimi_case(kimi_drafter, starts, seed=len(starts))
    _assert_close_to_reference(args, k, step)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [64, 1])  # v2: cuBLAS / the skinny GEMMs and the head's tiles
def test_gpu_graph_replay(kimi_drafter, step, B):
    draft_topk_triton = step
    drafter, target, cache, bonus, start = _kimi_case(kimi_drafter, (2048,) * B, seed=7)
    eager = draft_topk_triton(drafter, target, cache, bonus, start, 16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        draft_topk_triton(drafter, target, cache, bonus, start, 16)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")  # no host sync inside the step
    try:
        with torch.cuda.graph(graph):
            out = draft_topk_triton(drafter, target, cache, bonus, start, 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])
    # new positions and context lengths, same graph; shorter, so every context slot is finite
    # (slots >= 2048 are NaN by construction)
    start.sub_(5)
    graph.replay()
    again = draft_topk_triton(drafter, target, cache, bonus, start, 16)
    assert bool(torch.isfinite(again[0]).all())
    assert torch.equal(out[0], again[0]) and torch.equal(out[1], again[1])
    assert not torch.equal(out[0], eager[0])  # the replay did see the new lengths


# ---------------------------------------------------------------- context materialisation
# materialize_v1 vs `DFlashDrafter.materialize`: K/V written at positions[b, i] for i < count[b].
# Both caches start NaN-poisoned (new_cache), so a slot the kernel writes that the reference
# does not (a row past count, a dropped position) shows as a finite value where NaN is expected.
# K passes 5 bf16 roundings (fc, hidden norm, k GEMM, k norm, RoPE), V 3: the tolerance is
# 6 sigma of that noise on the values' RMS, as for the draft step's logits (on CPU the tiny
# sums are exact in fp32, so the interpreter usually matches bitwise).


def _mat_inputs(drafter, B, N, T, seed, device="cpu"):
    """(target_hidden [B, N, F] bf16, positions [B, N] int64: a random permutation of slots)."""
    g = torch.Generator(device=device).manual_seed(seed)
    Fin = drafter.fc.weight.shape[1]
    hidden = torch.randn(B, N, Fin, generator=g, device=device).to(torch.bfloat16)
    pos = torch.stack([torch.randperm(T, generator=g, device=device)[:N] for _ in range(B)])
    return hidden, pos


def _assert_cache_matches(ref, out, n_round=(5, 3)):
    for name, a, b, m in (("k", ref.k, out.k, n_round[0]), ("v", ref.v, out.v, n_round[1])):
        nan = a.isnan()
        assert torch.equal(nan, b.isnan()), f"cache.{name}: written slots differ from the reference"
        if nan.all():
            continue
        a, b = a.float()[~nan], b.float()[~nan]
        sigma = math.sqrt(m) * BF16_U * a.pow(2).mean().sqrt().item()
        err = (a - b).abs().max().item()
        assert err <= 6 * sigma, f"cache.{name}: max |d| {err:.3g} > 6 sigma {6 * sigma:.3g}"


def _hostile_tail(hidden, pos, count, T):
    """Rows past count: NaN features, positions on slots the valid rows write (a write would
    overwrite them with NaN) or outside the cache (a write would go out of bounds)."""
    hidden, pos = hidden.clone(), pos.clone()
    for b, n in enumerate(count.tolist()):
        if n < hidden.shape[1]:
            hidden[b, n:] = math.nan
            pos[b, n:] = pos[b, 0] if n > 0 else -1
            pos[b, -1] = T + 3
    return hidden, pos


@pytest.mark.parametrize("B,N,T,counts,why", [
    (2, 6, 12, (0, 0), "count 0 everywhere: nothing is written, the cache stays NaN"),
    (2, 6, 12, (6, 6), "count = N: every row"),
    (3, 9, 40, (0, 9, 4), "mixed counts in one batch (none, all, some)"),
    (1, 1, 1, (1,), "one row into a one-slot cache (budget-1 commit, slot 0 = slot T - 1)"),
    (4, 8, 23, (8, 3, 1, 7), "prime T, block-size N (the loop's commit width)"),
])
def test_materialize_edge(tiny, B, N, T, counts, why):
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    drafter = build_drafter(tiny, seed=1)
    hidden, pos = _mat_inputs(drafter, B, N, T, seed=B * N + T)
    count = torch.tensor(counts)
    hidden, pos = _hostile_tail(hidden, pos, count, T)
    ref, out = drafter.new_cache(B, T), drafter.new_cache(B, T)
    drafter.materialize(ref, hidden, pos, count)
    materialize_triton(drafter, out, hidden, pos, count)
    _assert_cache_matches(ref, out)


def test_materialize_window_edge(tiny):
    # why: positions straddling the sliding window (W = 16: slots 14..17) and the cache's last
    # slot T - 1, written by two calls as the loop does (prefill chunk, then one commit)
    from workbench.kernels.drafter.materialize_v1 import materialize

    drafter = build_drafter(tiny, seed=2)
    W, T = tiny.drafter.sliding_window, 20
    hidden, _ = _mat_inputs(drafter, 2, 6, T, seed=5)
    ref, out = drafter.new_cache(2, T), drafter.new_cache(2, T)
    for p0, counts in ((W - 2, (4, 2)), (T - 6, (6, 1))):  # rows p0 .. p0 + 5; ends at T - 1
        pos = (p0 + torch.arange(6)).expand(2, 6).contiguous()
        count = torch.tensor(counts)
        drafter.materialize(ref, hidden, pos, count)
        materialize(drafter, out, hidden, pos, count)
    assert not out.k[:, 0, T - 1].isnan().any() and not out.k[:, 0, W].isnan().any()
    _assert_cache_matches(ref, out)


def test_materialize_strided_inputs_and_kept_slots(tiny):
    # why: non-contiguous target_hidden (a slice of the captured features), int32 positions and
    # count, and a cache already holding finite context: only the rows' slots may change
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    drafter = build_drafter(tiny, seed=3)
    B, N, T = 2, 5, 16
    wide, pos = _mat_inputs(drafter, B, 2 * N, T, seed=9)
    hidden = wide[:, ::2]  # [B, N, F], stride 2 along N
    pos = pos[:, :N].to(torch.int32)
    count = torch.tensor([3, 5], dtype=torch.int32)
    ref = drafter.new_cache(B, T)
    g = torch.Generator().manual_seed(4)
    ref.k.copy_(torch.randn(ref.k.shape, generator=g).to(torch.bfloat16))
    ref.v.copy_(torch.randn(ref.v.shape, generator=g).to(torch.bfloat16))
    out = type(ref)(ref.k.clone(), ref.v.clone())
    before = out.k.clone()
    drafter.materialize(ref, hidden, pos, count)
    materialize_triton(drafter, out, hidden, pos, count)
    _assert_cache_matches(ref, out)
    written = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(count.tolist()):
        written[b, pos[b, :n].long()] = True
    assert torch.equal(out.k[:, ~written], before[:, ~written])  # bitwise untouched


def test_materialize_drops_out_of_range_positions(tiny):
    # why: positions are not validated (a sync); a valid row outside [0, T) is skipped, the
    # others are written (the reference raises instead: compare with the row left out)
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    drafter = build_drafter(tiny, seed=4)
    B, N, T = 2, 4, 10
    hidden, pos = _mat_inputs(drafter, B, N, T, seed=6)
    pos[0, 3], pos[1, 3] = T, -1  # the last valid row of each request
    ref, out = drafter.new_cache(B, T), drafter.new_cache(B, T)
    drafter.materialize(ref, hidden, pos, torch.tensor([3, 3]))
    materialize_triton(drafter, out, hidden, pos, torch.tensor([4, 4]))
    _assert_cache_matches(ref, out)


def test_materialize_errors(tiny):
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    drafter = build_drafter(tiny, seed=0)
    cache = drafter.new_cache(1, 4)
    h, pos = _mat_inputs(drafter, 1, 2, 4, seed=0)
    cnt = torch.tensor([2])
    with pytest.raises(ValueError, match=r"target_hidden: expected \[B, N, 128\]"):
        materialize_triton(drafter, cache, h[..., :-1], pos, cnt)
    with pytest.raises(ValueError, match="target_hidden: expected bfloat16"):
        materialize_triton(drafter, cache, h.float(), pos, cnt)
    with pytest.raises(ValueError, match=r"positions: expected shape \(1, 2\)"):
        materialize_triton(drafter, cache, h, pos[:, :1], cnt)
    with pytest.raises(ValueError, match="count: expected an integer dtype"):
        materialize_triton(drafter, cache, h, pos, cnt.float())
    with pytest.raises(ValueError, match="cache.v"):
        materialize_triton(drafter, type(cache)(cache.k, cache.v[:, :, :2]), h, pos, cnt)


@pytest.fixture
def materialize_spy(monkeypatch):
    """Variant 'spy' of drafter_materialize: materialize_v1, recording each call's row count N
    and whether it ran inside a decode step (the step's commit phase) or outside (prefill)."""
    from workbench import generate as gen
    from workbench import ops
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    calls, in_step = [], {"on": False}

    def spy(drafter, cache, hidden, pos, count):
        calls.append((hidden.shape[1], in_step["on"]))
        return materialize_triton(drafter, cache, hidden, pos, count)

    step_call = gen._DDTreeStep.__call__

    def traced(self, *a):
        in_step["on"] = True
        try:
            return step_call(self, *a)
        finally:
            in_step["on"] = False

    monkeypatch.setitem(ops.op_spec("drafter_materialize").variants, "spy",
                        ops.Variant("spy", spy, needs=("triton",)))
    monkeypatch.setattr(gen._DDTreeStep, "__call__", traced)
    return calls


@pytest.mark.parametrize("budget", [3, 12])  # path rows budget + 1 = 4 < block_size; 8 < 13
def test_decode_token_exact_with_materialize_op(tiny_target, materialize_spy, budget):
    # the registry's drafter_materialize kernel, selected alone, runs in the step's commit phase
    # on min(budget + 1, block_size) path rows (and on the prefill chunks) and changes no token:
    # DDTree == AR == the reference loop (host-side reference materialisation)
    from workbench.generate import generate

    drafter = build_drafter(tiny_target.cfg, seed=0)
    prompts = [[5, 6, 7, 8], [20, 21, 22]]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=6)
    ref = generate(tiny_target, drafter, prompts, max_new_tokens=6, budget=budget)
    assert not materialize_spy  # the reference loop never calls the kernel
    dd = generate(tiny_target, drafter, prompts, max_new_tokens=6, budget=budget,
                  kernels={"drafter_materialize": "spy"})
    assert dd.tokens == ar.tokens == ref.tokens
    rows = min(budget + 1, tiny_target.cfg.drafter.block_size)
    steps = [n for n, inside in materialize_spy if inside]
    assert steps == [rows] * len(dd.steps), materialize_spy  # once per step, inside it
    assert [n for n, inside in materialize_spy if not inside] == [4]  # the one prefill chunk


def test_decode_token_exact_with_both_drafter_kernels(tiny_target):
    # the kernel draft step AND the in-step kernel materialisation: still the AR tokens
    from workbench.generate import generate

    register()
    drafter = build_drafter(tiny_target.cfg, seed=0)
    prompts = [[5, 6, 7, 8], [20, 21, 22]]
    ar = generate(tiny_target, prompts=prompts, max_new_tokens=5)
    dd = generate(tiny_target, drafter, prompts, max_new_tokens=5, budget=6,
                  kernels={"drafter": BEST, "drafter_materialize": "triton_v1"})
    assert dd.tokens == ar.tokens


def test_acceptance_replay_with_materialize_op(tiny_target):
    # replay mode (lengths from a trace, NOT the target's tokens): the in-step kernel writes the
    # drafter context the host-side reference writes (bitwise on tiny), so the drafts, trees
    # and emitted tokens are the reference loop's
    from workbench.acceptance import AcceptanceTrace
    from workbench.generate import generate

    drafter = build_drafter(tiny_target.cfg, seed=0)
    trace = AcceptanceTrace.from_mean(4.48, 8, drafter.cfg.depth)
    kw = dict(max_new_tokens=12, budget=8, acceptance=trace, seed=5)
    prompts = [[5, 9, 2, 7], [3] * 11]
    ref = generate(tiny_target, drafter, prompts, **kw)
    got = generate(tiny_target, drafter, prompts, kernels={"drafter_materialize": "triton_v1"},
                   **kw)
    assert got.mode == ref.mode == "ddtree-replay"
    assert got.tokens == ref.tokens
    assert [s["accepted"] for s in got.steps] == [s["accepted"] for s in ref.steps]
    assert ref.tokens_per_step > 1.0  # multi-token paths were committed


@pytest.mark.slow
def test_trained_pair_accepts_the_same_paths_with_materialize_op():
    # the shipped trained pair's drafter IS accepted (multi-token commits, ~2 tokens/step at
    # budget 8), so the committed context decides the next drafts: the in-step kernel must give
    # the reference loop's accepted lengths step by step, not only its (lossless) tokens
    from workbench.generate import generate
    from workbench.train import TRAINED_DIR, load_pair, pair_present

    if not pair_present(TRAINED_DIR):
        pytest.skip("no trained pair in workbench/assets/trained")
    target, drafter, tok = load_pair()
    prompts = [tok.encode(text).ids for text in ("import os\n\n\ndef main(argv):\n    ",
                                                  "for i in range(10):\n    if i % 2 == 0:\n")]
    kw = dict(max_new_tokens=12, budget=8)
    ref = generate(target, drafter, prompts, **kw)
    got = generate(target, drafter, prompts, kernels={"drafter_materialize": "triton_v1"}, **kw)
    assert got.tokens == ref.tokens
    assert [s["accepted"] for s in got.steps] == [s["accepted"] for s in ref.steps]
    assert ref.tokens_per_step > 1.5, ref.tokens_per_step


@pytest.mark.gpu
def test_gpu_materialize_real_and_graph_replay(kimi_drafter):
    # kimi-k2.6 widths (F 43008, 6 layers, 8 kv heads of 128), bs 64 x block_size rows
    from workbench.kernels.drafter.materialize_v1 import materialize_triton

    cfg, (drafter, _) = kimi_drafter
    B, N, T = 64, cfg.drafter.block_size, 4096
    hidden, pos = _mat_inputs(drafter, B, N, T, seed=11, device="cuda")
    pos = torch.where(pos == T - 1, pos[:, -1:], pos)  # swap T - 1 to the last row: the
    pos[:, -1] = T - 1  # cache's last slot, written where count = N; slots stay distinct
    count = (torch.arange(B, device="cuda") % (N + 1))  # 0..N, mixed
    hidden, pos = _hostile_tail(hidden, pos, count, T)
    ref, eager = drafter.new_cache(B, T), drafter.new_cache(B, T)
    drafter.materialize(ref, hidden, pos, count)
    materialize_triton(drafter, eager, hidden, pos, count)  # also builds the stacked weights
    _assert_cache_matches(ref, eager)

    def same(a, b):
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))

    out = drafter.new_cache(B, T)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        materialize_triton(drafter, out, hidden, pos, count)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")  # no host sync inside the materialisation
    try:
        with torch.cuda.graph(graph):
            materialize_triton(drafter, out, hidden, pos, count)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for t in out:
        t.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert same(out.k, eager.k) and same(out.v, eager.v)
    # new features, positions and counts in the same buffers: the replay follows them
    hidden2, pos2 = _mat_inputs(drafter, B, N, T, seed=12, device="cuda")
    hidden.copy_(hidden2)
    pos.copy_(pos2)
    count.copy_((count + 3) % (N + 1))
    for t in out:
        t.fill_(math.nan)
    graph.replay()
    again = drafter.new_cache(B, T)
    materialize_triton(drafter, again, hidden, pos, count)
    assert same(out.k, again.k) and same(out.v, again.v)
    assert not same(out.k, eager.k)
