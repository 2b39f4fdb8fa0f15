"""Shadow one op in the real decode loop: every call of the selected variant is compared with the
reference on the same inputs, per call and per row; the loop goes on with the variant's output.

    from workbench.shadow import shadow
    with shadow("tree_mla") as sh:                       # the variant `kernels=` selects
        res = generate(target, drafter, prompts, budget=64, kernels="optimized",
                       on_step=sh.on_step)               # on_step: calls labelled by step
    sh.summary()                                         # DataFrame, one row per call

    python -m workbench.shadow --preset trained --op tree_mla --kernels optimized --batch 32 \\
        --budget 64 --max-new-tokens 12 --device cuda --csv shadow_tree_mla.csv --top 20

--route-trace REQ:POS runs workbench.route_trace instead (no op is shadowed): both real loops,
the MoE routing of the rows that feed that token, per layer, and check.py's verdict.

What a call records: input shapes, and per output (o_lat and lse for tree_mla) the max abs error,
the max of |out - ref| / band with the checker's own band (workbench.check: rtol |ref| + atol
rms(ref), atol from workbench.ops.cases.tolerance; > 1 is outside what rounding explains; NaN
or inf where the reference has none counts as inf), its location, NaN counts, and the worst rows
(the first `rows_dim` indices: (b, n) for [B, N, ...] outputs). For tree_mla a row whose
ancestor mask holds only itself at n > 0 is padding (its output is never read): flagged `pad`,
and `real_err_over_tol` leaves those rows out. The checker's tier verdicts come along (`pass`).
Step labels (with `on_step=sh.on_step`): `step` is -1 in prefill, else the decode step;
`call_in_step` is the target layer for tree_mla (one call per layer per forward; Shadow.label).

The reference runs on clones of the inputs taken before the variant runs (an in-place op's
written buffers, workbench.ops.cases.Harness.written, are compared too), under the reference
selection of every other op. It syncs and allocates: shadow runs need cuda_graph=False (a call
inside CUDA-graph capture raises), so they compare the eager loop, which launches the same
kernels as the graphed one.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch

from workbench import ops
from workbench.check import _bits, _elementwise, _outputs, compare_outputs
from workbench.ops import REFERENCE, VariantUnavailable, registry
from workbench.ops.case import Case
from workbench.ops.cases import HARNESS, Harness, tolerance

# op -> (args, kwargs) -> the named sizes `tolerance` reads (the case generators' dims); ops not
# listed get {}: tolerance's defaults, the tightest band (n = 1)
DIMS = {
    "tree_mla": lambda a, kw: dict(T=a[1].shape[1], C=a[5], R=a[0].shape[-1] - a[5]),
    "int4_moe": lambda a, kw: dict(D=a[0].shape[-1], I=a[3].gate_packed.shape[1]),
    "rmsnorm": lambda a, kw: dict(D=a[0].shape[-1]),
    "linear": lambda a, kw: dict(D=a[0].shape[-1]),
    "lm_head": lambda a, kw: dict(D=a[0].shape[-1]),
    "moe_route": lambda a, kw: dict(D=a[0].shape[-1]),
    "swiglu_mlp": lambda a, kw: dict(D=a[0].shape[-1], F=a[1].shape[0]),
    "mla_q_absorb": lambda a, kw: dict(K=a[1].shape[1]),  # reduces over dn
    "mla_v_up": lambda a, kw: dict(K=a[1].shape[-1]),  # reduces over C
}


def exact_prompts(C: int, vocab: int, seed: int) -> list[list[int]]:
    """The token-exact suite's prompts (tests/test_exact_gpu.py uses this, with seed = C), so a
    shadow run replays the suite's requests: C requests of 4..24 random ids."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(4, 25))] for _ in range(C)]


