"""workbench.shadow: an op's calls in the real loop compared with the reference, per call and row.

Tiny preset, CPU (Triton variants through the interpreter, tests/conftest.py). Temporary
variants are added with monkeypatch on the OpSpec's `variants` dict (as test_registry.py does),
so the registry is left as found.
"""

import pandas as pd
import pytest
import torch

from workbench import ops
from workbench.generate import generate
from workbench.ops import registry
from workbench.reference.drafter import build_drafter
from workbench.shadow import Shadow, exact_prompts, main, shadow, step_of, watch

BUDGET, NEW = 4, 4  # two DDTree steps or more per request: prefill, then several decode steps


@pytest.fixture(scope="module")
def pair():
    import workbench

    target = workbench.build_model("tiny", seed=0)
    return target, build_drafter(target.cfg, seed=0)


def _run(pair, kernels=None, on_step=None):
    target, drafter = pair
    prompts = exact_prompts(3, target.cfg.vocab_size, seed=3)
    return generate(target, drafter, prompts, NEW, budget=BUDGET, kernels=kernels,
                    on_step=on_step)


@pytest.fixture
def bumped(monkeypatch):
    """tree_mla variant 'bumped': the reference with 1.0 added to row (b=0, n=last) of o_lat."""
    ref = ops.op_spec("tree_mla").variant(ops.REFERENCE).load()

    def bump(*a, **kw):
        o, lse = ref(*a, **kw)
        o = o.clone()
        o[0, -1] += 1.0
        return o, lse

    monkeypatch.setitem(ops.op_spec("tree_mla").variants, "bumped", ops.Variant("bumped", bump))
    return "bumped"


def test_reference_against_itself_is_exact_and_changes_nothing(pair):
    plain = _run(pair)
    with shadow("tree_mla") as sh:
        res = _run(pair, on_step=sh.on_step)
    assert res.tokens == plain.tokens
    df = sh.summary()
    layers = pair[0].cfg.num_layers
    assert len(df) == sh.calls == layers * (1 + len(res.steps))  # one prefill chunk + steps
    assert (df["max_err"] == 0).all() and (df["max_err_over_tol"] == 0).all() and df["pass"].all()
    assert (df["variant"] == ops.REFERENCE).all()
    # labels: prefill is step -1, then one call per layer in every decode step
    assert list(df["step"]) == [s for s in range(-1, len(res.steps)) for _ in range(layers)]
    assert list(df["call_in_step"]) == list(range(layers)) * (1 + len(res.steps))
    # the registry is back to plain: no wrapper, the reference callable itself
    assert registry._WRAP.get() is None
    assert ops.get("tree_mla") is ops.op_spec("tree_mla").variant(ops.REFERENCE).load()


def test_a_wrong_row_is_named_and_the_loop_keeps_the_variants_output(pair, bumped):
    plain = _run(pair, kernels={"tree_mla": bumped})
    with shadow("tree_mla") as sh:
        res = _run(pair, kernels={"tree_mla": bumped}, on_step=sh.on_step)
    assert res.tokens == plain.tokens  # shadowing does not change what the loop emits
    assert sh.records
    for r in sh.records:
        o = r["outputs"]["o_lat"]
        N = int(r["shapes"].split()[0].split("x")[1])  # q [B, N, H, C+R]
        (row, ratio, err, _), *_ = o["worst_rows"]
        assert row == (0, N - 1) and ratio > 1 and err >= 0.5, r
        assert o["by_request"][0][1] == N - 1 and o["by_request"][0][0] > 1
        assert o["rows"].shape[1] == N and o["rows"][0, N - 1] == ratio
        assert r["outputs"]["lse"]["err_over_tol"] == 0  # lse untouched by the bump
        assert r["variant"] == bumped and not r["passed"]
    df = sh.summary()
    assert (df["worst_output"] == "o_lat").all() and (df["max_err_over_tol"] > 1).all()
    assert df["worst_rows"].str.startswith("0,").all()


