"""Roofline floors of one emulated rank's step, by phase and by registry op.

A floor is max(bytes / copy bandwidth, FLOPs / bf16 peak): what the step's data must cost
at the card's measured ceilings. `rank_terms` splits the step's (bytes, FLOPs) by phase and,
inside a phase, by the registry op that reads them (the op table's names, so the op table can
show each op's time next to its floor); `price_phases` prices each phase's sum (the #12
bar's floor), `price_ops` each op's own (summed over phases: the LM head runs in the verify
and in the draft). Every byte of a phase belongs to exactly one op, so the phases' sums are the
op terms' sums.

Bytes counted (loopbench.phase_floors' rules on the shard):
- verify: the shard's dense weights by the op that reads them (linear: q_a, kv_a, q_b, o;
  mla_q_absorb / mla_v_up: kv_b's W_UK / W_UV rows; swiglu_mlp: the dense MLP and shared
  experts; moe_route: the router; rmsnorm: every norm's weight; "(other)": anything else), the
  LOCAL experts the step's routing touches (int4_moe: each read once), the LM-head shard and
  the logits (lm_head), the whole latent cache (tree_mla: replicated, every rank reads it).
- draft (DDTree): the rank's drafter (whole, or its TP shard) and its cached K/V ("(drafter
  body)", the op table's row), the LM-head shard and its logits (lm_head:
  `loopbench.draft_terms`).
- commit: the verify rows' cache writes (mla_kv_write) + the drafter's context weights (fc,
  K/V: drafter_materialize).
FLOPs: 2 x rows x parameters a dense op reads, the attention's rows x prefix x the rank's
heads (`Layout.heads`: num_heads / world under every layout; before session 59 the EP layouts
counted all heads, num_heads / tp, an 8x overcount that only bytes-bound phases hid), the
experts' 2 x (token, expert) pairs x parameters.

    python -m workbench.dist.floors --layers 16 \
        --op-table traces/gpu/session59/call1/emulate_ops_v2.csv.gz \
        [--emulate-csv traces/gpu/session60/call1/emulate_v6_a.csv.gz]

prices every op of the emulated rank on the meta device (`meta_rank`: kimi-k2.6's shapes on a
laptop, `uniform_routing`) beside an op table's µs: op, µs, floor µs, µs over it, x floor;
with an emulate CSV, what the bar leaves the kernels after the modelled comm (`bar_budget`).
"""

from __future__ import annotations

import torch

# a shard's dense parameter -> the registry op that reads it (the first part its name holds;
# "mlp." after the router: the dense layer's MLP and the shared experts)
_OP_OF = (("layernorm", "rmsnorm"), ("model.norm.", "rmsnorm"), ("self_attn.kv_b_proj", "kv_b"),
          ("self_attn.", "linear"), ("mlp.gate.", "moe_route"), ("mlp.", "swiglu_mlp"))


def _op_of(name: str) -> str:
    return next((op for part, op in _OP_OF if part in name), "(other)")


def _add(terms: dict, op: str, b: float, f: float) -> None:
    """terms[op] += (bytes b, FLOPs f)."""
    acc = terms.setdefault(op, [0.0, 0.0])
    acc[0] += b
    acc[1] += f


