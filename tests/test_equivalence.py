"""The registry-driven equivalence suite, and proof that the checker catches what it claims to.

Registering a variant is enough to get it tested here: every op x every variant x the op's EDGE
cases goes through `workbench.check.check` (fresh seeds each run; a failure prints them).
Variants that need a GPU carry the `gpu` marker (skipped on CPU); Triton variants run on CPU
under the interpreter, numba ones under the simulator (conftest.py sets both up).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from workbench import ModelConfig, ops
from workbench.check import check, check_main, compare_outputs, failures
from workbench.ops import registry
from workbench.ops.case import Case
from workbench.ops.cases import GENERATORS, HARNESS, ROOFLINES, Harness
from workbench.reference.int4 import dequant_int4_g32
from workbench.reference.layers import rmsnorm
from workbench.reference.tree_mla import _valid_rows, visible_mask

GPU_NEEDS = {"cuda", "sm90", "cupy"}  # cupy imports on CPU but every launch raises


def _params():
    # each kernel folder's BEST and the engine's picks for the supporting ops (kernels/dense)
    best = ops.PRESETS["engine"]
    portable = ops.PORTABLE  # what the preset runs where its pick needs absent hardware
    for op in ops.list_ops():
        for name, v in ops.op_spec(op).variants.items():
            marks = [pytest.mark.gpu] if GPU_NEEDS & set(v.needs) else []
            # Triton variants run in the interpreter (slow on CPU): the default run checks the
            # version a preset selects; earlier and experimental versions run with
            # `-m extended` (their own kernel test files cover them too)
            if "triton" in v.needs and name not in (best.get(op), portable.get(op)):
                marks.append(pytest.mark.extended)
            if op == "drafter" and "triton" in v.needs:
                marks.append(pytest.mark.slow)  # ~40 s in the interpreter: scheduled first
            yield pytest.param(op, name, marks=marks, id=f"{op}-{name}")


@pytest.mark.parametrize("op, variant", list(_params()))
def test_variant_matches_reference_on_edge_cases(op, variant, device):
    reason = ops.op_spec(op).variant(variant).unavailable_reason()
    if reason:
        pytest.skip(reason)
    df = check(op, variant, shapes="edge", device=device)
    assert len(df) == 2 * len(ops.op_spec(op).make_inputs("edge", 0, device=device))
    assert df["pass"].all(), failures(df)


# -- the generators: hostile EDGE cases, REAL derived from the config, rooflines --------------
@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_edge_cases_are_small_hostile_and_explained(op):
    cases = GENERATORS[op]("edge", 0)
    assert len({c.label for c in cases}) == len(cases), "labels are the readable test ids"
    assert all(c.why and c.kind == "edge" and c.op == op for c in cases)
    tensors = [a for c in cases for a in (*c.args, *c.kwargs.values())
               if isinstance(a, torch.Tensor)]
    assert max(max(t.shape, default=1) for t in tensors) <= 256  # interpreter-sized
    assert any(not t.is_contiguous() for t in tensors), "one non-contiguous input per op"
    again = GENERATORS[op]("edge", 0)  # seeded: the same seed, the same inputs
    assert all(torch.equal(a, b) or (a.isnan() == b.isnan()).all()
               for c, d in zip(cases, again, strict=True)
               for a, b in zip(c.args, d.args, strict=True) if isinstance(a, torch.Tensor))


def test_cache_slots_past_the_valid_length_hold_nan():
    for c in GENERATORS["tree_mla"]("edge", 1):
        q, cache, P = c.args[:3]
        for b in range(cache.shape[0]):
            assert cache[b, int(P[b]) + q.shape[1]:].isnan().all()
            assert not cache[b, : int(P[b]) + q.shape[1]].isnan().any()
    for c in GENERATORS["drafter"]("edge", 1):
        cache, start = c.args[2], c.args[4]
        for b, p in enumerate(start.tolist()):
            assert cache.k[:, b, p:].isnan().all() and not cache.k[:, b, :p].isnan().any()


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_real_cases_follow_the_config(op):
    tiny = ModelConfig.preset("tiny")
    cases = GENERATORS[op]("real", 0, cfg=tiny)
    assert cases and all(c.kind == "real" for c in cases)
    dims = [c.dims for c in cases]
    want = {"int4_moe": ("D", tiny.hidden_size), "tree_mla": ("C", tiny.kv_lora_rank),
            "tree_build": ("L", tiny.drafter.depth), "drafter": ("V", tiny.vocab_size),
            "moe_route": ("E", tiny.n_routed_experts), "lm_head": ("V", tiny.vocab_size),
            "swiglu_mlp": ("D", tiny.hidden_size)}.get(op)
    if want:
        assert all(d[want[0]] == want[1] for d in dims)
    for c in cases:
        r = ROOFLINES[op](c)
        assert isinstance(r["bytes"], int) and isinstance(r["flops"], int) and r["bytes"] > 0


def test_real_int4_moe_trims_experts_only_when_asked():
    tiny = ModelConfig.preset("tiny")
    assert {c.dims["E"] for c in GENERATORS["int4_moe"]("real", 0, cfg=tiny)} == {16}
    trimmed = GENERATORS["int4_moe"]("real", 0, cfg=tiny, max_experts=5)
    assert {c.args[3].num_experts for c in trimmed} == {5}
    assert max(int(c.args[1].max()) for c in trimmed) < 5


def test_rooflines_reproduce_the_design_numbers():
    k = ModelConfig.preset("kimi-k2.6")
    moe = dict(D=k.hidden_size, I=k.moe_intermediate, E=384, K=8)
    for T, touched, gb in ((1, 8, 0.198), (9, 66, 1.64), (33, 192, 4.76), (128, 384, 9.5)):
        r = ROOFLINES["int4_moe"](Case("int4_moe", "", (), dims=moe | dict(T=T, E_touched=touched)))
        assert r["bytes"] / 1e9 == pytest.approx(gb, rel=0.01)  # DESIGN.md §6: touched experts
    mla = dict(B=1, N=33, H=64, C=512, R=64, T=8192 + 36, P_sum=8192, W=1)
    r = ROOFLINES["tree_mla"](Case("tree_mla", "", (), dims=mla))
    assert r["flops"] / 1e9 == pytest.approx(37.8, rel=0.01)  # budget 32, ctx 8k, 64 heads
    d = k.drafter
    dr = dict(B=1, L=d.depth, k=8, P_sum=0, D=d.hidden_size, V=k.vocab_size, layers=d.num_layers,
              Hq=d.num_heads, Hkv=d.num_kv_heads, d=d.head_dim, F=d.intermediate_size)
    r = ROOFLINES["drafter"](Case("drafter", "", (), dims=dr))
    assert r["bytes"] / 1e9 == pytest.approx(8.69, rel=0.01)  # drafter + LM head at bs 1


HEAVY_REAL = {"drafter", "tree_walk"}  # 35-45 s each on two cores: `slow`, scheduled first


@pytest.mark.parametrize("op", [pytest.param(op, marks=[pytest.mark.slow] * (op in HEAVY_REAL))
                                for op in sorted(GENERATORS)])
def test_reference_passes_real_cases_at_tiny_widths(op):
    df = check(op, shapes="real", cfg="tiny", seeds=1)
    assert df["pass"].all(), failures(df)


@pytest.mark.slow
@pytest.mark.parametrize("op, opts", [("tree_build", {}), ("moe_route", {}), ("rmsnorm", {}),
                                      ("linear", {}), ("int4_moe", {"max_experts": 8})])
def test_reference_passes_kimi_real_cases_on_cpu(op, opts):
    # full Kimi widths (int4_moe with 8 of its 384 experts, its T <= 9 cases: the larger T
    # are the GPU's; the float64 reference spends minutes on them on two cores)
    cases = GENERATORS[op]("real", 0, device="cpu", **opts)
    if op == "int4_moe":
        cases = [c for c in cases if c.dims["T"] <= 9]
    df = check(op, cases=cases, device="cpu")
    assert df["pass"].all(), failures(df)


@pytest.fixture
def candidate(monkeypatch):
    """candidate(op, fn) registers `fn` as variant 'candidate' of `op` for this test."""

    def add(op, fn):
        monkeypatch.setitem(ops.op_spec(op).variants, "candidate", ops.Variant("candidate", fn))

    return add


# -- the tolerances admit kernels that round where real kernels do ---------------------------
def _moe_vllm_style(x, ids, w, ex):
    """bf16 SiLU*up into the down GEMM and a bf16 result per slot (vLLM's fused MoE), combine
    summed in one reduction instead of slot by slot."""
    y = torch.zeros(*ids.shape, x.shape[-1])  # [T, K, D]
    for e in ids.unique().tolist():
        if e == -1:  # the slot's expert is not here (EP): nothing
            continue
        t, j = (ids == e).nonzero(as_tuple=True)
        wg, wu, wd = (dequant_int4_g32(p[e], s[e]).float() for p, s in (
            (ex.gate_packed, ex.gate_scale), (ex.up_packed, ex.up_scale),
            (ex.down_packed, ex.down_scale)))
        xf = x[t].float()
        a = (F.silu(xf @ wg.T) * (xf @ wu.T)).to(torch.bfloat16).float()
        y[t, j] = (a @ wd.T).to(torch.bfloat16).float()
    return (w.unsqueeze(-1).float() * y).sum(1).to(x.dtype)


def _mla_flash_style(q, cache, P, anc, scale, C):
    """max-subtracted exp, P rounded to bf16 for the P.V product, normalised afterwards."""
    N = q.shape[1]
    kc = _valid_rows(cache, P, N).float()  # an fp32 kernel's view of the cache
    s = torch.einsum("bnhc,btc->bnht", q.float(), kc) * scale
    s = s.masked_fill(~visible_mask(P, anc, N, kc.shape[1]).unsqueeze(2), -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    o = torch.einsum("bnht,btc->bnhc", p.to(torch.bfloat16).float(), kc[..., :C]) / denom
    return o.to(q.dtype), (m + denom.log()).squeeze(-1)


def _swiglu_bf16_hidden(x, g, u, d):
    a = (F.silu(x.float() @ g.float().T) * (x.float() @ u.float().T)).to(torch.bfloat16)
    return (a.float() @ d.float().T).to(x.dtype)


@pytest.mark.parametrize("op, fn", [("int4_moe", _moe_vllm_style), ("tree_mla", _mla_flash_style),
                                    ("swiglu_mlp", _swiglu_bf16_hidden)],
                         ids=["int4_moe", "tree_mla", "swiglu_mlp"])
@pytest.mark.parametrize("shapes", ["edge", "real"])
def test_tolerances_admit_realistic_rounding(candidate, op, fn, shapes):
    candidate(op, fn)
    df = check(op, "candidate", shapes=shapes, cfg="tiny" if shapes == "real" else None, seeds=2)
    assert df["pass"].all(), failures(df)
    assert (df["max_abs"] > 0).any()  # it did round differently


# -- the checker catches each kind of bug ----------------------------------------------------
def _only_failures(df, tier):
    """The failing rows, after asserting there are some and each failed `tier`."""
    bad = df[~df["pass"]]
    assert len(bad), "the checker missed the bug"
    assert (bad[tier] == "FAIL").all(), bad[[tier, "mismatches"]]
    return bad


def test_catches_one_wrong_element(candidate):
    def one_element_off(x, w, eps):
        y = rmsnorm(x, w, eps)
        y.view(-1)[y.numel() // 2] += 0.5
        return y

    candidate("rmsnorm", one_element_off)
    bad = _only_failures(check("rmsnorm", "candidate", seeds=[3]), "elementwise")
    assert len(bad) == 5  # every case
    first = bad.iloc[0]
    assert first["mismatches"].startswith("out[0, 32]: got ") and "want" in first["mismatches"]
    assert first["nan_inf"] == "pass" and first["inputs"] == "pass"


def test_catches_nan_left_in_an_unwritten_output(candidate):
    def skips_the_last_element(x, w, eps):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # NaN inside the checker
        y.view(-1)[:-1] = rmsnorm(x, w, eps).reshape(-1)[:-1]
        return y

    candidate("rmsnorm", skips_the_last_element)
    bad = _only_failures(check("rmsnorm", "candidate", seeds=[4]), "nan_inf")
    assert "out[0, 63]: nan where the reference is" in bad.iloc[0]["mismatches"]


def test_catches_a_mutated_input(candidate):
    def normalises_in_place(x, w, eps):
        x.copy_(rmsnorm(x, w, eps))
        return x.clone()

    candidate("rmsnorm", normalises_in_place)
    bad = _only_failures(check("rmsnorm", "candidate", seeds=[5]), "inputs")
    assert bad.iloc[0]["elementwise"] == "pass"
    assert bad.iloc[0]["mismatches"].startswith("input x[0, 0] changed: ")


def test_catches_a_tree_differing_in_one_parent(candidate):
    build = ops.op_spec("tree_build").variant(ops.REFERENCE).load()

    def wrong_parent(*a, **kw):
        tree = build(*a, **kw)
        tree.parents[0, -1] = 0 if int(tree.parents[0, -1]) != 0 else -1
        return tree

    candidate("tree_build", wrong_parent)
    bad = _only_failures(check("tree_build", "candidate", seeds=[6]), "bitwise")
    assert len(bad) == len(GENERATORS["tree_build"]("edge", 6))
    assert bad.iloc[0]["mismatches"].startswith("parents[0, 1]: got -1, want 0")


def test_check_main_exits_nonzero_and_names_the_mismatch(candidate, capsys):
    def wrong_route(*a):
        ids, w = ops.op_spec("moe_route").variant(ops.REFERENCE).load()(*a)
        return ids.flip(-1), w

    candidate("moe_route", wrong_route)
    assert check_main(["moe_route", "--variant", "reference", "--seeds", "1"]) == 0
    assert check_main(["moe_route", "--variant", "candidate", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "FAIL T=1 E=7 seed 7: ids[0, 0]: got" in out


def test_drafter_ids_may_swap_only_inside_tie_bands():
    case = Case("drafter", "", (), dims=dict(layers=1, F=64, V=64))
    lp = torch.tensor([[-1.0, -1.0 + 1e-4, -6.0, -9.0]])
    ids = torch.tensor([[3, 7, 9, 11]])
    names = HARNESS["drafter"].outputs
    tie_swap = compare_outputs((lp, ids), (lp, ids[:, [1, 0, 2, 3]]), case, names, {"ids": "logprobs"})
    assert tie_swap["bitwise"] == "pass"
    real_swap = compare_outputs((lp, ids), (lp, ids[:, [0, 2, 1, 3]]), case, names,
                                {"ids": "logprobs"})
    assert real_swap["bitwise"] == "FAIL" and real_swap["mismatches"].startswith("ids[0, 1]")
    lp_tail = torch.tensor([[-1.0, -6.0, -9.0, -9.0]])  # an unseen 5th candidate may tie too
    ids_tail = torch.tensor([[3, 7, 9, 40]])
    new_tail = compare_outputs((lp_tail, ids), (lp_tail, ids_tail), case, names, {"ids": "logprobs"})
    assert new_tail["bitwise"] == "pass"
    new_head = compare_outputs((lp, ids), (lp, torch.tensor([[40, 7, 9, 11]])), case, names,
                               {"ids": "logprobs"})
    assert new_head["bitwise"] == "FAIL"


def test_drafter_logprobs_carry_the_logits_absolute_error():
    # why: at k = 1 the log-probs' own RMS (< 1) made the floor 0.06 while the logits (std 10)
    # carry ~0.07 of bf16 error at one sigma (CI, session 6): the floor is the logits' 6 sigma
    # (atol_abs) wherever that is larger, and a real error still fails
    from workbench.ops.cases import tolerance

    case = Case("drafter", "", (), dims=dict(layers=2, F=64, V=64))
    tol = tolerance("drafter", "logprobs", torch.float32, case)
    assert 0.5 < tol.atol_abs < 1.0 and tolerance("drafter", "ids", torch.int64, case).exact
    lp = torch.tensor([[-0.64, -0.71], [-0.30, -0.52]])
    ids = torch.tensor([[3, 7], [9, 11]])
    names = HARNESS["drafter"].outputs
    noisy = compare_outputs((lp, ids), (lp + torch.tensor([[0.08, -0.1], [0.05, 0.0]]), ids), case,
                            names, {"ids": "logprobs"})
    assert noisy["elementwise"] == "pass" and noisy["global"] == "pass", noisy["mismatches"]
    wrong = compare_outputs((lp, ids), (lp + torch.tensor([[1.5, 0.0], [0.0, 0.0]]), ids), case,
                            names, {"ids": "logprobs"})
    assert wrong["elementwise"] == "FAIL" and wrong["mismatches"].startswith("logprobs[0, 0]")


def test_declared_out_buffers_are_poisoned_compared_and_may_be_written(monkeypatch):
    """An op with an out= buffer (none of today's ops has one): the hook names it."""

    def scale_into(x, out):  # the reference writes every element of `out`
        out.copy_(x * 2)

    def lazy_scale_into(x, out):  # forgets the last row: its poisoned NaN must show
        out[:-1] = x[:-1] * 2

    spec = registry.OpSpec("scale_into", "test op", make_inputs=lambda shapes, seed, **kw: [
        Case("scale_into", "3x5", (torch.randn(3, 5), torch.zeros(3, 5)), why="out= buffer")])
    spec.add(ops.Variant(ops.REFERENCE, scale_into))
    spec.add(ops.Variant("lazy", lazy_scale_into))
    monkeypatch.setitem(registry._OPS, "scale_into", spec)
    monkeypatch.setitem(HARNESS, "scale_into", Harness(written=lambda a, kw: {"out": a[1]}))
    ok = check("scale_into", seeds=[0]).iloc[0]
    assert ok["pass"] and ok["inputs"] == "pass"  # writing a declared buffer is no mutation
    lazy = check("scale_into", "lazy", seeds=[0]).iloc[0]
    assert not lazy["pass"] and lazy["mismatches"].startswith("out:out[2, 0]: nan where")
    assert math.isnan(lazy["max_abs"]) is False
