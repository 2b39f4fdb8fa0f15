"""The DFlash block drafter (Qwen3-style layers over projected target features): the `drafter` op
(`draft_topk`) and the `drafter_materialize` op (`materialize`, the context K/V of committed tokens).

Per round (notes/ddtree.md §1.2): the block [bonus, MASK x L] at positions P..P+L attends to
itself and to the drafter's cache of committed context K/V; rows 1..L go through the TARGET's
LM head and give L independent per-depth distributions; `draft_topk` returns their top-k.

    c_t   = hidden_norm(fc(concat of the target layers' outputs at token t))      # [D]
    Kc_t  = RoPE(k_norm(W_k c_t), t),   Vc_t = W_v c_t      (no input_layernorm on c_t)

The cache holds ONLY committed context (`materialize` writes slot == position); the block's own
K/V are recomputed each round and never written, so rejected tree nodes never need cleaning up.

Attention mask of block query at position qp over a key at position kp (cache slot == position):
  * context keys: kp < P (committed); block keys: all L+1 (non-causal inside the block).
  * sliding layers (layer_types[i] == "sliding_attention", W = sliding_window): visible iff
    |qp - kp| < W, i.e. flash-attn window=(W-1, W-1), which is how we read the HF reference's
    non-causal sliding layers (an inference, notes/ddtree.md §1.4). The left edge kp > qp - W is
    HF's causal `sliding_window` rule and SGLang's window_left = W - 1 (W keys up to and
    including the query itself). The right edge can only cut inside the block, and only when
    block_size > W; for the real drafter (8 vs 2048) and every preset only the left edge matters.
  * cfg.causal_sliding_in_block (SGLang's AttentionType.DECODER on sliding layers): sliding
    layers are also causal inside the block (kp <= qp). Full layers stay non-causal either way.

Legend: B batch, L = block_size - 1 draft depths, T cached context length (slots), n rows per
materialise call, Hq/Hkv heads, G = Hq/Hkv, d head_dim, D hidden, nT target layers, V vocab,
k top-k. float64-accumulated math inside ops (layers.ACC); bf16 params and activations.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from workbench import ops
from workbench.config import DrafterConfig, ModelConfig

from .layers import ACC
from .model import Linear, Norm, SwiGLU
from .rope import drafter_rope
from .tree_build import topk_logprobs

ATTN_CHUNK_BYTES = 1 << 32  # float64 attention temporaries per chunk of requests (forward_block)


class DrafterCache(NamedTuple):
    """Committed-context K/V, slot == position. k, v: [layers, B, T, Hkv, d] bf16."""

    k: torch.Tensor
    v: torch.Tensor


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        D, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = Linear(D, cfg.num_heads * d)
        self.k_proj = Linear(D, cfg.num_kv_heads * d)
        self.v_proj = Linear(D, cfg.num_kv_heads * d)
        self.o_proj = Linear(cfg.num_heads * d, D)
        self.q_norm, self.k_norm = Norm(d), Norm(d)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int):
        super().__init__()
        self.sliding = cfg.layer_types[index] == "sliding_attention"
        self.input_layernorm = Norm(cfg.hidden_size)
        self.post_attention_layernorm = Norm(cfg.hidden_size)
        self.self_attn = DrafterAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)


class DFlashDrafter(nn.Module):
    """DFlash drafter; parameter names are the DFlash HF checkpoint's (no embedding, no LM head)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        if "sliding_attention" in cfg.layer_types and cfg.sliding_window < 1:
            raise ValueError(f"drafter.sliding_window: expected >= 1 with sliding layers, "
                             f"got {cfg.sliding_window}")
        self.cfg = cfg
        D = cfg.hidden_size
        self.fc = Linear(len(cfg.target_layer_ids) * D, D)
        self.hidden_norm = Norm(D)
        self.layers = nn.ModuleList(DrafterLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = Norm(D)
        self.rope = drafter_rope(cfg)

    # None here; a tensor-parallel shard (workbench/dist/drafter.py) holds D/w of fc's output
    # rows and gives the all-gather that reassembles [.., D]
    fc_gather = None

    def fc_out(self, h: torch.Tensor) -> torch.Tensor:
        """fc's whole output [.., D] from this module's fc GEMM `h` (`materialize` and the
        kernels' materialise call it between the GEMM and the hidden norm)."""
        return h if self.fc_gather is None else self.fc_gather(h)

    def o_proj_out(self, layer: DrafterLayer, o: torch.Tensor) -> torch.Tensor:
        """The attention's output projection in forward_block: o [B, S, Hq d] bf16 ->
        [B, S, D] (a tensor-parallel shard overrides it: its heads' part, summed over ranks)."""
        return ops.get("linear")(o, layer.self_attn.o_proj.weight)

    def mlp_out(self, layer: DrafterLayer, h: torch.Tensor) -> torch.Tensor:
        """The layer's MLP in forward_block: h [B, S, D] -> [B, S, D] (overridden alike)."""
        return layer.mlp(h)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def new_cache(self, batch: int, max_len: int) -> DrafterCache:
        """K and V [layers, B, T, Hkv, d] bf16, NaN-filled so unwritten rows show."""
        c = self.cfg
        # context slots < max_len; a block starts at most at max_len
        self.rope.reserve(max_len + c.block_size, self.device)
        shape = (c.num_layers, batch, max_len, c.num_kv_heads, c.head_dim)
        return DrafterCache(*(torch.full(shape, float("nan"), dtype=torch.bfloat16,
                                         device=self.device) for _ in range(2)))

    def _kv(self, layer: DrafterLayer, x: torch.Tensor, positions: torch.Tensor):
        """x [..., S, D] at positions [..., S] -> K, V [..., S, Hkv, d] (K normed and rotated)."""
        c, at = self.cfg, layer.self_attn
        k = ops.get("linear")(x, at.k_proj.weight).unflatten(-1, (c.num_kv_heads, c.head_dim))
        k = self.rope.apply(ops.get("rmsnorm")(k, at.k_norm.weight, c.rms_norm_eps), positions)
        v = ops.get("linear")(x, at.v_proj.weight).unflatten(-1, (c.num_kv_heads, c.head_dim))
        return k, v

    def materialize(self, cache: DrafterCache, target_hidden: torch.Tensor,
                    positions: torch.Tensor, count: torch.Tensor) -> None:
        """Write committed context K/V into `cache` in place.

        target_hidden [B, n, nT*D] (captured target layer outputs), positions [B, n] int,
        count [B]: rows j < count[b] are written at slot positions[b, j]; later rows (rejected
        tree nodes, padding) are ignored and may hold anything.
        """
        c = self.cfg
        B, n, F = target_hidden.shape
        T = cache.k.shape[2]
        if F != self.fc.weight.shape[1] or positions.shape != (B, n) or count.shape != (B,):
            raise ValueError(f"materialize: expected target_hidden [B, n, {self.fc.weight.shape[1]}]"
                             f", positions [B, n], count [B]; got {tuple(target_hidden.shape)}, "
                             f"{tuple(positions.shape)}, {tuple(count.shape)}")
        rows = torch.arange(n, device=count.device) < count.view(B, 1)  # [B, n]
        b_idx, j_idx = rows.nonzero(as_tuple=True)  # [M] (host sync: fine for a reference)
        pos = positions[b_idx, j_idx].to(torch.long)  # [M]
        if pos.numel() and not (0 <= int(pos.min()) and int(pos.max()) < T):
            raise ValueError(f"materialize: positions must lie in the cache [0, {T}), "
                             f"got [{int(pos.min())}, {int(pos.max())}]")
        linear, rmsnorm = ops.get("linear"), ops.get("rmsnorm")
        ctx = rmsnorm(self.fc_out(linear(target_hidden[b_idx, j_idx], self.fc.weight)),
                      self.hidden_norm.weight, c.rms_norm_eps)  # [M, D]
        for li, layer in enumerate(self.layers):
            k, v = self._kv(layer, ctx, pos)  # [M, Hkv, d]
            cache.k[li, b_idx, pos] = k
            cache.v[li, b_idx, pos] = v

    def _mask(self, layer: DrafterLayer, qpos, kpos, key_ok, in_block: bool) -> torch.Tensor:
        """bool [B, S, Tk]: qpos [B, S], kpos [B or 1, Tk], key_ok [B or 1, Tk]."""
        rel = qpos.unsqueeze(2) - kpos.unsqueeze(1)  # [B, S, Tk] = qp - kp
        ok = key_ok.unsqueeze(1).expand_as(rel)
        if layer.sliding:
            W = self.cfg.sliding_window
            ok = ok & (rel < W) & (rel > -W)
            if in_block and self.cfg.causal_sliding_in_block:
                ok = ok & (rel >= 0)
        return ok

    @staticmethod
    def _attend(q, kb, vb, kc, vc, ctx_ok, mask) -> torch.Tensor:
        """One layer's attention of Bc requests (any slice of the batch: a request's rows do
        not depend on the others), float64: q [Bc, S, Hq, d], kb / vb [Bc, S, Hkv, d] (the
        block), kc / vc [Bc, Tc, Hkv, d] (the cache's context slots), ctx_ok [Bc, Tc], mask
        [Bc, S, Tc+S] -> o [Bc, S, Hkv, G, d]."""
        Bc, S, Hq, d = q.shape
        Hkv, Tc = kb.shape[2], ctx_ok.shape[1]
        # Zero the unread context rows: a masked score is dropped, but 0 * NaN in p @ V is not.
        keep = ctx_ok.view(Bc, Tc, 1, 1)
        k = torch.cat([torch.where(keep, kc.to(ACC), 0.0), kb.to(ACC)], 1)  # [Bc, Tc+S, Hkv, d]
        v = torch.cat([torch.where(keep, vc.to(ACC), 0.0), vb.to(ACC)], 1)
        qg = q.to(ACC).view(Bc, S, Hkv, Hq // Hkv, d)  # GQA: head h reads kv head h // G
        s = torch.einsum("bshgd,bthd->bhgst", qg, k) / math.sqrt(d)  # [Bc, Hkv, G, S, Tc+S]
        s = s.masked_fill(~mask.view(Bc, 1, 1, S, -1), float("-inf"))
        return torch.einsum("bhgst,bthd->bshgd", s.softmax(-1), v)  # [Bc, S, Hkv, G, d]

    def forward_block(self, cache: DrafterCache, block_ids: torch.Tensor, start: torch.Tensor,
                      target) -> torch.Tensor:
        """Drafter forward over one block per request; the cache is read, never written.

        block_ids [B, L+1] (usually [bonus, MASK x L]) at positions start[b] + j; start [B] =
        committed length P (context slots [0, P) are read); target: a KimiModel (embedding).
        Returns the final-normed hidden [B, L+1, D] bf16.
        """
        c = self.cfg
        B, S = block_ids.shape
        Hq, Hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
        dev = block_ids.device
        P = start.to(dev, torch.long).view(B, 1)
        Tc = int(P.max()) if B else 0  # context slots anyone reads (host sync: reference)
        if B and (int(P.min()) < 0 or Tc > cache.k.shape[2]):
            raise ValueError(f"forward_block: start must lie in [0, {cache.k.shape[2]}], "
                             f"got {start.tolist()}")
        qpos = P + torch.arange(S, device=dev)  # [B, S]
        kpos = torch.arange(Tc, device=dev).view(1, Tc)  # [1, Tc] context slot == position
        ctx_ok = kpos < P  # [B, Tc]: committed slots only; the rest may hold NaN
        linear, rmsnorm = ops.get("linear"), ops.get("rmsnorm")

        x = target.embed(block_ids)  # [B, S, D]
        for li, layer in enumerate(self.layers):
            at = layer.self_attn
            a = rmsnorm(x, layer.input_layernorm.weight, c.rms_norm_eps)
            q = linear(a, at.q_proj.weight).unflatten(-1, (Hq, d))  # [B, S, Hq, d]
            q = self.rope.apply(rmsnorm(q, at.q_norm.weight, c.rms_norm_eps), qpos)
            kb, vb = self._kv(layer, a, qpos)  # [B, S, Hkv, d]
            mask = torch.cat([self._mask(layer, qpos, kpos, ctx_ok, False),
                              self._mask(layer, qpos, qpos, torch.ones_like(qpos, dtype=torch.bool),
                                         True)], 2)  # [B, S, Tc+S]
            # requests in chunks: float64 K/V of a whole bs 64 x 32k batch would be ~70 GB
            per_req = 8 * (Tc + S) * (4 * Hkv * d + 2 * Hq * S)  # bytes of temporaries
            step = max(1, min(B, ATTN_CHUNK_BYTES // max(1, per_req)))
            o = torch.cat([self._attend(q[i:i + step], kb[i:i + step], vb[i:i + step],
                                        cache.k[li, i:i + step, :Tc], cache.v[li, i:i + step, :Tc],
                                        ctx_ok[i:i + step], mask[i:i + step])
                           for i in range(0, max(B, 1), step)])  # [B, S, Hkv, G, d]
            x = x + self.o_proj_out(layer, o.to(x.dtype).reshape(B, S, Hq * d))
            x = x + self.mlp_out(layer, rmsnorm(x, layer.post_attention_layernorm.weight,
                                                c.rms_norm_eps))
        return rmsnorm(x, self.norm.weight, c.rms_norm_eps)


def draft_topk(drafter: DFlashDrafter, target, cache: DrafterCache, bonus: torch.Tensor,
               start: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `drafter` op: block [bonus, MASK x L] at positions P..P+L -> per-depth top-k.

    bonus [B] int (the root token, at position start[b]); start [B] committed lengths P.
    Returns (logprobs fp32 [B, L, k], ids int64 [B, L, k]) sorted descending, depth d at row
    d - 1 (row 0 of the block is not decoded); log_softmax over the full target vocab.
    """
    L = drafter.cfg.depth
    B = bonus.shape[0]
    masks = torch.full((B, L), drafter.cfg.mask_token_id, dtype=torch.long, device=bonus.device)
    block = torch.cat([bonus.view(B, 1).long(), masks], 1)  # [B, L+1]
    z = drafter.forward_block(cache, block, start, target)  # [B, L+1, D]
    logits = ops.get("lm_head")(z[:, 1:], target.lm_head.weight)  # [B, L, V] fp32
    return topk_logprobs(logits, k)


def materialize(drafter: DFlashDrafter, cache: DrafterCache, target_hidden: torch.Tensor,
                positions: torch.Tensor, count: torch.Tensor) -> None:
    """The `drafter_materialize` op: `drafter.materialize(cache, target_hidden, positions, count)`
    (written in place, returns None): rows j < count[b] of target_hidden [B, n, nT*D] become
    context K/V at slot positions[b, j] of every layer; later rows are ignored. The decode loop
    calls it through the registry (workbench/generate.py) for every committed path and prompt."""
    drafter.materialize(cache, target_hidden, positions, count)


# -- seeded synthetic weights (the scheme of workbench/weights.py) ------------------------------
_SEED_BASE = 1 << 20  # drafter streams never coincide with a target layer's (seed, layer) stream


def drafter_state(cfg: DrafterConfig, seed: int = 0, device="cpu") -> dict:
    """Synthetic tensors keyed by checkpoint name: linears ~ N(0, 1/fan_in), norms ~ 1 ± 0.05.

    One generator per (seed, layer); fc and the two outer norms use pseudo layer -1.
    """
    from workbench.weights import norm_weight, normal_weight, seeded_generator

    def normal(g, o, i):
        return normal_weight(g, (o, i), i**-0.5, device)

    def norm(g, n):
        return norm_weight(g, n, device)

    def gen(layer):
        return seeded_generator(seed, _SEED_BASE + layer, device)

    D, d, Hq, Hkv, F = (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
                        cfg.intermediate_size)
    g = gen(-1)
    st = {"fc.weight": normal(g, D, len(cfg.target_layer_ids) * D),
          "hidden_norm.weight": norm(g, D), "norm.weight": norm(g, D)}
    for i in range(cfg.num_layers):
        g, p = gen(i), f"layers.{i}."
        st |= {
            p + "input_layernorm.weight": norm(g, D),
            p + "post_attention_layernorm.weight": norm(g, D),
            p + "self_attn.q_proj.weight": normal(g, Hq * d, D),
            p + "self_attn.k_proj.weight": normal(g, Hkv * d, D),
            p + "self_attn.v_proj.weight": normal(g, Hkv * d, D),
            p + "self_attn.o_proj.weight": normal(g, D, Hq * d),
            p + "self_attn.q_norm.weight": norm(g, d),
            p + "self_attn.k_norm.weight": norm(g, d),
            p + "mlp.gate_proj.weight": normal(g, F, D),
            p + "mlp.up_proj.weight": normal(g, F, D),
            p + "mlp.down_proj.weight": normal(g, D, F),
        }
    return st


def empty_drafter(cfg: DrafterConfig, device="cpu", cls=None) -> DFlashDrafter:
    """A drafter with uninitialised bf16 parameters (allocated without a first fill); cls: a
    DFlashDrafter subclass to make instead (workbench/dist/drafter.py's shard)."""
    with torch.device("meta"):
        model = (cls or DFlashDrafter)(cfg)
    return model.to_empty(device=device).eval()


def build_drafter(cfg: ModelConfig | DrafterConfig, seed: int = 0, device="cpu") -> DFlashDrafter:
    """A drafter with seeded synthetic weights (`cfg` a ModelConfig's drafter or a DrafterConfig)."""
    dcfg = cfg.drafter if isinstance(cfg, ModelConfig) else cfg
    model = empty_drafter(dcfg, device)
    params = dict(model.named_parameters())
    for name, t in drafter_state(dcfg, seed, device).items():
        params[name].data.copy_(t)
    return model


if __name__ == "__main__":  # quick check: tiny target + drafter, one materialise and one draft
    import workbench

    tgt = workbench.build_model("tiny")
    dr = build_drafter(tgt.cfg)
    B, n = 2, 24
    cache = dr.new_cache(B, n)
    hidden = torch.randn(B, n, dr.fc.weight.shape[1]).to(torch.bfloat16)  # stand-in features
    dr.materialize(cache, hidden, torch.arange(n).expand(B, n), torch.tensor([n, 17]))
    lp, ids = draft_topk(dr, tgt, cache, torch.tensor([5, 6]), torch.tensor([n, 17]), k=4)
    print(f"drafter {dr.cfg.num_layers} layers, L={dr.cfg.depth}; top-4 per depth of request 0:")
    for d in range(dr.cfg.depth):
        print(f"  depth {d + 1}: ids {ids[0, d].tolist()} logprobs {lp[0, d].tolist()}")
