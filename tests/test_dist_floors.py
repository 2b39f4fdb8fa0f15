"""workbench/dist/floors.py: the emulated rank's roofline terms by phase and by registry op."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import ModelConfig
from workbench.dist.drafter import make_dist_drafter
from workbench.dist.emulate import rank_model
from workbench.dist.floors import price_ops, price_phases, rank_terms
from workbench.reference.drafter import build_drafter


@pytest.fixture(scope="module")
def ep8_rank():
    cfg = ModelConfig.preset("tiny-dist")
    model, _ = rank_model(cfg, "ep8")
    full = build_drafter(model.cfg, seed=0)
    return model, make_dist_drafter(full, model, "tp")


def _routing(model, C, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    moe_layers = sum(m.is_moe for m in model.model.layers.values())
    return [torch.randint(0, cfg.n_routed_experts, (C, N, cfg.n_experts_per_tok), generator=g)
            for _ in range(moe_layers)]


def _nb(t):
    return t.numel() * t.element_size()


def test_every_byte_of_the_verify_belongs_to_one_op(ep8_rank):
    """The verify's op terms sum to the phase's bytes and FLOPs counted directly (the shard's
    non-expert weights, the touched local experts, the LM-head shard and logits, the latent
    cache); every dense weight of the shard is charged to a named op, none to "(other)"."""
    model, drafter = ep8_rank
    cfg, lay = model.cfg, model.layout
    C, budget, ctx = 2, 8, 40
    routing = _routing(model, C, budget + 1)
    terms = rank_terms(model, drafter, C, budget, ctx, routing)
    assert set(terms) == {"verify", "draft", "commit"}
    verify = terms["verify"]
    assert "(other)" not in verify
    assert {"linear", "mla_q_absorb", "mla_v_up", "rmsnorm", "moe_route", "swiglu_mlp",
            "int4_moe", "lm_head", "tree_mla"} <= set(verify)
    dense = sum(_nb(t) for n, t in list(model.named_parameters()) + list(model.named_buffers())
                if not ("embed_tokens" in n or n.startswith("lm_head") or ".mlp.experts." in n))
    e0, e1 = lay.experts(cfg)
    moe = [m.mlp.experts for m in model.model.layers.values() if m.is_moe]
    per_expert = sum(_nb(b) for b in moe[0].buffers()) / (e1 - e0)
    touched = sum(ids[(ids >= e0) & (ids < e1)].unique().numel() for ids in routing)
    head = model.lm_head_shard.weight
    rows, layers = C * (budget + 1), len(model.layer_ids)
    want = (dense + touched * per_expert + _nb(head) + rows * head.shape[0] * 4
            + layers * C * ctx * cfg.latent_dim * 2)
    assert sum(b for b, _ in verify.values()) == pytest.approx(want)
    assert verify["int4_moe"][0] == pytest.approx(touched * per_expert)
    # the attention's FLOPs on the rank's own heads (num_heads / world under EP as under TP)
    h = model.model.layers[str(model.layer_ids[0])].self_attn.q_b_proj.weight.shape[0] \
        // cfg.qk_head_dim
    assert h == cfg.num_heads // lay.world
    assert verify["tree_mla"][1] == pytest.approx(
        rows * 2 * h * ctx * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim) * layers)
    # kv_b's rows split between the absorption (W_UK) and the up-projection (W_UV)
    kvb = sum(_nb(t) for n, t in model.named_parameters() if "kv_b_proj" in n)
    assert verify["mla_q_absorb"][0] + verify["mla_v_up"][0] == pytest.approx(kvb)
    assert verify["mla_q_absorb"][0] == pytest.approx(
        kvb * cfg.qk_nope_dim / (cfg.qk_nope_dim + cfg.v_head_dim))


def test_phase_and_op_prices(ep8_rank):
    """A phase's floor prices its ops' summed terms; an op's floor its own terms summed over
    the phases (the LM head: verify + draft); both scale with the card's copy speed when
    bytes bind; AR has the verify alone."""
    model, drafter = ep8_rank
    routing = _routing(model, 1, 17, seed=3)
    terms = rank_terms(model, drafter, 1, 16, 64, routing)
    phases, ops_ = price_phases(terms), price_ops(terms)
    for p, per in terms.items():
        b = sum(v[0] for v in per.values())
        f = sum(v[1] for v in per.values())
        assert phases[p] == pytest.approx(max(b / 4.26e12, f / 989e12))
    head_b = terms["verify"]["lm_head"][0] + terms["draft"]["lm_head"][0]
    head_f = terms["verify"]["lm_head"][1] + terms["draft"]["lm_head"][1]
    assert ops_["lm_head"] == pytest.approx(max(head_b / 4.26e12, head_f / 989e12))
    assert ops_["(drafter body)"] > 0 and ops_["drafter_materialize"] > 0
    half = price_ops(terms, bw_tbs=2.13)
    bytes_bound = [op for op, (b, f) in terms["verify"].items() if b / 4.26e12 > f / 989e12
                   and op != "lm_head"]  # bound by bytes on both cards (verify-only ops)
    assert "int4_moe" in bytes_bound
    for op in bytes_bound:
        assert half[op] == pytest.approx(2 * ops_[op])
    ar = rank_terms(model, drafter, 1, None, 64, _routing(model, 1, 1))
    assert set(ar) == {"verify"}
    assert math.isfinite(sum(price_phases(ar).values()))


def test_floors_cli_puts_an_op_tables_times_beside_the_floors(tmp_path):
    """`python -m workbench.dist.floors`: the meta-device rank's floors by op for each
    configuration, an op table's µs beside them (x_floor = µs / floor), ops without a floor
    (glue) and floors without a time both listed."""
    import pandas as pd

    from workbench.dist.floors import main, meta_rank, uniform_routing

    ops_csv, out = tmp_path / "ops.csv", tmp_path / "floors.csv"
    pd.DataFrame({"layout": "EP8", "C": [1, 1, 1], "mode": "DDTree-4",
                  "op": ["int4_moe", "(glue)", "linear"], "calls": [5, 0, 18],
                  "us": [400.0, 50.0, 90.0]}).to_csv(ops_csv, index=False)
    assert main(["--preset", "tiny-dist", "--batches", "1", "--budgets", "ar,4", "--ctx", "64",
                 "--op-table", str(ops_csv), "--csv", str(out)]) == 0
    t = pd.read_csv(out)
    assert set(t["mode"]) == {"AR", "DDTree-4"}
    dd = t[t["mode"] == "DDTree-4"].set_index("op")
    assert dd.loc["int4_moe", "us"] == 400.0 and dd.loc["int4_moe", "floor_us"] > 0
    assert dd.loc["int4_moe", "x_floor"] == pytest.approx(400.0 / dd.loc["int4_moe", "floor_us"])
    assert math.isnan(dd.loc["(glue)", "floor_us"]) and dd.loc["(glue)", "over_us"] == 50.0
    assert math.isnan(dd.loc["tree_mla", "us"]) and dd.loc["tree_mla", "floor_us"] > 0
    # the meta rank holds the emulated shapes without memory; routing rows pick distinct experts
    from workbench.dist.layout import Layout

    lay = Layout.named("ep4xtp2", 8, rank=3)  # emulate's layout names, shared with rank_model
    assert (lay.ep, lay.tp, lay.rank) == (4, 2, 3) and Layout.named("tp8", 8).tp == 8
    model, _ = meta_rank("tiny-dist", "ep8")
    assert next(model.parameters()).device.type == "meta"
    r = uniform_routing(model, 2, 3)[0]
    assert r.shape == (2, 3, model.cfg.n_experts_per_tok)
    assert all(len(set(row.tolist())) == r.shape[-1] for row in r.view(-1, r.shape[-1]))


def test_bar_budget_pays_the_modelled_comm_out_of_the_bars_slack(tmp_path, capsys):
    """#12's bar allows 1.3x the floor sum for kernels AND comm: what is left for the kernels,
    and the cut the measured kernels need (none when they are under the budget)."""
    import pandas as pd

    from workbench.dist.floors import BAR_X, bar_budget, main

    rows = pd.DataFrame({"layout": "EP8", "link": ["NVLink4", "PCIe5x16", "NVLink4"],
                         "C": [1, 1, 8], "mode": "DDTree-16", "floor_ms": [2.0, 2.0, 4.0],
                         "comm_ms": [0.5, 1.5, 0.2], "collectives": [40, 40, 10],
                         "kernel_ms": [4.0, 4.0, 4.0], "graph_replay_ms": 9.9})
    t = bar_budget(rows)
    assert BAR_X == 1.3 and list(t.bar_ms) == pytest.approx([2.6, 2.6, 5.2])
    assert list(t.kernel_budget_ms) == pytest.approx([2.1, 1.1, 5.0])
    assert list(t.budget_x_floor) == pytest.approx([1.05, 0.55, 1.25])
    assert list(t.cut_ms) == pytest.approx([1.9, 2.9, 0.0])  # C 8: under budget, no cut
    # a what-if latency: each collective's alpha re-priced (NVLink4 10 -> 5 µs, PCIe 20 -> 5)
    w = bar_budget(rows, alpha_us=5.0)
    assert list(w.comm_ms) == pytest.approx([0.3, 0.9, 0.15])
    assert list(w.kernel_budget_ms) == pytest.approx([2.3, 1.7, 5.05])
    with pytest.raises(ValueError, match="alpha_us: re-prices the links"):
        bar_budget(rows.assign(link="mine"), alpha_us=5.0)
    csv = tmp_path / "emulate.csv"
    rows.to_csv(csv, index=False)
    assert main(["--preset", "tiny-dist", "--batches", "1", "--budgets", "ar", "--ctx", "64",
                 "--emulate-csv", str(csv), "--alpha-us", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("kernel_budget_ms") == 2 and "alpha_us" in out
