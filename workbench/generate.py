"""The decode loop: prefill, then autoregressive or DDTree steps, for a batch of requests.

One loop for both modes (gpt-fast style: plain step functions, host-side control):
    prefill   chunks of <= 128 prompt rows per forward (causal chain masks; padding rows see
              only themselves), first token from each prompt's last row
    ar_step   one row per request
    ddtree    draft -> build -> verify -> walk -> commit (DESIGN.md §5); the commit's drafter
              context goes through the `drafter_materialize` op: inside the step (and its CUDA
              graph) for a kernel variant, on the host after the step for the reference
Legend: B requests, N rows per request (budget + 1 in DDTree), L draft depth, K top-k.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from workbench import ops
from workbench.cuda_graph import copy_out
from workbench.reference.tree_mla import pack_anc_bits
from workbench.tracing import nvtx_range, phase_range

PHASES = ("draft", "build", "verify", "walk", "commit")
_RANGES = {p: nvtx_range(phase_range(p)) for p in PHASES}  # ddtree/<phase> (no-ops unprofiled)


class _Phases:
    """phase(name) -> the NVTX range, and the timer's span too when one is given (a timer has
    .phase(name), a context manager: workbench.loopbench.PhaseTimer, eager loops only)."""

    def __init__(self, timer=None):
        self.timer = timer

    @contextlib.contextmanager
    def _both(self, name):
        with _RANGES[name], self.timer.phase(name):
            yield

    def __call__(self, name: str):
        return _RANGES[name] if self.timer is None else self._both(name)

PREFILL_CHUNK = 128  # rows per prefill forward: the tree_mla kernels' N limit


@dataclass
class GenerateResult:
    tokens: list[list[int]]  # new tokens per request (stop token included when hit)
    steps: list[dict] = field(default_factory=list)  # one dict per decode step
    prompt_lens: list[int] = field(default_factory=list)
    # "ar", "ddtree", or "ddtree-replay" (acceptance replay: NOT the target's tokens, see
    # workbench/acceptance.py)
    mode: str = "ar"
    budget: int | None = None
    first_tree: object = None  # the DDTree of step 0 (for drawing), None in AR mode
    acceptance: str | None = None  # the replay trace's label in "ddtree-replay" mode

    @property
    def accepted(self) -> list[int]:
        """Tokens emitted per active request per step (bonus included): the τ samples."""
        return [a for s in self.steps for a, live in zip(s["accepted"], s["active"]) if live]

    @property
    def tokens_per_step(self) -> float:
        acc = self.accepted
        return sum(acc) / max(len(acc), 1)

    def stats(self):
        """Per-step, per-request rows as a pandas DataFrame."""
        import pandas as pd

        rows = []
        for s in self.steps:
            for b, (a, live) in enumerate(zip(s["accepted"], s["active"])):
                if live:
                    rows.append({"step": s["step"], "request": b, "accepted": a,
                                 "tree_size": s["tree_size"][b],
                                 "distinct_experts_mean": s["distinct_experts_mean"],
                                 "time_s": s["time_s"]})
        return pd.DataFrame(rows)

    def to_json(self) -> dict:
        return {
            "mode": self.mode, "budget": self.budget, "acceptance": self.acceptance,
            "tokens": self.tokens,
            "accepted_per_step": [[a for a, live in zip(s["accepted"], s["active"]) if live]
                                  for s in self.steps],
            "tokens_per_step": self.tokens_per_step,
            "distinct_experts_per_layer": [s["distinct_experts"] for s in self.steps],
        }


def _check_prompts(prompts, vocab: int) -> list[list[int]]:
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"prompts: expected a non-empty list of token-id lists, got {prompts!r}")
    out = []
    for b, p in enumerate(prompts):
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompts[{b}]: expected at least one token, got []")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompts[{b}]: expected token ids in [0, {vocab}), got {bad[:5]}")
        out.append(p)
    return out


def _per_request(value, n: int, name: str) -> list[int]:
    vals = [value] * n if isinstance(value, int) else list(value)
    if len(vals) != n or any(int(v) < 1 for v in vals):
        raise ValueError(f"{name}: expected a positive int or {n} positive ints, got {value!r}")
    return [int(v) for v in vals]


class _Sampler:
    """argmax at temperature 0, else one independent sample per row from softmax(logits / T)."""

    def __init__(self, temperature: float, seed: int | None, device):
        if temperature < 0:
            raise ValueError(f"temperature: expected >= 0, got {temperature}")
        self.t = temperature
        self.g = None
        if temperature > 0:
            self.g = torch.Generator(device=device)
            self.g.manual_seed(0 if seed is None else seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
        if self.t == 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / self.t, -1)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=self.g).view(probs.shape[:-1])


class _Requests:
    """Host-side bookkeeping: emitted tokens, stop conditions, which requests are still live."""

    def __init__(self, n: int, max_new: list[int], stop: set[int]):
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.max_new, self.stop = max_new, stop
        self.live = [True] * n

    def emit(self, b: int, toks: Iterable[int]) -> int:
        """Append tokens until a stop token or the length limit; returns how many were taken."""
        taken = 0
        for t in toks:
            if not self.live[b]:
                break
            self.out[b].append(int(t))
            taken += 1
            if int(t) in self.stop or len(self.out[b]) >= self.max_new[b]:
                self.live[b] = False
        return taken

    @property
    def any_live(self) -> bool:
        return any(self.live)


def _prefill(target, drafter, dcache, cache, prompts, capture):
    """Run all prompts through the target in chunks; returns the last-row logits [B, V]."""
    B, dev = len(prompts), target.device
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    last = [None] * B
    for c0 in range(0, int(lens.max()), PREFILL_CHUNK):
        w = min(PREFILL_CHUNK, int(lens.max()) - c0)
        valid = (lens - c0).clamp(0, w)  # [B] real rows in this chunk
        ids = torch.zeros(B, w, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : int(valid[b])] = torch.tensor(p[c0 : c0 + w], device=dev)
        prefix = torch.minimum(lens, torch.full_like(lens, c0))  # [B]
        i = torch.arange(w, device=dev)
        real = i.view(1, -1) < valid.view(-1, 1)  # [B, w]
        # real rows: causal chain; padding rows: only themselves
        mask = (i.view(1, 1, -1) <= i.view(1, -1, 1)) & real.unsqueeze(-1)
        mask |= torch.eye(w, dtype=torch.bool, device=dev).unsqueeze(0)
        pos = prefix.view(-1, 1) + i.view(1, -1)
        out = target(ids, pos, cache, prefix, pack_anc_bits(mask), capture=capture)
        for b in range(B):
            if valid[b] > 0 and c0 + int(valid[b]) == len(prompts[b]):
                last[b] = out.logits[b, int(valid[b]) - 1]
        if drafter is not None and out.captured is not None:
            materializer(drafter)(dcache, out.captured, pos, valid)
    return torch.stack(last)


def materializer(drafter):
    """The loop's drafter-context call (cache, target_hidden, positions, count): the registry's
    `drafter_materialize` op for a DFlashDrafter; a wrapper's own `materialize` otherwise (the
    ReplayDrafter's does nothing, the distributed DistDrafter's logs its time)."""
    from workbench.reference.drafter import DFlashDrafter

    if isinstance(drafter, DFlashDrafter):
        return functools.partial(ops.get("drafter_materialize"), drafter)
    return drafter.materialize


def in_step_materializer(drafter):
    """The materialisation `_DDTreeStep` runs in its commit phase (inside the step's CUDA graph),
    or None when the loop calls it on the host after the step: a wrapper drafter, or the
    reference op (it reads lengths on the host, which a graph capture forbids)."""
    from workbench.reference.drafter import DFlashDrafter

    if isinstance(drafter, DFlashDrafter) and ops.selected("drafter_materialize") != ops.REFERENCE:
        return materializer(drafter)
    return None


def _distinct_experts(routing: list[torch.Tensor], rows_valid: torch.Tensor) -> list[int]:
    """Distinct routed experts per MoE layer over the valid rows ([B, N] bool) of this forward."""
    return [int(torch.unique(r[rows_valid]).numel()) for r in routing]


def commit_tree_kv(cache: torch.Tensor, prefix: torch.Tensor, acc_idx: torch.Tensor,
                   acc_len: torch.Tensor) -> None:
    """Move the accepted path's rows to slots P..P+k-1 in every layer (gather, then scatter).

    cache [layers, B, T, C+R]; acc_idx [B, N] tree-node indices of the path (root first, -1 pad).
    The moved K needs no re-rotation: node i_d was computed at position P + d already.
    No host sync (graph-capturable): every shape is fixed; a padding entry (d >= acc_len)
    copies the root's slot P onto itself, and the root's own entry does the same (node 0 sits
    at P), so every duplicate write to slot P carries the one value gathered from it.
    """
    B, N = acc_idx.shape
    d = torch.arange(N, device=cache.device).view(1, -1)
    keep = d < acc_len.view(-1, 1)  # [B, N]
    P = prefix.view(-1, 1)
    src = P + torch.where(keep, acc_idx, 0)  # [B, N]
    dst = torch.where(keep, P + d, P)
    bi = torch.arange(B, device=cache.device).view(-1, 1).expand(B, N)
    rows = cache[:, bi, src]  # [layers, B, N, C+R]; gather first: a source may be a later dst
    cache[:, bi, dst] = rows


class _ARStep:
    """Device part of an AR step: one row per request through the target, then sample."""

    def __init__(self, target, cache, sample, phase=None):
        self.target, self.cache, self.sample = target, cache, sample
        self.phase = phase or _Phases()

    def __call__(self, bonus: torch.Tensor, prefix: torch.Tensor) -> dict:
        B = bonus.shape[0]
        anc = torch.ones(B, 1, 1, dtype=torch.long, device=bonus.device)  # one row sees itself
        with self.phase("verify"):
            out = self.target(bonus.view(B, 1), prefix.view(B, 1), self.cache, prefix, anc,
                              record_routing=True)
            nxt = self.sample(out.logits[:, 0])  # [B]
        return {"nxt": nxt, "acc_len": torch.ones_like(nxt),
                "routing": out.stats.get("routing", [])}


class _DDTreeStep:
    """Device part of a DDTree step: draft -> build -> verify -> walk -> KV commit.

    Returns the tree, the accepted path (acc_idx [B, N], acc_len [B], path_tokens [B, N]), the
    bonus tokens nxt [B], the target features of the path's first A = min(N, block_size) rows
    for the drafter (hid [B, A, F], pos [B, A]: an accepted path is at most one block long) and
    the routing ids per MoE layer. Fixed shapes for a given (B, budget); no host sync when every
    op selected is a kernel (GraphedStep captures it).
    replay: a workbench.acceptance.ReplayWalk that replaces the walk (accepted lengths drawn
    from a trace, not the target's greedy choice); its outputs add max_accept [B].
    materialize: None (the loop materialises hid/pos on the host after the step), or
    fn(cache, hid, pos, count) run in the commit phase, inside the step (`in_step_materializer`:
    the `drafter_materialize` kernel; the graph warm-up's eager call stacks its weights).
    """

    def __init__(self, target, drafter, dcache, cache, budget, capture, sample, replay=None,
                 phase=None, materialize=None):
        self.target, self.drafter, self.dcache, self.cache = target, drafter, dcache, cache
        self.budget, self.capture, self.sample = budget, capture, sample
        self.k = min(budget, target.cfg.vocab_size)
        self.replay, self.phase = replay, phase or _Phases()
        self.materialize = materialize

    def __call__(self, bonus: torch.Tensor, prefix: torch.Tensor) -> dict:
        dr, n_rows, phase = self.drafter, self.budget + 1, self.phase
        with phase("draft"):  # a ReplayDrafter (workbench/replay.py) replays a recorded path
            draft = getattr(dr, "draft_override", None) or ops.get("drafter")
            lp, ids = draft(dr, self.target, self.dcache, bonus, prefix, self.k)
        with phase("build"):
            tree = ops.get("tree_build")(lp, ids, self.budget, root_tokens=bonus,
                                         prefix_lens=prefix)
        with phase("verify"):
            out = self.target(tree.tokens, tree.positions, self.cache, prefix, tree.anc_bits,
                              capture=self.capture, record_routing=True)
            choice = self.sample(out.logits)  # [B, N]: the target's token after each node
        max_accept = None
        with phase("walk"):
            if self.replay is None:
                acc_idx, acc_len, nxt = walk_tree(tree, choice)
            else:  # acceptance replay: lengths drawn from a trace (workbench/acceptance.py)
                acc_idx, acc_len, nxt, max_accept = self.replay(tree, choice)
        path = acc_idx.clamp_min(0)
        o = {"tree": tree, "acc_idx": acc_idx, "acc_len": acc_len, "nxt": nxt,
             "path_tokens": torch.gather(tree.tokens, 1, path),
             "routing": out.stats.get("routing", []), "captured": out.captured,
             "hid": None, "pos": None, "max_accept": max_accept}
        with phase("commit"):
            commit_tree_kv(self.cache, prefix, acc_idx, acc_len)
            if out.captured is not None:
                A = min(n_rows, dr.cfg.block_size)  # acc_len <= depth + 1 = block_size rows
                o["hid"] = torch.gather(out.captured, 1, path[:, :A].unsqueeze(-1).expand(
                    -1, -1, out.captured.shape[-1]))  # [B, A, F]
                o["pos"] = prefix.view(-1, 1) + torch.arange(A, device=prefix.device)  # [B, A]
                if self.materialize is not None:  # fixed shapes, count read on the device
                    self.materialize(self.dcache, o["hid"], o["pos"], acc_len)
        return o


@torch.no_grad()
def generate(target, drafter=None, prompts=(), max_new_tokens: int | Sequence[int] = 32,
             budget: int | None = None, temperature: float = 0.0, seed: int | None = None,
             stop_tokens: Iterable[int] | None = None, kernels=None,
             progress: bool = False, on_step=None, cuda_graph: bool = False,
             acceptance=None, timer=None) -> GenerateResult:
    """Greedy or sampled decoding of a batch of prompts; DDTree when `budget` is given.

    target: a KimiModel; drafter: a DFlashDrafter (needed for DDTree); prompts: token-id lists
    of any lengths; budget: DDTree node budget B (None = autoregressive); temperature 0 = greedy;
    kernels: op selection for `workbench.ops.use` (e.g. {"tree_build": "triton_v1"}).
    on_step: optional callback(step_stats, kv_cache, prefix_lens) after every decode step.
    cuda_graph: replay each step's device part (draft, build, verify, walk, KV commit, and the
    drafter context when a `drafter_materialize` kernel is selected) from one CUDA graph per
    call (workbench/cuda_graph.py): greedy only, every selected op must be capture-safe
    (kernels="optimized"); one host sync per step reads the emitted tokens.
    DDTree emits exactly the tokens of autoregressive decoding under the same kernels.
    acceptance: a workbench.acceptance.AcceptanceTrace (or a path to its JSON): ACCEPTANCE
    REPLAY, a benchmark mode: the walk accepts lengths drawn from the trace (seeded by `seed`)
    along the tree's deepest path, so the tokens are NOT the target's; mode "ddtree-replay".
    timer: an object with .phase(name) -> context manager around each phase of each step
    (workbench.loopbench.PhaseTimer: CUDA events / wall clock); eager loops only.
    """
    cfg = target.cfg
    prompts = _check_prompts(prompts, cfg.vocab_size)
    B = len(prompts)
    max_new = _per_request(max_new_tokens, B, "max_new_tokens")
    if budget is not None:
        if not isinstance(budget, int) or not 1 <= budget <= 1024:
            raise ValueError(f"budget: expected an int in [1, 1024] or None, got {budget!r}")
        if drafter is None:
            raise ValueError("drafter: expected a DFlashDrafter when budget is set, got None")
    if cuda_graph and temperature != 0:
        raise ValueError(f"cuda_graph: needs greedy decoding (temperature 0), got temperature "
                         f"{temperature}")
    if cuda_graph and target.device.type != "cuda":
        raise ValueError(f"cuda_graph: needs the target on a CUDA device, got {target.device}")
    if acceptance is not None:
        from workbench.acceptance import AcceptanceTrace

        if budget is None:
            raise ValueError("acceptance: replay needs a DDTree budget, got budget=None")
        if not isinstance(acceptance, AcceptanceTrace):
            acceptance = AcceptanceTrace.load(acceptance)
    if timer is not None and cuda_graph:
        raise ValueError("timer: phase timing needs the eager loop, got cuda_graph=True")
    with ops.use(kernels):
        return _generate(target, drafter if budget else None, prompts, max_new, budget,
                         temperature, seed, set(stop_tokens or ()), progress, on_step,
                         cuda_graph, acceptance, timer)


def _generate(target, drafter, prompts, max_new, budget, temperature, seed, stop, progress,
              on_step, cuda_graph=False, acceptance=None, timer=None):
    from tqdm.auto import tqdm

    B, dev = len(prompts), target.device
    n_rows = 1 if budget is None else budget + 1
    max_len = max(len(p) for p in prompts) + max(max_new) + n_rows + 1
    cache = target.new_cache(B, max_len)
    sample = _Sampler(temperature, seed, dev)
    req = _Requests(B, max_new, stop)
    capture = () if drafter is None else tuple(
        getattr(drafter, "capture_layers", drafter.cfg.target_layer_ids))
    dcache = drafter.new_cache(B, max_len) if drafter is not None else None

    first = sample(_prefill(target, drafter, dcache, cache, prompts, capture))  # [B]
    prefix = torch.tensor([len(p) for p in prompts], device=dev)  # committed lengths P
    bonus = first.clone()  # emitted, not yet run through the target
    for b in range(B):
        req.emit(b, [int(first[b])])

    mode = "ar" if budget is None else "ddtree" if acceptance is None else "ddtree-replay"
    result = GenerateResult([], [], [len(p) for p in prompts], mode, budget)
    bar = tqdm(total=sum(max_new), disable=not progress, desc=result.mode)
    bar.update(sum(len(o) for o in req.out))
    phase = _Phases(timer)
    if budget is None:
        dstep = _ARStep(target, cache, sample, phase)
    else:
        replay = None
        if acceptance is not None:
            from workbench.acceptance import ReplayWalk

            replay = ReplayWalk(acceptance, budget, B, max_len, dev, 0 if seed is None else seed)
            result.acceptance = acceptance.label(budget)
        dstep = _DDTreeStep(target, drafter, dcache, cache, budget, capture, sample, replay,
                            phase, in_step_materializer(drafter))
        host_materialize = None if dstep.materialize is not None else materializer(drafter)
    if cuda_graph:
        from workbench.cuda_graph import GraphedStep

        dstep = GraphedStep(dstep, name=f"{result.mode} step (B={B}, budget={budget})")
    step = 0
    while req.any_live:
        t0 = time.perf_counter()
        active = list(req.live)
        o = dstep(bonus, prefix)  # device part: fixed shapes, no host sync
        acc_len, nxt = o["acc_len"], o["nxt"]
        if budget is None:
            emitted = [[t] for t in nxt.tolist()]
            rows_valid = torch.ones(B, 1, dtype=torch.bool, device=dev)
            tree_size = [1] * B
        else:
            tree = o["tree"]
            if result.first_tree is None:  # a graph's outputs are overwritten by the next step
                result.first_tree = copy_out(tree) if cuda_graph else tree
            lens, path, last = acc_len.tolist(), o["path_tokens"].tolist(), nxt.tolist()
            emitted = [path[b][1 : lens[b]] + [last[b]] for b in range(B)]
            rows_valid = torch.arange(n_rows, device=dev).view(1, -1) < tree.node_count.view(-1, 1)
            tree_size = tree.node_count.tolist()
            if o["captured"] is not None and host_materialize is not None:
                with phase("commit"):  # drafter context for the accepted tokens, off the graph
                    host_materialize(dcache, o["hid"], o["pos"], acc_len)
        out_routing = o["routing"]
        live_t = torch.tensor(active, device=dev)
        rows_valid &= live_t.view(-1, 1)
        taken = [req.emit(b, emitted[b]) if active[b] else 0 for b in range(B)]
        bar.update(sum(taken))
        # Requests still live commit the whole path. A request that finished (this step or
        # earlier) stops advancing: its rows are still computed each step and ignored, and a
        # prefix frozen at its last committed length keeps those writes inside the cache even
        # when it stopped in the middle of an accepted path.
        still = torch.tensor(req.live, device=dev)
        prefix = torch.where(still, prefix + acc_len, prefix)
        bonus = torch.where(still, nxt, bonus)
        experts = _distinct_experts(out_routing, rows_valid)
        result.steps.append({
            "step": step, "active": active,
            "accepted": [len(e) if a else 0 for e, a in zip(emitted, active)],
            "tree_size": tree_size, "distinct_experts": experts,
            "distinct_experts_mean": sum(experts) / max(len(experts), 1),
            "time_s": time.perf_counter() - t0,
        })
        if o.get("max_accept") is not None:  # replay: what the tree's deepest path allowed
            result.steps[-1]["max_accept"] = o["max_accept"].tolist()
        if timer is not None and hasattr(timer, "end_step"):
            timer.end_step()
        if on_step is not None:
            on_step(result.steps[-1], cache, prefix)
        step += 1
    bar.close()
    result.tokens = req.out
    return result


def walk_tree(tree, choice):
    """The walk through the registry: (accepted_indices [B, N], accept_lens [B], bonus [B])."""
    return ops.get("tree_walk")(tree, choice)