def _clone(obj):
    """Tensors cloned (a view's own elements only, not its whole storage), containers rebuilt,
    anything else deep-copied (an op's cache object with its tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def _shape(x) -> str:
    return "x".join(map(str, x.shape)) if isinstance(x, torch.Tensor) else \
        (f"{x:.6g}" if isinstance(x, (int, float, bool)) else type(x).__name__)


def _pad_rows(op: str, args) -> torch.Tensor | None:
    """bool [B, N]: tree_mla rows that are padding (n > 0 and only the self bit set)."""
    if op != "tree_mla":
        return None
    from workbench.reference.tree_mla import unpack_anc_bits

    anc, N = args[3], args[0].shape[1]
    only_self = unpack_anc_bits(anc, N).sum(-1) <= 1  # [B, N]
    return only_self & (torch.arange(N, device=anc.device) > 0)


def output_stats(op: str, name: str, ref: torch.Tensor, out: torch.Tensor, case: Case,
                 rows_dim: int = 2, top: int = 5, pad: torch.Tensor | None = None) -> dict:
    """One output of one call: max_err, err_over_tol (max |out-ref| / band), argmax, NaN counts,
    worst rows [(row index tuple, err/tol, max err, padding?)] over the first rows_dim dims."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return dict(max_err=math.inf, err_over_tol=math.inf, real_err_over_tol=math.inf,
                    argmax=(), nan_out=-1, nan_ref=-1, worst_rows=[],
                    error=f"{tuple(out.shape)} {out.dtype}, want {tuple(ref.shape)} {ref.dtype}")
    tol = tolerance(op, name, ref.dtype, case)
    r64, o64 = ref.double(), out.double()
    if tol.exact:  # integers, bools, trees: any difference is outside tolerance
        bad = _bits(ref) != _bits(out)
        err = (o64 - r64).abs().nan_to_num(math.inf) * bad
        ratio = torch.where(bad, math.inf, 0.0)
    else:  # the checker's elementwise band, computed by the checker (throwaway report)
        rep = {"nan_inf": "-", "elementwise": "-", "global": "-", "max_abs": 0.0,
               "max_rel": 0.0, "rel_err": 0.0}
        band = _elementwise(name, ref, out, tol, rep, lambda *a: None)
        fin = r64.isfinite() & o64.isfinite()
        pattern = (r64.isnan() != o64.isnan()) | ((r64 == math.inf) != (o64 == math.inf)) | \
            ((r64 == -math.inf) != (o64 == -math.inf))
        err = torch.where(fin, (o64 - r64).abs(), 0.0)
        ratio = torch.where(pattern, math.inf, err / band)
    stats = dict(max_err=err.max().item() if err.numel() else 0.0,
                 err_over_tol=ratio.max().item() if ratio.numel() else 0.0,
                 argmax=tuple(int(i) for i in torch.unravel_index(ratio.argmax(), ratio.shape))
                 if ratio.numel() else (),
                 nan_out=int(o64.isnan().sum()), nan_ref=int(r64.isnan().sum()), error="")
    k = min(rows_dim, ratio.dim())
    row_ratio = ratio.flatten(k).amax(-1) if ratio.dim() > k else ratio  # [rows...]
    row_err = err.flatten(k).amax(-1) if err.dim() > k else err
    is_pad = pad if pad is not None and tuple(pad.shape) == tuple(row_ratio.shape) else \
        torch.zeros_like(row_ratio, dtype=torch.bool)
    real = row_ratio[~is_pad]
    stats["real_err_over_tol"] = real.max().item() if real.numel() else 0.0
    # every row's err/tol as a CPU tensor [rows...] when small (tree_mla: [B, N]), for a look
    # at chosen rows: sh.records[i]["outputs"]["o_lat"]["rows"][b, n]
    stats["rows"] = row_ratio.float().cpu() if row_ratio.numel() <= 1 << 16 else None
    stats["by_request"] = []  # per first index b: (its worst row's err/tol, that row's n)
    if row_ratio.dim() > 1:
        v, n = row_ratio.flatten(1).max(-1)
        stats["by_request"] = list(zip(v.tolist(), n.tolist()))
    elif row_ratio.dim() == 1:
        stats["by_request"] = [(v, None) for v in row_ratio.tolist()]
    flat = row_ratio.flatten()
    worst = flat.topk(min(top, flat.numel())).indices if flat.numel() else flat.long()
    stats["worst_rows"] = [
        (idx, row_ratio[idx].item(), row_err[idx].item(), bool(is_pad[idx]))
        for idx in (tuple(int(i) for i in torch.unravel_index(f, row_ratio.shape))
                    for f in worst)]
    return stats


