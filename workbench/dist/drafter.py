"""The DFlash drafter under tensor parallelism (`drafter_layout="tp"`), beside vocab.py's
replicated one.

Why: replicated, every rank reads the whole drafter on every draft: at K2.6 size its six layers
and fc are ~7 GB of bf16, ~1.6 ms a step at 4.3 TB/s on each of the 8 ranks (the EP8 emulation's
draft floor with the LM-head shard: 1.81 ms at C 8, session 38; the whole C 1 DDTree-16
step's floor is ~7.2 ms, session 27). Split like the target's attention and dense layers,
each rank reads ~1/8 of the layers and pays two small all-reduces a layer ([C (L+1), D] rows:
115 KB at C 1); fc (0.62 GB) is split too, for one all-gather a commit. What a serving engine
does with a draft model; measured against the replicated drafter by `emulate --drafter-layout
tp` (H200, session 42: the C 1 DDTree-16 draft 1.89 -> 0.64 ms, the step's kernels 13.92 ->
12.71 ms; traces/gpu/session42/README.md).

Rank r of `world` holds (Hq q heads, Hkv KV heads, F MLP width, G = Hq / Hkv):
  q_proj / q rows     q heads [r Hq/w, (r+1) Hq/w)
  k_proj / v_proj     KV heads [r Hkv/w, (r+1) Hkv/w) when w divides Hkv, else the one KV head
                      its q heads read, (r Hkv) // w (replicated over w / Hkv ranks, as GQA
                      engines do past Hkv ranks); the drafter cache holds only these heads
  o_proj              engine: the columns of its q heads [D, Hq/w d], partial sums all-reduced;
                      exact: D/w output rows over all heads, the heads' outputs all-gathered
  mlp                 workbench.dist.model.SwiGLUShard: gate/up rows F/w, down by columns
                      (engine) or D/w output rows (exact)
  fc                  D/w output rows [r D/w, (r+1) D/w) of every committed row's context,
                      all-gathered ([M, D] bf16: 244 KB for 17 rows) before the hidden norm;
                      whole dot products, so the single process's values in both layouts
                      (bit for bit on the CPU; cuBLAS may tile a narrower GEMM differently)
  norms               replicated
The exact layout keeps every dot product whole (layout.py EXACT), so the CPU proof's drafts,
and hence its trees and accepted lengths, are the single-process drafter's bit for bit.
Legend: B batch, S = L + 1 block rows, T cached context, Hq / Hkv heads (local: /w), d
head_dim, D hidden, F MLP width (local: F/w), L draft depth.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from workbench import ops
from workbench.reference.drafter import DFlashDrafter, empty_drafter
from workbench.reference.model import Linear

from .comm import Comm
from .layout import Layout, LayoutError
from .model import SwiGLUShard, row_parallel
from .vocab import DistDrafter

DRAFTER_LAYOUTS = ("replicated", "tp")


def check_drafter_layouts(layout, several: bool = False) -> tuple[str, ...]:
    """`layout` as a tuple of DRAFTER_LAYOUTS names, or ValueError naming the argument, what it
    takes and what it got (the dist loop's and the emulation's one check, before any weights
    are made); several: a tuple of names is accepted too (emulate times each)."""
    names = (layout,) if isinstance(layout, str) or not several else tuple(layout)
    if not names or any(not isinstance(d, str) or d not in DRAFTER_LAYOUTS for d in names):
        raise ValueError(f"drafter_layout: expected one of {DRAFTER_LAYOUTS}"
                         + (" or a tuple of them" if several else "") + f", got {layout!r}")
    return names


def drafter_heads(dcfg, lay: Layout) -> tuple[tuple[int, int], tuple[int, int]]:
    """This rank's (q heads, KV heads) ranges; LayoutError naming the field that does not
    divide."""
    w, r, Hq, Hkv, F = lay.world, lay.rank, dcfg.num_heads, dcfg.num_kv_heads, \
        dcfg.intermediate_size
    for field, value, div, why in (
            ("drafter.num_heads", Hq, w, "q heads split over all ranks"),
            ("drafter.intermediate_size", F, w, "MLP width split over all ranks"),
            ("drafter.hidden_size", dcfg.hidden_size, w,
             "fc, and in exact mode o_proj / down_proj, split by output rows")):
        if value % div:
            raise LayoutError(f"{field}={value} is not a multiple of {div} ({why}) under the "
                              f"tensor-parallel drafter on {w} ranks; use "
                              f"drafter_layout='replicated' or fewer ranks")
    if Hkv % w and w % Hkv:
        raise LayoutError(f"drafter.num_kv_heads={Hkv}: expected a multiple or a divisor of the "
                          f"{w} ranks (KV heads split, or each replicated over w / Hkv ranks) "
                          f"under the tensor-parallel drafter; use drafter_layout='replicated'")
    q = (r * Hq // w, (r + 1) * Hq // w)
    kv = (r * Hkv // w, (r + 1) * Hkv // w) if Hkv % w == 0 else (r * Hkv // w, r * Hkv // w + 1)
    return q, kv


def shard_drafter(drafter: DFlashDrafter, lay: Layout) -> DrafterShard:
    """This rank's drafter: a DrafterShard of the local head counts and width (so the
    reference's forward_block, materialize, cache and K/V code and the kernels' block body run
    on it unchanged) whose fc, o_proj and mlp are the TP modules above; weights copied from
    `drafter`. Its comm is unset: the caller joins it to one (TPDistDrafter)."""
    c = drafter.cfg
    (q0, q1), (k0, k1) = drafter_heads(c, lay)
    w, d, D, F = lay.world, c.head_dim, c.hidden_size, c.intermediate_size
    local = dataclasses.replace(c, num_heads=q1 - q0, num_kv_heads=k1 - k0,
                                intermediate_size=F // w)
    out = empty_drafter(local, drafter.device, cls=DrafterShard)
    out.exact = lay.exact
    build = torch.device(drafter.device)  # the TP modules straight on the drafter's device
    f0, f1 = lay.rank * F // w, (lay.rank + 1) * F // w
    d0, d1 = lay.rank * D // w, (lay.rank + 1) * D // w
    with torch.no_grad():
        with build:  # D/w of fc's output rows: whole dot products, all-gathered (fc_gather)
            out.fc = Linear(drafter.fc.weight.shape[1], D // w)
        out.fc.weight.copy_(drafter.fc.weight[d0:d1])
        for name in ("hidden_norm", "norm"):
            getattr(out, name).weight.copy_(getattr(drafter, name).weight)
        for src, dst in zip(drafter.layers, out.layers):
            a, b = src.self_attn, dst.self_attn
            for name in ("input_layernorm", "post_attention_layernorm"):
                getattr(dst, name).weight.copy_(getattr(src, name).weight)
            b.q_norm.weight.copy_(a.q_norm.weight)
            b.k_norm.weight.copy_(a.k_norm.weight)
            b.q_proj.weight.copy_(a.q_proj.weight[q0 * d:q1 * d])
            b.k_proj.weight.copy_(a.k_proj.weight[k0 * d:k1 * d])
            b.v_proj.weight.copy_(a.v_proj.weight[k0 * d:k1 * d])
            if lay.exact:  # D/w output rows over every head's columns
                with build:
                    b.o_proj = Linear(c.num_heads * d, D // w)
                b.o_proj.weight.copy_(a.o_proj.weight[d0:d1])
            else:  # the columns of this rank's q heads
                b.o_proj.weight.copy_(a.o_proj.weight[:, q0 * d:q1 * d])
            with build:
                mlp = SwiGLUShard(D, F // w, lay)
            mlp.gate_proj.weight.copy_(src.mlp.gate_proj.weight[f0:f1])
            mlp.up_proj.weight.copy_(src.mlp.up_proj.weight[f0:f1])
            mlp.down_proj.weight.copy_(src.mlp.down_proj.weight[d0:d1] if lay.exact
                                       else src.mlp.down_proj.weight[:, f0:f1])
            dst.mlp = mlp
    return out.eval()


class DrafterShard(DFlashDrafter):
    """A rank's drafter (`shard_drafter`): DFlashDrafter's forward_block and materialize on
    this rank's heads and width, with fc's output columns all-gathered (fc_gather) and the
    o_proj and MLP outputs summed over ranks (engine) or gathered whole (exact). `comm` is
    unset (no collectives) until TPDistDrafter joins the shard to its target's."""

    comm: Comm | None = None
    exact: bool = True

    @property
    def fc_gather(self):
        comm = self.comm
        return None if comm is None else (lambda h: comm.all_gather_cat(h, -1))

    def o_proj_out(self, layer, o):
        if self.exact:  # all heads' outputs in head order (rank r holds q heads r Hq/w ..)
            o = self.comm.all_gather_cat(o, -1)
        return row_parallel(o, layer.self_attn.o_proj.weight, o.dtype, self.comm, self.exact)

    def mlp_out(self, layer, h):
        return layer.mlp(h, self.comm)


