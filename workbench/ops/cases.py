"""Seeded inputs, tolerances and rooflines of every registered op (DESIGN.md §6-§7, STYLE.md 6-7).

EDGE cases are tiny, odd, prime and hostile, each with a `why` (every dim <= 256, so the Triton
interpreter runs them); REAL cases take every size from a ModelConfig (kimi-k2.6 by default).
Hostile by default: NaN in cache slots past each request's valid length, one non-contiguous input
per op whose gaps hold NaN (or out-of-range ids), permuted, duplicate and one-expert routing.
Draws use a generator on `device`: the same seed gives different values on CPU and GPU.

Tolerance model, per op and output (what `tolerance` returns, what workbench.check applies):
    noise = sqrt(m) u_bf16 + sqrt(n) u_fp32          u = eps / 2, the unit roundoff
      m  bf16 roundings a correct kernel may add inside the op (int4_moe rounds SiLU*up to bf16
         for the down GEMM and each slot's result before the combine, as vLLM's fused MoE does:
         m = 2; swiglu_mlp's engine path rounds gate, up and SiLU*up: m = 3); independent
         roundings add in quadrature.
      n  the longest fp32 reduction (its order is free: ~sqrt(n) u relative to the terms).
    elementwise  |out - ref| <= rtol |ref| + atol rms(ref), rtol = eps_out (two correct roundings
                 of nearly equal values land at most one ulp apart), atol = 6 noise (6 sigma: the
                 tail over ~1e7 elements; rms(ref) scales the floor where outputs cancel to ~0)
    global       ||out - ref|| / ||ref|| <= eps_out / 2 + 2 noise
    atol_abs     outputs whose error does not scale with their own RMS get an absolute unit as
                 well: the drafter's log-probs carry the logits' absolute error (logits of std
                 `weights.DEFAULT_LOGIT_SCALE`, ~6 bf16 boundaries a layer), while their RMS is
                 < 1 at k = 1. atol_abs = 6 noise_logits, noise_logits = sqrt(6 layers + 2)
                 u_bf16 x logit std; the elementwise floor is max(atol rms(ref), atol_abs) and
                 the global tier also passes at RMS error <= 2 noise_logits (CI, session 6: a
                 fresh seed's k = 1 case missed the RMS-scaled floor, 0.073 against 0.061,
                 with the logits' 1-sigma error ~0.07).
Integer and bool outputs, and every DDTree field (float64 scores included), are bitwise.
Legend: B batch, N tree rows, T cache slots, P committed length, H heads, C latent, R rope,
D hidden, I expert FFN, F dense FFN, E experts, K top-k, L draft depth, V vocab, W mask words.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workbench.config import ModelConfig

from .case import Case

bf16, f32 = torch.bfloat16, torch.float32
NAN = float("nan")
INT4_GROUP_BYTES = 0.5 + 2 / 32  # per weight: 4 bits packed + one bf16 scale per group of 32


@dataclass(frozen=True)
class Tol:
    atol_rms: float = 0.0  # absolute floor, in units of the reference output's RMS
    rtol: float = 0.0
    rel: float = 0.0  # bound on ||out - ref|| / ||ref||
    exact: bool = False  # bitwise, whatever the dtype
    atol_abs: float = 0.0  # absolute floor in the output's units (module docstring)


def tolerance(op: str, output: str, dtype: torch.dtype, case: Case | None = None) -> Tol:
    """The tolerance of one output of `op` (module docstring: the model behind it)."""
    if op == "tree_build" or not dtype.is_floating_point:
        return Tol(exact=True)
    d = case.dims if case is not None else {}
    m, n = {
        "rmsnorm": (0, d.get("D", 1)), "linear": (0, d.get("D", 1)), "lm_head": (0, d.get("D", 1)),
        # the same norm after an add (session 43's CI: a fresh seed's fp32 case missed the
        # (0, 1) default by a hair, 2 ulps of 4.2 against 1.8: the D-long sum of squares)
        "add_rmsnorm": (0, d.get("D", 1)),
        "moe_route": (0, d.get("D", 1)),
        # the engine's path rounds the gate and up GEMM outputs and SiLU(gate) * up to bf16
        # before the down GEMM: 3 (m 1 until session 11's CI: a fresh seed's strided-x case
        # missed the 1-rounding floor, 0.0176 against 0.016)
        "swiglu_mlp": (3, max(d.get("D", 1), d.get("F", 1))),
        "int4_moe": (2, max(d.get("D", 1), d.get("I", 1))),
        # P is rounded to bf16 for the P.V GEMM (FlashAttention); lse stays fp32 throughout
        "tree_mla": (int(output == "o_lat"), d.get("T", 1) + d.get("C", 0) + d.get("R", 0)),
        # ~6 bf16 op boundaries per layer (norm, qkv, attention, o, residual, MLP) + embed/norm;
        # x16 (noise x4): log-probs carry the logits' absolute error (logit std 10 by
        # construction, weights.logit_scale), which the log-probs' own RMS (< 1 at k = 1, the
        # unit of atol) does not scale with
        "drafter": (16 * (6 * d.get("layers", 1) + 2), max(d.get("F", 1), d.get("V", 1))),
        # K: fc, hidden norm, k GEMM, k norm, RoPE; V: fc, hidden norm, v GEMM (bf16 each);
        # the longest reduction is fc's over F = nT * D
        "drafter_materialize": (5 if output.endswith("k") else 3, d.get("F", 1)),
        "mla_q_absorb": (0, d.get("K", 1)), "mla_v_up": (0, d.get("K", 1)),
    }.get(op, (0, 1))
    eps = torch.finfo(dtype).eps
    noise = math.sqrt(m) * torch.finfo(bf16).eps / 2 + math.sqrt(n) * torch.finfo(f32).eps / 2
    atol_abs = 0.0
    if op == "drafter" and output == "logprobs":
        from workbench.weights import DEFAULT_LOGIT_SCALE

        atol_abs = 6 * math.sqrt(6 * d.get("layers", 1) + 2) * torch.finfo(bf16).eps / 2 * \
            DEFAULT_LOGIT_SCALE
    return Tol(atol_rms=6 * noise, rtol=eps, rel=eps / 2 + 2 * noise, atol_abs=atol_abs)


class _Rand:
    """Seeded draws on one device."""

    def __init__(self, seed: int, device):
        self.device = torch.device(device)
        self.g = torch.Generator(device=self.device)
        self.g.manual_seed(int(seed))

    def normal(self, *shape, std=1.0, dtype=bf16):
        return (torch.randn(*shape, generator=self.g, device=self.device) * std).to(dtype)

    def uniform(self, *shape):
        return torch.rand(*shape, generator=self.g, device=self.device)

    def ints(self, lo, hi, *shape, dtype=torch.int64):
        return torch.randint(lo, hi, shape, generator=self.g, device=self.device, dtype=dtype)

    def distinct(self, n: int, k: int, rows: int) -> torch.Tensor:
        """[rows, k] int64, distinct within a row, random order (uniform subsets for n <= 4096;
        above that, increasing random offsets then shuffled: no [rows, V] buffer)."""
        if n <= 4096:
            return self.uniform(rows, n).argsort(-1)[:, :k].contiguous()
        ids = self.ints(1, n // k + 1, rows, k).cumsum(-1) - 1
        return ids.gather(1, self.uniform(rows, k).argsort(-1))

    def zipf(self, n: int, k: int, rows: int, exponent: float = 1.2) -> torch.Tensor:
        """[rows, k] int64, distinct within a row, ids drawn with Zipf(exponent) popularity
        over n experts whose hot ones sit at random ids (the skewed routing of the int4_moe
        cases and of the int4 timing CLI's --skew)."""
        pop = (torch.arange(n, device=self.device) + 1.0) ** -exponent
        pop = pop[self.uniform(n).argsort()]
        return torch.multinomial(pop.expand(rows, n), k, generator=self.g)


def _gappy(t: torch.Tensor, fill=NAN) -> torch.Tensor:
    """The same values with element stride 2 along the last dim. The gaps hold `fill` (NaN, or
    an out-of-range id), so a kernel that ignores strides fails loudly instead of subtly."""
    buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), fill, dtype=t.dtype, device=t.device)
    buf[..., ::2] = t
    return buf[..., ::2]


