"""Command line: `python -m workbench <command>` (also installed as `workbench`).

    demo       AR vs DDTree on the tiny preset (CPU, seconds)
    generate   decode prompts (AR, or DDTree with --budget) and print tokens / stats
    weights    write a synthetic checkpoint in the Kimi K2.6 format
    check      an op's variants against its reference (EDGE or REAL shapes)
    bench      time variants, peers and the roofline (traces/ rows)
    trace      torch.profiler trace of an op or a decode, plus the ncu/nsys commands
    suite      the H200 run: gpu tests, benchmarks, sanitizer; results to traces/
    train      train the small target + DFlash drafter pair
    loopbench  decode-loop step time by phase, roofline floors, tokens/s per budget and C
    acceptance record or make acceptance traces for the replay walk (labelled replay)
    info       presets and registered ops
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None


def _kernels(text: str | None):
    """--kernels: a named selection ("reference", "optimized", "engine", ...), "op=variant,...",
    or a named selection then overrides ("engine,int4_moe=triton_v10": the preset's ops with
    those replaced)."""
    if not text:
        return None
    if "=" not in text:
        return text  # a named selection such as "reference"
    out = {}
    for part in text.split(","):
        op, eq, variant = part.partition("=")
        if not eq:  # a named selection, expanded where it stands (later parts override it)
            import workbench.ops  # noqa: F401  (registers the kernel folders and the presets)
            from workbench.ops.registry import _normalize

            out.update(_normalize(op.strip()))
            continue
        out[op.strip()] = variant.strip()
    return out


def _threads_for_cpu(device: str) -> None:
    # The toy models are latency-bound; MKL's threaded small GEMMs spin and get ~100x slower on
    # a shared 2-core box. One thread is the fast choice there.
    import torch

    if device == "cpu":
        torch.set_num_threads(1)


def _load_models(args):
    """(target, drafter) from --checkpoint/--drafter-checkpoint or the preset's synthetic weights."""
    from workbench import build_model

    if args.checkpoint:
        from workbench.checkpoint import load_model

        target = load_model(args.checkpoint, device=args.device)
    else:
        target = build_model(args.preset, seed=args.seed, device=args.device)
    drafter = None
    if args.budget is not None or getattr(args, "need_drafter", False):
        if args.drafter_checkpoint:
            from workbench.drafter_io import load_drafter

            drafter = load_drafter(args.drafter_checkpoint, device=args.device)
        else:
            from workbench.reference.drafter import build_drafter

            drafter = build_drafter(target.cfg, seed=args.seed, device=args.device)
    return target, drafter


def cmd_generate(args) -> int:
    import os

    from workbench.generate import generate

    if (args.tp or 1) * (args.ep or 1) > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from workbench.dist import generate_main_distributed  # torchrun, or --tp/--ep ranks

        if args.cuda_graph:
            raise SystemExit("--cuda-graph: the distributed loop (--tp/--ep, torchrun) runs "
                             "eagerly for now; drop --cuda-graph or run one process")

        return generate_main_distributed(args)
    if getattr(args, "drafter_layout", "replicated") != "replicated":
        raise SystemExit(f"--drafter-layout {args.drafter_layout}: splits the drafter over "
                         "ranks; add --tp / --ep (or run under torchrun), or drop it")
    _threads_for_cpu(args.device)
    target, drafter = _load_models(args)
    prompts = args.prompt_ids or [[1, 2, 3]]
    t0 = time.perf_counter()
    res = generate(target, drafter, prompts, max_new_tokens=args.max_new_tokens,
                   budget=args.budget, temperature=args.temperature, seed=args.seed,
                   stop_tokens=args.stop_ids, kernels=_kernels(args.kernels),
                   progress=not args.json, cuda_graph=args.cuda_graph)
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({**res.to_json(), "wall_s": wall}))
        return 0
    for b, toks in enumerate(res.tokens):
        acc = [s["accepted"][b] for s in res.steps if s["active"][b]]
        print(f"request {b}: prompt {len(prompts[b])} tokens -> {len(toks)} new")
        print(f"  tokens: {toks}")
        if args.budget:
            print(f"  accepted per step: {acc}")
    print(f"{res.mode}: {sum(map(len, res.tokens))} tokens in {len(res.steps)} steps, "
          f"{res.tokens_per_step:.2f} tokens/step, {wall:.2f} s")
    return 0