def test_variant_argument_runs_that_variant_in_the_loop(pair, bumped):
    """shadow(op, variant) replaces the selection: the loop emits that variant's tokens."""
    want = _run(pair, kernels={"tree_mla": bumped}).tokens
    with shadow("tree_mla", bumped) as sh:
        got = _run(pair).tokens  # reference selection, but the shadow's variant runs
    assert got == want and {r["variant"] for r in sh.records} == {bumped}


def test_every_and_a_second_shadow_inside(pair):
    with shadow("tree_mla", every=3) as sh, shadow("mla_v_up") as sh2:
        res = _run(pair)
    assert [r["call"] for r in sh.records] == list(range(0, sh.calls, 3))
    assert sh2.calls == sh.calls and len(sh2.records) == sh2.calls  # one per MLA layer call
    assert sh2.summary()["pass"].all() and res.tokens


def test_bad_names_say_which_argument_and_the_known_names():
    with pytest.raises(ops.UnknownOpError, match=r"shadow op: unknown op 'nope'.*tree_mla"):
        with shadow("nope"):
            pass
    with pytest.raises(ops.UnknownOpError,
                       match=r"shadow variant: op 'tree_mla' has no variant 'v99'.*reference"):
        with shadow("tree_mla", "v99"):
            pass
    with pytest.raises(ValueError, match="every: expected a positive int"):
        with shadow("tree_mla", every=0):
            pass
    assert registry._WRAP.get() is None


def test_inside_cuda_graph_capture_it_refuses(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with shadow("rmsnorm"), pytest.raises(RuntimeError, match="cuda_graph=False"):
        ops.get("rmsnorm")(torch.ones(2, 4), torch.ones(4), 1e-6)


def test_step_labels_split_prefill_from_step_0():
    sh = Shadow("tree_mla")
    assert sh.label(0) == (None, None)  # no on_step: unknown
    sh.bounds = [10, 16, 22]  # prefill 4 calls, then 6 a step
    assert [sh.label(c) for c in (0, 3, 4, 9, 10, 21)] == \
        [(-1, 0), (-1, 3), (0, 0), (0, 5), (1, 0), (2, 5)]


def test_step_of_counts_the_prefill_token():
    class R:
        steps = [{"step": 0, "accepted": [2, 1]}, {"step": 1, "accepted": [3, 1]}]

    assert [step_of(R, 0, p) for p in range(7)] == [-1, 0, 0, 1, 1, 1, None]
    assert [step_of(R, 1, p) for p in range(4)] == [-1, 0, 1, None]


def test_cli_writes_the_csv(tmp_path, capsys):
    """Under the Triton interpreter when no GPU: tree_mla triton_v4 (the optimized preset's)."""
    reason = ops.op_spec("tree_mla").variant("triton_v4").unavailable_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "shadow.csv"
    rc = main(["--preset", "tiny", "--op", "tree_mla", "--kernels", "tree_mla=triton_v4",
               "--batch", "2", "--budget", "4", "--max-new-tokens", "3", "--csv", str(out),
               "--top", "3", "--watch", "1:2", "--ar", "--device", "cpu"])
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) and (df["variant"] == "triton_v4").all() and df["pass"].all()
    assert {"call", "step", "shapes", "max_err", "max_err_over_tol", "worst_rows"} <= set(df)
    text = capsys.readouterr().out
    assert "step 0:" in text and "request 1 position 2: emitted in step" in text
    assert "DDTree vs AR:" in text


def test_cli_bad_op_is_a_clear_error(capsys):
    assert main(["--preset", "tiny", "--op", "nope", "--kernels", "reference",
                 "--device", "cpu"]) == 2
    assert "shadow op: unknown op 'nope'" in capsys.readouterr().err


def test_watch_table_names_the_request(pair):
    with shadow("tree_mla") as sh:
        res = _run(pair, on_step=sh.on_step)
    df = watch(sh, res, 2, 1)
    assert set(df["request"]) == {2} and set(df["step"]) == {step_of(res, 2, 1)}


def test_workbench_cli_delegates_shadow(capsys):
    from workbench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["shadow", "--help"])
    assert e.value.code == 0 and "--watch" in capsys.readouterr().out
