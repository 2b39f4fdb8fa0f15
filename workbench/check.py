"""Equivalence checker: an op's variant against its reference, three tiers (DESIGN.md §7).

    df = check("int4_moe", "triton_v1")                # EDGE cases, two fresh seeds
    python -m workbench check int4_moe --shapes real --seeds 3

Per case and seed: fresh inputs from the op's generator; the reference and the candidate each
run on their own deep copy (strides, views and shared storage kept), under the reference
selection of every other op, with uninitialised allocations NaN-filled (torch's deterministic
`fill_uninitialized_memory`), so an output the op allocates and leaves partly unwritten shows as
NaN; declared out= buffers are NaN-poisoned explicitly. Afterwards the candidate's inputs must be
byte-identical to the pristine ones, over their whole storage (an out-of-bounds write counts).
Tiers: bitwise (integer/bool outputs, every DDTree field); elementwise with the op's dtype-derived
tolerance plus an exact NaN/+inf/-inf pattern match; global relative error ||out-ref||/||ref||.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import inspect
import itertools
import math
import secrets
import warnings

import pandas as pd
import torch

from workbench import ops
from workbench.ops import REFERENCE, VariantUnavailable
from workbench.ops.case import Case
from workbench.ops.cases import HARNESS, Harness, Tol, tolerance

PASS, FAIL, NA = "pass", "FAIL", "-"
TIERS = ("bitwise", "elementwise", "nan_inf", "global", "inputs")
SHOW = 3  # mismatches named per output


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# -- walking nested values -------------------------------------------------------------------
def _leaves(obj, path: str):
    """(path, leaf) for every tensor or plain value inside tuples, lists, dicts, NamedTuples,
    dataclasses and nn.Modules (their parameters and buffers)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, torch.nn.Module):
        for k, t in itertools.chain(obj.named_parameters(), obj.named_buffers()):
            yield f"{path}.{k}", t
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for f in obj._fields:
            yield from _leaves(getattr(obj, f), f"{path}.{f}")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _leaves(x, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}")
    else:
        yield path, obj


