"""The op registry: `use` scoping, clear errors, GPU-only variants on CPU, presets, `kernels=`.

Temporary variants are added with monkeypatch on an OpSpec's `variants` dict, so every test
leaves the registry exactly as it found it.
"""

import pytest
import torch

from workbench import ops
from workbench.check import check, check_main
from workbench.ops import registry
from workbench.reference.layers import rmsnorm

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def twins(monkeypatch):
    """Variant 'twin' of rmsnorm and linear: the reference under another name, counting calls."""
    calls = {"rmsnorm": 0, "linear": 0}

    def add(op):
        ref = ops.op_spec(op).variant(ops.REFERENCE).load()

        def twin(*a, **kw):
            calls[op] += 1
            return ref(*a, **kw)

        monkeypatch.setitem(ops.op_spec(op).variants, "twin", ops.Variant("twin", twin))

    add("rmsnorm")
    add("linear")
    return calls


def test_every_numbered_kernel_file_is_a_registered_variant():
    # why: a version file the VARIANTS table misses is invisible to the bench, the presets and
    # the shared GPU suites, which then fail on the GPU at lookup (cuda_v17 in session 45,
    # cuda_v21 in session 48: a range() that stopped one short); each kernels/<op>/<impl>_vN.py
    # must be the target of some registered variant
    import importlib
    import pathlib
    import re

    import workbench.kernels as kernels

    for folder in sorted(pathlib.Path(kernels.__file__).parent.iterdir()):
        if not (folder / "__init__.py").exists():
            continue
        mod = importlib.import_module(f"workbench.kernels.{folder.name}")
        targets = {t.split(":")[0].rsplit(".", 1)[-1]
                   for table in getattr(mod, "VARIANTS", {}).values() for t in table.values()}
        files = {f.stem for f in folder.glob("*.py") if re.fullmatch(r"[a-z]+_v\d+", f.stem)}
        assert files <= targets, (folder.name, sorted(files - targets))
        for op, table in getattr(mod, "VARIANTS", {}).items():
            known = set(ops.op_spec(op).variants)
            assert set(table) <= known, (op, sorted(set(table) - known))


def test_every_op_has_its_harness_hooks():
    for op in ["int4_moe", "tree_mla", "tree_build", "drafter", "tree_walk",
               "drafter_materialize", "rmsnorm", "linear", "swiglu_mlp", "moe_route", "lm_head"]:
        spec = ops.op_spec(op)
        assert spec.make_inputs and spec.compare and spec.roofline, op
        assert ops.REFERENCE in spec.variants


