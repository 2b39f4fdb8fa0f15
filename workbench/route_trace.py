"""Routing trace of the REAL decode loops at one (request, position): what every MoE router saw
and chose on the rows that feed that position, in the AR loop and in the DDTree loop.

    from workbench.route_trace import trace_pair, compare_traces
    ar, dd = trace_pair(target, drafter, prompts, request=21, position=9, max_new_tokens=12,
                        budget=64, kernels="optimized")
    report, table, line = compare_traces(ar, dd, target)   # line: the verdict

    python -m workbench.shadow --preset trained --kernels optimized --batch 32 --budget 64 \\
        --max-new-tokens 12 --device cuda --route-trace 21:9 --csv route_trace.csv

Why: check.explain_divergence replays one request teacher-forced (the request repeated to the
batch's row count), so it misses a divergence that needs the real batch's numerics (other requests'
rows in int4_moe's tiles, the verify batch's row count, the cache's length). Here nothing is
replayed: while `generate` runs (eager, cuda_graph=False) the registry hook (registry.wrapping, as
workbench.shadow uses it) wraps `moe_route` (the MoE input rows and the chosen ids of the watched
requests, per MoE layer: trace_runs / trace_pairs watch several (request, position) in one loop, as
the exact suite does for every divergent request), the target's final `rmsnorm` (its input) and the
`lm_head` call right after it (the loop's own logits: argmax and top-2), and `tree_walk` (each
DDTree step's accepted path, tree tokens, positions and choices). After the run the rows that
carried the request's sequence are picked: every prompt row (prefill, which is the same in both
loops but in a cache of another length) and, per emitted position q <= position, the row that
predicted it: AR step q-1's only row; in DDTree the step that emitted q (shadow.step_of) and the
accepted path's node at depth q - E (E tokens emitted before that step; the root, node 0, holds the
last emitted token and predicts token E). The mapping checks itself: each traced DDTree node must
hold token seq[r] at position r, and every predicting row's argmax must be the emitted token
(greedy), else RuntimeError.
The comparison is check.py's, on the loops' own inputs: K-th vs (K+1)-th router gap and its
relative size (check.router_margin, on each loop's MoE input row), MoE-input relative L2
difference (hidden_rel), the first MoE layer (layer-major, over the request's rows up to the
predicting one) whose id SETS differ, and the verdict with check.py's constants and rule: a
flip there is EXPLAINED (router near-tie) when the AR input's gap is a near-tie
(router_margin_rel < NEAR_TIE_REL) reached through a rounding-level input difference
(hidden_rel < ROUNDING_REL) and DDTree's ids are the reference rule's on its own input (or that
is a near-tie too); with no flip, the argmax rule (check.logit_margin on the final norm's
input). AR is run A (the exact suite's reference loop), DDTree run B.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch

from workbench.dist.check import (
    NEAR_TIE_REL,
    ROUNDING_REL,
    explanation,
    largest_input_difference,
    logit_margin,
    router_margin,
)
from workbench.ops import registry
from workbench.shadow import step_of


@dataclass
class RouteTrace:
    """One loop's view of request `request` up to the row predicting `position`.

    Rows r = 0 .. prompt_len - 1 + position index the request's sequence seq = prompt + tokens
    (row r holds seq[r] and predicts seq[r + 1]: the last row predicts tokens[position]).
    where[r]: (step, row in that forward) with step -1 for prefill (the row's index in its
    chunk), DDTree: the tree node. Per MoE layer i: ids[i] [R, K] (the loop's own), hidden[i]
    [R, D] fp32 (the moe_route input), and check.router_margin on that input: margin[i],
    margin_rel[i] [R], ref_ids[i] [R, K] (the reference rule's top-k), pair[i] [R, 2]
    (the K-th and (K+1)-th expert). final [R, D]: the final norm's input; argmax [R],
    top2 [R, 2] values and top2_ids [R, 2] of the loop's logits; logit_margin_rel: check's
    argmax measure on the predicting row's final-norm input."""

    mode: str
    request: int
    position: int
    prompt_len: int
    seq: list[int]
    tokens: list[int]  # the request's emitted tokens in this loop (all of them)
    where: list[tuple[int, int]]
    layers: list[int]
    ids: dict[int, torch.Tensor]
    hidden: dict[int, torch.Tensor]
    margin: dict[int, torch.Tensor]
    margin_rel: dict[int, torch.Tensor]
    ref_ids: dict[int, torch.Tensor]
    pair: dict[int, torch.Tensor]
    final: torch.Tensor
    argmax: torch.Tensor
    top2: torch.Tensor
    top2_ids: torch.Tensor
    logit_margin_rel: float = math.nan

    @property
    def row(self) -> int:
        """The row that predicts tokens[position]."""
        return self.prompt_len - 1 + self.position


@dataclass
class _Rows:
    """One watched request's rows of every recorded call, on the CPU (the calls' dtypes)."""

    moe: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    final: list[torch.Tensor] = field(default_factory=list)
    logits: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    walks: list[dict] = field(default_factory=list)


@dataclass
class _Recorder:
    """The registry hook: keeps the watched requests' rows of every call (`of[request]`), one
    device-to-host copy a call for all of them."""

    target: object
    requests: tuple[int, ...]
    batch: int
    of: dict[int, _Rows] = field(init=False)
    _after_final_norm: bool = False

    def __post_init__(self):
        m = self.target.model
        # identity of the weight tensor tells the target's calls from the drafter's (which
        # shares the LM head, and has its own norms)
        self.gates = {id(lyr.mlp.gate.weight): int(k) for k, lyr in m.layers.items()
                      if lyr.is_moe}
        self.norm_w = m.norm.weight
        self.of = {b: _Rows() for b in self.requests}

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """The requests' rows of a call's tensor: [B * N, F] or [B, N, F] -> [requests, N, F]."""
        return x.reshape(self.batch, -1, x.shape[-1])[list(self.requests)]

    def _keep(self, field_name: str, *per_request: torch.Tensor, head=()) -> None:
        for k, b in enumerate(self.requests):  # views of one host copy, request k's slice
            getattr(self.of[b], field_name).append((*head, *(t[k] for t in per_request)))

    def wrap(self, name: str, fn):
        if name not in ("moe_route", "rmsnorm", "lm_head", "tree_walk"):
            return fn

        def traced(*args, **kwargs):
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("route trace: called inside CUDA-graph capture; it copies "
                                   "rows to the host: run with cuda_graph=False")
            out = fn(*args, **kwargs)
            if name == "moe_route" and id(args[1]) in self.gates:
                h, ids = args[0], out[0]  # [B*N, D], [B*N, K]
                self._keep("moe", self._rows(h).cpu(), self._rows(ids).cpu(),
                           head=(self.gates[id(args[1])],))
            elif name == "rmsnorm" and args[1] is self.norm_w:
                for b, x in zip(self.requests, self._rows(args[0]).cpu()):  # [N, D] each
                    self.of[b].final.append(x)
                self._after_final_norm = True
            elif name == "lm_head" and self._after_final_norm:  # model.logits: norm, then head
                self._after_final_norm = False
                lg = self._rows(out)  # [requests, N, V]; fp32 values are exact: ranks kept
                top = lg.topk(2, -1)
                self._keep("logits", lg.argmax(-1).cpu(), top.values.float().cpu(),
                           top.indices.cpu())
            elif name == "tree_walk":
                tree, choice = args[0], args[1]
                acc_idx, acc_len = out[0].cpu(), out[1].cpu()
                tokens, positions, choice = (tree.tokens.cpu(), tree.positions.cpu(),
                                             choice.cpu())
                for b in self.requests:
                    self.of[b].walks.append({"path": acc_idx[b, : int(acc_len[b])].tolist(),
                                             "tokens": tokens[b].tolist(),
                                             "positions": positions[b].tolist(),
                                             "choice": choice[b].tolist()})
            return out

        return traced


@contextlib.contextmanager
def recording(target, requests, batch: int) -> Iterator[_Recorder]:
    """While active, the target's moe_route / final rmsnorm / lm_head and the loop's tree_walk
    calls are recorded for `requests` (an int or several) of a `batch`-request run (another
    shadow keeps working); rec.of[request] holds one request's rows."""
    reqs = (requests,) if isinstance(requests, int) else tuple(requests)
    rec = _Recorder(target, reqs, batch)
    with registry.wrapping(rec.wrap):
        yield rec


def _check_request(request: int, position: int, prompts, max_new_tokens: int) -> None:
    if not isinstance(request, int) or not 0 <= request < len(prompts):
        raise ValueError(f"request: expected an index in [0, {len(prompts)}) (the batch's "
                         f"requests), got {request!r}")
    if not isinstance(position, int) or not 0 <= position < max_new_tokens:
        raise ValueError(f"position: expected an index in [0, {max_new_tokens}) "
                         f"(max_new_tokens), got {position!r}")


def build_trace(rec: _Recorder, result, prompt: list[int], position: int,
                request: int | None = None) -> RouteTrace:
    """The rows of the request's sequence picked from the recorder's calls (module docstring);
    request: which of the recorded requests (None: the only one)."""
    from workbench.generate import PREFILL_CHUNK

    if request is None:
        if len(rec.requests) != 1:
            raise ValueError(f"request: expected one of the recorded requests {rec.requests}, "
                             "got None")
        request = rec.requests[0]
    if request not in rec.of:
        raise ValueError(f"request: expected one of the recorded requests {rec.requests}, got "
                         f"{request!r}")
    target, b, got = rec.target, request, rec.of[request]
    toks = result.tokens[b]
    if position >= len(toks):
        raise ValueError(f"position: expected < {len(toks)} (tokens generated for request {b} "
                         f"in the {result.mode} loop), got {position}")
    layers = sorted(set(rec.gates.values()))
    nl = len(layers)
    if len(got.moe) % nl or len(got.final) * nl != len(got.moe):
        raise RuntimeError(f"route trace: {len(got.moe)} moe_route calls, {len(got.final)} "
                           f"final norms for {nl} MoE layers: not whole target forwards")
    fwd = [got.moe[f * nl:(f + 1) * nl] for f in range(len(got.final))]
    n_pre = len(fwd) - len(result.steps)  # one target forward per decode step, after prefill
    ddtree = result.mode != "ar"
    if ddtree and len(got.walks) != len(result.steps):
        raise RuntimeError(f"route trace: {len(got.walks)} tree walks for {len(result.steps)} "
                           "steps")
    P, seq = len(prompt), list(prompt) + list(toks)
    where, src = [], []  # (step, row) labels; (forward, row in it)
    for r in range(P + position):
        if r < P:  # prefill: chunks of PREFILL_CHUNK rows, the request's rows first in each
            f, n = r // PREFILL_CHUNK, r % PREFILL_CHUNK
            if f >= n_pre:
                raise RuntimeError(f"route trace: prompt row {r} in prefill chunk {f}, but "
                                   f"only {n_pre} prefill forwards were recorded")
            where.append((-1, n))
        else:
            q = r - P + 1  # the position row r predicts
            s = step_of(result, b, q)
            emitted = 1 + sum(st["accepted"][b] for st in result.steps[:s])
            d = q - emitted
            n = got.walks[s]["path"][d] if ddtree else 0
            if ddtree:
                w = got.walks[s]
                if (w["tokens"][n], w["positions"][n], w["choice"][n]) != (seq[r], r, seq[r + 1]):
                    raise RuntimeError(
                        f"route trace: step {s} node {n} (depth {d}) holds token "
                        f"{w['tokens'][n]} at {w['positions'][n]} choosing {w['choice'][n]}; "
                        f"expected {seq[r]} at {r} choosing {seq[r + 1]}")
            f = n_pre + s
            where.append((s, n))
        src.append((f, n))
    R = len(src)

    def pick(per):  # per(forward) -> that forward's [N, ...] rows: stacked over `src`
        return torch.stack([per(f)[n] for f, n in src])

    ids = {i: pick(lambda f, j=j: fwd[f][j][2]) for j, i in enumerate(layers)}
    hidden = {i: pick(lambda f, j=j: fwd[f][j][1]).float() for j, i in enumerate(layers)}
    for j, i in enumerate(layers):  # the recorder's forward grouping must be layer-ordered
        if any(fwd[f][j][0] != i for f in range(len(fwd))):
            raise RuntimeError(f"route trace: moe_route calls out of layer order at layer {i}")
    argmax = pick(lambda f: got.logits[f][0])
    for r in range(P - 1, R):  # greedy: each predicting row's argmax is the emitted token
        if int(argmax[r]) != seq[r + 1]:
            raise RuntimeError(f"route trace ({result.mode}): row {r} at {where[r]} has argmax "
                               f"{int(argmax[r])}, the loop emitted {seq[r + 1]}")
    K = target.cfg.n_experts_per_tok
    rm = {i: [router_margin(hidden[i][r], target.model.layers[str(i)].mlp, K) for r in range(R)]
          for i in layers}
    final = pick(lambda f: got.final[f]).float()
    return RouteTrace(
        mode=result.mode, request=b, position=position, prompt_len=P, seq=seq[: R + 1],
        tokens=list(toks), where=where, layers=layers, ids=ids, hidden=hidden,
        margin={i: torch.tensor([m["margin"] for m in rm[i]], dtype=torch.float64)
                for i in layers},
        margin_rel={i: torch.tensor([m["margin_rel"] for m in rm[i]], dtype=torch.float64)
                    for i in layers},
        ref_ids={i: torch.tensor([m["ids"] for m in rm[i]]) for i in layers},
        pair={i: torch.tensor([m["pair"] for m in rm[i]]) for i in layers},
        final=final, argmax=argmax, top2=pick(lambda f: got.logits[f][1]),
        top2_ids=pick(lambda f: got.logits[f][2]),
        logit_margin_rel=logit_margin(target, final[R - 1])["margin_rel"])


@torch.no_grad()
def _traced_loop(target, drafter, prompts, watch: dict[int, int], max_new_tokens: int,
                 budget: int | None, kernels, progress: bool, stop_tokens
                 ) -> dict[int, RouteTrace | Exception]:
    """ONE real loop traced at every watched (request: position); a request whose rows do not
    map (build_trace's RuntimeError / ValueError) gets its exception instead of a trace."""
    from workbench.generate import generate

    for b, n in watch.items():
        _check_request(b, n, prompts, max_new_tokens)
    with recording(target, tuple(watch), len(prompts)) as rec:
        res = generate(target, drafter if budget else None, prompts, max_new_tokens,
                       budget=budget, kernels=kernels, cuda_graph=False, progress=progress,
                       stop_tokens=stop_tokens)
    out: dict[int, RouteTrace | Exception] = {}
    for b, n in watch.items():
        try:
            out[b] = build_trace(rec, res, list(prompts[b]), n, request=b)
        except (RuntimeError, ValueError) as e:
            out[b] = e
    return out


def trace_runs(target, drafter, prompts, watch: dict[int, int], max_new_tokens: int,
               budget: int | None = None, kernels=None, progress: bool = False,
               stop_tokens=None) -> dict[int, RouteTrace]:
    """trace_run at several {request: position} of the same loop: the loop runs once (what a
    batch with many divergent requests costs the exact suite), the first failure raised."""
    out = _traced_loop(target, drafter, prompts, watch, max_new_tokens, budget, kernels,
                       progress, stop_tokens)
    for t in out.values():
        if isinstance(t, Exception):
            raise t
    return out


def trace_run(target, drafter, prompts, request: int, position: int, max_new_tokens: int,
              budget: int | None = None, kernels=None, progress: bool = False,
              stop_tokens=None) -> RouteTrace:
    """One real greedy loop (AR when budget is None, else DDTree), eager, traced at
    (request, position); position indexes the request's emitted tokens, 0-based."""
    return trace_runs(target, drafter, prompts, {request: position}, max_new_tokens, budget,
                      kernels, progress, stop_tokens)[request]


_SAME = object()


def trace_pairs(target, drafter, prompts, watch: dict[int, int], max_new_tokens: int,
                budget: int | None, kernels=None, progress: bool = False, stop_tokens=None,
                kernels_a=_SAME, ar_traces: dict | None = None, failed: dict | None = None
                ) -> dict[int, tuple[RouteTrace, RouteTrace]]:
    """{request: (AR trace, DDTree trace)} at every watched {request: position}, each loop run
    once for all of them (trace_pair's runs and kernels). ar_traces: {(request, position): run
    A's trace} from earlier calls with the same target, prompts, max_new_tokens, stop tokens
    and run-A kernels, read and filled here (run A, an AR loop, does not depend on the budget:
    the exact suite compares six budgets against one AR run), so run A runs only for the
    watched pairs it lacks, and not at all when it has them. failed: where given, a request
    whose trace fails (its rows do not map, or a loop raises) is left out and its exception
    kept there (failed[request]) instead of raised."""
    for b, n in watch.items():  # before either loop runs
        _check_request(b, n, prompts, max_new_tokens)
    if budget is None and kernels_a is _SAME:
        raise ValueError("budget: expected a DDTree budget for the DDTree run, got None")
    ar_traces = {} if ar_traces is None else ar_traces
    for (b, n), tr in ar_traces.items():
        if watch.get(b) != n:
            continue
        got = (tr.mode, tr.request, tr.position, tr.seq[:len(prompts[b])])
        want = ("ar", b, n, list(prompts[b]))
        if got != want:
            raise ValueError(f"ar_trace: expected the AR trace of request {b} position {n} "
                             f"(mode, request, position, prompt {want}), got {got}")

    def loop(todo, drafter_, budget_, kernels_):
        if not todo:
            return {}
        try:
            return _traced_loop(target, drafter_, prompts, todo, max_new_tokens, budget_,
                                kernels_, progress, stop_tokens)
        except Exception as e:  # noqa: BLE001 (kept per request where the caller asks)
            if failed is None:
                raise
            return {b: e for b in todo}

    new_a = loop({b: n for b, n in watch.items() if (b, n) not in ar_traces}, None, None,
                 kernels if kernels_a is _SAME else kernels_a)
    for b, tr in new_a.items():
        if not isinstance(tr, Exception):
            ar_traces[(b, watch[b])] = tr
    dd = loop(dict(watch), drafter, budget, kernels)
    out = {}
    for b, n in watch.items():
        pair = (ar_traces.get((b, n), new_a.get(b)), dd[b])
        bad = next((t for t in pair if isinstance(t, Exception)), None)
        if bad is None:
            out[b] = pair
        elif failed is None:
            raise bad
        else:
            failed[b] = bad
    return out


def trace_pair(target, drafter, prompts, request: int, position: int, max_new_tokens: int,
               budget: int | None, kernels=None, progress: bool = False, stop_tokens=None,
               kernels_a=_SAME, ar_trace: RouteTrace | None = None
               ) -> tuple[RouteTrace, RouteTrace]:
    """(AR trace, DDTree trace) of the same request and position under the same kernels; with
    kernels_a, run A is AR under kernels_a (None: the reference ops) and run B runs under
    `kernels`, AR when budget is None (an op's kernel loop against the reference loop).
    ar_trace: run A's trace from an earlier call with the same target, prompts, request,
    position, max_new_tokens, stop tokens and run-A kernels (an AR loop does not depend on the
    budget: the exact suite compares six budgets against one AR run); it is not run again."""
    known = {} if ar_trace is None else {(request, position): ar_trace}  # checked there
    return trace_pairs(target, drafter, prompts, {request: position}, max_new_tokens, budget,
                       kernels, progress, stop_tokens, kernels_a, known)[request]


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row |b - a|_2 / |a|_2 (check.first_discrete_divergence's hidden_rel)."""
    return (b.double() - a.double()).norm(dim=-1) / a.double().norm(dim=-1).clamp_min(1e-30)


def layer_table(a: RouteTrace, b: RouteTrace) -> pd.DataFrame:
    """Long format, one line per (row, MoE layer) and a layer "final" line per row.

    position: the emitted token the row predicts (< 0: a prompt row, predicting the prompt);
    where_ar / where_dd: (step, row or tree node), step -1 for prefill (RouteTrace.where).

    MoE lines: ids_ar/ids_dd (the loops' own, in their order), ids_equal (as sets), gap_* =
    the K/K+1 router gap on that loop's input, gap_rel_* its relative size, pair_* (the K-th and
    (K+1)-th expert), hidden_rel / hidden_max_abs (DDTree vs AR input). "final" lines: ids_* =
    the loop's top-2 token ids, gap_* = its top-2 logit margin, hidden_rel = the final norm's
    input difference (gap_rel_ar: check.logit_margin's relative size, predicting row only)."""
    rows = []
    for r in range(a.row + 1):
        q = r - a.prompt_len + 1
        base = dict(row=r, position=q, predicting=r == a.row,
                    where_ar=a.where[r], where_dd=b.where[r])
        for i in a.layers:
            ia, ib = a.ids[i][r].tolist(), b.ids[i][r].tolist()
            d = b.hidden[i][r].double() - a.hidden[i][r].double()
            rows.append(base | dict(
                layer=str(i), ids_ar=ia, ids_dd=ib, ids_equal=set(ia) == set(ib),
                gap_ar=float(a.margin[i][r]), gap_rel_ar=float(a.margin_rel[i][r]),
                gap_dd=float(b.margin[i][r]), gap_rel_dd=float(b.margin_rel[i][r]),
                pair_ar=tuple(a.pair[i][r].tolist()), pair_dd=tuple(b.pair[i][r].tolist()),
                hidden_rel=float(_rel(a.hidden[i][r], b.hidden[i][r])),
                hidden_max_abs=float(d.abs().max())))
        ma, mb = a.top2[r], b.top2[r]
        rows.append(base | dict(
            layer="final", ids_ar=a.top2_ids[r].tolist(), ids_dd=b.top2_ids[r].tolist(),
            ids_equal=int(a.argmax[r]) == int(b.argmax[r]),
            gap_ar=float(ma[0] - ma[1]), gap_dd=float(mb[0] - mb[1]),
            gap_rel_ar=a.logit_margin_rel if r == a.row else math.nan,
            gap_rel_dd=b.logit_margin_rel if r == a.row else math.nan,
            hidden_rel=float(_rel(a.final[r], b.final[r])),
            hidden_max_abs=float((b.final[r].double() - a.final[r].double()).abs().max())))
    return pd.DataFrame(rows)


def compare_traces(a: RouteTrace, b: RouteTrace, target=None, near_tie: float = NEAR_TIE_REL,
                   rounding: float = ROUNDING_REL, names=("AR", "DDTree")
                   ) -> tuple[dict, pd.DataFrame, str]:
    """AR trace `a` vs DDTree trace `b` of one (request, position): (report, table, verdict).

    report: first_discrete_divergence's keys where they apply (layer, flips with the same
    keys, hidden {layer: max_rel, max_abs}, final_rel, logit margins, argmax_a/b, reproduced =
    the loops' argmax differ at the row) + explained. target (optional): the model, for
    router_margin_b (AR's K/K+1 pair's gap on DDTree's input; NaN without it).
    The rule is explain_divergence's (check.py); traces that already differ in tokens before
    the row cannot be compared row by row: ValueError. names: the two loops in the verdict
    line (("reference", "kernel") for trace_pair's kernels_a runs)."""
    if (a.request, a.position, a.prompt_len) != (b.request, b.position, b.prompt_len):
        raise ValueError(f"traces: expected the same (request, position, prompt_len), got "
                         f"{(a.request, a.position, a.prompt_len)} and "
                         f"{(b.request, b.position, b.prompt_len)}")
    if a.seq[: a.row + 1] != b.seq[: b.row + 1]:
        first = next(i for i, (x, y) in enumerate(zip(a.seq, b.seq)) if x != y)
        raise ValueError(f"position: expected <= {first - a.prompt_len} (the loops' first "
                         f"divergence in request {a.request}), got {a.position}")
    table = layer_table(a, b)
    row = a.row
    fa, fb = a.top2[row], b.top2[row]
    d = {"request": a.request, "position": a.position, "row": row, "prompt_len": a.prompt_len,
         "logit_margin": float(fa[0] - fa[1]), "logit_margin_b": float(fb[0] - fb[1]),
         "logit_margin_rel": a.logit_margin_rel, "argmax_a": int(a.argmax[row]),
         "argmax_b": int(b.argmax[row]), "final_rel": float(_rel(a.final[row], b.final[row])),
         "layer": None, "flips": [], "hidden": {}}
    d["reproduced"] = d["argmax_a"] != d["argmax_b"]
    K = a.ids[a.layers[0]].shape[-1] if a.layers else 0
    for i in a.layers:
        rel = _rel(a.hidden[i], b.hidden[i])  # [R]
        diff = (b.hidden[i].double() - a.hidden[i].double()).abs().amax(-1)
        d["hidden"][i] = {"max_abs": float(diff.max()), "max_rel": float(rel.max())}
        ra, rb = a.ids[i].tolist(), b.ids[i].tolist()
        flipped = [r for r in range(row + 1) if set(ra[r]) != set(rb[r])]
        if not flipped or d["layer"] is not None:
            continue
        d["layer"] = i
        for r in flipped:
            pair = tuple(a.pair[i][r].tolist())
            gap_b = math.nan if target is None else router_margin(
                b.hidden[i][r], target.model.layers[str(i)].mlp, K, pair)["margin"]
            d["flips"].append({
                "row": r, "position": r - a.prompt_len + 1, "ids_a": ra[r], "ids_b": rb[r],
                "router_margin": float(a.margin[i][r]),
                "router_margin_rel": float(a.margin_rel[i][r]), "router_margin_b": gap_b,
                "pair": pair, "hidden_diff": float(diff[r]), "hidden_rel": float(rel[r]),
                "router_ok_a": set(a.ref_ids[i][r].tolist()) == set(ra[r]),
                "router_ok_b": set(b.ref_ids[i][r].tolist()) == set(rb[r]),
                "router_margin_rel_b": float(b.margin_rel[i][r])})
    return d, table, _verdict(d, near_tie, rounding, names)


def _verdict(d: dict, near_tie: float, rounding: float, names=("AR", "DDTree")) -> str:
    """check.explanation's rule and line for the real loops (a = names[0], b = names[1]);
    d["explained"] is None when the row's argmax and every expert set agree (nothing to
    explain there)."""
    na, nb = names
    head = (f"request {d['request']} position {d['position']} (row {d['row']}, prompt "
            f"{d['prompt_len']}): real loops emit {na} {d['argmax_a']} vs {nb} {d['argmax_b']} "
            f"({'differ' if d['reproduced'] else 'same'}); logit top-2 margin {na} "
            f"{d['logit_margin']:.4g}, {nb} {d['logit_margin_b']:.4g}; final-norm input rel "
            f"{d['final_rel']:.3g}")
    if not d["flips"] and not d["reproduced"]:  # same token, same experts
        d["explained"] = None
        return (f"NO DIVERGENCE at this row: {head}; no routing differs; "
                f"{largest_input_difference(d['hidden'])}")
    return explanation(d, head, near_tie, rounding)


def parse_watch(text: str) -> tuple[int, int]:
    """'REQ:POS' -> (REQ, POS)."""
    req, sep, pos = text.partition(":")
    try:
        return int(req), int(pos)
    except ValueError:
        raise ValueError(f"route-trace: expected REQ:POS (two ints), got {text!r}") from None


def run_cli(target, drafter, prompts, watch: str, max_new_tokens: int, budget: int, kernels,
            csv: str | None = None, progress: bool = True) -> int:
    """`python -m workbench.shadow ... --route-trace REQ:POS [--csv PATH]`: both loops traced,
    the predicting row's per-layer table and the verdict printed; the csv holds every row."""
    req, pos = parse_watch(watch)
    ar, dd = trace_pair(target, drafter, prompts, req, pos, max_new_tokens, budget, kernels,
                        progress)
    rep, table, line = compare_traces(ar, dd, target)
    cols = ["layer", "ids_ar", "ids_dd", "ids_equal", "gap_ar", "gap_rel_ar", "gap_dd",
            "gap_rel_dd", "hidden_rel", "hidden_max_abs"]
    print(f"\nroute trace, request {req} position {pos}: AR emitted {ar.tokens}, DDTree "
          f"{dd.tokens}; predicting row {ar.row} = AR {ar.where[ar.row]}, DDTree (step, node) "
          f"{dd.where[dd.row]}")
    print(table[table["predicting"]][cols].to_string(index=False,
                                                      float_format=lambda x: f"{x:.4g}"))
    for i, h in rep["hidden"].items():
        flips = int((~table[(table["layer"] == str(i))]["ids_equal"]).sum())
        print(f"layer {i}: over the request's rows up to the predicting one, MoE-input rel <= "
              f"{h['max_rel']:.3g}, {flips} row(s) with other expert sets")
    print(line)
    if csv:
        table.to_csv(csv, index=False)
        print(f"wrote {csv}")
    return 0
