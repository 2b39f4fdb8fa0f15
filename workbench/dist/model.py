"""`DistKimiModel`: one rank's shard of the Kimi K2.6 target, with KimiModel's decode interface.

generate() runs unchanged on every rank: it calls `target(...)`, `new_cache`, `embed`, `cfg`,
`device`, `layer_ids`, and reads fp32 logits [B, N, V]. Ranks stay in lockstep because every
host decision (tree build, walk, sampling) reads the all-gathered logits, which are identical
bit for bit on all ranks (each vocab shard was computed by one rank).

The math mirrors reference/model.py line by line with the local slices of layout.py; the
partial sums that cross ranks stay in the reference's accumulation dtype (moe.ACC) and are
rounded to bf16 once, after the collective, where the single-process op rounds. Differences
from the reference are therefore reduction order in ACC only (none for the EP combine, none in
exact mode).
Legend: B batch, N rows per request, T cache length, H heads (local: H/world), C latent,
R rope, D hidden, E experts, K experts per token, V vocab.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from workbench import ops
from workbench.config import ModelConfig
from workbench.reference.model import (
    ForwardOut,
    Linear,
    Norm,
    Router,
    forward_out,
    new_latent_cache,
)
from workbench.reference.rope import target_rope
from workbench.streams import Side

from .comm import Comm
from .layout import Layout, shard_state
from .moe import (
    ACC,
    LocalExperts,
    ep_dispatch_mode,
    moe_ep,
    moe_ep_local,
    moe_tp_exact,
    moe_tp_partial,
    op_dtype,
)

# -- side streams (engine schedule) ----------------------------------------------------------
# SGLang's DeepSeek model runs the shared experts on an alternate stream while the routed ones
# run: the shared expert's three small GEMMs (~11-14 µs a layer on an EP8 rank, mostly launch
# latency) then fill the time the router and the int4 GEMMs leave. Off unless asked for: the
# emulation asks (`emulate --shared-stream`, on by default from session 20, measured from
# CUDA-graph replays with `--graph`: -0.23 ms at C 1 DDTree-16, -0.17 at C 8 AR).
# The attention has two such branches (`attn_stream`, session 20; on by default in the
# emulation from session 21): the latent cache write needs only kv_a's columns, and q_pe's RoPE
# and q_nope's absorption write disjoint halves of the query, so the write and the RoPE
# (~1.7 µs each a layer) can run beside q's norm, q_b and the absorption (session 21 call 1,
# graph replays, on vs off: -0.15 ms at C 1 AR, -0.14 at C 1 DDTree-16, -0.15 at C 8 AR, -0.04
# at C 8 DDTree-16, -0.17 / -0.13 at C 32 AR / DDTree-16: faster in all six, by ~1-3 %).
# Side-stream work competes with the critical path for SMs (session 21: cuBLAS's router GEMM
# took 10.7 µs a layer in graph replays beside the shared expert, ~5.8 eager alone). CUDA
# stream priorities order the dispatch of waiting CTAs; the side stream already has the lowest
# (0), so `main_priority` raises the stream a captured step runs on (emulate --main-priority,
# -1 by default from session 21: AR -0.07 / -0.11 kernel ms at C 1 / 8, the verify within the
# runs' spread; 0 here, as torch.cuda.graph captures, for every other caller).
# Where the shared expert forks (`shared_fork`): "before-route" (session 20) puts its three
# GEMMs beside the router GEMM, its top-k and the local-id gather (all short, all on the
# critical path); "after-route" forks once the routing is queued, beside the routed experts'
# own launches (the int4 GEMMs run ~25-125 µs a layer). The emulation forks after the route by
# default from session 21 (call 11: -0.01 to -0.13 kernel ms at C 1 / 8, never slower; the
# runs' spread is of that size); "before-route" here, for every other caller.
SHARED_FORKS = ("before-route", "after-route")
_SHARED_STREAM = [False]
_SHARED_FORK = ["before-route"]
_ATTN_STREAM = [False]
_MAIN_PRIORITY = [0]


@contextmanager
def shared_stream(on: bool):
    """Within the block, the EP engine path runs the shared expert on a side stream (CUDA)."""
    _SHARED_STREAM.append(bool(on))
    try:
        yield
    finally:
        _SHARED_STREAM.pop()


@contextmanager
def shared_fork(where: str):
    """Within the block, the shared expert's side stream forks `where` (SHARED_FORKS) in the
    EP engine path's MoE layer (with shared_stream on)."""
    if where not in SHARED_FORKS:
        raise ValueError(f"shared_fork: expected one of {SHARED_FORKS}, got {where!r}")
    _SHARED_FORK.append(where)
    try:
        yield
    finally:
        _SHARED_FORK.pop()