def cmd_demo(args) -> int:
    from workbench.demo import run_demo

    _threads_for_cpu(args.device)
    return run_demo(preset=args.preset, budget=args.budget, max_new_tokens=args.max_new_tokens,
                    seed=args.seed, device=args.device)


def cmd_weights(args) -> int:
    from workbench.checkpoint import write_synthetic_checkpoint

    write_synthetic_checkpoint(args.preset, args.out, seed=args.seed, device=args.device,
                               progress=True)
    print(f"wrote {args.preset} checkpoint to {args.out}")
    return 0


def cmd_info(args) -> int:
    from workbench import ModelConfig, ops

    for name in ("tiny", "small", "kimi-k2.6"):
        c = ModelConfig.preset(name)
        print(f"{name:10s} layers {c.num_layers:2d}  D {c.hidden_size:5d}  H {c.num_heads:2d}  "
              f"E {c.n_routed_experts:3d} top-{c.n_experts_per_tok}  V {c.vocab_size}  "
              f"drafter {c.drafter.num_layers} layers, block {c.drafter.block_size}")
    print()
    for op in ops.list_ops():
        spec = ops.op_spec(op)
        vs = []
        for v in spec.variants.values():
            why = v.unavailable_reason()
            vs.append(v.name if why is None else f"{v.name} (unavailable: {why})")
        print(f"{op:12s} {', '.join(vs)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def model_args(sp, budget_default=None):
        sp.add_argument("--preset", default="tiny", help="tiny | small | kimi-k2.6 (default tiny)")
        sp.add_argument("--checkpoint", help="target checkpoint folder (instead of --preset)")
        sp.add_argument("--drafter-checkpoint", help="DFlash drafter checkpoint folder")
        sp.add_argument("--device", default="cpu")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--budget", type=int, default=budget_default,
                        help="DDTree node budget (none = autoregressive)")
        sp.add_argument("--max-new-tokens", type=int, default=32)

    g = sub.add_parser("generate", help="decode prompts")
    model_args(g)
    g.add_argument("--prompt-ids", type=_ids, action="append",
                   help="comma-separated token ids; repeat for a batch")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--stop-ids", type=_ids, default=None)
    g.add_argument("--kernels", help="op=variant[,op=variant] or a named selection "
                   "(\"optimized\": every kernel folder's best)")
    g.add_argument("--cuda-graph", action="store_true",
                   help="replay each decode step from one CUDA graph (greedy, --kernels "
                   "optimized, --device cuda)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")
    from workbench.dist.__main__ import add_dist_args

    add_dist_args(g)  # --tp, --ep, --nvls, --timeout
    g.set_defaults(fn=cmd_generate)

    d = sub.add_parser("demo", help="AR vs DDTree on the tiny preset")
    model_args(d, budget_default=8)
    d.set_defaults(fn=cmd_demo)

    w = sub.add_parser("weights", help="write a synthetic checkpoint")
    w.add_argument("--preset", default="tiny")
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--device", default="cpu")
    w.set_defaults(fn=cmd_weights)

    for name in _DELEGATED:  # listed in --help; parsed by their own modules
        sub.add_parser(name, help=f"see python -m workbench {name} -h", add_help=False)
    i = sub.add_parser("info", help="presets and registered ops")
    i.set_defaults(fn=cmd_info)
    return p


# sub-commands with their own argument parsers: `python -m workbench check -h` etc.
_DELEGATED = {
    "check": "workbench.check:check_main",
    "bench": "workbench.bench:bench_main",
    "trace": "workbench.trace:trace_main",
    "suite": "workbench.suite:suite_main",
    "train": "workbench.train.__main__:main",
    "loopbench": "workbench.loopbench:main",
    "acceptance": "workbench.acceptance:main",
    "shadow": "workbench.shadow:main",
}


def _interpret_triton_on_cpu() -> None:
    # Triton kernels run on CPU tensors through the interpreter; Triton reads the switch when a
    # kernel module is imported, so it is set before anything imports one.
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _interpret_triton_on_cpu()
    if argv and argv[0] in _DELEGATED:
        import importlib

        mod, _, fn = _DELEGATED[argv[0]].partition(":")
        return getattr(importlib.import_module(mod), fn)(argv[1:])
    args = build_parser().parse_args(argv)
    from workbench.ops.registry import UnknownOpError, VariantUnavailable

    try:
        return args.fn(args)
    except (ValueError, UnknownOpError, VariantUnavailable) as e:  # bad input: no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
