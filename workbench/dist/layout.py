"""Parallel layouts: which rank holds which slice of the Kimi K2.6 target, and why.

One `Layout` per rank; world = tp * ep ranks. The MoE's (ep, tp) split is the only choice; the
rest is fixed because it is what wins on every interconnect (DESIGN.md §9, kimi_mla.md §6-§7):

  attention   TP over all `world` ranks: q_b_proj / kv_b_proj rows split by head, o_proj
              columns by head, one all-reduce. q_a / kv_a projections and their norms are
              REPLICATED: MLA has a single latent KV head, so every rank computes the same
              latent row and keeps the whole latent cache (the cost `latent_cache_bytes` counts;
              decode-context parallelism would split it by sequence instead).
  dense MLP   TP over world (gate/up rows, down columns, all-reduce); the shared expert too.
  routed MoE  ep expert groups x tp width slices: rank r holds experts [g E/ep, (g+1) E/ep),
              g = r // tp, and width slice i = r % tp (I/tp wide) of each. ep=1 is MoE-TP,
              tp=1 is EP, both >1 is the EP x TP hybrid. INT4 groups of 32 run along each
              projection's input dim: gate/up split by output rows (groups untouched), down by
              input columns, so I/tp must be a multiple of 32.
  router      replicated (E x D bf16, 5.5 MB a layer): every rank routes every token the same
              way, so each knows the whole all-to-all plan without a count exchange.
  LM head     vocab-parallel over world: rows [r V/w, (r+1) V/w).
  embedding   replicated: a lookup reads only B*N rows, so vocab-parallel would buy HBM capacity
              (2.35 GB a rank at K2.6) with an all-reduce per forward and per draft block.
EXACT mode (`exact=True`, the CPU proof): a K-split dot product summed across ranks differs
from the single-process fp32 dot in rounding, a bf16 rounding flips now and then, and a router
near-tie turns that into another expert and another greedy token (seen at TP2 on tiny within
two steps). So the row-parallel layers (o_proj, dense/shared down_proj, and the experts'
down_proj under MoE-TP) instead all-gather their input features and compute a slice of OUTPUT
rows with whole dot products, then all-gather the outputs: bit-exact with the single-process
ops wherever the BLAS's per-element result does not depend on the column split (true at every
tiny/small shape tested). Same weight bytes per rank, two all-gathers instead of one
all-reduce. The engine layout (exact=False) is what emulate.py times.
Legend: B batch, T cached length, H heads, C latent 512, R rope 64, D hidden, E experts,
I expert FFN width, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.config import INT4_GROUP, ModelConfig

PACK = 8  # int4 values per int32 word (reference/int4.py)


class LayoutError(ValueError):
    """A layout does not divide the model; the message names the field, the split and the fix."""


@dataclass(frozen=True)
class Layout:
    world: int
    rank: int
    tp: int  # MoE width split (attention, dense, shared, LM head always split over `world`)
    ep: int  # MoE expert groups
    exact: bool = False  # row-parallel layers keep whole dot products (see EXACT below)

    @classmethod
    def make(cls, world: int, rank: int = 0, tp: int | None = None, ep: int | None = None,
             exact: bool = False):
        """Fill the missing one of tp/ep so tp * ep == world (neither given: tp = world)."""
        if world < 1 or not 0 <= rank < world:
            raise LayoutError(f"world/rank: expected world >= 1 and 0 <= rank < world, got "
                              f"world={world}, rank={rank}")
        if tp is None and ep is None:
            tp = world
        if tp is None:
            tp = world // ep if ep and world % ep == 0 else 0
        if ep is None:
            ep = world // tp if tp and world % tp == 0 else 0
        if tp < 1 or ep < 1 or tp * ep != world:
            raise LayoutError(f"tp x ep: expected tp * ep == world size {world}, got tp={tp}, "
                              f"ep={ep}")
        return cls(world, rank, tp, ep, exact)

    @classmethod
    def named(cls, name: str, world: int, rank: int = 0, exact: bool = False):
        """The layout the emulation's names give (`tpN`, `epN`, `epAxtpB`): `make`'s tp / ep."""
        return cls.make(world, rank, exact=exact,
                        **{part[:2]: int(part[2:]) for part in name.lower().split("x")})

    @property
    def name(self) -> str:
        if self.world == 1:
            return "single"
        if self.ep == 1:
            return f"TP{self.tp}"
        return f"EP{self.ep}" if self.tp == 1 else f"EP{self.ep}xTP{self.tp}"

    @property
    def group(self) -> int:  # this rank's expert group
        return self.rank // self.tp

    @property
    def slice(self) -> int:  # this rank's width slice inside its group
        return self.rank % self.tp

    # -- ranges this rank holds (start, stop) -------------------------------------------------
    def heads(self, cfg: ModelConfig) -> tuple[int, int]:
        h = cfg.num_heads // self.world
        return self.rank * h, (self.rank + 1) * h

    def experts(self, cfg: ModelConfig) -> tuple[int, int]:
        e = cfg.n_routed_experts // self.ep
        return self.group * e, (self.group + 1) * e

    def width(self, cfg: ModelConfig) -> tuple[int, int]:
        i = cfg.moe_intermediate // self.tp
        return self.slice * i, (self.slice + 1) * i

    def vocab(self, cfg: ModelConfig) -> tuple[int, int]:
        v = cfg.vocab_size // self.world
        return self.rank * v, (self.rank + 1) * v

    def rows_exact(self, cfg: ModelConfig, parts: int) -> tuple[int, int]:
        """Exact mode: this rank's slice of D output rows (o_proj, down_proj), `parts` ways."""
        d = cfg.hidden_size // parts
        r = self.rank % parts
        return r * d, (r + 1) * d

    @property
    def moe_exact(self) -> bool:
        """Exact mode with a width split (tp > 1): expert down_proj split by output rows (pure
        EP keeps experts whole and is exact as it is)."""
        return self.exact and self.tp > 1

    def dense_cols(self, width: int) -> tuple[int, int]:
        """A TP-over-world slice of a bf16 FFN width (dense layer, shared expert)."""
        f = width // self.world
        return self.rank * f, (self.rank + 1) * f

    def check(self, cfg: ModelConfig) -> None:
        """Raise LayoutError naming the first field the layout does not divide."""
        w, tp, ep = self.world, self.tp, self.ep
        need = [
            ("num_heads", cfg.num_heads, w, "attention heads split over all ranks"),
            ("vocab_size", cfg.vocab_size, w, "vocab-parallel LM head (no padding rows)"),
            ("dense_intermediate", cfg.dense_intermediate, w, "dense layer TP"),
            ("moe_intermediate * n_shared_experts", cfg.moe_intermediate * cfg.n_shared_experts,
             w, "shared-expert TP"),
            ("n_routed_experts", cfg.n_routed_experts, ep, f"EP{ep} expert groups"),
        ]
        if self.exact:
            need.append(("hidden_size", cfg.hidden_size, w, "exact mode: o_proj / dense and "
                         "shared down_proj split by output rows"))
        if self.moe_exact:
            need += [("moe_intermediate", cfg.moe_intermediate, tp, f"MoE TP{tp} gate/up rows"),
                     ("hidden_size", cfg.hidden_size, tp, "exact MoE-TP: down_proj rows")]
        else:
            need.append(("moe_intermediate", cfg.moe_intermediate, tp * INT4_GROUP,
                         f"MoE TP{tp}: each rank's slice of the expert width is the input dim "
                         f"of down_proj, whose INT4 groups of {INT4_GROUP} must stay whole"))
        for field, value, div, why in need:
            if value % div:
                raise LayoutError(f"{field}={value} is not a multiple of {div} ({why}) under "
                                  f"{self.name} on {w} ranks; pick a layout that divides it")