class TPDistDrafter(DistDrafter):
    """DistDrafter on a tensor-parallel shard (`shard_drafter`): the same loop interface
    (new_cache, materialize, draft_override), this rank's heads in its cache, two collectives
    a drafter layer and one a commit. `drafter` is the shard (its bytes are what a rank reads:
    emulate's floors); `full_cfg` the unsharded config."""

    def __init__(self, drafter: DFlashDrafter, target, lay: Layout):
        super().__init__(shard_drafter(drafter, lay), target)
        self.full_cfg = drafter.cfg
        self.drafter.comm = target.comm

    def _body(self):
        """The kernel's block body with its row-parallel outputs all-reduced (engine), or
        None: the shard's own forward_block."""
        body = tp_block_body(self.drafter.exact)  # the shard's layout (shard_drafter)
        if body is None:
            return None
        comm = self.target.comm
        return functools.partial(body, reduce=lambda r: comm.all_reduce(r))


def tp_block_body(exact: bool):
    """The selected `drafter` variant's tensor-parallel block body (kernels/drafter
    BLOCK_HIDDEN_TP: it takes `reduce=`), None for the reference; a variant without one, or
    any kernel under the exact layout (whose o_proj / down are row slices the kernels do not
    run), is an error, never a silent switch to the reference body."""
    from workbench.kernels.drafter import BLOCK_HIDDEN_TP

    name = ops.selected("drafter")
    if name == ops.REFERENCE:
        return None
    if exact:
        raise ValueError(f"drafter: the tensor-parallel drafter's exact layout runs the "
                         f"reference body; got variant {name!r} (select drafter="
                         f"{ops.REFERENCE!r}, or exact=False)")
    if name not in BLOCK_HIDDEN_TP:
        raise ValueError(f"drafter: the tensor-parallel drafter needs a block body taking "
                         f"reduce= for variant {name!r}; expected one of "
                         f"{sorted(BLOCK_HIDDEN_TP)} or {ops.REFERENCE!r}")
    return ops.Variant(name, BLOCK_HIDDEN_TP[name]).load()


def make_dist_drafter(drafter: DFlashDrafter, target, layout: str = "replicated"):
    """The loop's drafter for `target` (a DistKimiModel) under `layout` (DRAFTER_LAYOUTS)."""
    if layout == "replicated":
        return DistDrafter(drafter, target)
    check_drafter_layouts(layout)
    return TPDistDrafter(drafter, target, target.layout)