@dataclass
class Shadow:
    """The records of one shadow block; `summary()` tabulates them."""

    op: str
    variant: str | None = None  # None: whatever the selection holds at each call
    every: int = 1
    rows_dim: int = 2
    top: int = 5
    records: list[dict] = field(default_factory=list)
    calls: int = 0  # calls seen (shadowed or not)
    bounds: list[int] = field(default_factory=list)  # `calls` at the end of each decode step

    def on_step(self, stats: dict, *_) -> None:
        """generate(..., on_step=) callback: marks the end of a decode step."""
        self.bounds.append(self.calls)

    def label(self, call: int) -> tuple[int | None, int | None]:
        """(step, call_in_step) of a call: step -1 is prefill. The loop gives no hook between
        prefill and step 0, so they are told apart by assuming every decode step makes as many
        calls as step 1 (one target forward a step: true of the target's ops); with fewer than
        two steps (or no on_step) prefill and step 0 share step 0 (None without on_step)."""
        b = self.bounds
        if not b:
            return None, None
        starts = [max(b[0] - (b[1] - b[0]), 0) if len(b) > 1 else 0, *b]  # step s starts[s]
        if call < starts[0]:
            return -1, call
        s = next((i for i, end in enumerate(b) if call < end), len(b))
        return s, call - starts[s]

    def wrap(self, name: str, fn):
        """The registry hook: `ops.get(name)` returns this instead of `fn`."""
        if name != self.op:
            return fn
        spec = ops.op_spec(name)
        chosen = fn if self.variant is None else spec.variant(self.variant).load()
        vname = self.variant or ops.selected(name)

        def shadowed(*args, **kwargs):
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"shadow({self.op!r}): called inside CUDA-graph capture; "
                                   "the reference syncs and allocates: run with "
                                   "cuda_graph=False")
            call = self.calls
            self.calls += 1
            if call % self.every:
                return chosen(*args, **kwargs)
            return self._compare(spec, vname, chosen, call, args, kwargs)

        return shadowed

    def _compare(self, spec, vname, fn, call, args, kwargs):
        h = HARNESS.get(self.op, Harness())
        ref_args, ref_kwargs = _clone((args, kwargs))  # before the variant may write
        token = registry._WRAP.set(None)  # ops called inside either run are not shadowed
        try:
            out = fn(*args, **kwargs)
            with ops.use(REFERENCE):
                ref = spec.variant(REFERENCE).load()(*ref_args, **ref_kwargs)
        finally:
            registry._WRAP.reset(token)
        got, want = _outputs(out, h.outputs), _outputs(ref, h.outputs)
        if h.written:
            got |= {f"out:{k}": v for k, v in h.written(args, kwargs).items()}
            want |= {f"out:{k}": v for k, v in h.written(ref_args, ref_kwargs).items()}
        dims = DIMS.get(self.op, lambda a, kw: {})(args, kwargs)
        case = Case(self.op, f"call {call}", args, kwargs, dims=dims)
        rep = compare_outputs(want, got, case, names=tuple(want), ranked=h.ranked)
        pad = _pad_rows(self.op, args)
        per = {n: output_stats(self.op, n, want[n], got[n], case, self.rows_dim, self.top, pad)
               for n in want if n in got and isinstance(want[n], torch.Tensor)}
        self.records.append(dict(
            call=call, op=self.op, variant=vname,
            shapes=" ".join(_shape(a) for a in [*args, *kwargs.values()]),
            outputs=per, passed=rep["pass"], rel_err=rep["rel_err"],
            mismatches=rep["mismatches"]))
        return out

    def summary(self) -> pd.DataFrame:
        """One row per shadowed call: call, step, call_in_step, variant, shapes, max_err and
        max_err_over_tol (the worst output), real_err_over_tol (padding rows left out),
        worst_output, worst_rows ("b,n:err/tol" of that output), per-output columns
        `<out>_max_err`, `<out>_err_over_tol`, `<out>_nan`, and the checker's `pass`."""
        rows = []
        for r in self.records:
            per = r["outputs"]
            worst = max(per, key=lambda n: per[n]["err_over_tol"]) if per else ""
            w = per.get(worst, {})
            step, in_step = self.label(r["call"])
            row = dict(call=r["call"], step=step, call_in_step=in_step, variant=r["variant"],
                       shapes=r["shapes"],
                       max_err=w.get("max_err", 0.0), max_err_over_tol=w.get("err_over_tol", 0.0),
                       real_err_over_tol=max((s["real_err_over_tol"] for s in per.values()),
                                             default=0.0),
                       worst_output=worst, argmax=",".join(map(str, w.get("argmax", ()))),
                       worst_rows="; ".join(
                           f"{','.join(map(str, i))}:{q:.3g}{' pad' if p else ''}"
                           for i, q, _, p in w.get("worst_rows", [])))
            for n, s in per.items():
                row |= {f"{n}_max_err": s["max_err"], f"{n}_err_over_tol": s["err_over_tol"],
                        f"{n}_nan": s["nan_out"]}
            row |= {"pass": r["passed"], "rel_err": r["rel_err"], "mismatches": r["mismatches"]}
            rows.append(row)
        return pd.DataFrame(rows)