def test_use_nests_and_restores(twins):
    assert ops.selected("rmsnorm") == ops.REFERENCE
    with ops.use(rmsnorm="twin") as sel:
        assert sel["rmsnorm"] == "twin" and ops.selected("linear") == ops.REFERENCE
        with ops.use(linear="twin"):  # inner adds to the outer selection
            assert (ops.selected("rmsnorm"), ops.selected("linear")) == ("twin", "twin")
            with ops.use(rmsnorm=ops.REFERENCE):  # and can override it
                assert ops.selected("rmsnorm") == ops.REFERENCE
            assert ops.selected("rmsnorm") == "twin"
        assert ops.selected("linear") == ops.REFERENCE
        x, w = torch.randn(2, 8).to(torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
        assert torch.equal(ops.get("rmsnorm")(x, w, 1e-5), rmsnorm(x, w, 1e-5))
        assert twins["rmsnorm"] == 1
    assert ops.selected("rmsnorm") == ops.REFERENCE


def test_use_restores_on_exception(twins):
    with pytest.raises(RuntimeError, match="boom"):
        with ops.use(rmsnorm="twin"):
            with ops.use(linear="twin"):
                raise RuntimeError("boom")
    assert ops.selected("rmsnorm") == ops.selected("linear") == ops.REFERENCE


def test_unknown_names_list_the_known_ones(twins):
    with pytest.raises(ops.UnknownOpError, match=r"known ops: \[.*'int4_moe'.*'tree_mla'"):
        with ops.use(int4moe="reference"):
            pass
    with pytest.raises(ops.UnknownOpError, match=r"no variant 'triton_v9'.*'reference'.*'twin'"):
        with ops.use(rmsnorm="triton_v9"):
            pass
    with pytest.raises(ops.UnknownOpError, match="known ops"):
        ops.get("rms_norm")
    with pytest.raises(ops.UnknownOpError, match="known ops"):
        check("rms_norm")
    with pytest.raises(ops.UnknownOpError, match=r"known: \[.*'reference'.*'twin'"):
        check("rmsnorm", "triton_v9")
    assert ops.selected("rmsnorm") == ops.REFERENCE  # a failed `use` selected nothing


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of a GPU-only variant")
def test_gpu_only_variant_is_listed_with_its_reason(monkeypatch, capsys):
    # the target module does not exist: listing and refusing must never import it
    v = ops.Variant("cuda_v0", "workbench.kernels.no_such_module:fn", needs=("cuda",))
    monkeypatch.setitem(ops.op_spec("rmsnorm").variants, "cuda_v0", v)
    reason = v.unavailable_reason()
    assert reason and "CUDA" in reason
    with pytest.raises(ops.VariantUnavailable, match="rmsnorm=cuda_v0 cannot run here.*CUDA"):
        with ops.use(rmsnorm="cuda_v0"):
            pass
    with pytest.raises(ops.VariantUnavailable, match="CUDA"):
        check("rmsnorm", "cuda_v0")
    # every variant: the GPU one is listed with its reason, not failed
    assert check_main(["rmsnorm", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert f"rmsnorm cuda_v0: not run here: {reason}" in out and "rmsnorm / reference" in out
    # asked for by name: nothing could be checked, which is neither a pass nor a failure
    assert check_main(["rmsnorm", "--variant", "cuda_v0"]) == 2
    assert v._fn is None  # never loaded


def test_presets_are_named_selections(twins, monkeypatch):
    monkeypatch.setitem(registry.PRESETS, "twins", {"rmsnorm": "twin", "linear": "twin"})
    with ops.use("twins"):
        assert ops.selected("rmsnorm") == ops.selected("linear") == "twin"
        with ops.use(ops.REFERENCE):  # "reference" resets every op
            assert all(ops.selected(op) == ops.REFERENCE for op in ops.list_ops())
        with ops.use("twins", linear=ops.REFERENCE):  # keywords win over the preset
            assert ops.selected("linear") == ops.REFERENCE
    with pytest.raises(ops.UnknownOpError, match=r"'reference'.*'twins'"):
        with ops.use("fastest"):
            pass


def test_generate_kernels_selects_the_op(twins, tiny_target):
    from workbench.generate import generate

    prompts = [[1, 2, 3], [4, 5]]
    want = generate(tiny_target, None, prompts, max_new_tokens=3, progress=False).tokens
    assert twins["rmsnorm"] == 0
    got = generate(tiny_target, None, prompts, max_new_tokens=3, kernels={"rmsnorm": "twin"},
                   progress=False).tokens
    assert twins["rmsnorm"] > 0 and twins["linear"] == 0
    assert got == want
    assert ops.selected("rmsnorm") == ops.REFERENCE  # the selection ended with the call


def test_drafter_materialize_is_one_op_in_the_presets_and_flips_alone():
    # the loop's context materialisation: reference = the drafter's own method, the kernel
    # folder's variant in "optimized" and "engine", selectable without touching `drafter`
    from workbench.reference.drafter import materialize

    spec = ops.op_spec("drafter_materialize")
    assert spec.variant(ops.REFERENCE).load() is materialize
    assert "triton_v1" in spec.variants and "triton" in spec.variant("triton_v1").needs
    for preset in ("optimized", "engine"):
        assert ops.PRESETS[preset]["drafter_materialize"] == "triton_v1"
    if spec.variant("triton_v1").unavailable_reason() is None:
        with ops.use(drafter_materialize="triton_v1"):
            assert ops.selected("drafter_materialize") == "triton_v1"
            assert ops.selected("drafter") == ops.REFERENCE


def test_invariant_preset_is_optimized_with_the_invariant_versions():
    # "invariant" = "optimized" with each folder's INVARIANT version (the exact suite's bitwise
    # DDTree == AR selection); every other op stays the folder's BEST
    from workbench.kernels import int4_moe, tree_mla

    inv, best = ops.PRESETS["invariant"], ops.PRESETS["optimized"]
    assert inv == {**best, "int4_moe": int4_moe.INVARIANT, "tree_mla": tree_mla.INVARIANT}
    assert (inv["int4_moe"], inv["tree_mla"]) == ("triton_v6", "triton_v6")
    for op, name in inv.items():
        assert name in ops.op_spec(op).variants, (op, name)


def test_cli_kernels_preset_with_overrides():
    # why: --kernels "engine,int4_moe=triton_v10" runs a candidate inside a preset (the loop
    # benchmarks and the exact suite name kernels this way); a bad preset names the choices
    from workbench.__main__ import _kernels
    from workbench.ops.registry import PRESETS, UnknownOpError, resolve_preset

    sel = _kernels("engine,int4_moe=triton_v10")
    # the preset as this machine runs it (registry.PORTABLE where a pick cannot run here)
    assert sel == {**resolve_preset(PRESETS["engine"]), "int4_moe": "triton_v10"}
    assert _kernels("int4_moe=triton_v9") == {"int4_moe": "triton_v9"}
    assert _kernels("optimized") == "optimized"
    with pytest.raises(UnknownOpError, match="nosuch"):
        _kernels("nosuch,int4_moe=triton_v9")
