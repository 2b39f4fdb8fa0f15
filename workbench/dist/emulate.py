"""Single-rank emulation of the 8-GPU decode step: rank 0's REAL work, MODELLED collectives.

One GPU runs what rank 0 of the TP8 or EP8 target would run per step (its attention heads, its
experts or expert slices, its LM-head shard, its drafter shard or the whole drafter, the tree
build) on synthetic weights made shard-only, one layer at a time (EP8 rank 0 of kimi-k2.6:
48 experts x 60 layers INT4 ~71 GB + attention + heads). `StandInComm` replaces every
collective by a tensor of the right shape and logs its bytes; a `Link` turns the log into
seconds:

    all_reduce  t = alpha + 2 (w-1)/w * S / BW        S = payload per rank (ring)
    all_gather  t = alpha + (w-1) * S / BW            S = each rank's part
    all_to_all  t = alpha + max(sent, received) / BW  remote rows only
Bytes are counted at 2 per value (bf16 on the wire, what engines send; the CPU proof path
keeps some fp32). BW is per GPU per direction. Comms are not overlapped with compute: the
projection is an upper bound on step time. Stand-in values are not the true sums, so routing
downstream is plausible, not exact; EP's a2a sizes come from the real routing of all tokens.

Projection: tokens/s = C * tau / step time (tau = 1 for AR), C concurrent requests of one
context length. Legend: C concurrent requests (batch B), N rows per request, T context.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import torch

from workbench import ops
from workbench.config import ModelConfig

from .comm import Comm, StepLog
from .decode import dist_config
from .floors import price_ops, price_phases, rank_terms
from .layout import Layout
from .model import (
    SHARED_FORKS,
    DistKimiModel,
    capture_priority,
    empty_dist_model,
    main_priority,
    shared_fork,
)
from .model import attn_stream as attn_side_stream
from .model import shared_stream as side_stream
from .moe import EP_DISPATCH, op_activations
from .moe import ep_dispatch as moe_dispatch

WIRE_BYTES = 2  # bf16 per value on the wire
ACCEPTED = 4  # rows per request the drafter materialises after a DDTree step (a typical tau)


@dataclass(frozen=True)
class Link:
    """An interconnect: per-GPU bandwidth per direction (GB/s) and per-collective latency."""

    name: str
    bw_gbps: float
    alpha_us: float
    efficiency: float = 0.8  # achieved / peak bandwidth for the bytes term

    def seconds(self, kind: str, nbytes: float, world: int) -> float:
        bw = self.bw_gbps * 1e9 * self.efficiency
        factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": world - 1,
                  "all_to_all": 1.0}[kind]
        return self.alpha_us * 1e-6 + factor * nbytes / bw


# NVLink 4 on H200: 900 GB/s bidirectional = 450 GB/s each way; small-message NCCL latency
# 5-15 us (kimi_mla.md §7.4). PCIe Gen5 x16: 64 GB/s each way; GPU-to-GPU through a switch or
# the host, ~20 us a collective. Both editable: Link("mine", bw_gbps=..., alpha_us=...).
NVLINK4 = Link("NVLink4", 450.0, 10.0)
PCIE5 = Link("PCIe5x16", 64.0, 20.0)


class StandInComm(Comm):
    """Collectives of rank `rank` of `world`, answered locally; each call's wire bytes logged
    as (kind, bytes, world) so any Link can price it afterwards."""

    def __init__(self, rank: int, world: int, log: StepLog | None = None):
        super().__init__(log)
        self.rank, self.world = rank, world
        self.calls: list[tuple[str, str, int]] = []  # (phase, kind, wire bytes)

    def _log(self, kind: str, nbytes: int):
        self.calls.append((self.log.phase, kind, nbytes))
        self.log.add_comm(kind, nbytes, 0.0)

    def all_reduce(self, t):
        self._log("all_reduce", t.numel() * WIRE_BYTES)
        return t  # the local partial stands in for the sum

    def all_gather_cat(self, t, dim):
        self._log("all_gather", t.numel() * WIRE_BYTES)
        return torch.cat([t] * self.world, dim)

    def all_to_all(self, send, send_splits, recv_splits, standin=None):
        row = send.shape[1:].numel() * WIRE_BYTES
        sent = sum(n for r, n in enumerate(send_splits) if r != self.rank)
        got = sum(n for r, n in enumerate(recv_splits) if r != self.rank)
        self._log("all_to_all", max(sent, got) * row)
        if standin is not None:
            return standin()
        return send.new_zeros((sum(recv_splits), *send.shape[1:]))

    def priced(self, link: Link) -> dict[str, float]:
        """Seconds per phase of the logged calls over `link`."""
        out: dict[str, float] = {}
        for phase, kind, nbytes in self.calls:
            out[phase] = out.get(phase, 0.0) + link.seconds(kind, nbytes, self.world)
        return out


# -- shard-only synthetic weights (values differ from build_model's; shapes and scales match) ---
def _fan_in(cfg: ModelConfig, name: str) -> int:
    D, H = cfg.hidden_size, cfg.num_heads
    table = {"q_a_proj": D, "q_b_proj": cfg.q_lora_rank, "kv_a_proj_with_mqa": D,
             "kv_b_proj": cfg.kv_lora_rank, "o_proj": H * cfg.v_head_dim, "mlp.gate.": D,
             "gate_proj": D, "up_proj": D}
    for key, fan in table.items():
        if key in name:
            return fan
    if "shared_experts.down_proj" in name:
        return cfg.moe_intermediate * cfg.n_shared_experts
    if "down_proj" in name:
        return cfg.dense_intermediate
    raise KeyError(name)


@torch.no_grad()
def fill_direct(model: DistKimiModel, seed: int = 0, logit_scale: float = 10.0) -> None:
    """Fill a rank's shard with synthetic weights made directly, one tensor (one expert) at a
    time: the full layer never exists, so kimi-k2.6 shards build on one GPU."""
    from workbench.reference.int4 import pack_int4, quantize_int4_g32
    from workbench.weights import norm_weight, normal_weight, seeded_generator

    cfg, lay = model.cfg, model.layout
    g = seeded_generator(seed, (1 << 24) + lay.world * 1000 + lay.rank, model.device)
    slots = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, t in slots.items():
        dev = t.device
        if name.endswith("_scale"):
            continue  # filled with its _packed partner
        if name.endswith("_packed"):  # [E/ep, out, in/8]: quantize expert by expert
            full_in = cfg.hidden_size if "down" not in name else cfg.moe_intermediate
            scale = slots[name.replace("_packed", "_scale")]
            for e in range(t.shape[0]):
                w = normal_weight(g, (t.shape[1], t.shape[2] * 8), full_in**-0.5, dev)
                q, s = quantize_int4_g32(w)
                t[e], scale[e] = pack_int4(q), s
        elif name.endswith("e_score_correction_bias"):
            t.copy_(0.02 * torch.randn(t.shape, generator=g, device=dev))
        elif "norm" in name:
            t.copy_(norm_weight(g, t.shape[0], dev))
        elif name == "model.embed_tokens.weight":
            t.copy_(normal_weight(g, t.shape, 1.0, dev))
        elif name == "lm_head_shard.weight":
            t.copy_(normal_weight(g, t.shape, logit_scale * cfg.hidden_size**-0.5, dev))
        else:
            t.copy_(normal_weight(g, t.shape, _fan_in(cfg, name) ** -0.5, dev))


def load_for(kernels, model: DistKimiModel) -> None:
    """The load step the selected int4_moe needs: the CUDA versions read the experts in the
    mma fragment layout, repacked in place (`mma_layout.replace_with_repacked`): a second copy
    of a full-size rank's 71 GB of experts does not fit beside the first; each version's
    `REPACKED` names the GEMMs it reads that way (cuda_v4 / cuda_v5: gate / up). kernels: a
    selection as `ops.use` takes it (a preset name is resolved for this machine: "engine"
    selects ENGINE, cuda_v28, where CUDA and cupy are). Other selections: nothing to do."""
    import importlib

    if isinstance(kernels, str):  # a preset name ("engine": int4_moe ENGINE where it runs)
        kernels = ops.resolve_selection(kernels)
    variant = kernels.get("int4_moe", "") if isinstance(kernels, dict) else ""
    if not str(variant).startswith("cuda_"):
        return

    from workbench.kernels.int4_moe import mma_layout

    from .moe import LocalExperts

    # the GEMMs the version reads repacked (cuda_v1-v3: both; cuda_v4 on: gate / up only).
    # No default: session 57's cuda_v28 lacked the name, a default of both repacked its down
    # weights, and its Triton down GEMM refused them mid-step
    mod = importlib.import_module(f"workbench.kernels.int4_moe.{variant}")
    gemms = getattr(mod, "REPACKED", None)
    if gemms is None:
        raise ValueError(f"kernels['int4_moe']: expected a CUDA version that names the GEMMs it "
                         f"reads repacked (REPACKED), got {variant!r} without it")
    for m in model.modules():
        if isinstance(m, LocalExperts):
            mma_layout.replace_with_repacked(m, gemms)


def rank_model(cfg, layout_name: str, world: int = 8, rank: int = 0, device="cpu",
               seed: int = 0):
    """(DistKimiModel, StandInComm) for rank `rank` of `tpN` / `epN` / `epAxtpB`."""
    cfg = dist_config(cfg)
    lay = Layout.named(layout_name, world, rank)
    comm = StandInComm(rank, world, StepLog(device))
    model = empty_dist_model(cfg, lay, comm, device)
    fill_direct(model, seed)
    return model, comm


# -- timing one step ----------------------------------------------------------------------------
def _timed(fn, comm: StandInComm, repeats: int):
    """Median wall seconds of fn() and the log of ONE call (phases, comm calls)."""
    fn()  # warm-up (allocator, lazy init)
    walls = []
    for _ in range(repeats):
        comm.log.reset()
        comm.calls = []
        comm.log.sync()
        t0 = time.perf_counter()
        fn()
        comm.log.sync()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def _profiled(fn, comm: StandInComm, device, ranges: bool = False):
    """(prof, cuda): one call of fn() under torch.profiler (CPU activity, and CUDA's on a
    GPU), the comm log synced before and inside; ranges: every registry op in a profiler
    range of its own (`loopbench.op_ranges`)."""
    import contextlib

    from torch.profiler import ProfilerActivity, profile

    from workbench.loopbench import op_ranges

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    comm.log.sync()
    with op_ranges() if ranges else contextlib.nullcontext(), profile(activities=acts) as prof:
        fn()
        comm.log.sync()
    return prof, cuda


def _graph_profiled(fn, comm: StandInComm, device, replays: int = 5):
    """(prof, replay_s): fn() captured once in a CUDA graph, one replay of it under
    torch.profiler (kernels on a side stream overlap as the replay runs them), and the median
    wall of `replays` event-timed replays. The phase log's syncs are off meanwhile (a sync
    inside a capture is an error); the comm log of these calls is not used."""
    from torch.profiler import ProfilerActivity, profile

    from workbench.bench import capture_replays, replay_us

    log, was = comm.log, comm.log.cuda
    log.cuda = False
    try:
        replay = capture_replays([fn], priority=capture_priority())[0]
        replay()
        torch.cuda.synchronize(device)
        walls = [us * 1e-6 for us in replay_us(replay, replays)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            replay()
            torch.cuda.synchronize(device)
    finally:
        log.cuda = was
    return prof, statistics.median(walls)


def _kernel_time(fn, comm: StandInComm, device, top: int = 4, graph: bool = False) -> dict:
    """One more call of fn() under torch.profiler: the time the GPU was busy with its kernels
    (`kernel_s`: the union of their intervals, so kernels that overlap under PDL count once;
    sessions up to 7 reported the plain sum, kept as `kernel_total_s`) and its `top` kernels.
    The eager wall above is host-launch-bound (one Python op at a time, ~10^4 launches a step
    at full size); a CUDA graph of the step would replay in about the busy time, so this is
    the emulated rank's graph-replay estimate. graph (CUDA): the call is a replay of fn()
    captured in a CUDA graph instead (`_graph_profiled`), where kernels on two streams really
    overlap, plus `graph_replay_s`, the replay's event-timed wall; a step that cannot be
    captured falls back to the eager call, its error in `graph_error`. The comm
    log of this call is not used (read the timed calls' log before). CPU: the ops' self time."""
    from workbench.loopbench import busy_us, idle_gaps, kernel_times

    extra: dict = {}
    prof = None
    if graph and torch.device(device).type == "cuda":
        try:
            prof, extra["graph_replay_s"] = _graph_profiled(fn, comm, device)
            cuda = True
        except Exception as e:  # noqa: BLE001 - a step that cannot be captured: say why
            torch.cuda.synchronize(device)
            extra["graph_error"] = f"{type(e).__name__}: {e}"[:200]
    if prof is None:
        prof, cuda = _profiled(fn, comm, device)
    per = kernel_times(prof, cuda)
    ranked = _ranked(per)
    if cuda:  # the profiled call's idle device time, and where its launches waited
        gaps = idle_gaps(prof, top=2 * top)
        extra["idle_s"] = gaps["idle_us"] * 1e-6
        extra["idle_gaps"] = gaps["gaps"]
        extra["top_gaps"] = "; ".join(f"{us:.1f} us {a[:32]} -> {b[:32]}"
                                      for us, a, b in gaps["longest"])
        extra["gaps_by_next"] = "; ".join(f"{k[:48]} {us:.1f} us x{n}"
                                          for k, n, us in gaps["by_next"])
    total = sum(v[1] for v in per.values()) * 1e-6
    return {"kernel_s": busy_us(prof) * 1e-6 if cuda else total, "kernel_total_s": total,
            "top_kernels": "; ".join(f"{k[:48]} {us / 1e3:.2f} ms x{n}"
                                     for k, n, us in ranked[:top]),
            "kernels": ranked, **extra}


def _ranked(per: dict) -> list[tuple]:
    """{name: [calls, µs]} -> [(name, calls, µs)], most µs first (the side tables' rows)."""
    return sorted(((k, n, us) for k, (n, us) in per.items()), key=lambda r: -r[2])


def _op_time(fn, comm: StandInComm, device, terms: dict, card: dict | None) -> dict:
    """One more eager call of fn() under torch.profiler with every registry op in a range of
    its own (`loopbench.op_ranges`): {"ops": [(op, calls, µs, floor µs)], "glue": [(kernel,
    calls, µs)], "op_kernels": [(op, kernel, calls, µs)]}, largest first, "(glue)" for the
    kernels between ops, "glue" naming them and "op_kernels" naming every op's; an op's floor
    from `floors.price_ops(terms)` on the card (NaN where no bytes are charged to the op). A
    pass of its own: the ranges' device-side annotations must not reach `_kernel_time`'s busy
    time."""
    from workbench.loopbench import op_kernel_times

    by_kernel: dict = {}
    per = op_kernel_times(*_profiled(fn, comm, device, ranges=True), by_kernel=by_kernel)
    floor = price_ops(terms, **(card or {}))
    op_kernels = sorted(((op, k, n, us) for op, ks in by_kernel.items()
                         for k, (n, us) in ks.items()), key=lambda r: -r[3])
    return {"ops": [(op, n, us, floor.get(op, math.nan) * 1e6) for op, n, us in _ranked(per)],
            "glue": _ranked(by_kernel.get("(glue)", {})), "op_kernels": op_kernels}


@torch.no_grad()
def measure(model: DistKimiModel, comm: StandInComm, drafter, batch: int, ctx: int,
            budget: int | None, repeats: int = 3, seed: int = 0,
            op_table: bool = False, graph: bool = False, card: dict | None = None) -> dict:
    """One decode step of `batch` requests at context `ctx`: AR (budget None) or DDTree
    (draft -> tree build -> verify). Returns compute seconds per phase, wall, comm log;
    op_table: also the step's kernel time by registry op (`_op_time`, one more call); graph:
    the kernel times from a CUDA-graph replay of the step (`_kernel_time`); card: the floors'
    copy bandwidth and bf16 peak (`floors.price_phases`' bw_tbs / tflops; default the H200's)."""
    from workbench.reference.tree_build import topk_logprobs

    dev, cfg = model.device, model.cfg
    g = torch.Generator(device=dev).manual_seed(seed)
    n = 1 if budget is None else budget + 1
    cache = model.new_cache(batch, ctx + n + 1)
    for layer in cache:  # in place, a layer at a time: no fp32 copy of an 18 GB cache
        layer[:, :ctx].normal_(generator=g)
    prefix = torch.full((batch,), ctx, dtype=torch.long, device=dev)
    bonus = torch.randint(0, cfg.vocab_size, (batch,), generator=g, device=dev)
    times: dict[str, float] = {}
    seen: dict = {}  # the timed step's routing ids (recording them launches nothing): floors
    if budget is None:
        anc = torch.ones(batch, 1, 1, dtype=torch.long, device=dev)
        def ar_step():
            seen["routing"] = model(bonus.view(-1, 1), prefix.view(-1, 1), cache, prefix, anc,
                                    record_routing=True).stats.get("routing", [])

        wall = _timed(ar_step, comm, repeats)
        out = {"wall_s": wall, **_phases(comm), "calls": list(comm.calls)}
        terms = rank_terms(model, drafter, batch, None, ctx, seen["routing"])
        ops_ = _op_time(ar_step, comm, dev, terms, card) if op_table else {}
        return {**out, **_kernel_time(ar_step, comm, dev, graph=graph),
                **_floor_cols(price_phases(terms, **(card or {}))), **ops_}
    dcache = drafter.new_cache(batch, ctx + n + 1)
    for t in dcache:
        for layer in t:
            layer[:, :ctx].normal_(generator=g)
    k = min(budget, cfg.vocab_size)
    lp, ids = topk_logprobs(torch.randn(batch, cfg.drafter.depth, cfg.vocab_size,
                                        generator=g, device=dev), k)
    tree = ops.get("tree_build")(lp, ids, budget, root_tokens=bonus, prefix_lens=prefix)

    def step():
        drafter.draft_override(None, model, dcache, bonus, prefix, k)
        t0 = time.perf_counter()
        ops.get("tree_build")(lp, ids, budget, root_tokens=bonus, prefix_lens=prefix)
        times["tree_build_s"] = time.perf_counter() - t0
        out = model(tree.tokens, tree.positions, cache, prefix, tree.anc_bits,
                    capture=tuple(cfg.drafter.target_layer_ids), record_routing=True)
        seen["routing"] = out.stats.get("routing", [])
        # the drafter's context for the accepted path: ACCEPTED rows per request
        drafter.materialize(dcache, out.captured, tree.positions,
                            torch.full((batch,), min(n, ACCEPTED), device=dev))

    wall = _timed(step, comm, repeats)
    out = {"wall_s": wall, **_phases(comm), **times, "calls": list(comm.calls)}
    draft = _kernel_time(lambda: drafter.draft_override(None, model, dcache, bonus, prefix, k),
                         comm, dev, graph=graph)  # the draft forward's share of the kernel sum
    terms = rank_terms(model, drafter, batch, budget, ctx, seen["routing"])
    ops_ = _op_time(step, comm, dev, terms, card) if op_table else {}
    floors = price_phases(terms, **(card or {}))
    return {**out, **_kernel_time(step, comm, dev, graph=graph),
            "draft_kernel_s": draft["kernel_s"], **_floor_cols(floors), **ops_}


def _floor_cols(floors: dict) -> dict:
    """The floors as measure() columns: {phase}_floor_s and their sum floor_s."""
    return {**{f"{p}_floor_s": v for p, v in floors.items()}, "floor_s": sum(floors.values())}


def _phases(comm: StandInComm) -> dict:
    return {f"{p}_s": s for p, s in comm.log.phase_s.items()}


def project(meas: dict, link: Link, world: int, batch: int, tau: float) -> dict:
    """Step time = measured compute + modelled comm over `link`; tokens/s = C tau / step."""
    comm = StandInComm(0, world)
    comm.calls = meas["calls"]
    priced = comm.priced(link)
    comm_s = sum(priced.values())
    step = meas["wall_s"] + comm_s
    row = {k: v * 1e3 for k, v in meas.items()
           if k.endswith("_s") and k not in ("wall_s", "kernel_s", "draft_kernel_s",
                                             "graph_replay_s", "idle_s")
           and not k.endswith("floor_s")}
    row = {k.replace("_s", "_ms"): v for k, v in row.items()}
    kernel = meas.get("kernel_s", math.nan)
    return {**row, "compute_ms": meas["wall_s"] * 1e3, "comm_ms": comm_s * 1e3,
            "comm_MB": sum(c[2] for c in meas["calls"]) / 1e6, "collectives": len(meas["calls"]),
            "step_ms": step * 1e3, "tokens_per_s": batch * tau / step,
            # graph-replay estimate: the step's kernels back to back, plus the same comm
            "kernel_ms": kernel * 1e3, "kernel_step_ms": (kernel + comm_s) * 1e3,
            # how kernel_ms was measured: a profiled eager call, or a CUDA-graph replay (whose
            # event-timed wall is graph_replay_ms: kernels plus the gaps between them)
            "kernel_timing": ("graph" if "graph_replay_s" in meas else "eager"),
            "graph_replay_ms": meas.get("graph_replay_s", math.nan) * 1e3,
            "graph_error": meas.get("graph_error", ""),
            # the profiled call's device idle between its first and last kernel (CUDA), the
            # longest gaps and the kernels whose launches waited most (`loopbench.idle_gaps`)
            "idle_ms": meas.get("idle_s", math.nan) * 1e3, "idle_gaps": meas.get("idle_gaps", 0),
            "top_gaps": meas.get("top_gaps", ""), "gaps_by_next": meas.get("gaps_by_next", ""),
            "draft_kernel_ms": meas.get("draft_kernel_s", math.nan) * 1e3,
            **{k.replace("_s", "_ms"): v * 1e3 for k, v in meas.items() if k.endswith("floor_s")},
            # the bar's ratio: the graph-replay estimate (kernels + comm) over the floor sum
            "x_floor": (kernel + comm_s) / meas["floor_s"] if meas.get("floor_s") else math.nan,
            "floor_tokens_per_s": batch * tau / meas["floor_s"] if meas.get("floor_s") else math.nan,
            "kernel_tokens_per_s": batch * tau / (kernel + comm_s),
            "top_kernels": meas.get("top_kernels", ""), "kernel_list": meas.get("kernels", []),
            "op_list": meas.get("ops", []), "glue_list": meas.get("glue", []),
            "op_kernel_list": meas.get("op_kernels", [])}


def emulate(cfg="kimi-k2.6", layouts=("tp8", "ep8"), batches=(1, 8, 32, 64),
            budgets=(None, 8, 16, 32), tau: float | dict = 3.0, ctx: int = 4096,
            links=(NVLINK4, PCIE5), world: int = 8, device=None, repeats: int = 3,
            seed: int = 0, progress=print, kernels=None, on_rows=None,
            ep_dispatch: str = "local", op_table: bool = False, graph: bool = False,
            shared_stream: bool = True, attn_stream: bool = True, priority: int = -1,
            fork: str = "after-route", drafter_layout: str | tuple = "tp",
            layers: int | None = None, bw_tbs: float | None = None,
            tflops: float | None = None):
    """Projection table (list of dict rows): layout x link x C x (AR | budget).

    ep_dispatch: how EP layouts move tokens to experts (`moe.EP_DISPATCH`): "local" (default:
    the stream is replicated after TP attention, each rank runs its experts on the slots that
    name them and the partials join the shared expert's all-reduce) or "all_to_all"
    (DeepEP-style: two all-to-alls and a host sync a MoE layer).

    kernels: an ops.use selection (e.g. {"int4_moe": "triton_v2"}). The emulated engine hands
    the ops bf16 activations and all-reduces bf16 partials (`moe.op_activations`), as a serving
    engine does, so the optimized kernels run on it; the CPU proof path keeps ACC partials.
    on_rows(rows) is called after every configuration (a long run cut short keeps its table).
    op_table: each row's "op_list" holds the step's kernel time by registry op (and each op's
    floor), its "glue_list" the kernels outside every op by name and its "op_kernel_list"
    every op's kernels by name (one more profiled eager call a configuration). graph:
    kernel_ms from a profiled CUDA-graph replay of the step (`_kernel_time`). shared_stream
    (default on from session 20: -0.23 ms at C 1 DDTree-16, -0.17 at C 8 AR in graph
    replays, nothing slower): the EP engine path runs the shared expert on a side stream
    beside the router and the routed experts (`model.shared_stream`); on a CPU it changes
    nothing. attn_stream (default on from session 21:
    -0.04 to -0.17 ms in all six EP8 graph replays at C 1 / 8 / 32, AR and DDTree-16): the
    attention's cache write and q_pe's RoPE on a side stream beside q's path
    (`model.attn_stream`). priority (default -1 from session 21): with graph, the CUDA stream
    priority the step is captured on (`model.main_priority`: lower is higher; the side streams
    keep 0, so their CTAs wait while the main path's do): call 6, -1 against 0, kernel ms -0.04
    / -0.10 / -0.14 / -0.24 at C 1 AR / C 1 DDTree-16 / C 8 AR / C 8 DDTree-16, C 32 within
    the runs' spread (-0.09 AR, +0.29 DDTree-16, which varied 53.8-55.6 over the session);
    pooled over calls 3-7: AR -0.07 / -0.11 ms at C 1 / 8, DDTree-16 within 0.05 ms. fork
    (default "after-route" from session 21): where the shared expert's side stream forks
    (`model.shared_fork`): beside the routed experts only, or "before-route" (session 20's,
    beside the router too); call 11, after against before, kernel ms: C 1 AR 5.71 / 5.73,
    C 1 DDTree-16 14.40 / 14.53, C 8 AR 9.51 / 9.52, C 8 DDTree-16 29.56 / 29.62: never slower,
    by at most the runs' spread. drafter_layout: the DFlash drafter's tensor-parallel shard,
    "tp" (drafter.py: 1/world of its heads, MLP width and fc, two stand-in all-reduces a drafter
    layer and one all-gather a commit; the default from session 42: graph-replayed on the
    H200, C 1 DDTree-16 kernel ms 13.92 -> 12.71, the draft's 1.89 -> 0.64; C 8 28.72 ->
    27.33) or the whole drafter "replicated" on the rank (vocab.DistDrafter); a tuple of both
    times each DDTree configuration with each, on one rank model (rows say which). layers:
    the model's first `layers` target layers only (`ModelConfig.first_layers`; rows say how
    many in "layers"): a full-size rank's per-layer kernels and floors on a card whose memory
    does not hold its 61 layers (kimi-k2.6's EP8 rank is ~78 GB; 16 layers ~21 GB). Its step
    times, floors and tokens/s are those of the shorter model, not of kimi-k2.6. bw_tbs,
    tflops: the card the floors price (copy TB/s, bf16 TFLOP/s; default the H200's, as the
    bar is; an H100's run against its own copy speed says what its kernels left there); rows
    say which in "floor_bw_tbs" / "floor_tflops"."""
    from workbench.reference.drafter import build_drafter

    from .drafter import check_drafter_layouts, make_dist_drafter

    dlays = check_drafter_layouts(drafter_layout, several=True)

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = dist_config(cfg)
    if layers is not None:
        cfg = cfg.first_layers(layers)
    from workbench.loopbench import H200_BF16_TFLOPS, H200_COPY_TBS

    card = {"bw_tbs": H200_COPY_TBS if bw_tbs is None else bw_tbs,
            "tflops": H200_BF16_TFLOPS if tflops is None else tflops}
    for k, v in card.items():
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"{k}: expected a positive number, got {v!r}")
    rows = []
    for name in layouts:
        model, comm = rank_model(cfg, name, world, 0, device, seed)
        load_for(kernels, model)
        full = build_drafter(model.cfg, seed=seed, device=device)
        drafters = {d: make_dist_drafter(full, model, d) for d in dlays}  # tp: copies slices
        del full
        for C, b, dlay in ((c, bud, d) for c in batches for bud in budgets
                           for d in (dlays if bud is not None else dlays[:1])):
            drafter = drafters[dlay]
            with ops.use(kernels), op_activations(torch.bfloat16), \
                    moe_dispatch(ep_dispatch), side_stream(shared_stream), \
                    attn_side_stream(attn_stream), main_priority(priority), \
                    shared_fork(fork):
                meas = measure(model, comm, drafter, C, ctx, b, repeats, seed, op_table,
                               graph, card)
            t = 1.0 if b is None else (tau[b] if isinstance(tau, dict) else tau)
            for link in links:
                rows.append({"layout": name.upper(), "layers": cfg.num_layers,
                             "floor_bw_tbs": card["bw_tbs"], "floor_tflops": card["tflops"],
                             "ep_dispatch": ep_dispatch,
                             "shared_stream": "on" if shared_stream else "off",
                             "attn_stream": "on" if attn_stream else "off",
                             "main_priority": priority, "shared_fork": fork,
                             "drafter_layout": dlay if b is not None else "",
                             "link": link.name, "C": C,
                             "mode": "AR" if b is None else f"DDTree-{b}", "tau": t,
                             "ctx": ctx, **project(meas, link, world, C, t)})
            if on_rows is not None:
                on_rows(rows)
            if progress:
                r = rows[-len(links)]
                dl = f" ({dlay} drafter)" if b is not None and len(dlays) > 1 else ""
                progress(f"{name} C={C} {r['mode']}{dl}: compute {r['compute_ms']:.2f} ms, "
                         f"comm {r['comm_MB']:.2f} MB in {r['collectives']} collectives")
        drafter = None
        del model, drafters
        if device != "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.dist.emulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny-dist")
    p.add_argument("--layouts", default="tp8,ep8")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--budgets", default="ar,8,16,32")
    p.add_argument("--tau", type=float, default=3.0, help="mean tokens per DDTree step")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--kernels", help="op=variant[,op=variant] (python -m workbench generate's)")
    p.add_argument("--csv", help="write the table here")
    p.add_argument("--kernel-table", help="write every configuration's kernels here (CSV: "
                   "layout, C, mode, kernel, calls, us), largest first")
    p.add_argument("--op-table", help="write every configuration's kernel time by registry op "
                   "here (CSV: layout, C, mode, op, calls, us; '(glue)': kernels between ops), "
                   "from one more profiled eager call with the ops in profiler ranges")
    p.add_argument("--glue-table", help="write the kernels of --op-table's '(glue)' here by "
                   "name (CSV: layout, C, mode, kernel, calls, us; the same profiled call, "
                   "taken even without --op-table; GPU kernels only: empty on CPU)")
    p.add_argument("--op-kernel-table", help="write every registry op's kernels here by name "
                   "(CSV: layout, C, mode, op, kernel, calls, us; '(glue)' as in "
                   "--glue-table; the same profiled call; GPU kernels only: empty on CPU)")
    p.add_argument("--measured-link", help="a commbench CSV (python -m workbench.dist."
                   "commbench): its fitted Link is priced next to NVLink4 and PCIe5")
    p.add_argument("--ep-dispatch", default="local", choices=EP_DISPATCH,
                   help="EP layouts: all-to-all dispatch / combine (DeepEP-style), or local "
                   "experts on the replicated stream + the shared expert's all-reduce")
    p.add_argument("--graph", action="store_true",
                   help="kernel_ms from a profiled CUDA-graph replay of each step (the phase "
                   "syncs off while capturing) instead of a profiled eager call; adds "
                   "graph_replay_ms (the replay's wall); CUDA only")
    p.add_argument("--shared-stream", default="on", choices=("on", "off"),
                   help="EP engine path: the shared expert on a side stream beside the router "
                   "and the routed experts (default on; measure it with --graph)")
    p.add_argument("--attn-stream", default="on", choices=("on", "off"),
                   help="the attention's latent cache write and q_pe's RoPE on a side stream "
                   "beside q's norm, q_b and absorption (default on; measure it with --graph)")
    p.add_argument("--main-priority", type=int, default=-1,
                   help="--graph: the CUDA stream priority the step is captured on (default -1; "
                   "lower is higher, 0 the default stream's): the side streams keep 0 and "
                   "yield the SMs")
    p.add_argument("--shared-fork", default="after-route", choices=SHARED_FORKS,
                   help="where the shared expert's side stream forks: after the router, beside "
                   "the routed experts only (default), or before it (session 20's)")
    p.add_argument("--drafter-layout", default="tp",
                   help="the DFlash drafter's tensor-parallel shard (tp, the default: 1/world "
                   "of its heads, MLP width and fc, two all-reduces a layer) or the whole "
                   "drafter on the rank (replicated); 'replicated,tp' times each DDTree row "
                   "with both")
    p.add_argument("--layers", type=int, help="emulate the preset's first N target layers "
                   "only (every width kept; the drafter's taps rebuilt): a full-size rank's "
                   "per-layer kernels on a card its whole depth does not fit (kimi-k2.6's EP8 "
                   "rank: ~78 GB at 61 layers, ~21 GB at 16); rows say how many")
    p.add_argument("--bw-tbs", type=float, help="the floors' copy bandwidth, TB/s (default "
                   "the H200's 4.26: the bar's card; give the running card's to read its "
                   "kernels against it)")
    p.add_argument("--tflops", type=float, help="the floors' bf16 peak, TFLOP/s (default the "
                   "H200's 989)")
    a = p.parse_args(argv)
    import pandas as pd

    from workbench.__main__ import _kernels

    if (a.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu":
        torch.set_num_threads(1)  # toy shapes: threaded small GEMMs spin (tests/conftest.py)

    from workbench.traces_io import run_metadata

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    meta = {**run_metadata(device), "kernels": a.kernels or "reference"}

    # the side tables: (path, their rows' columns, the row field holding their rows)
    tables = ((a.kernel_table, ("kernel", "calls", "us"), "kernel_list"),
              (a.op_table, ("op", "calls", "us", "floor_us"), "op_list"),
              (a.glue_table, ("kernel", "calls", "us"), "glue_list"),
              (a.op_kernel_table, ("op", "kernel", "calls", "us"), "op_kernel_list"))

    def save(rows):  # the table so far, with the run's provenance on every row
        if a.csv:
            lists = {field for _, _, field in tables}  # not columns of the main table
            pd.DataFrame([{**{k: v for k, v in r.items() if k not in lists},
                           **meta} for r in rows]).to_csv(a.csv, index=False)
        for path, cols, field in tables:
            if path:  # one configuration's rows once (the links repeat them)
                seen = {(r["layout"], r["C"], r["mode"], r["drafter_layout"]): r for r in rows}
                head = ["layout", "C", "mode", "drafter_layout", *cols, *meta]
                pd.DataFrame([{"layout": key[0], "C": key[1], "mode": key[2],
                               "drafter_layout": key[3], **dict(zip(cols, row)), **meta}
                              for key, r in seen.items() for row in r[field]],
                             columns=head).to_csv(path, index=False)

    links = (NVLINK4, PCIE5)
    if a.measured_link:
        from .commbench import read_link

        links += (read_link(a.measured_link),)
    rows = emulate(a.preset, a.layouts.split(","), [int(x) for x in a.batches.split(",")],
                   [None if x == "ar" else int(x) for x in a.budgets.split(",")], a.tau, a.ctx,
                   links=links, device=device, repeats=a.repeats, kernels=_kernels(a.kernels),
                   on_rows=save, ep_dispatch=a.ep_dispatch,
                   op_table=bool(a.op_table or a.glue_table or a.op_kernel_table),
                   graph=a.graph, shared_stream=a.shared_stream == "on",
                   attn_stream=a.attn_stream == "on", priority=a.main_priority,
                   fork=a.shared_fork, drafter_layout=tuple(a.drafter_layout.split(",")),
                   layers=a.layers, bw_tbs=a.bw_tbs, tflops=a.tflops)
    df = pd.DataFrame(rows)
    cols = ["layout", "layers", "link", "C", "mode", "drafter_layout", "compute_ms", "comm_ms",
            "step_ms", "tokens_per_s", "kernel_ms", "draft_kernel_ms", "kernel_step_ms", "floor_ms",
            "x_floor", "kernel_tokens_per_s"] + (["graph_replay_ms", "idle_ms"] if a.graph else [])
    for r in rows:
        if r.get("graph_error"):
            print(f"{r['layout']} C={r['C']} {r['mode']}: not captured ({r['graph_error']}); "
                  "kernel_ms is the eager call's")
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    for r in rows if a.graph else ():  # where the replay idled (one line a configuration)
        if r["link"] == links[0].name and r.get("idle_gaps"):
            print(f"{r['layout']} C={r['C']} {r['mode']}: idle {r['idle_ms']:.3f} ms in "
                  f"{r['idle_gaps']} gaps; longest: {r['top_gaps']}; launches that waited "
                  f"most: {r['gaps_by_next']}")
    return 0 if all(math.isfinite(r["step_ms"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