@contextlib.contextmanager
def shadow(op: str, variant: str | None = None, *, every: int = 1, rows_dim: int = 2,
           top: int = 5) -> Iterator[Shadow]:
    """While active, `ops.get(op)` runs the selected variant (or `variant`) AND the reference on
    clones of the same inputs, records the comparison, and returns the variant's output.

    every: shadow one call in `every` (the others run the variant alone); rows_dim: leading
    output dims that index a row ([B, N, ...]: 2); top: worst rows kept per output."""
    try:
        spec = ops.op_spec(op)
    except ops.UnknownOpError as e:
        raise ops.UnknownOpError(f"shadow op: {e}") from None
    if variant is not None:
        try:
            spec.variant(variant)
        except ops.UnknownOpError as e:
            raise ops.UnknownOpError(f"shadow variant: {e}") from None
        reason = spec.variant(variant).unavailable_reason()
        if reason:
            raise VariantUnavailable(f"shadow variant: {op}={variant} cannot run here: {reason}")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every: expected a positive int, got {every!r}")
    sh = Shadow(op, variant, every, rows_dim, top)
    with registry.wrapping(sh.wrap):  # another shadow (another op) keeps working inside this one
        yield sh


def step_of(result, request: int, position: int) -> int | None:
    """The decode step that emitted token `position` (0-based, as in GenerateResult.tokens) of
    `request`: -1 for the first token (prefill), None past the end. That step's verify forward
    scored it (DDTree: its accepted path; the bonus from the path's last row)."""
    emitted = 1  # prefill emits each request's first token
    if position < emitted:
        return -1
    for st in result.steps:
        emitted += st["accepted"][request]
        if position < emitted:
            return st["step"]
    return None


def watch(sh: Shadow, result, request: int, position: int) -> pd.DataFrame:
    """The shadowed calls of the step that emitted (request, position), as that request sees
    them: per call and output, the worst err/tol over the request's rows and which row."""
    s = step_of(result, request, position)
    rows = []
    for r in sh.records:
        step, in_step = sh.label(r["call"])
        if step != s:
            continue
        for name, st in r["outputs"].items():
            if request < len(st["by_request"]):
                q, n = st["by_request"][request]
                rows.append(dict(call=r["call"], step=step, call_in_step=in_step, output=name,
                                 request=request, err_over_tol=q, worst_row=n))
    return pd.DataFrame(rows)


# -- command line ----------------------------------------------------------------------------
def load(preset: str, device: str):
    """(target, drafter) as the exact suite builds them (tests/test_exact_gpu.py `pair`)."""
    if preset == "trained":
        from workbench.train import load_pair

        target, drafter, _ = load_pair(device=device)
        return target, drafter
    import workbench
    from workbench.reference.drafter import build_drafter

    target = workbench.build_model(preset, seed=0, device=device)
    return target, build_drafter(target.cfg, seed=0, device=device)