def _cfg(shapes: str, cfg) -> ModelConfig:
    if shapes not in ("edge", "real"):
        raise ValueError(f"shapes: expected 'edge' or 'real', got {shapes!r}")
    if isinstance(cfg, str):
        return ModelConfig.preset(cfg)
    return cfg or ModelConfig.preset("tiny" if shapes == "edge" else "kimi-k2.6")


def _nb(*tensor_shapes_and_sizes) -> int:
    """Bytes of (numel, itemsize) pairs."""
    return int(sum(n * s for n, s in tensor_shapes_and_sizes))


# -- int4_moe ------------------------------------------------------------------------------------
def _experts(r: _Rand, E: int, D: int, I: int, nan_experts=()):
    """Stacked INT4 experts: uniform random nibbles (what a kernel sees; the quantizer is tested
    elsewhere), scales so that W has RMS fan_in^-0.5 (uniform q in [-8, 7] has RMS 4.64)."""
    from workbench.reference.int4_moe import Int4Experts

    def proj(o, i):
        packed = r.ints(-(2**31), 2**31, E, o, i // 8, dtype=torch.int32)
        scale = (i**-0.5 / 4.64) * (1 + 0.1 * r.uniform(E, o, i // 32))
        scale[list(nan_experts)] = NAN
        return packed, scale.to(bf16)

    return Int4Experts(*proj(I, D), *proj(I, D), *proj(D, I))


def int4_moe_cases(shapes, seed, cfg=None, device="cpu", max_experts=None) -> list[Case]:
    """x [T, D] bf16, topk_ids [T, K] int64, topk_weights [T, K] fp32, Int4Experts.
    REAL is full size (E = 384: 9.5 GB of experts); `max_experts` trims E only when asked."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(T, D, I, E, K, label, why="", route="uniform", experts=None):
        ids = r.distinct(E, K, T)  # [T, K]
        if route == "skewed":  # Zipf(1.2) expert popularity, hot experts at random indices
            ids = r.zipf(E, K, T)
        if route == "one":
            ids[:, 0] = 2
        if route == "ep":  # one EP rank's view of 2E experts: the other rank's slots are -1
            ids = r.distinct(2 * E, K, T)
            ids = torch.where(ids < E, ids, -1)
            ids[0] = -1  # a token none of whose experts is here: a zero row
        w = r.uniform(T, K) + 0.05
        w = w / w.sum(-1, keepdim=True) * cfg.routed_scaling_factor
        if route != "perm":  # router order: descending weight; "perm" keeps slots unsorted
            w, order = w.sort(-1, descending=True)
            ids = ids.gather(1, order)
        unused = sorted(set(range(E)) - set(ids.unique().tolist()))  # (-1 is in no range)
        ex = experts or _experts(r, E, D, I, unused if route == "one" else ())
        x = r.normal(T, D)
        if route == "gappy":
            x = _gappy(x)
        dims = dict(T=T, D=D, I=I, E=E, K=K, E_touched=int((ids.unique() >= 0).sum()))
        return Case("int4_moe", label, (x, ids, w, ex), dims=dims, why=why, kind=shapes)

    if shapes == "edge":
        return [
            case(1, 64, 32, 1, 1, "T=1 E=1 K=1", "one token, one expert: the smallest launch"),
            case(13, 96, 160, 5, 1, "T=13 one-expert", "every token to expert 2 (worst imbalance); "
                 "the other experts hold NaN scales and must not be read into the output; 3 and 5 "
                 "groups of 32", route="one"),
            case(7, 64, 96, 6, 3, "T=7 I=96", "three groups of 32 along I; seven tokens"),
            case(31, 64, 32, 16, 4, "T=31 permuted", "T prime; slots not sorted by weight (a kernel "
                 "may not assume router order)", route="perm"),
            case(5, 32, 64, 7, 7, "T=5 K=E=7", "K = E: every expert for every token"),
            case(11, 64, 64, 9, 2, "T=11 strided-x", "x is a stride-2 view with NaN in the gaps",
                 route="gappy"),
            case(9, 64, 32, 8, 4, "T=9 EP -1 slots", "expert parallelism on a replicated stream: "
                 "slots of another rank's experts are -1 and add nothing (token 0 has none here: "
                 "a zero row); -1 may repeat in a row", route="ep"),
        ]
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    E = min(E, max_experts) if max_experts else E
    if E < K:
        raise ValueError(f"max_experts: expected >= K = {K}, got {max_experts}")
    ex = _experts(r, E, cfg.hidden_size, cfg.moe_intermediate)  # shared: one layer's experts
    return [case(T, cfg.hidden_size, cfg.moe_intermediate, E, K,
                 f"T={T} E={E} K={K} {route}", experts=ex, route=route)
            for route in ("uniform", "skewed") for T in (1, 9, 17, 33, 65, 128, 512)]


def int4_moe_roofline(c: Case) -> dict:
    d = c.dims
    touched = d["E_touched"] * 3 * d["D"] * d["I"] * INT4_GROUP_BYTES  # gate, up, down
    acts = _nb((d["T"] * d["D"], 2 * 2), (d["T"] * d["K"], 8 + 4))  # x in, y out; ids, weights
    return {"bytes": int(touched + acts), "flops": 2 * d["T"] * d["K"] * 3 * d["D"] * d["I"]}


# -- tree_mla ------------------------------------------------------------------------------------
def _tree_bits(r: _Rand, B: int, N: int, count=None, chain=False) -> torch.Tensor:
    """Ancestor bitmasks [B, N, W]: random trees (parent of node i uniform in [0, i)), or a chain;
    rows >= count[b] are padding that sees only itself."""
    from workbench.reference.tree_mla import pack_anc_bits

    vis = torch.eye(N, dtype=torch.bool, device=r.device).repeat(B, 1, 1)  # [B, N, N]
    count = torch.full((B,), N, device=r.device) if count is None else count
    rows = torch.arange(B, device=r.device)
    for i in range(1, N):
        p = torch.full((B,), i - 1, device=r.device) if chain else r.ints(0, i, B)
        vis[:, i] |= vis[rows, p] & (i < count).view(B, 1)
    return pack_anc_bits(vis)


def tree_mla_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """q [B, N, H, C+R] bf16, kv_cache [B, T, C+R] bf16 (NaN past P_b + N), prefix_lens [B],
    anc_bits [B, N, W], softmax_scale, kv_lora_rank."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)
    C, R = cfg.kv_lora_rank, cfg.qk_rope_dim

    def case(B, N, H, prefix, label, why="", q_std=1.0, chain=False, count=None, gappy=False):
        P = torch.tensor(prefix, device=r.device)
        T = max(prefix) + N + 3  # spare slots past every request: NaN like all slots >= P_b + N
        cache = r.normal(B, T, C + R)
        cache[torch.arange(T, device=r.device).view(1, T) >= (P + N).view(B, 1)] = NAN
        # heads-major storage viewed as [B, N, H, C+R]: a realistic non-contiguous q
        q = r.normal(B, H, N, C + R, std=q_std).transpose(1, 2) if gappy else \
            r.normal(B, N, H, C + R, std=q_std)
        cnt = None if count is None else torch.tensor(count, device=r.device)
        anc = _tree_bits(r, B, N, cnt, chain)
        dims = dict(B=B, N=N, H=H, C=C, R=R, T=T, P_sum=sum(prefix), W=anc.shape[-1])
        return Case("tree_mla", label, (q, cache, P, anc, cfg.softmax_scale, C), dims=dims,
                    why=why, kind=shapes)

    H = cfg.num_heads
    if shapes == "edge":
        return [
            case(1, 1, H, (0,), "P=0 N=1", "empty cache, one node: the row sees only itself"),
            case(1, 2, H, (5,), "budget 1", "root + one child"),
            case(3, 13, 3, (0, 7, 29), "B=3 N=13 H=3 ragged", "ragged prefixes incl. an empty "
                 "one, N and H prime; NaN in every slot past P_b + N"),
            case(2, 65, H, (3, 40), "N=65", "the ancestor mask spills into a second 64-bit word"),
            case(1, 17, H, (11,), "N=17 chain", "a chain mask is a causal prefill chunk",
                 chain=True),
            case(2, 9, H, (4, 0), "N=9 padded", "node_count 6 and 2 < N: padding rows see only "
                 "themselves", count=(6, 2)),
            case(2, 5, H, (6, 2), "N=5 heads-major q", "q is a transposed view (non-contiguous)",
                 gappy=True),
            case(1, 7, H, (19,), "N=7 large scores", "q x40: scores overflow exp in fp32 unless "
                 "the running max is subtracted", q_std=40.0),
        ]
    return [case(1, N, h, (ctx,), f"N={N} H={h} P={ctx}")
            for ctx in (1024, 8192) for h in (max(1, H // 8), H)  # TP8 rank and TP1
            for N in (1, 9, 17, 33, 65, 129)] + [
        case(B, N, h, (ctx,) * B, f"B={B} N={N} H={h} P={ctx}")  # longer contexts, batches
        for B, N, h, ctx in ((1, 9, H, 4096), (1, 9, max(1, H // 8), 32768), (8, 17, H, 4096),
                             (32, 9, max(1, H // 8), 4096))]


def tree_mla_roofline(c: Case) -> dict:
    d = c.dims
    keys = d["P_sum"] + d["B"] * d["N"]  # prefix + tree slots, every request
    rows = d["B"] * d["N"] * d["H"]
    nbytes = _nb((keys, (d["C"] + d["R"]) * 2), (rows, (d["C"] + d["R"]) * 2 + d["C"] * 2 + 4),
                 (d["B"] * d["N"] * d["W"], 8), (d["B"], 8))
    return {"bytes": nbytes, "flops": 2 * d["N"] * d["H"] * keys * (2 * d["C"] + d["R"])}


# -- tree_build ----------------------------------------------------------------------------------
def tree_build_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """top_logprobs [B, L, K] fp32 sorted descending, top_ids [B, L, K] int64, budget,
    root_tokens [B], prefix_lens [B] (kwargs; absent in some EDGE cases = the defaults)."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)
    V, L0 = cfg.vocab_size, cfg.drafter.depth

    def case(B, L, K, budget, label, why="", ties=False, inf_from=None, gappy=False, kw=True):
        K = min(K, V)
        ids = r.distinct(V, K, B * L).view(B, L, K)
        z = r.normal(B, L, K, std=2.0, dtype=f32).sort(-1, descending=True).values
        lp = z - z.logsumexp(-1, keepdim=True) - 0.5  # 0.5 nats left to the unseen vocab
        if ties:
            lp = torch.full_like(lp, -math.log(K))
        if inf_from is not None:
            lp[:, 1:, inf_from:] = -math.inf  # depths >= 2 have only `inf_from` candidates
        if gappy:  # the same values through a transposed [B, K, L] buffer
            lp = lp.transpose(1, 2).contiguous().transpose(1, 2)
        kwargs = dict(root_tokens=r.ints(0, V, B), prefix_lens=r.ints(0, 4096, B)) if kw else {}
        dims = dict(B=B, L=L, K=K, budget=budget, N=budget + 1, W=(budget + 64) // 64)
        return Case("tree_build", label, (lp, ids, budget), kwargs, dims, why, shapes)

    if shapes == "edge":
        return [
            case(1, L0, 1, 1, "budget 1", "root + one node", kw=False),
            case(2, L0, 1, L0 + 3, "K=1 chain", "one candidate per depth: the chain ends at depth "
                 "L before the budget is spent, leaving padding rows"),
            case(3, L0, 4, 16, "ties", "every log-prob equal: the rank-tuple tie-break decides "
                 "everything", ties=True, kw=False),
            case(2, 3, 8, 64, "N=65", "the ancestor mask spills into a second 64-bit word"),
            case(1, L0, 16, 127, "N=128", "bit 63 of both words is set (negative int64 words)"),
            case(5, 1, 9, 8, "L=1 star", "one depth: every node is a child of the root"),
            case(3, L0, 6, 12, "-inf tail", "-inf candidates are never pushed", inf_from=3),
            case(2, L0, 8, 8, "transposed lp", "top_logprobs is a non-contiguous view", gappy=True),
            case(4, L0, 32, 4, "K > budget", "ranks >= budget are never needed (Lemma 1)"),
        ]
    return [case(B, L0, budget, budget, f"B={B} budget={budget} L={L0}")
            for B in (1, 8, 64, 256) for budget in (8, 16, 32, 64, 128)]


# -- tree_walk -----------------------------------------------------------------------------------
def tree_walk_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(tree: DDTree, target_tokens [B, N]) built from tree_build's cases: at every node the
    target's choice is one of its children with probability 0.7 (so paths run deep), else a
    random token (usually a miss). EDGE cases keep tree_build's `why`."""
    from workbench.reference.tree_build import build_ddtree

    cases = []
    for c in tree_build_cases(shapes, seed, cfg, device):
        tree = build_ddtree(*c.args, **c.kwargs)
        g = torch.Generator().manual_seed(seed + len(cases))
        B, N = tree.tokens.shape
        choice = torch.randint(0, int(tree.tokens.max()) + 2, (B, N), generator=g)
        for b in range(B):
            for i in range(int(tree.node_count[b])):
                kids = [j for j in range(N) if int(tree.parents[b, j]) == i]
                if kids and torch.rand(1, generator=g) < 0.7:
                    choice[b, i] = tree.tokens[b, kids[int(torch.randint(len(kids), (1,),
                                                                          generator=g))]]
        choice = choice.to(device)
        if "transposed" in c.label:  # the choices through a transposed buffer: non-contiguous
            choice = choice.t().contiguous().t()
        cases.append(Case("tree_walk", c.label, (tree, choice), {}, c.dims, c.why, shapes))
    return cases


def tree_walk_roofline(c: Case) -> dict:
    """Launch-bound: reads tokens, parents and choices once, writes the path row."""
    d = c.dims
    return {"bytes": _nb((d["B"] * d["N"], 8 * 4), (d["B"], 16)), "flops": d["B"] * d["N"]}


def tree_build_roofline(c: Case) -> dict:
    """Launch-bound; the estimate counts the inputs read once and every output row written,
    and heap work as ~3 log2(2 budget) compare-and-swaps per node (one pop, <= 2 pushes)."""
    d = c.dims
    k_used = min(d["K"], d["budget"])
    nbytes = _nb((d["B"] * d["L"] * k_used, 4 + 8), (d["B"] * d["N"], 8 * 7 + 8 * d["W"]),
                 (d["B"], 8 * 3))
    flops = d["B"] * d["budget"] * (3 * math.ceil(math.log2(2 * d["budget"])) + d["W"])
    return {"bytes": nbytes, "flops": int(flops)}


# -- drafter -------------------------------------------------------------------------------------
def drafter_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(drafter, target, cache, bonus [B], start [B], k). The target is built with no layers:
    draft_topk reads only its embedding and LM head. Cache slots >= start[b] hold NaN."""
    from workbench.models import build_model
    from workbench.reference.drafter import build_drafter

    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)
    dc, V = cfg.drafter, cfg.vocab_size
    target = build_model(cfg, seed=seed, device=device, layers=[])
    drafter = build_drafter(cfg, seed=seed, device=device)

    def case(starts, k, label, why="", gappy=False):
        B = len(starts)
        bonus = r.ints(0, V, B)
        bonus = _gappy(bonus, fill=V + 7) if gappy else bonus
        start = torch.tensor(starts, device=r.device)
        seed_kv = int(r.ints(0, 2**31 - 1, 1)[0])

        def inputs():  # REAL caches reach 26 GB (bs 32 x 32k): built when the case runs
            g = _Rand(seed_kv, device)
            cache = drafter.new_cache(B, max(starts) + dc.block_size + 2)  # NaN-filled
            for b, p in enumerate(starts):  # committed context: unit-scale K/V, as materialised
                cache.k[:, b, :p] = g.normal(dc.num_layers, p, dc.num_kv_heads, dc.head_dim)
                cache.v[:, b, :p] = g.normal(dc.num_layers, p, dc.num_kv_heads, dc.head_dim)
            return drafter, target, cache, bonus, start, k

        # context keys the step reads, summed over layers and requests: a sliding layer sees
        # at most W - 1 of them (reference/drafter.py _mask), a full layer all P
        kv_rows = sum(min(p, dc.sliding_window - 1) if t == "sliding_attention" else p
                      for t in dc.layer_types for p in starts)
        dims = dict(B=B, L=dc.depth, k=k, P_sum=sum(starts), KV_rows=kv_rows, D=cfg.hidden_size,
                    V=V, layers=dc.num_layers, Hq=dc.num_heads, Hkv=dc.num_kv_heads,
                    d=dc.head_dim, F=dc.intermediate_size)
        return Case("drafter", label, inputs if shapes == "real" else inputs(), dims=dims,
                    why=why, kind=shapes)

    if shapes == "edge":
        w = dc.sliding_window
        return [
            case((0,), 8, "P=0", "empty context: the block attends only to itself"),
            case((0, 5, 23), 4, "B=3 ragged", "ragged committed lengths; NaN in every cache "
                 "slot past P_b"),
            case((w + 21, w + 2), 1, f"P>{w} k=1", "context longer than the sliding window: "
                 "sliding layers drop the oldest keys; k = 1"),
            case((9, 3), 16, "strided bonus", "bonus is a stride-2 view; its gaps hold an "
                 "out-of-vocab id", gappy=True),
            case((2,), V, "k=V", "k = V: the whole vocabulary, sorted"),
        ]
    # the bs x context grid (first the cases of earlier traces, then the rest); bs 64 x
    # 32k holds a 52 GB cache: run it alone (`bench --case`), not beside the compiled peers
    grid = [(B, 1024, 8) for B in (1, 8, 32, 64)] + [(1, 1024, 32), (8, 1024, 32)] + [
        (1, 8192, 8), (1, 32768, 8), (8, 8192, 8)] + [
        (8, 32768, 8), (32, 8192, 8), (32, 32768, 8), (64, 8192, 8), (64, 32768, 8)]
    return [case((P,) * B, k, f"B={B} k={k} P={P}") for B, P, k in grid]


def drafter_roofline(c: Case) -> dict:
    """Weights read once per call (layers + final norm + LM head; fc and hidden_norm belong to
    materialise, not to the draft), the block's embedding rows, the cached context K/V the
    layers read (sliding layers: the window only; until session 9 every layer counted all P,
    which overstated the floor past the 2048 window), outputs."""
    d = c.dims
    D, q, kv, B, S = d["D"], d["Hq"] * d["d"], d["Hkv"] * d["d"], d["B"], d["L"] + 1
    kv_rows = d.get("KV_rows", d["layers"] * d["P_sum"])
    linear = D * q + 2 * D * kv + q * D + 3 * D * d["F"]  # per layer
    weights = d["layers"] * (linear + 2 * D + 2 * d["d"]) + D + d["V"] * D
    nbytes = _nb((weights, 2), (B * S * D, 2), (kv_rows * 2 * kv, 2),
                 (B * d["L"] * d["k"], 4 + 8), (B, 16))
    attn = 4 * q * S * (kv_rows + d["layers"] * B * S)  # QK^T and PV over context + block
    flops = 2 * B * S * d["layers"] * linear + 2 * B * d["L"] * d["V"] * D + attn
    return {"bytes": nbytes, "flops": int(flops)}


# -- drafter_materialize -------------------------------------------------------------------------
def drafter_materialize_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(drafter, cache, target_hidden [B, N, F] bf16, positions [B, N] int, count [B] int),
    F = nT * D the concatenated target features. Rows i < count[b] are written at slot
    positions[b, i] (distinct slots per request); rows past count are hostile: NaN features and
    positions on a slot a valid row writes, or outside the cache (a write would show or fault).
    The harness NaN-poisons the whole cache first, so only the written slots compare."""
    from workbench.reference.drafter import build_drafter

    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)
    dc = cfg.drafter
    drafter = build_drafter(cfg, seed=seed, device=device)
    Fin = drafter.fc.weight.shape[1]

    def case(T, counts, label, why="", N=None, pos=None, gappy=False, int32=False):
        B, N = len(counts), N or dc.block_size
        count = torch.tensor(counts, device=r.device)
        pos = r.distinct(T, N, B) if pos is None else pos  # [B, N] distinct slots, shuffled
        hidden = r.normal(B, N, Fin)
        for b, n in enumerate(counts):  # the hostile tail
            if n < N:
                hidden[b, n:] = NAN
                pos[b, n:] = pos[b, 0] if n > 0 else -1
                pos[b, -1] = T + 3
        hidden = _gappy(hidden) if gappy else hidden
        if int32:
            pos, count = pos.to(torch.int32), count.to(torch.int32)
        dims = dict(B=B, N=N, T=T, F=Fin, D=dc.hidden_size, layers=dc.num_layers,
                    Hkv=dc.num_kv_heads, d=dc.head_dim, rows=sum(min(n, N) for n in counts))
        return Case("drafter_materialize", label,
                    (drafter, drafter.new_cache(B, T), hidden, pos, count), dims=dims, why=why,
                    kind=shapes)

    if shapes == "edge":
        W = dc.sliding_window
        window = (W - 2 + torch.arange(6, device=r.device)).expand(2, 6).contiguous()
        return [
            case(12, (0, 0), "count 0", "nothing is written: the cache stays NaN", N=6),
            case(12, (6, 6), "count N", "every row", N=6),
            case(40, (0, 9, 4), "B=3 mixed", "none, all and some rows in one batch", N=9),
            case(1, (1,), "T=1 N=1", "one row into a one-slot cache (a budget-1 commit)", N=1),
            case(23, (8, 3, 1, 7), "T=23 N=block", "prime T; N = block_size, the loop's commit "
                 "width; mixed accepted lengths"),
            case(W + 4, (6, 2), f"window edge W={W}", "positions W-2 .. W+3 straddle the sliding "
                 "window and end on the cache's last slot", N=6, pos=window),
            case(16, (3, 5), "strided hidden int32", "target_hidden is a stride-2 view with NaN "
                 "gaps; int32 positions and count", N=5, gappy=True, int32=True),
        ]
    N, P = dc.block_size, 1024
    out = []
    for B in (1, 8, 32, 64):  # the loop's commit: N = block_size path rows at P .. P + N - 1
        counts = [N - b % (N + 1) for b in range(B)]  # N, N-1, ..., 0, N, ...: mixed lengths
        pos = (P + torch.arange(N, device=r.device)).expand(B, N).contiguous()
        out.append(case(P + N + 2, counts, f"B={B} N={N} P={P}", pos=pos))
    return out


def drafter_materialize_roofline(c: Case) -> dict:
    """Weights read once (fc, hidden norm, every layer's k/v projection and k norm), all B*N
    feature rows read (the GEMMs run over every row), the written rows' K/V in every layer."""
    d = c.dims
    kv = 2 * d["Hkv"] * d["d"]  # k and v width per layer
    weights = d["F"] * d["D"] + d["D"] + d["layers"] * (kv * d["D"] + d["d"])
    M = d["B"] * d["N"]
    nbytes = _nb((weights, 2), (M * d["F"], 2), (M, 8), (d["B"], 8),
                 (d["rows"] * d["layers"] * kv, 2))
    return {"bytes": nbytes, "flops": 2 * M * (d["F"] * d["D"] + d["layers"] * kv * d["D"])}


# -- supporting ops ------------------------------------------------------------------------------
# rmsnorm (x, w, eps), linear (x, W), swiglu_mlp (x, Wg, Wu, Wd), lm_head (h, W): x [..., D] and
# n = the output (linear, lm_head) or hidden (swiglu F) width; layout marks the hostile input.
DENSE_EDGE = {  # op: [(x shape, n, label, why, layout)]
    "rmsnorm": [((1, 64), 64, "rows=1", "one row", ""),
                ((5, 67), 67, "D=67", "D prime: the vector tail", ""),
                ((2, 3, 251), 251, "[2,3,251]", "3-d rows, D prime > 128", ""),
                ((9, 128), 128, "strided x", "x is a stride-2 view", "gappy"),
                ((4, 96), 96, "zero/huge rows", "a zero row must stay 0 (not NaN); a 1e4 row must "
                 "not overflow the fp32 sum of squares", "zero/huge")],
    "linear": [((1, 64), 32, "rows=1", "one row", ""),
               ((7, 67), 45, "67->45", "odd in and out dims: K and N tails", ""),
               ((2, 5, 96), 160, "[2,5,96]->160", "3-d x, as the model calls it", ""),
               ((9, 128), 80, "weight^T", "weight is a transposed (column-major) view", "w^T")],
    "swiglu_mlp": [((1, 64), 32, "rows=1 F=32", "one row", ""),
                   ((7, 67), 45, "D=67 F=45", "odd widths", ""),
                   ((2, 3, 96), 160, "[2,3,96] F=160", "3-d x", ""),
                   ((9, 64), 128, "strided x", "x is a stride-2 view", "gappy")],
    "lm_head": [((1, 64), 251, "rows=1 V=251", "one row, V prime", ""),
                ((2, 7, 64), 128, "[2,7,64]", "3-d h: the drafter's [B, L, D]", ""),
                ((5, 96), 200, "strided h", "h is a stride-2 view", "gappy")],
}
REAL_ROWS = (1, 9, 65)  # AR decode, budget 8, budget 64: the rows of one verify forward


def _ep8_linear(c: ModelConfig) -> dict:
    """An EP8 rank's projections (TP8 attention and shared expert; q_a | kv_a stacked), for
    configs whose heads and shared width split 8 ways."""
    F = c.moe_intermediate * c.n_shared_experts
    if c.num_heads % 8 or F % 8:
        return {}
    return {"qkv_a": (c.hidden_size, c.q_lora_rank + c.latent_dim),
            "q_b/8": (c.q_lora_rank, c.num_heads // 8 * c.qk_head_dim),
            "o/8": (c.num_heads // 8 * c.v_head_dim, c.hidden_size),
            "gate_up/8": (c.hidden_size, 2 * F // 8), "down/8": (F // 8, c.hidden_size)}


def _dense_real(op: str, c: ModelConfig) -> tuple[dict, tuple]:
    """({use: (in, out)}, rows) of the model's calls of `op`."""
    H, D, L = c.num_heads, c.hidden_size, c.drafter.depth
    return {
        "rmsnorm": {"D": (D, D), "q_lora": (c.q_lora_rank,) * 2, "kv_lora": (c.kv_lora_rank,) * 2},
        "linear": {"q_a": (D, c.q_lora_rank), "q_b": (c.q_lora_rank, H * c.qk_head_dim),
                   "kv_a": (D, c.latent_dim), "o": (H * c.v_head_dim, D), **_ep8_linear(c)},
        "swiglu_mlp": {"dense": (D, c.dense_intermediate),
                       "shared": (D, c.moe_intermediate * c.n_shared_experts)},
        "lm_head": {"V": (D, c.vocab_size)},
    }[op], ((L, 8 * L, 32 * L, 9, 65) if op == "lm_head" else REAL_ROWS)  # drafter bs 1/8/32


def _dense_cases(op: str, shapes, seed, cfg=None, device="cpu") -> list[Case]:
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def w(o, i, layout=""):  # ~ N(0, 1/fan_in): unit-scale outputs
        return r.normal(i, o, std=i**-0.5).T if layout == "w^T" else r.normal(o, i, std=i**-0.5)

    def case(xs, n, label, why="", layout=""):
        D, x = xs[-1], r.normal(*xs)
        if layout == "gappy":
            x = _gappy(x)
        elif layout == "zero/huge":
            x[1], x[2] = 0, x[2] * 1e4
        if op == "rmsnorm":
            args = (x, (1 + 0.05 * r.normal(D, dtype=f32)).to(bf16), cfg.rms_norm_eps)
        else:  # linear, lm_head: (x, W [n, D]); swiglu_mlp: (x, Wg, Wu [n, D], Wd [D, n])
            args = (x, w(n, D, layout)) if op != "swiglu_mlp" else (x, w(n, D), w(n, D), w(D, n))
        dims = dict(rows=math.prod(xs[:-1]), D=D, O=n, F=n, V=n)
        return Case(op, label, args, dims=dims, why=why, kind=shapes)

    if shapes == "edge":
        return [case(*spec) for spec in DENSE_EDGE[op]]
    widths, rows = _dense_real(op, cfg)
    label = {"rmsnorm": "rows={n} {k}={i}", "lm_head": "rows={n} D={i} V={o}",
             "swiglu_mlp": "rows={n} {k} D={i} F={o}"}.get(op, "rows={n} {k} {i}->{o}")
    return [case((n, i), o, label.format(n=n, k=k, i=i, o=o)) for k, (i, o) in widths.items()
            for n in rows]


rmsnorm_cases = functools.partial(_dense_cases, "rmsnorm")
linear_cases = functools.partial(_dense_cases, "linear")
swiglu_mlp_cases = functools.partial(_dense_cases, "swiglu_mlp")
lm_head_cases = functools.partial(_dense_cases, "lm_head")


def _mla_proj_cases(op: str, shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """The absorbed-MLA per-head projections, called as the model calls them: x is a slice of
    a wider tensor (q_nope = q[..., :dn]; o_lat [B, N, H, C]) and the weight a slice of
    kv_b_proj viewed [H, dn + dv, C] (W_UK = [:, :dn], W_UV = [:, dn:]): both strided."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(B, N, H, dn, dv, C, label, why=""):
        K = dn if op == "mla_q_absorb" else C  # the contracted width
        w = r.normal(H, dn + dv, C, std=K**-0.5)
        if op == "mla_q_absorb":
            x, wv, O = r.normal(B, N, H, dn + 8)[..., :dn], w[:, :dn], C
        else:
            x, wv, O = r.normal(B, N, H, C), w[:, dn:], dv
        dims = dict(rows=B * N, H=H, K=K, O=O)
        return Case(op, label, (x, wv), dims=dims, why=why, kind=shapes)

    if shapes == "edge":
        return [case(1, 1, 1, 16, 8, 32, "B=N=H=1", "one row, one head"),
                case(2, 5, 3, 16, 16, 48, "[2,5,3]", "odd rows and heads"),
                case(1, 9, 4, 24, 8, 40, "dn=24 C=40", "widths not powers of two")]
    H, dn, dv, C = cfg.num_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    return [case(1, n, H, dn, dv, C, f"rows={n} H={H} dn={dn} C={C}") for n in REAL_ROWS]


mla_q_absorb_cases = functools.partial(_mla_proj_cases, "mla_q_absorb")
mla_v_up_cases = functools.partial(_mla_proj_cases, "mla_v_up")


def _mla_proj_roofline(c: Case) -> dict:
    d = c.dims
    return {"bytes": _nb((d["rows"] * d["H"] * d["K"], 2), (d["H"] * d["K"] * d["O"], 2),
                         (d["rows"] * d["H"] * d["O"], 2)),
            "flops": 2 * d["rows"] * d["H"] * d["K"] * d["O"]}


def rope_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """x [B, N, (H,) R] bf16 (q_pe with heads, k_pe without), positions [B, N] int, table [T, R]
    fp32 (Rope.reserve's cos|sin rows), interleaved. The model passes column slices of q and kv:
    the strided cases put NaN in the columns next to the slice, which must not leak in."""
    from workbench.reference.rope import Rope, target_rope

    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(B, N, H, T, label, why="", R=None, interleaved=True, sliced=False, int32=False):
        R = R or cfg.qk_rope_dim
        rope = target_rope(cfg) if R == cfg.qk_rope_dim else Rope(
            R, cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_position,
            cfg.rope_beta_fast, cfg.rope_beta_slow)  # the table does not depend on the layout
        rope.reserve(T, device)
        heads = () if H == 0 else (H,)
        if sliced:  # q[..., dn:] of q [B, N, H, dn + R]: row stride dn + R, NaN in the dn part
            dn = 8
            x = r.normal(B, N, *heads, dn + R)
            x[..., :dn] = NAN
            x = x[..., dn:]
        else:
            x = r.normal(B, N, *heads, R)
        pos = r.ints(0, T, B, N, dtype=torch.int32 if int32 else torch.int64)
        pos[0, -1] = T - 1  # the table's last row
        dims = dict(rows=B * N, H=max(H, 1), R=R, T=T, itemsize=x.element_size())
        return Case("rope", label, (x, pos, rope.table(device), interleaved), dims=dims,
                    why=why, kind=shapes)

    if shapes == "edge":
        H = cfg.num_heads
        return [
            case(1, 1, 0, 1, "k_pe one row", "one position, no heads axis, a one-row table"),
            case(2, 5, 3, 37, "q_pe [2,5,3]", "heads axis, B N H odd, repeated positions"),
            case(1, 13, H, 251, "q_pe sliced", "x = q[..., dn:]: strided rows, NaN next to the "
                 "slice", sliced=True),
            case(3, 7, 0, 64, "k_pe sliced int32", "x = kv[..., C:] without heads; int32 "
                 "positions", sliced=True, int32=True),
            case(2, 9, 4, 50, "rotate-half", "the drafter's pair layout (i, i + R/2)",
                 interleaved=False),
            case(1, 6, 2, 40, "R=38", "19 pairs: not a power of two (the pair mask)", R=38),
        ]
    T, H = 8192, cfg.num_heads
    return [case(1, n, h, T, f"rows={n} H={h}") for n in REAL_ROWS
            for h in (max(1, H // 8), H)] + [  # q_pe at TP8 and TP1
        case(1, n, 0, T, f"rows={n} k_pe") for n in REAL_ROWS]


def rope_roofline(c: Case) -> dict:
    """x read + y written, one fp32 table row (R) and one position per row; 3 flops an element."""
    d = c.dims
    elems = d["rows"] * d["H"] * d["R"]
    return {"bytes": _nb((elems, 2 * d["itemsize"]), (d["rows"], 4 * d["R"] + 8)),
            "flops": 3 * elems}


def ep_plan_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """ids [T, K] int64 (distinct per row, as the router gives), rank, world, tp, experts per
    group: one rank's side of the EP exchange (reference/ep_plan.py). Discrete outputs."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(T, K, world, tp, epg, label, why="", rank=0, ids=None):
        n_e = world // tp * epg
        ids = r.distinct(n_e, K, T) if ids is None else ids
        return Case("ep_plan", label, (ids, rank, world, tp, epg),
                    dims=dict(T=T, K=K, W=world, tp=tp), why=why, kind=shapes)

    if shapes == "edge":
        one = torch.arange(4, device=r.device).repeat(7, 1)  # every pair to group 0
        return [case(1, 2, 4, 1, 3, "T=1", "one token: ranks 1..3 own nothing", rank=0),
                case(3, 4, 8, 1, 4, "T<W rank 5", "an empty owned slice still receives",
                     rank=5),
                case(13, 3, 4, 1, 5, "T=13 prime", "the last owner's slice is short", rank=3),
                case(7, 4, 4, 1, 4, "all to group 0", "rank 0 receives every pair", ids=one),
                case(7, 4, 4, 1, 4, "group gets none", "rank 2 receives nothing", ids=one,
                     rank=2),
                case(9, 4, 8, 2, 6, "EPxTP tp=2", "each pair to both members of its group",
                     rank=3),
                case(21, 5, 5, 1, 3, "W=5", "world not a power of two", rank=4),
                case(6, 3, 4, 1, 3, "strided ids", "ids a stride-2 view; the gaps hold an "
                     "out-of-range expert", rank=1, ids=_gappy(r.distinct(12, 3, 6), 10**6))]
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    return [case(T, K, 8, 1, E // 8, f"T={T} EP8 rank {rk}", rank=rk)
            for T in (*REAL_ROWS, 528) for rk in (0, 7)]


def ep_plan_roofline(c: Case) -> dict:
    """ids read once per pass (4 passes at most), the int64 outputs written once."""
    d = c.dims
    pairs = d["T"] * d["K"]
    return {"bytes": _nb((pairs, 8 * 4), (pairs * d["tp"], 16), (pairs, 16)), "flops": 0}


def mla_kv_write_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(kv [B, N, C+R] bf16, norm_weight [C], eps, positions [B, N] int, table [n, R] fp32,
    interleaved, kv_cache [B, T, C+R] bf16 (written in place), prefix_lens [B] int). Positions
    are tree depths (not the slots); the harness NaN-poisons the cache first, so only the
    written rows compare (the rest must stay NaN)."""
    from workbench.reference.rope import Rope, target_rope

    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(B, N, T, prefix, label, why="", C=None, R=None, interleaved=True, strided=False):
        C, R = C or cfg.kv_lora_rank, R or cfg.qk_rope_dim
        rope = target_rope(cfg) if R == cfg.qk_rope_dim else Rope(
            R, cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max_position,
            cfg.rope_beta_fast, cfg.rope_beta_slow)
        rope.reserve(T, device)
        kv = r.normal(B, N, C + R)
        if strided:  # a column slice of a wider row, NaN next to it
            wide = torch.full((B, N, C + R + 8), NAN, dtype=bf16, device=r.device)
            wide[..., 8:] = kv
            kv = wide[..., 8:]
        pre = torch.tensor(prefix, dtype=torch.int64, device=r.device)
        pos = pre.view(B, 1) + r.ints(0, N, B, N)  # depths: repeats, not slots
        cache = torch.full((B, T, C + R), NAN, dtype=bf16, device=r.device)
        w = (1 + 0.1 * r.normal(C, dtype=f32)).to(bf16)
        dims = dict(B=B, N=N, C=C, R=R, T=T)
        return Case("mla_kv_write", label, (kv, w, cfg.rms_norm_eps, pos, rope.table(device),
                                            interleaved, cache, pre), dims=dims, why=why,
                    kind=shapes)

    if shapes == "edge":
        return [case(1, 1, 4, [0], "B=1 N=1 P=0", "one row into slot 0"),
                case(3, 5, 16, [0, 7, 11], "mixed prefixes", "per-request slots, the last "
                     "request fills the cache to its end"),
                case(2, 9, 24, [3, 1], "strided kv", "kv a column slice, NaN beside it",
                     strided=True),
                case(2, 4, 12, [2, 5], "C=40 R=6", "C and R/2 not powers of two", C=40, R=6),
                case(1, 6, 10, [4], "rotate-half", "the drafter's pair layout",
                     interleaved=False)]
    return [case(B, n, 4096, [4096 - n - 5 * b for b in range(B)], f"B={B} rows={n}")
            for B in (1, 8) for n in REAL_ROWS]


def mla_kv_write_roofline(c: Case) -> dict:
    """kv rows read, cache rows written (bf16), one fp32 table row and the norm weight."""
    d = c.dims
    rows = d["B"] * d["N"]
    return {"bytes": _nb((rows, (d["C"] + d["R"]) * 4 + 4 * d["R"] + 16), (d["C"], 2)),
            "flops": rows * (3 * d["C"] + 3 * d["R"])}


def ep_combine_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(back [S, D] bf16 expert outputs in send order, order [S] a permutation (EPRoutes.order),
    weights [Tm, K] fp32, chunk >= Tm, tp, out dtype): the owner's weighted slot combine."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(Tm, K, tp, D, chunk, label, why="", dtype=bf16, w_strided=False):
        S = Tm * K * tp
        back = r.normal(S, D, dtype=dtype)
        order = r.uniform(S).argsort() if S else torch.empty(0, dtype=torch.int64,
                                                             device=r.device)
        w = r.uniform(Tm, K)
        if w_strided:
            w = r.uniform(K, Tm).t()  # column-major weights
        return Case("ep_combine", label, (back, order, w, chunk, tp, bf16),
                    dims=dict(S=S, D=D, Tm=Tm, K=K, tp=tp, chunk=chunk), why=why, kind=shapes)

    if shapes == "edge":
        return [case(5, 4, 1, 64, 6, "Tm=5 chunk=6", "one padding row must come out zero"),
                case(3, 2, 2, 100, 3, "EPxTP tp=2 D=100", "two width partials per slot; D not "
                     "a power of two"),
                case(0, 4, 1, 32, 1, "Tm=0", "a rank that owns no token: one zero row"),
                case(4, 3, 1, 48, 4, "fp32 back", "fp32 partials in, bf16 out", dtype=f32),
                case(6, 8, 1, 40, 8, "strided weights", "column-major weights [Tm, K]",
                     w_strided=True)]
    D, K = cfg.hidden_size, cfg.n_experts_per_tok
    return [case(-(-T // 8), K, 1, D, -(-T // 8), f"T={T} EP8 owner") for T in (*REAL_ROWS, 528)]


def ep_combine_roofline(c: Case) -> dict:
    """back rows read once, the owned slice written once (bf16), weights and order."""
    d = c.dims
    return {"bytes": _nb((d["S"] * d["D"], 2), (d["chunk"] * d["D"], 2), (d["S"], 12)),
            "flops": 2 * d["S"] * d["D"]}


def add_rmsnorm_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """(x, r [..., D] bf16, weight [D] bf16, eps): the residual add and the next norm."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(xs, label, why="", dtype=bf16, gappy=False):
        D = xs[-1]
        x, res = r.normal(*xs, dtype=dtype), r.normal(*xs, dtype=dtype)
        if gappy:
            x = _gappy(x)
        w = (1 + 0.05 * r.normal(D, dtype=f32)).to(bf16)
        return Case("add_rmsnorm", label, (x, res, w, cfg.rms_norm_eps),
                    dims=dict(rows=math.prod(xs[:-1]), D=D, itemsize=x.element_size()),
                    why=why, kind=shapes)

    if shapes == "edge":
        return [case((1, 64), "rows=1", "one row"),
                case((2, 3, 67), "[2,3,67]", "3-d rows, D prime"),
                case((5, 96), "strided x", "x a stride-2 view", gappy=True),
                case((4, 80), "fp32", "an fp32 residual stream: no rounding of h", dtype=f32)]
    return [case((n, cfg.hidden_size), f"rows={n} D={cfg.hidden_size}") for n in REAL_ROWS]


def add_rmsnorm_roofline(c: Case) -> dict:
    """x and r read, h and y written, once each."""
    d = c.dims
    return {"bytes": _nb((d["rows"] * d["D"], 4 * d["itemsize"]), (d["D"], 2)),
            "flops": 5 * d["rows"] * d["D"]}


def moe_route_cases(shapes, seed, cfg=None, device="cpu") -> list[Case]:
    """h [T, D] bf16, gate_weight [E, D] bf16, bias [E] fp32, top_k, scaling."""
    cfg, r = _cfg(shapes, cfg), _Rand(seed, device)

    def case(T, D, E, K, label, why="", h=None, bias=None, **kwargs):
        h = r.normal(T, D) if h is None else h
        bias = 0.02 * r.normal(E, dtype=f32) if bias is None else bias
        args = (h, r.normal(E, D, std=D**-0.5), bias, K, cfg.routed_scaling_factor)
        return Case("moe_route", label, args, kwargs, dims=dict(T=T, D=D, E=E, K=K), why=why,
                    kind=shapes)

    if shapes == "edge":
        forced = torch.zeros(16, device=r.device)
        forced[11] = 10.0
        return [case(1, 64, 7, 2, "T=1 E=7", "one token, E prime"),
                case(5, 64, 12, 4, "all ties", "zero h: every score ties, the lower expert index "
                     "must win", h=torch.zeros(5, 64, dtype=bf16, device=r.device),
                     bias=torch.zeros(12, device=r.device)),
                case(9, 64, 16, 1, "one-expert", "K=1 and a bias forcing expert 11: every token "
                     "to one expert; weights use the unbiased score", bias=forced),
                case(13, 32, 13, 13, "K=E=13", "K = E: the full sorted order"),
                case(6, 64, 16, 4, "strided h", "h is a stride-2 view", h=_gappy(r.normal(6, 64))),
                case(9, 64, 16, 4, "local 5..10", "local_experts (5, 6): the local ids of an EP "
                     "rank holding experts 5..10, -1 for the others", local_experts=(5, 6))]
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    ep = E // 8  # an EP8 rank's experts: the last rank's local ids
    return [case(T, cfg.hidden_size, E, K, f"T={T} E={E} K={K}") for T in (1, 9, 17, 33, 65)] + [
        case(17, cfg.hidden_size, E, K, f"T=17 E={E} K={K} local {E - ep}..{E - 1}",
             local_experts=(E - ep, ep))]


def _dense_roofline(in_rows: str, inner: Callable, out_itemsize=2):
    """bytes = x + weights + y; flops = 2 rows x weight elements (matmul-like ops)."""

    def roofline(c: Case) -> dict:
        d = c.dims
        weights, out_cols = inner(d)
        rows = d[in_rows]
        return {"bytes": _nb((rows * d["D"], 2), (weights, 2), (rows * out_cols, out_itemsize)),
                "flops": 2 * rows * weights}

    return roofline


ROOFLINES = {
    "int4_moe": int4_moe_roofline, "tree_mla": tree_mla_roofline,
    "tree_build": tree_build_roofline, "tree_walk": tree_walk_roofline,
    "drafter": drafter_roofline, "drafter_materialize": drafter_materialize_roofline,
    "rmsnorm": _dense_roofline("rows", lambda d: (d["D"], d["D"])),
    "linear": _dense_roofline("rows", lambda d: (d["D"] * d["O"], d["O"])),
    "swiglu_mlp": _dense_roofline("rows", lambda d: (3 * d["D"] * d["F"], d["D"])),
    "moe_route": _dense_roofline("T", lambda d: (d["E"] * d["D"], d["K"] * 3), out_itemsize=4),
    "lm_head": _dense_roofline("rows", lambda d: (d["V"] * d["D"], d["V"]), out_itemsize=4),
    "mla_q_absorb": _mla_proj_roofline, "mla_v_up": _mla_proj_roofline,
    "rope": rope_roofline, "ep_plan": ep_plan_roofline,
    "mla_kv_write": mla_kv_write_roofline, "ep_combine": ep_combine_roofline,
    "add_rmsnorm": add_rmsnorm_roofline,
}


@dataclass(frozen=True)
class Harness:
    """What the checker needs beyond the OpSpec hooks."""

    outputs: tuple[str, ...] = ("out",)  # names of the returned values (dataclasses: their fields)
    # ids output -> values output: ids may swap only where the reference values tie within
    # the values' tolerance (an optimized drafter's bf16 rounding reorders near-equal logits)
    ranked: dict = field(default_factory=dict)
    # (args, kwargs) -> {name: tensor} the op writes in place (out= buffers): poisoned before the
    # call, compared as outputs afterwards, exempt from the inputs-unmodified check
    written: Callable | None = None


HARNESS = {
    "int4_moe": Harness(), "rmsnorm": Harness(), "linear": Harness(), "swiglu_mlp": Harness(),
    "lm_head": Harness(), "tree_build": Harness(), "mla_q_absorb": Harness(),
    "mla_v_up": Harness(), "rope": Harness(),
    "ep_plan": Harness(("send_t", "order", "splits", "recv_t", "recv_e")),
    "ep_combine": Harness(), "add_rmsnorm": Harness(("h", "y")),
    "mla_kv_write": Harness((), written=lambda a, kw: {"kv_cache": a[6]}),
    "tree_walk": Harness(("accepted_indices", "accept_lens", "bonus")),
    "tree_mla": Harness(("o_lat", "lse")), "moe_route": Harness(("ids", "weights", "local_ids")),
    "drafter": Harness(("logprobs", "ids"), ranked={"ids": "logprobs"}),
    # in place: the drafter cache is the output (returns None)
    "drafter_materialize": Harness((), written=lambda a, kw: {"cache.k": a[1].k,
                                                              "cache.v": a[1].v}),
}
GENERATORS = {
    "int4_moe": int4_moe_cases, "tree_mla": tree_mla_cases, "tree_build": tree_build_cases,
    "tree_walk": tree_walk_cases,
    "drafter": drafter_cases, "drafter_materialize": drafter_materialize_cases, "rmsnorm": rmsnorm_cases, "linear": linear_cases,
    "swiglu_mlp": swiglu_mlp_cases, "moe_route": moe_route_cases, "lm_head": lm_head_cases,
    "mla_q_absorb": mla_q_absorb_cases, "mla_v_up": mla_v_up_cases, "rope": rope_cases,
    "ep_plan": ep_plan_cases, "mla_kv_write": mla_kv_write_cases,
    "ep_combine": ep_combine_cases, "add_rmsnorm": add_rmsnorm_cases,
}


def compare(ref_out, out, case: Case) -> dict:
    """The OpSpec `compare` hook: workbench.check's three tiers with this op's names and ties."""
    from workbench.check import compare_outputs

    h = HARNESS.get(case.op, Harness())
    return compare_outputs(ref_out, out, case, names=h.outputs, ranked=h.ranked)


def hooks(op: str) -> dict:
    """Keyword arguments for `register_op`: make_inputs, compare, roofline."""
    return dict(make_inputs=GENERATORS[op], compare=compare, roofline=ROOFLINES[op])