def rank_terms(model, drafter, C: int, budget: int | None, ctx: int,
               routing: list[torch.Tensor]) -> dict[str, dict[str, tuple[float, float]]]:
    """{phase: {op: (bytes, FLOPs)}} of this rank's step (module docstring). routing: [B, N,
    K] global expert ids per MoE layer (EP: ids in this rank's range count, each once)."""
    from workbench.loopbench import draft_terms

    cfg, lay = model.cfg, model.layout
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    N = 1 if budget is None else budget + 1
    rows = C * N
    verify: dict[str, list[float]] = {}

    dn, dv = cfg.qk_nope_dim, cfg.v_head_dim
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "embed_tokens" in name or name.startswith("lm_head") or ".mlp.experts." in name:
            continue
        op, b, p = _op_of(name), nb(t), t.numel()
        if op == "kv_b":  # [H (dn + dv), C]: W_UK rows feed the absorption, W_UV the up-proj
            uk = dn / (dn + dv)
            _add(verify, "mla_q_absorb", b * uk, 2 * rows * p * uk)
            _add(verify, "mla_v_up", b * (1 - uk), 2 * rows * p * (1 - uk))
        else:
            _add(verify, op, b, 2 * rows * p)
    e0, e1 = lay.experts(cfg)
    moe = [m.mlp.experts for m in model.model.layers.values() if m.is_moe]
    if moe:
        exp_b = sum(nb(b) for b in moe[0].buffers()) / (e1 - e0)
        exp_p = sum(b.numel() * 8 for n, b in moe[0].named_buffers()
                    if n.endswith("_packed")) / (e1 - e0)
        touched = pairs = 0
        for ids in routing:
            mine = ids[(ids >= e0) & (ids < e1)]
            touched += mine.unique().numel()
            pairs += mine.numel()
        _add(verify, "int4_moe", touched * exp_b, 2 * pairs * exp_p)
    head = model.lm_head_shard.weight
    _add(verify, "lm_head", nb(head) + rows * head.shape[0] * 4, 2 * rows * head.numel())
    h0, h1 = lay.heads(cfg)  # the attention's heads are split over every rank (EP too)
    layers, lat = len(model.layer_ids), cfg.latent_dim
    attn = 2 * (h1 - h0) * ctx * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim) * layers  # FLOPs a row
    _add(verify, "tree_mla", layers * C * ctx * lat * 2, rows * attn)
    out = {"verify": {op: tuple(v) for op, v in verify.items()}}
    if budget is not None:
        d, dm = drafter.cfg, drafter.drafter
        dp = list(dm.named_parameters())
        w_b, w_p = sum(nb(t) for _, t in dp), sum(t.numel() for _, t in dp)
        whole = draft_terms(d, C, ctx, w_b, w_p, nb(head), head.numel(), head.shape[0])
        body = draft_terms(d, C, ctx, w_b, w_p, 0, 0, 0)  # the same without the head
        out["draft"] = {"(drafter body)": body,
                        "lm_head": (whole[0] - body[0], whole[1] - body[1])}
        ctx_w = sum(nb(t) for n, t in dp if n.startswith("fc.") or "k_proj" in n
                    or "v_proj" in n)
        out["commit"] = {"mla_kv_write": (2 * layers * rows * lat * 2, 0.0),
                         "drafter_materialize": (ctx_w, 0.0)}
    return out


def _price(b: float, f: float, bw_tbs: float | None, tflops: float | None) -> float:
    from workbench.loopbench import H200_BF16_TFLOPS, H200_COPY_TBS

    return max(b / ((bw_tbs or H200_COPY_TBS) * 1e12), f / ((tflops or H200_BF16_TFLOPS) * 1e12))


def price_phases(terms: dict, bw_tbs: float | None = None, tflops: float | None = None) -> dict:
    """{phase: floor seconds} from `rank_terms`: each phase's (bytes, FLOPs) summed over its
    ops, priced at bw_tbs copy TB/s and tflops bf16 TFLOP/s (default the H200's measured
    ceilings)."""
    return {p: _price(sum(b for b, _ in ops_.values()), sum(f for _, f in ops_.values()),
                      bw_tbs, tflops) for p, ops_ in terms.items()}


def price_ops(terms: dict, bw_tbs: float | None = None, tflops: float | None = None) -> dict:
    """{op: floor seconds} from `rank_terms`: each op's bytes and FLOPs summed over the phases,
    then priced (an op's floor, not a share of its phase's)."""
    per: dict[str, list[float]] = {}
    for ops_ in terms.values():
        for op, (b, f) in ops_.items():
            _add(per, op, b, f)
    return {op: _price(b, f, bw_tbs, tflops) for op, (b, f) in per.items()}


def meta_rank(preset: str, layout: str, layers: int | None = None, drafter_layout: str = "tp",
              world: int = 8):
    """(model, drafter) of rank 0 of `layout` (emulate's names: tp8, ep8, ep4xtp2) on the meta
    device: every shape of the emulated rank, no memory (a laptop prices kimi-k2.6's)."""
    from workbench.config import ModelConfig
    from workbench.reference.drafter import empty_drafter

    from .decode import dist_config
    from .drafter import make_dist_drafter
    from .layout import Layout
    from .model import empty_dist_model

    cfg = dist_config(ModelConfig.preset(preset))
    if layers is not None:
        cfg = cfg.first_layers(layers)
    model = empty_dist_model(cfg, Layout.named(layout, world), None, "meta")
    return model, make_dist_drafter(empty_drafter(cfg.drafter, "meta"), model, drafter_layout)