def main(argv=None) -> int:
    from workbench.__main__ import _kernels, _threads_for_cpu  # the CLI's --kernels parser
    from workbench.generate import generate

    p = argparse.ArgumentParser(prog="python -m workbench.shadow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="trained | small | tiny")
    p.add_argument("--op", default="tree_mla", help=f"one of {ops.list_ops()}")
    p.add_argument("--variant", default=None, help="default: the one --kernels selects")
    p.add_argument("--kernels", default="optimized", help="preset name or op=variant,...")
    p.add_argument("--batch", type=int, default=8, help="C requests (prompts seeded by C)")
    p.add_argument("--budget", type=int, default=None, help="DDTree budget; omit for AR")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--every", type=int, default=1, help="shadow one call in EVERY")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--csv", default=None, help="write the per-call table here")
    p.add_argument("--top", type=int, default=20, help="worst calls printed")
    p.add_argument("--ar", action="store_true",
                   help="also run AR (same kernels, eager, unshadowed): print each request's "
                        "first divergence from it and watch it")
    p.add_argument("--watch", action="append", default=[], metavar="REQ:POS",
                   help="print the calls of the step that emitted token POS (0-based) of request "
                        "REQ, seen from that request's rows (repeatable)")
    p.add_argument("--route-trace", default=None, metavar="REQ:POS",
                   help="instead of shadowing --op: run AR and DDTree (--budget) with --kernels, "
                        "eager, and trace the MoE routing of the rows that feed token POS of "
                        "request REQ in each real loop (workbench.route_trace): per-layer table "
                        "and verdict; --csv writes every traced row")
    a = p.parse_args(argv)
    if a.device == "cpu":  # Triton variants through the interpreter (python -m workbench's rule)
        from workbench.__main__ import _interpret_triton_on_cpu

        _interpret_triton_on_cpu()
    _threads_for_cpu(a.device)
    kernels = _kernels(a.kernels)
    try:
        with ops.use(kernels):
            pass  # unknown or unavailable selections fail here, before the models load
        if a.route_trace is not None:
            from workbench.route_trace import parse_watch, run_cli

            parse_watch(a.route_trace)  # a malformed REQ:POS fails before the models load
            if a.budget is None:
                raise ValueError("route-trace: expected --budget (the DDTree run), got none")
        target, drafter = load(a.preset, a.device)
        prompts = exact_prompts(a.batch, target.cfg.vocab_size, seed=a.batch)
        if a.route_trace is not None:
            return run_cli(target, drafter, prompts, a.route_trace, a.max_new_tokens, a.budget,
                           kernels, a.csv)
        with shadow(a.op, a.variant, every=a.every, top=5) as sh:
            def step_line(stats, *_):
                start = sh.bounds[-1] if sh.bounds else 0
                sh.on_step(stats)
                done = [r for r in sh.records if r["call"] >= start]  # step 0: prefill's too
                worst = max((s["err_over_tol"] for r in done for s in r["outputs"].values()),
                            default=0.0)
                print(f"step {stats['step']}: {len(done)} {a.op} calls shadowed, worst err/tol "
                      f"{worst:.3g}, accepted {sum(stats['accepted'])}", flush=True)

            res = generate(target, drafter if a.budget else None, prompts, a.max_new_tokens,
                           budget=a.budget, kernels=kernels, on_step=step_line, progress=True,
                           cuda_graph=False)
    except (ops.UnknownOpError, VariantUnavailable, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    df = sh.summary()
    print(f"\n{a.preset} C={a.batch} budget={a.budget} kernels={a.kernels}: {len(df)} {a.op} "
          f"calls shadowed, {int((~df['pass']).sum()) if len(df) else 0} outside the checker's "
          f"tolerance; {res.tokens_per_step:.2f} tokens/step")
    if len(df):
        cols = ["call", "step", "call_in_step", "variant", "max_err", "max_err_over_tol",
                "real_err_over_tol", "worst_output", "worst_rows"]
        print(df.sort_values("max_err_over_tol", ascending=False).head(a.top)[cols]
              .to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if a.ar and a.budget:
        with ops.use(kernels):  # already checked above
            ar = generate(target, None, prompts, a.max_new_tokens, kernels=kernels).tokens
        div = [(b, next((i for i, (x, y) in enumerate(zip(r, g)) if x != y), min(len(r), len(g))))
               for b, (r, g) in enumerate(zip(ar, res.tokens)) if r != g]
        print(f"\nDDTree vs AR: {len(div)} request(s) differ" + "".join(
            f"; request {b} from position {p} (AR {ar[b][p:p + 1]}, DDTree "
            f"{res.tokens[b][p:p + 1]})" for b, p in div))
        a.watch += [f"{b}:{p}" for b, p in div]
    for w in a.watch:
        b, _, pos = w.partition(":")
        b, pos = int(b), int(pos)
        wdf = watch(sh, res, b, pos)
        print(f"\nrequest {b} position {pos}: emitted in step {step_of(res, b, pos)}, token "
              f"{res.tokens[b][pos] if pos < len(res.tokens[b]) else None}")
        if len(wdf):
            print(wdf.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if a.csv:
        df.to_csv(a.csv, index=False)
        print(f"wrote {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