@contextmanager
def attn_stream(on: bool):
    """Within the block, the engine attention writes the latent cache and ropes q_pe on a side
    stream (CUDA) while q's norm, q_b and the absorption run on the current one."""
    _ATTN_STREAM.append(bool(on))
    try:
        yield
    finally:
        _ATTN_STREAM.pop()


@contextmanager
def main_priority(priority: int):
    """Within the block, a CUDA graph of the step is captured on a stream of this priority (0
    the default; lower numbers are higher priorities, torch.cuda.Stream.priority_range()):
    the side streams' kernels keep the default, so they yield to the main path's."""
    if not isinstance(priority, int) or priority > 0:
        raise ValueError(f"main_priority: expected an int <= 0 (lower is higher), got "
                         f"{priority!r}")
    _MAIN_PRIORITY.append(priority)
    try:
        yield
    finally:
        _MAIN_PRIORITY.pop()


def capture_priority() -> int:
    """The stream priority a captured step runs on (`main_priority`)."""
    return _MAIN_PRIORITY[-1]


def beside(side_fn, main_fn, device: torch.device):
    """(side_fn(), main_fn()): with shared_stream on and a CUDA device, side_fn runs on a side
    stream forked from the current one (it waits for what was queued before) while main_fn
    runs on the current stream, which then waits for the side stream; both results are ready
    on the current stream. Otherwise one after the other. Graph-capturable (fork / join by
    events, as torch.cuda.graph records them)."""
    side = Side(device, _SHARED_STREAM[-1])
    side.fork()
    a = side.run(side_fn)
    b = main_fn()
    side.join(a)
    return a, b


def stacked_weight(*mods: Linear) -> torch.Tensor:
    """The weights of `mods` (same input width) as row blocks of ONE buffer [sum O, I]: inputs
    shared by several projections then take one GEMM (what engines call merged QKV / gate_up
    weights). The first call stacks them and makes each parameter a view of its block, so the
    memory is not doubled and later in-place loads (load_shard) land in the buffer; later
    calls find them adjacent and return the [sum O, I] view."""
    from workbench.kernels.dense.torch_bf16 import adjacent

    ws = [m.weight for m in mods]
    if not all(adjacent(a, b) for a, b in zip(ws, ws[1:])):
        buf = torch.cat([w.detach() for w in ws])
        row = 0
        for m in mods:
            n = m.weight.shape[0]
            m.weight.data = buf[row : row + n]
            row += n
    first = mods[0].weight.detach()
    return first.as_strided((sum(m.weight.shape[0] for m in mods), first.shape[1]),
                            (first.shape[1], 1))


def _stack_weights() -> bool:
    """Engine path with bf16 activations (the full-size emulation, `moe.op_activations`): share
    GEMMs between projections of one input. The ACC proof path keeps one GEMM per weight."""
    return op_dtype() != ACC