def _outputs(obj, names) -> dict:
    """Name -> leaf of an op's result: a tensor, a tuple (named by `names`) or a dataclass."""
    if isinstance(obj, torch.Tensor) or obj is None:
        return {} if obj is None else {names[0] if names else "out": obj}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return {(names[i] if names and i < len(names) else f"out[{i}]"): x
                for i, x in enumerate(obj)}
    return {p.lstrip("."): x for p, x in _leaves(obj, "")}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern as integers (NaN == NaN with the same payload; -0.0 != 0.0)."""
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point():
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
                      [t.element_size()])
    return t


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _at(name: str, t: torch.Tensor, flat: torch.Tensor) -> tuple[str, tuple]:
    idx = tuple(int(i) for i in torch.unravel_index(flat, t.shape)) if t.dim() else ()
    return f"{name}[{', '.join(map(str, idx))}]", idx


def _val(t: torch.Tensor, idx) -> str:
    v = t[idx].item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# -- the three tiers -------------------------------------------------------------------------
def compare_outputs(ref, out, case: Case | None = None, names=(), ranked=None) -> dict:
    """Compare a candidate's result with the reference's: a report dict with the tier verdicts
    (pass / FAIL / - for not applicable), max abs/rel error, global relative error and the first
    mismatches as text. `ranked` maps an ids output to the values output whose near-ties may
    reorder it (see cases.Harness)."""
    rep = {t: NA for t in TIERS[:4]} | {"max_abs": 0.0, "max_rel": 0.0, "rel_err": 0.0,
                                        "mismatches": []}
    op = case.op if case is not None else ""

    def verdict(tier, ok, *msgs):
        rep[tier] = FAIL if rep[tier] == FAIL or not ok else PASS
        rep["mismatches"].extend(msgs)

    want, got = _outputs(ref, names), _outputs(out, names)
    if set(want) != set(got):
        verdict("bitwise", False, f"outputs {sorted(got)}, want {sorted(want)}")
    bands = {}  # values output -> per-element tolerance band, for ranked ids
    for name in [n for n in want if n in got and n not in (ranked or {})] + \
            [n for n in (ranked or {}) if n in want and n in got]:
        r, o = want[name], got[name]
        if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
            verdict("bitwise", r == o, *([] if r == o else [f"{name}: got {o!r}, want {r!r}"]))
            continue
        if o.shape != r.shape or o.dtype != r.dtype or o.device != r.device:
            verdict("bitwise", False, f"{name}: {tuple(o.shape)} {o.dtype} on {o.device}, want "
                    f"{tuple(r.shape)} {r.dtype} on {r.device}")
            continue
        tol = tolerance(op, name, r.dtype, case)  # exact for integer/bool and for trees
        if tol.exact:
            bad = (_bits(r) != _bits(o)).flatten()
            if ranked and name in ranked and ranked[name] in bands:
                bad &= ~_tie_swaps(r, o, want[ranked[name]], bands[ranked[name]]).flatten()
            where = bad.nonzero().flatten()[:SHOW]
            verdict("bitwise", not bad.any(), *[
                f"{at}: got {_val(o, i)}, want {_val(r, i)}"
                for at, i in (_at(name, r, f) for f in where)])
        else:
            bands[name] = _elementwise(name, r, o, tol, rep, verdict)
    rep["mismatches"] = "; ".join(rep["mismatches"])
    rep["pass"] = all(rep[t] != FAIL for t in TIERS[:4])
    return rep


def _elementwise(name, r, o, tol: Tol, rep, verdict) -> torch.Tensor:
    r64, o64 = r.double(), o.double()  # exact for every float dtype we compare
    pattern = (r64.isnan() != o64.isnan()) | ((r64 == math.inf) != (o64 == math.inf)) | \
        ((r64 == -math.inf) != (o64 == -math.inf))
    fin = r64.isfinite() & o64.isfinite()
    rf = r64[r64.isfinite()]
    scale = rf.pow(2).mean().sqrt().item() if rf.numel() else 0.0
    floor = max(tol.atol_rms * (scale if scale > 0 else 1.0), tol.atol_abs)
    band = tol.rtol * r64.abs() + floor  # [same shape as the output]
    err = torch.where(fin, (o64 - r64).abs(), 0.0)
    bad = fin & (err > band)
    pmsgs = [f"{at}: {_val(o, i)} where the reference is {_val(r, i)}" for at, i in
             (_at(name, r, f) for f in pattern.flatten().nonzero().flatten()[:SHOW])]
    emsgs = [f"{at}: got {_val(o, i)}, want {_val(r, i)} (|d| {err[i].item():.3g} > "
             f"{band[i].item():.3g})" for at, i in
             (_at(name, r, f) for f in bad.flatten().nonzero().flatten()[:SHOW])]
    verdict("nan_inf", not pattern.any(), *pmsgs)
    verdict("elementwise", not bad.any(), *emsgs)
    if err.numel():  # relative to max(|ref|, the floor): no infinities where ref is ~0
        rel = err / r64.abs().clamp_min(max(floor, 1e-300))
        rep["max_abs"] = max(rep["max_abs"], err.max().item())
        rep["max_rel"] = max(rep["max_rel"], rel.max().item())
    den = r64[fin].norm().item()
    d = (o64 - r64)[fin]
    g = d.norm().item() / (den if den > 0 else 1.0)
    rep["rel_err"] = max(rep["rel_err"], g)
    # an absolute error unit (Tol.atol_abs = 6 noise): RMS error within 2 noise passes too
    rms_ok = tol.atol_abs > 0 and d.numel() > 0 and d.pow(2).mean().sqrt().item() <= \
        tol.atol_abs / 3
    ok = g <= tol.rel or rms_ok
    verdict("global", ok, *([] if ok else
                            [f"{name}: ||out-ref||/||ref|| = {g:.3g} > {tol.rel:.3g}"]))
    return band


def _tie_swaps(ref_ids, out_ids, values, band) -> torch.Tensor:
    """bool [..., k]: out_ids[..., j] may stand at rank j although it differs from the reference,
    because the reference ranks it within the values' band of rank j, or (absent from the
    reference's top-k) rank j ties with the last rank, whose unseen successors may tie too."""
    v = values.double()
    close = (v.unsqueeze(-1) - v.unsqueeze(-2)).abs() <= \
        torch.maximum(band.unsqueeze(-1), band.unsqueeze(-2))  # [..., k, k]: rank j ~ rank j'
    same = out_ids.unsqueeze(-1) == ref_ids.unsqueeze(-2)  # [..., k, k]: out j is ref j'
    return (same & close).any(-1) | (~same.any(-1) & close[..., -1])


