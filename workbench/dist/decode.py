"""The decode loop on every rank: `dist_generate` (a run_distributed target) and the CLI entry.

Each rank runs the unchanged single-process loop (workbench.generate.generate) on its
DistKimiModel shard; the loop's host-side control is replicated, kept in lockstep by the
all-gathered logits, and checked at the end: all ranks must have emitted the same tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from workbench.models import resolve_config

from .comm import Comm, TorchComm
from .layout import Layout, latent_cache_bytes
from .model import build_dist_model

dist_config = resolve_config  # a ModelConfig or a preset name ("tiny-dist" divides 8 ranks)


def dist_generate(rank: int, world: int, config, prompts, tp=None, ep=None, budget=None,
                  drafter: str | None = "dflash", replay=None, hit_prob: float = 0.8,
                  replay_seed: int = 0, seed: int = 0, max_new_tokens=32,
                  temperature: float = 0.0, stop_tokens=None, kernels=None, checkpoint=None,
                  drafter_checkpoint=None, device=None, exact: bool | None = None,
                  sample_seed: int | None = None, drafter_layout: str = "replicated") -> dict:
    """One rank's decode (call through run_distributed or under torchrun, after init).

    drafter: "dflash" (the DFlash drafter, seeded like build_drafter), "replay"
    (ReplayDrafter over `replay` = prompt + greedy continuation per request) or None (AR).
    drafter_layout: the DFlash drafter "replicated" on every rank (vocab.py) or split "tp"
    over the ranks (drafter.py: its heads and MLP width, two collectives a layer).
    seed: synthetic weights (and drafter) seed; sample_seed: the sampler's (default `seed`,
    as the CLI's --seed is both).
    exact: whole-dot-product reductions (layout.py EXACT; default on CPU, where the tests
    prove token equality) or the engine's fp32 all-reduces (default on GPUs).
    Returns {"result": GenerateResult, "layout", "ranks": per-rank timing dicts,
    "cache_bytes_per_rank", "weight_bytes_per_rank"} (the same on every rank).
    """
    from workbench.generate import generate

    device = torch.device(device or ("cpu" if world == 1 else _device_of_group()))
    exact = device.type == "cpu" if exact is None else exact
    lay = Layout.make(world, rank, tp=tp, ep=ep, exact=exact)
    comm = TorchComm() if world > 1 else Comm()
    t0 = time.perf_counter()
    cfg = None if checkpoint else dist_config(config)
    target = build_dist_model(cfg, lay, comm, seed=seed, device=device, checkpoint=checkpoint)
    cfg = target.cfg
    build_s = time.perf_counter() - t0
    dr = None
    if budget is not None:
        dr = _drafter(drafter, target, cfg, replay, hit_prob, replay_seed, seed, device,
                      drafter_checkpoint, drafter_layout)
    comm.log.reset()
    t0 = time.perf_counter()
    res = generate(target, dr, prompts, max_new_tokens=max_new_tokens, budget=budget,
                   temperature=temperature, seed=seed if sample_seed is None else sample_seed,
                   stop_tokens=stop_tokens, kernels=kernels)
    wall = time.perf_counter() - t0
    me = {"rank": rank, "layout": lay.name + (" exact" if exact else ""), "build_s": build_s, "decode_s": wall,
          "steps": len(res.steps), "cache_bytes": target.cache_bytes,
          "weight_bytes": sum(t.numel() * t.element_size() for t in target.state_dict().values()),
          **comm.log.summary()}
    per_rank, tokens = [me], [res.tokens]
    if world > 1:
        per_rank, tokens = [None] * world, [None] * world
        dist.all_gather_object(per_rank, me)
        dist.all_gather_object(tokens, res.tokens)
    bad = [r for r in range(world) if tokens[r] != tokens[0]]
    if bad:  # lockstep broken: a rank saw different logits (must never happen)
        raise RuntimeError(f"ranks {bad} emitted tokens different from rank 0's")
    return {"result": res, "layout": me["layout"], "ranks": per_rank,
            "cache_bytes_per_rank": target.cache_bytes,  # measured: the tensor generate() made
            "cache_slots": target.cache_bytes // latent_cache_bytes(cfg, len(prompts), 1)}


def _device_of_group():
    from .launch import rank_device

    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return rank_device(dist.get_backend(), local)


def _drafter(kind, target, cfg, replay, hit_prob, replay_seed, seed, device, checkpoint,
             layout="replicated"):
    from .drafter import check_drafter_layouts, make_dist_drafter

    check_drafter_layouts(layout)  # before any weights are made

    if kind == "replay":
        from workbench.replay import ReplayDrafter

        if replay is None:
            raise ValueError("drafter='replay': expected replay= prompt + continuation lists")
        return ReplayDrafter(cfg, replay, hit_prob=hit_prob, seed=replay_seed)
    if kind != "dflash":
        raise ValueError(f"drafter: expected 'dflash', 'replay' or None, got {kind!r}")
    if checkpoint:
        from workbench.drafter_io import load_drafter

        return make_dist_drafter(load_drafter(checkpoint, device=device), target, layout)
    from workbench.reference.drafter import build_drafter

    return make_dist_drafter(build_drafter(cfg, seed=seed, device=device), target, layout)


# -- command line ---------------------------------------------------------------------------------
def _rank_from_args(rank, world, args_dict):
    a = args_dict
    return dist_generate(rank, world, a["preset"], a["prompts"], tp=a["tp"], ep=a["ep"],
                         budget=a["budget"], seed=a["seed"], max_new_tokens=a["max_new_tokens"],
                         temperature=a["temperature"], stop_tokens=a["stop_ids"],
                         kernels=a["kernels"], checkpoint=a["checkpoint"],
                         drafter_checkpoint=a["drafter_checkpoint"],
                         drafter_layout=a.get("drafter_layout", "replicated"))


def generate_main_distributed(args) -> int:
    """`python -m workbench generate ... --tp N | --ep N` (the generate sub-command's args).

    Under torchrun (RANK/WORLD_SIZE set) this process is one rank: gloo for --device cpu,
    NCCL otherwise (NVLink multicast off unless --nvls). Without torchrun it starts
    tp*ep ranks itself (run_distributed). Only rank 0 prints.
    """
    from workbench.__main__ import _kernels

    from .launch import apply_nccl_env, init_rank, run_distributed

    tp, ep = getattr(args, "tp", None), getattr(args, "ep", None)
    timeout = float(getattr(args, "timeout", None) or 600)
    backend = "gloo" if str(args.device).startswith("cpu") else "nccl"
    a = {"preset": args.preset, "prompts": args.prompt_ids or [[1, 2, 3]], "tp": tp, "ep": ep,
         "budget": args.budget, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
         "temperature": args.temperature, "stop_ids": args.stop_ids,
         "kernels": _kernels(args.kernels), "checkpoint": args.checkpoint,
         "drafter_checkpoint": args.drafter_checkpoint,
         "drafter_layout": getattr(args, "drafter_layout", None) or "replicated"}
    t0 = time.perf_counter()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        from .launch import _arm_watchdog

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _arm_watchdog(timeout)  # never hang past the timeout
        if backend == "nccl":
            apply_nccl_env(multicast=getattr(args, "nvls", False))
        if backend == "gloo":
            torch.set_num_threads(1)  # ranks share the cores
        init_rank(rank, world, backend, "env://", min(timeout, 300.0),
                  local_rank=int(os.environ.get("LOCAL_RANK", rank)))
        try:
            out = _rank_from_args(rank, world, a)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
    else:
        world = (tp or 1) * (ep or 1)
        out = run_distributed(_rank_from_args, world, a, backend=backend, timeout_s=timeout,
                              multicast=getattr(args, "nvls", False))
    print_result(out, a["prompts"], args.budget, args.json, time.perf_counter() - t0)
    return 0


def print_result(out: dict, prompts, budget, as_json: bool, wall: float, file=None):
    file = file or sys.stdout  # looked up at call time (notebooks and pytest replace it)
    res = out["result"]
    if as_json:
        print(json.dumps({**res.to_json(), "wall_s": wall, "layout": out["layout"],
                          "ranks": out["ranks"]}), file=file)
        return
    for b, toks in enumerate(res.tokens):
        print(f"request {b}: prompt {len(prompts[b])} tokens -> {len(toks)} new", file=file)
        print(f"  tokens: {toks}", file=file)
        if budget:
            acc = [s["accepted"][b] for s in res.steps if s["active"][b]]
            print(f"  accepted per step: {acc}", file=file)
    print(f"{res.mode} on {out['layout']}: {sum(map(len, res.tokens))} tokens in "
          f"{len(res.steps)} steps, {res.tokens_per_step:.2f} tokens/step, {wall:.2f} s", file=file)
    for r in out["ranks"]:
        print(f"  rank {r['rank']}: decode {r['decode_s']:.2f} s, comm {r['comm_s']:.2f} s in "
              f"{r['comm_calls']} collectives ({r['comm_bytes'] / 1e6:.2f} MB)", file=file)