class SwiGLUShard(nn.Module):
    """Dense layer or shared expert, TP: gate/up rows of width F/world; down columns F/world
    (engine) or, exact, D/world output rows over the whole width F."""

    def __init__(self, d: int, width: int, lay: Layout):
        super().__init__()
        self.exact = lay.exact
        self.gate_proj, self.up_proj = Linear(d, width), Linear(d, width)
        self.down_proj = Linear(width * lay.world, d // lay.world) if lay.exact else Linear(
            width, d)

    def partial(self, x):
        """Engine: this rank's width slice of the MLP, [..., D] in op_dtype() (not reduced)."""
        if _stack_weights():  # gate | up in one buffer: ops that can, run one GEMM
            stacked_weight(self.gate_proj, self.up_proj)
        return ops.get("swiglu_mlp")(x.to(op_dtype()), self.gate_proj.weight,
                                     self.up_proj.weight, self.down_proj.weight)

    def forward(self, x, comm: Comm):
        """[..., D] bf16 -> [..., D] bf16, = reference swiglu_mlp up to (engine) ACC order."""
        if not self.exact:  # ACC in: the op returns its unrounded partial; round after the sum
            return comm.all_reduce(self.partial(x)).to(x.dtype)
        linear, xf = ops.get("linear"), x.to(ACC)  # ACC in -> ACC out, as the op computes
        a = torch.nn.functional.silu(linear(xf, self.gate_proj.weight)) * linear(
            xf, self.up_proj.weight)  # [..., F/world] ACC
        return row_parallel(comm.all_gather_cat(a, -1), self.down_proj.weight, x.dtype, comm,
                            exact=True)


def row_parallel(inp: torch.Tensor, weight: torch.Tensor, dtype, comm: Comm, exact: bool):
    """The second linear of a TP pair, rounded to `dtype` once, where the reference rounds.

    engine: inp holds this rank's input features, weight [D, F/world]: ACC partial,
    all-reduced, then rounded. exact: inp holds ALL input features, weight [D/world, F]: whole
    dot products for this rank's output columns, rounded, then all-gathered."""
    out = ops.get("linear")(inp.to(ACC if exact else op_dtype()), weight)  # the op returns
    # its input's dtype: ACC (unrounded) unless the engine path runs bf16 (moe.op_activations)
    if exact:
        return comm.all_gather_cat(out.to(dtype), -1)
    return comm.all_reduce(out).to(dtype)