# -- running one case ------------------------------------------------------------------------
@contextlib.contextmanager
def nan_allocations():
    """torch.empty & co. return NaN (floats) / the max int (integers) inside the block."""
    state = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "op X has no deterministic implementation"
            yield
    finally:
        torch.use_deterministic_algorithms(state[0], warn_only=state[1])
        torch.utils.deterministic.fill_uninitialized_memory = state[2]


def _poison(written: dict) -> None:
    for t in written.values():
        if t.is_floating_point():
            t.fill_(math.nan)
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).max)


def _call(fn, case: Case, h: Harness):
    """Run fn on a deep copy of the case's inputs; returns (result incl. written buffers, args)."""
    args, kwargs = copy.deepcopy((case.args, case.kwargs))  # one memo: shared storage stays shared
    written = h.written(args, kwargs) if h.written else {}
    _poison(written)
    with nan_allocations(), ops.use(REFERENCE):
        out = fn(*args, **kwargs)
        if any(t.is_cuda for _, t in _leaves(out, "") if isinstance(t, torch.Tensor)):
            torch.cuda.synchronize()  # asynchronous kernel errors surface here, in the try
    if written:
        out = {**_outputs(out, h.outputs), **{f"out:{k}": v for k, v in written.items()}}
    return out, (args, kwargs), written


def _mutations(names: list[str], pristine, used, written: dict) -> list[str]:
    skip = {t.untyped_storage().data_ptr() for t in written.values()}
    msgs, seen = [], set()
    for (path, a), (_, b) in zip(_leaves(pristine, ""), _leaves(used, ""), strict=True):
        if not isinstance(a, torch.Tensor):
            with contextlib.suppress(Exception):
                if bool(a != b):
                    msgs.append(f"input {_argname(path, names)} changed: {a!r} -> {b!r}")
            continue
        key = a.untyped_storage().data_ptr()
        if key == 0 or key in seen or b.untyped_storage().data_ptr() in skip:
            continue
        seen.add(key)
        if torch.equal(_storage_bytes(a), _storage_bytes(b)):
            continue
        diff = (_bits(a) != _bits(b)).flatten().nonzero().flatten()
        if diff.numel():
            at, i = _at(_argname(path, names), a, diff[0])
            msgs.append(f"input {at} changed: {_val(a, i)} -> {_val(b, i)}")
        else:
            msgs.append(f"input {_argname(path, names)}: memory outside its view changed "
                        "(an out-of-bounds write)")
    return msgs


def _argname(path: str, names: list[str]) -> str:
    """'[0][2].k' -> 'cache.k' using the reference's parameter names."""
    if path.startswith("[0]["):
        i, _, rest = path[4:].partition("]")
        return (names[int(i)] if int(i) < len(names) else f"args[{i}]") + rest
    return path[4:] if path.startswith("[1].") else path


def run_case(op: str, variant: str, case: Case, seed=None) -> dict:
    """One row of the result table: the variant against the reference on one case."""
    spec = ops.op_spec(op)
    h = HARNESS.get(op, Harness())
    ref_fn, fn = spec.variant(REFERENCE).load(), spec.variant(variant).load()
    row = {"op": op, "variant": variant, "shapes": case.kind, "case": case.label, "seed": seed}
    row |= {t: NA for t in TIERS} | {"max_abs": math.nan, "max_rel": math.nan,
                                     "rel_err": math.nan, "mismatches": "", "error": ""}
    ref, _, _ = _call(ref_fn, case, h)
    try:
        out, used, written = _call(fn, case, h)
    except Exception as e:  # the candidate crashed: a failed row, not a crashed check
        row |= {"error": f"{type(e).__name__}: {e}"[:500], "why": case.why, "pass": False}
        return row
    compare = spec.compare or (lambda a, b, c: compare_outputs(a, b, c, names=h.outputs))
    row |= compare(ref, out, case)
    try:
        names = list(inspect.signature(ref_fn).parameters)
    except (TypeError, ValueError):
        names = []
    muts = _mutations(names, (case.args, case.kwargs), used, written)
    row["inputs"] = FAIL if muts else PASS
    row["mismatches"] = "; ".join(m for m in [row["mismatches"], *muts[:SHOW]] if m)
    row["why"] = case.why
    row["pass"] = all(row[t] != FAIL for t in TIERS)
    return row