# -- sharding a full state dict, one tensor at a time ------------------------------------------
def _suffix(name: str) -> str:
    """'model.layers.3.self_attn.o_proj.weight' -> 'self_attn.o_proj.weight'."""
    parts = name.split(".")
    return ".".join(parts[3:]) if name.startswith("model.layers.") else name


def shard_tensor(name: str, t: torch.Tensor, cfg: ModelConfig, lay: Layout) -> torch.Tensor:
    """This rank's slice of full tensor `name` (checkpoint/in-memory name); a view, not a copy."""
    s = _suffix(name)
    H, dn, dv, C = cfg.num_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    h0, h1 = lay.heads(cfg)
    if s == "self_attn.q_b_proj.weight":  # [H*(dn+R), q_lora] rows by head
        return t.view(H, cfg.qk_head_dim, -1)[h0:h1].flatten(0, 1)
    if s == "self_attn.kv_b_proj.weight":  # [H*(dn+dv), C] rows by head
        return t.view(H, dn + dv, C)[h0:h1].flatten(0, 1)
    if s == "self_attn.o_proj.weight":  # [D, H*dv] columns by head (exact: D rows)
        if lay.exact:
            d0, d1 = lay.rows_exact(cfg, lay.world)
            return t[d0:d1]
        return t.view(t.shape[0], H, dv)[:, h0:h1].flatten(1, 2)
    if s.startswith("mlp.experts."):  # [E, out, in/8 | in/32]
        e0, e1 = lay.experts(cfg)
        i0, i1 = lay.width(cfg)
        t = t[e0:e1]
        if s.startswith("mlp.experts.down_") and lay.moe_exact:  # D rows, whole I
            d0, d1 = lay.rows_exact(cfg, lay.tp)
            return t[:, d0:d1]
        if s.startswith("mlp.experts.down_"):  # input dim = I: whole packed words / groups
            per = PACK if s.endswith("_packed") else INT4_GROUP
            return t[:, :, i0 // per : i1 // per]
        return t[:, i0:i1]  # gate/up: output rows = I
    if s.endswith(("gate_proj.weight", "up_proj.weight")):  # dense or shared, rows
        f0, f1 = lay.dense_cols(t.shape[0])
        return t[f0:f1]
    if s.endswith("down_proj.weight") and lay.exact:
        d0, d1 = lay.rows_exact(cfg, lay.world)
        return t[d0:d1]
    if s.endswith("down_proj.weight"):
        f0, f1 = lay.dense_cols(t.shape[1])
        return t[:, f0:f1]
    if name == "lm_head.weight":
        v0, v1 = lay.vocab(cfg)
        return t[v0:v1]
    return t  # norms, q_a / kv_a, router, embedding: replicated


def shard_state(state: dict, cfg: ModelConfig, lay: Layout) -> dict:
    return {k: shard_tensor(k, v, cfg, lay) for k, v in state.items()}


# -- costs this layout pays -----------------------------------------------------------------------
def latent_cache_bytes(cfg: ModelConfig, batch: int, tokens: int, layers: int | None = None,
                       bytes_per_value: int = 2) -> int:
    """Bytes of one rank's latent cache [layers, B, T, C+R]: the SAME on every rank (replicated),
    so the world holds `world` times this; a head-split KV would hold it once."""
    n = cfg.num_layers if layers is None else layers
    return n * batch * tokens * cfg.latent_dim * bytes_per_value


def rank_weight_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