class MLAShard(nn.Module):
    """H/world heads; q_a / kv_a and their norms replicated (one latent KV head)."""

    def __init__(self, cfg: ModelConfig, lay: Layout):
        super().__init__()
        D, heads = cfg.hidden_size, cfg.num_heads // lay.world
        self.q_a_proj = Linear(D, cfg.q_lora_rank)
        self.q_a_layernorm = Norm(cfg.q_lora_rank)
        self.q_b_proj = Linear(cfg.q_lora_rank, heads * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(D, cfg.latent_dim)
        self.kv_a_layernorm = Norm(cfg.kv_lora_rank)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, heads * (cfg.qk_nope_dim + cfg.v_head_dim))
        # engine: columns of the local heads; exact: D/world output rows over all heads
        self.o_proj = (Linear(cfg.num_heads * cfg.v_head_dim, D // lay.world) if lay.exact
                       else Linear(heads * cfg.v_head_dim, D))


class MoEShard(nn.Module):
    def __init__(self, cfg: ModelConfig, lay: Layout):
        super().__init__()
        self.gate = Router(cfg)  # replicated
        e0, e1 = lay.experts(cfg)
        i0, i1 = lay.width(cfg)
        D, I = cfg.hidden_size, cfg.moe_intermediate
        down = (D // lay.tp, I) if lay.moe_exact else (None, None)
        self.experts = LocalExperts(e1 - e0, D, i1 - i0, cfg.group_size, *down)
        self.shared_experts = SwiGLUShard(D, I * cfg.n_shared_experts // lay.world, lay)


class LayerShard(nn.Module):
    def __init__(self, cfg: ModelConfig, lay: Layout, layer: int):
        super().__init__()
        self.input_layernorm = Norm(cfg.hidden_size)
        self.post_attention_layernorm = Norm(cfg.hidden_size)
        self.self_attn = MLAShard(cfg, lay)
        self.is_moe = cfg.is_moe_layer(layer)
        self.mlp = MoEShard(cfg, lay) if self.is_moe else SwiGLUShard(
            cfg.hidden_size, cfg.dense_intermediate // lay.world, lay)


class DistKimiModel(nn.Module):
    """Rank `layout.rank`'s shard; parameter names are KimiModel's (lm_head -> lm_head_shard,
    so code that expects the full head, like the `drafter` op, fails loudly instead of taking
    shard-local token ids)."""

    def __init__(self, cfg: ModelConfig, layout: Layout, comm: Comm | None = None,
                 layers: list[int] | None = None):
        super().__init__()
        layout.check(cfg)
        self.cfg, self.layout = cfg, layout
        self.comm = comm or Comm()
        self.log = self.comm.log
        self.layer_ids = sorted(range(cfg.num_layers) if layers is None else set(layers))
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16), False)
        self.model.layers = nn.ModuleDict(
            {str(i): LayerShard(cfg, layout, i) for i in self.layer_ids})
        self.model.norm = Norm(cfg.hidden_size)
        v0, v1 = layout.vocab(cfg)
        self.lm_head_shard = Linear(cfg.hidden_size, v1 - v0)
        self.vocab_start = v0
        self.rope = target_rope(cfg)

    # -- the KimiModel interface generate() and the drafter use ---------------------------------
    @property
    def device(self) -> torch.device:
        return self.lm_head_shard.weight.device

    def new_cache(self, batch: int, max_len: int) -> torch.Tensor:
        """Latent cache [layers, B, T, C+R] bf16, NaN-filled; REPLICATED: the same on every rank
        (its bytes are kept in `cache_bytes`, the measured price of the replication)."""
        self.rope.reserve(max_len, self.device)  # positions are cache slots: < max_len
        cache = new_latent_cache(self.cfg, len(self.layer_ids), batch, max_len, self.device)
        self.cache_bytes = cache.numel() * cache.element_size()
        return cache

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens.weight[ids]  # replicated table: no collective

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., D] -> this rank's vocab shard [..., V/world] fp32 (ids start at vocab_start)."""
        with self.log("lm_head"):
            h = ops.get("rmsnorm")(hidden, self.model.norm.weight, self.cfg.rms_norm_eps)
            return ops.get("lm_head")(h, self.lm_head_shard.weight)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., D] -> full [..., V] fp32, all-gathered (what generate()'s sampler reads)."""
        local = self.local_logits(hidden)
        with self.log("lm_head"):
            return self.comm.all_gather_cat(local, -1)

    def forward(self, ids, positions, kv_cache, prefix_lens, anc_bits, capture=(),
                want_logits: bool = True, record_routing: bool = False) -> ForwardOut:
        """KimiModel.forward's contract (see reference/model.py), on this rank's shard."""
        rms, eps, add_norm = ops.get("rmsnorm"), self.cfg.rms_norm_eps, ops.get("add_rmsnorm")
        stats: dict = {} if record_routing else None
        x = self.embed(ids)  # [B, N, D]
        caps = {}
        pending = None  # the last MLP output, added by the next layer's fused add + norm
        for li, i in enumerate(self.layer_ids):
            layer = self.model.layers[str(i)]
            with self.log("attention"):
                if pending is None:
                    a = rms(x, layer.input_layernorm.weight, eps)
                else:  # x = x + mlp; a = rmsnorm(x)
                    x, a = add_norm(x, pending, layer.input_layernorm.weight, eps)
                attn = self._attention(layer.self_attn, a, positions, kv_cache[li], prefix_lens,
                                       anc_bits)
                x, m = add_norm(x, attn, layer.post_attention_layernorm.weight, eps)
            if layer.is_moe:
                with self.log("moe"):
                    pending = self._moe(layer.mlp, m, stats)
            else:
                with self.log("dense"):
                    pending = layer.mlp(m, self.comm)
            if i in capture:  # the drafter reads this layer's output: materialise it
                x, pending = x + pending, None
                caps[i] = x
        if pending is not None:
            x = x + pending
        return forward_out(self, x, caps, capture, want_logits, stats)

    # -- layers -------------------------------------------------------------------------------
    def _attention(self, at: MLAShard, x, positions, kv_cache, prefix_lens, anc_bits):
        """reference MLA.forward on the local heads; returns the all-reduced o_proj output bf16."""
        cfg, B, N = self.cfg, x.shape[0], x.shape[1]
        C, dn, dv = cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.v_head_dim
        H = at.q_b_proj.weight.shape[0] // cfg.qk_head_dim  # local heads
        eps, linear, rmsnorm = cfg.rms_norm_eps, ops.get("linear"), ops.get("rmsnorm")

        if _stack_weights():  # q_a | kv_a read the same x: one GEMM, column slices after
            qkv = linear(x, stacked_weight(at.q_a_proj, at.kv_a_proj_with_mqa))
            q_a, kv = qkv[..., : cfg.q_lora_rank], qkv[..., cfg.q_lora_rank :]
        else:
            q_a, kv = linear(x, at.q_a_proj.weight), linear(x, at.kv_a_proj_with_mqa.weight)
        table = self.rope.table(positions.device)  # [T, R] fp32 cos|sin
        # the latent cache write needs only kv: beside q's path (`attn_stream`); every rank
        # writes the same latent rows (the cache is replicated)
        side = Side(x.device, _ATTN_STREAM[-1])
        side.fork(kv, positions, table)
        side.run(lambda: ops.get("mla_kv_write")(kv, at.kv_a_layernorm.weight, eps, positions,
                                                 table, self.rope.interleaved, kv_cache,
                                                 prefix_lens))
        cq = rmsnorm(q_a, at.q_a_layernorm.weight, eps)
        q = linear(cq, at.q_b_proj.weight).view(B, N, H, cfg.qk_head_dim)
        q_nope = q[..., :dn]
        qq = torch.empty(B, N, H, cfg.latent_dim, dtype=x.dtype, device=x.device)  # [.., C+R]
        side.fork(q, qq)  # q_pe's RoPE (into qq's last R) beside the absorption (its first C)
        side.run(lambda: ops.get("rope")(q[..., dn:], positions, table, self.rope.interleaved,
                                         out=qq[..., C:]))
        w_kvb = at.kv_b_proj.weight.view(H, dn + dv, C)
        ops.get("mla_q_absorb")(q_nope, w_kvb[:, :dn], out=qq[..., :C])  # qq = [q_lat | q_pe]
        side.join()  # the cache rows and q_pe are in before the attention reads them
        o_lat, _ = ops.get("tree_mla")(qq, kv_cache, prefix_lens, anc_bits, cfg.softmax_scale, C)
        o = ops.get("mla_v_up")(o_lat, w_kvb[:, dn:])  # [B, N, H, dv] (W_UV)
        o = o.to(x.dtype).reshape(B, N, H * dv)  # bf16, as the reference rounds
        if self.layout.exact:  # all heads' outputs, in head order (rank r holds heads r*H..)
            o = self.comm.all_gather_cat(o, -1)
        return row_parallel(o, at.o_proj.weight, x.dtype, self.comm, self.layout.exact)

    def _moe(self, moe: MoEShard, x, stats):
        cfg, lay = self.cfg, self.layout
        B, N, D = x.shape
        h = x.reshape(B * N, D)
        experts, sh = moe.experts.stacked(), moe.shared_experts

        def route(local=None):  # local: (first, n) of this rank's experts (the EP-local path)
            out = ops.get("moe_route")(h, moe.gate.weight, moe.gate.e_score_correction_bias,
                                       cfg.n_experts_per_tok, cfg.routed_scaling_factor,
                                       **({} if local is None else {"local_experts": local}))
            if stats is not None:
                stats.setdefault("routing", []).append(out[0].view(B, N, -1))
            return out

        if lay.ep > 1 and not lay.exact and _stack_weights() and ep_dispatch_mode() == "local":
            # EP on bf16 rows, this rank's experts on every token (the engine emulation): the
            # shared expert's partial (`beside` the router and the routed experts, or beside
            # the routed experts only: `shared_fork`) plus the routed partial, then ONE
            # all-reduce sums both. The router also stores the slots' local ids (-1: another
            # rank's expert), which the routed experts take.
            e_loc = experts.num_experts
            local = lambda: route((lay.group * e_loc, e_loc))  # noqa: E731

            def routed_fn():
                _, w, here = routing or local()
                return moe_ep_local(h, here, w, experts, lay)

            routing = local() if _SHARED_FORK[-1] == "after-route" else None  # queued first
            part, routed = beside(lambda: sh.partial(h), routed_fn, h.device)
            part.add_(routed)
            return self.comm.all_reduce(part).to(x.dtype).view(B, N, D)
        ids, w = route()
        if lay.ep == 1 and not lay.exact:  # MoE-TP: one all-reduce, routed + shared partials
            part_s = ops.get("swiglu_mlp")(h.to(op_dtype()), sh.gate_proj.weight, sh.up_proj.weight,
                                           sh.down_proj.weight)
            both = self.comm.all_reduce(torch.stack([moe_tp_partial(h, ids, w, experts),
                                                     part_s]))
            y, s = both[0].to(x.dtype), both[1].to(x.dtype)
        elif lay.ep > 1 and not lay.exact and _stack_weights():
            # EP on bf16 rows (the engine emulation): the routed output joins the shared
            # expert's partial and ONE all-reduce sums both
            part = sh.partial(h)  # [T, D] bf16, this rank's shared-expert width slice
            # all-to-all dispatch ("local" is above): the owner adds its routed slice (the
            # owned slices are disjoint)
            routed, lo, hi = moe_ep(h, ids, w, experts, lay, self.comm, gather=False)
            part[lo:hi].add_(routed[: hi - lo])  # in place on the view: no write-back copy
            return self.comm.all_reduce(part).to(x.dtype).view(B, N, D)
        else:
            y = (moe_tp_exact(h, ids, w, experts, self.comm) if lay.ep == 1
                 else moe_ep(h, ids, w, experts, lay, self.comm))
            s = sh(h, self.comm)
        return (y + s).view(B, N, D)  # bf16 sum of the two branches, as the reference adds


# -- building a rank's shard ---------------------------------------------------------------------
def empty_dist_model(cfg: ModelConfig, layout: Layout, comm: Comm | None = None, device="cpu",
                     layers=None) -> DistKimiModel:
    with torch.device("meta"):
        model = DistKimiModel(cfg, layout, comm, layers)
    return model.to_empty(device=device).eval()


def load_shard(model: DistKimiModel, full_state: dict) -> None:
    """Copy this rank's slices of full (single-process-named) tensors into the model."""
    slots = dict(model.named_parameters())
    slots.update(dict(model.named_buffers()))
    for name, t in shard_state(full_state, model.cfg, model.layout).items():
        key = "lm_head_shard.weight" if name == "lm_head.weight" else name
        if key not in slots:
            raise KeyError(f"{name}: no such tensor in the {model.layout.name} shard")
        if tuple(slots[key].shape) != tuple(t.shape):
            raise ValueError(f"{name}: shard shape {tuple(t.shape)} != slot "
                             f"{tuple(slots[key].shape)}")
        slots[key].data.copy_(t)


def build_dist_model(cfg: ModelConfig | str | None, layout: Layout, comm: Comm | None = None,
                     seed: int = 0, device="cpu", layers=None, checkpoint=None,
                     **synthetic_kw) -> DistKimiModel:
    """This rank's shard of `workbench.build_model(cfg, seed)` (the same synthetic values), or
    of a checkpoint folder (its config.json wins; pass cfg=None). One full layer is in memory at a time (tiny/small sizes; at K2.6
    size use emulate.direct_shard_state, which makes only the shard)."""
    from workbench.checkpoint import load_model, read_config
    from workbench.models import resolve_config
    from workbench.weights import synthetic_state_chunks

    cfg = read_config(checkpoint) if checkpoint is not None else resolve_config(cfg)
    model = empty_dist_model(cfg, layout, comm, device, layers)
    if checkpoint is None:
        for _, state in synthetic_state_chunks(cfg, seed, model.layer_ids, device,
                                               **synthetic_kw):
            load_shard(model, state)
        return model
    for i in model.layer_ids:  # embed/head come along with each single-layer load
        part = load_model(checkpoint, device=device, layers=[i])
        state = dict(part.named_parameters()) | dict(part.named_buffers())
        load_shard(model, {k: v.data for k, v in state.items()})
        del part
    return model