def _seeds(seeds) -> list[int]:
    """An int = that many fresh seeds (shown in the table, so a failure can be replayed)."""
    if seeds is None or isinstance(seeds, int):
        return [secrets.randbelow(2**31) for _ in range(2 if seeds is None else seeds)]
    return [int(s) for s in seeds]


def check(op: str, variant: str = REFERENCE, cases=None, shapes: str = "edge", seeds=None,
          cfg=None, device=None, **gen_opts) -> pd.DataFrame:
    """Check `variant` of `op` against the reference; one row per case x seed.

    cases: explicit Case list (then shapes/seeds/cfg are not used), else the op's generator runs
    once per seed (`seeds`: a count of fresh seeds, default 2, or explicit seeds) with `cfg`
    (ModelConfig or preset name; default tiny for EDGE, kimi-k2.6 for REAL) and `gen_opts`
    (e.g. max_experts for int4_moe). Raises VariantUnavailable if the variant cannot run here.
    """
    spec = ops.op_spec(op)
    reason = spec.variant(variant).unavailable_reason()
    if reason:
        raise VariantUnavailable(f"{op}={variant} cannot run here: {reason}")
    if cases is not None:
        batches = [(None, list(cases))]
    else:
        if spec.make_inputs is None:
            raise ValueError(f"op {op!r} has no input generator; pass cases=")
        device = device or default_device()
        batches = ((s, spec.make_inputs(shapes, s, cfg=cfg, device=device, **gen_opts))
                   for s in _seeds(seeds))
    rows = [run_case(op, variant, c, seed) for seed, cs in batches for c in cs]
    return pd.DataFrame(rows)


def failures(df: pd.DataFrame) -> str:
    """`check`'s failed rows, one line each (case, seed, what differed, the case's why): the
    message a test asserts with."""
    bad = df[~df["pass"]]
    return "\n".join(f"{r.case} seed {r.seed}: {r.error or r.mismatches} (why: {r.why})"
                     for r in bad.itertuples())


# -- command line ----------------------------------------------------------------------------
COLUMNS = ["variant", "case", "seed", *TIERS, "max_abs", "max_rel", "rel_err", "pass"]


def check_main(argv=None) -> int:
    """`python -m workbench check <op|all> ...`: 0 all passed, 1 a failure, 2 nothing could run."""
    p = argparse.ArgumentParser(prog="python -m workbench check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", help=f"one of {ops.list_ops()} or 'all'")
    p.add_argument("--variant", action="append", help="repeatable; default: every variant")
    p.add_argument("--shapes", choices=("edge", "real"), default="edge")
    p.add_argument("--seeds", type=int, default=2, help="number of fresh seeds (default 2)")
    p.add_argument("--seed", type=int, action="append", help="explicit seed (repeatable)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--preset", default=None, help="ModelConfig preset for the shapes")
    p.add_argument("--max-experts", type=int, default=None, help="int4_moe REAL: trim E")
    a = p.parse_args(argv)
    try:
        names = ops.list_ops() if a.op == "all" else [ops.op_spec(a.op).name]
        for v in (a.variant or ()) if a.op != "all" else ():  # 'all': ops lacking v skip it
            ops.op_spec(a.op).variant(v)
    except ops.UnknownOpError as e:
        print(f"error: {e}")
        return 2
    failed, ran = False, 0
    for op in names:
        spec = ops.op_spec(op)
        opts = {"max_experts": a.max_experts} if op == "int4_moe" and a.max_experts else {}
        for v in [v for v in a.variant or spec.variants if v in spec.variants]:
            reason = spec.variant(v).unavailable_reason()
            if reason:
                print(f"{op} {v}: not run here: {reason}")
                continue
            df = check(op, v, shapes=a.shapes, seeds=a.seed or a.seeds, cfg=a.preset,
                       device=a.device, **opts)
            ran += 1
            print(f"\n{op} / {v} ({a.shapes}, device {a.device or default_device()})")
            print(df[COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.2e}"))
            for _, r in df[~df["pass"]].iterrows():
                failed = True
                print(f"  FAIL {r['case']} seed {r['seed']}: {r['error'] or r['mismatches']}"
                      f"\n       why this case: {r['why']}")
    return 1 if failed else (0 if ran else 2)