def uniform_routing(model, C: int, N: int, seed: int = 0) -> list[torch.Tensor]:
    """[C, N, top-k] expert ids per MoE layer, each row's k distinct and uniform (what the
    emulation's random router gives, near enough for a floor)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    n = sum(m.is_moe for m in model.model.layers.values())
    return [torch.rand(C * N, cfg.n_routed_experts, generator=g).argsort(-1)[
        :, : cfg.n_experts_per_tok].view(C, N, -1) for _ in range(n)]


BAR_X = 1.3  # #12's bar: the step within 1.3x its phases' floor sum (C 1, DDTree-16)


def bar_budget(rows, x: float = BAR_X, alpha_us: float | None = None):
    """What #12's bar leaves the kernels: for each row of an emulate CSV (a DataFrame with
    layout, link, C, mode, floor_ms, comm_ms, collectives, kernel_ms), the bar's step (x
    floor_ms), the kernel time it allows once the link's modelled collectives are paid (x floor
    - comm: the floors hold no communication, the step does), that budget over the floor, and
    the cut the measured kernels need. alpha_us: re-price each collective's latency term at
    this many µs instead of its link's (`emulate.LINKS`' alpha_us; the bytes term stays): a
    what-if of the model, not a measurement. Why (session 60): at C 1 DDTree-16 the NVLink4
    model's 48 collectives cost 0.54 ms against a 1.85 ms floor, so the bar's 30 % slack is
    the comm alone: the kernels would have to run AT their floors, unless the collectives get
    cheaper or overlap compute."""
    import pandas as pd

    from .emulate import NVLINK4, PCIE5

    t = pd.DataFrame(rows)[["layout", "link", "C", "mode", "floor_ms", "comm_ms",
                            "collectives", "kernel_ms"]].copy()
    if alpha_us is not None:
        model = {link.name: link.alpha_us for link in (NVLINK4, PCIE5)}
        unknown = sorted(set(t.link) - set(model))
        if unknown:
            raise ValueError(f"alpha_us: re-prices the links {sorted(model)}; the rows also "
                             f"hold {unknown}")
        t["comm_ms"] = t.comm_ms - t.collectives * (t.link.map(model) - alpha_us) * 1e-3
        t["alpha_us"] = alpha_us
    t["bar_ms"] = x * t.floor_ms
    t["kernel_budget_ms"] = t.bar_ms - t.comm_ms
    t["budget_x_floor"] = t.kernel_budget_ms / t.floor_ms
    t["cut_ms"] = (t.kernel_ms - t.kernel_budget_ms).clip(lower=0)
    return t


def main(argv=None) -> int:
    """Each registry op's floor for emulated configurations, beside an op table's times."""
    import argparse
    import math

    import pandas as pd

    p = argparse.ArgumentParser(prog="python -m workbench.dist.floors",
                                description="Roofline floors of an emulated rank's step by "
                                "registry op (meta-device shapes, uniform routing), beside the "
                                "times of an emulate --op-table CSV if given.")
    p.add_argument("--preset", default="kimi-k2.6")
    p.add_argument("--layout", default="ep8")
    p.add_argument("--layers", type=int, help="the preset's first N target layers (emulate's)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--budgets", default="ar,16")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--bw-tbs", type=float, help="copy TB/s (default the H200's)")
    p.add_argument("--tflops", type=float, help="bf16 TFLOP/s (default the H200's)")
    p.add_argument("--op-table", help="an emulate --op-table CSV: its µs beside the floors")
    p.add_argument("--csv", help="write the table here")
    p.add_argument("--emulate-csv", help="an emulate --csv: print what the 1.3x bar leaves its "
                   "rows' kernels once the modelled comm is paid (`bar_budget`)")
    p.add_argument("--alpha-us", default="",
                   help="with --emulate-csv: also re-price each collective's latency at these "
                   "µs (comma-separated; a what-if of the link model)")
    a = p.parse_args(argv)
    if a.emulate_csv:
        e = pd.read_csv(a.emulate_csv)
        for alpha in [None] + [float(v) for v in a.alpha_us.split(",") if v]:
            print(bar_budget(e, alpha_us=alpha).to_string(
                index=False, float_format=lambda v: f"{v:.3f}"))
    model, drafter = meta_rank(a.preset, a.layout, a.layers)
    times = pd.read_csv(a.op_table) if a.op_table else None
    rows = []
    for C in (int(x) for x in a.batches.split(",")):
        for bud in (None if x == "ar" else int(x) for x in a.budgets.split(",")):
            N, mode = (1, "AR") if bud is None else (bud + 1, f"DDTree-{bud}")
            terms = rank_terms(model, drafter, C, bud, a.ctx, uniform_routing(model, C, N))
            floor = price_ops(terms, a.bw_tbs, a.tflops)
            us = {}
            if times is not None:
                t = times[(times.C == C) & (times["mode"] == mode)]
                us = dict(zip(t.op, t.us))
            for op in sorted(set(floor) | set(us), key=lambda o: -us.get(o, floor.get(o, 0))):
                f = floor.get(op, math.nan) * 1e6
                u = us.get(op, math.nan)
                rows.append({"C": C, "mode": mode, "op": op, "us": u, "floor_us": f,
                             "over_us": u - (0 if math.isnan(f) else f),
                             "x_floor": u / f if f > 0 else math.nan})
            ph = price_phases(terms, a.bw_tbs, a.tflops)
            print(f"C {C} {mode}: phase floors " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                                          for k, v in ph.items()))
    df = pd.DataFrame(rows)
    if a.csv:
        df.to_csv(a.csv, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
