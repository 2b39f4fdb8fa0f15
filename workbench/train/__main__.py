"""`python -m workbench.train <command>`: train the shipped target + DFlash drafter pair.

    tokenizer  byte-level BPE on the training split -> OUT/tokenizer.json (+ corpus.json)
    target     tokenizer if missing, then the target -> OUT/target (K2.6 checkpoint format)
    drafter    DFlash drafter on OUT/target's greedy continuations -> OUT/drafter
    all        target, drafter, then the acceptance report
    report     acceptance report of a pair -> traces/acceptance_trained.{csv,md}
    readme     the pair folder's README.md from the run's records (train.json, corpus.json)
    smoke      target + drafter at toy scale on CPU in < 60 s, then load_model/load_drafter
               and AR vs DDTree (the CI check; same as `all --smoke`)

OUT defaults to workbench/assets/trained. --smoke runs a toy model on a few files (CPU,
seconds) and writes no traces unless --trace-dir is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import TRAINED_DIR


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help=f"pair folder (default {TRAINED_DIR})")
    p.add_argument("--device", default="cuda" if _has_cuda() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="toy scale, CPU, seconds")
    p.add_argument("--manifest", help="train on this corpus list (a shipped corpus.json)")
    p.add_argument("--trace-dir", default=None,
                   help="where train_<model>.csv go (default traces/, none with --smoke)")
    p.add_argument("--compile", action="store_true", help="torch.compile the training forward")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _overrides(ns, names) -> dict:
    return {k: getattr(ns, k) for k in names if getattr(ns, k, None) is not None}


def _out(ns) -> str:
    if ns.out:
        return ns.out
    if ns.smoke:
        raise SystemExit("--smoke needs --out (a scratch folder); the shipped pair is not "
                         "overwritten by a smoke run")
    return str(TRAINED_DIR)


def _trace(ns, name: str):
    if ns.trace_dir:
        return str(Path(ns.trace_dir) / f"train_{name}.csv")
    return None if ns.smoke else f"traces/train_{name}.csv"


def cmd_target(ns) -> dict:
    from .target import TargetArgs, train_target

    kw = _overrides(ns, ("steps", "batch", "seq", "lr", "vocab", "qat_frac", "max_files"))
    kw |= dict(device=ns.device, seed=ns.seed, manifest=ns.manifest, compile=ns.compile,
               trace=_trace(ns, "target"))
    args = (TargetArgs.smoke_defaults(_out(ns), **kw) if ns.smoke
            else TargetArgs(out=_out(ns), **kw))
    return train_target(args)


def cmd_tokenizer(ns) -> dict:
    from . import TOKENIZER_FILE
    from .target import TargetArgs, prepare_corpus

    out = Path(_out(ns))
    (out / TOKENIZER_FILE).unlink(missing_ok=True)
    kw = _overrides(ns, ("vocab", "max_files")) | dict(manifest=ns.manifest)
    args = TargetArgs.smoke_defaults(str(out), **kw) if ns.smoke else TargetArgs(str(out), **kw)
    tok, stream, held, _ = prepare_corpus(args)
    print(f"{out / TOKENIZER_FILE}: {tok.get_vocab_size()} tokens; train stream "
          f"{stream.numel():,} tokens, held-out {held.numel():,}")
    return {}


def cmd_drafter(ns) -> dict:
    from .drafter import DrafterArgs, train_drafter

    kw = _overrides(ns, ("steps", "batch", "seq", "lr", "pool", "anchors", "max_files"))
    kw |= dict(device=ns.device, seed=ns.seed, manifest=ns.manifest, compile=ns.compile,
               trace=_trace(ns, "drafter"))
    args = (DrafterArgs.smoke_defaults(_out(ns), **kw) if ns.smoke
            else DrafterArgs(out=_out(ns), **kw))
    return train_drafter(args)


def cmd_report(ns) -> int:
    from .report import acceptance_report

    def ints(text):
        return tuple(int(b) for b in text.split(",") if b.strip())

    pair = ns.pair or str(TRAINED_DIR)
    kw = dict(n_prompts=ns.prompts, max_new=ns.max_new, temperatures=tuple(ns.temperatures),
              device=ns.device, seed=ns.seed)
    for name, key in (("budgets", "budgets"), ("other_block_budgets", "other_block_budgets"),
                      ("exact_budgets", "exact_budgets"), ("other_blocks", "other_blocks")):
        if getattr(ns, name) is not None:
            kw[key] = ints(getattr(ns, name))
    df = acceptance_report(pair, ns.csv, ns.md, **kw)
    cols = ["precision", "temperature", "block_size", "budget", "tau", "tau_first64",
            "experts_per_layer", "requests_equal", "max_margin_at_divergence", "wall_s"]
    print(df[cols].to_string(index=False))
    exact = df[(df["precision"] == "fp32") & (df["mode"] == "ddtree")]
    if len(exact) and not exact["tokens_equal_ar"].all():
        print("ERROR: with fp32 activations DDTree tokens differ from AR (a lossless-ness bug)")
        return 1
    return 0


def smoke_check(out: str, device: str = "cpu") -> dict:
    """load_model + load_drafter of a (smoke) pair, AR vs DDTree on two held-out prompts
    (fp32 activations, same weights: see report.py)."""
    from workbench.generate import generate

    from . import load_pair
    from .report import decode_mode, heldout_prompts

    target, drafter, tok = load_pair(out, device=device)
    prompts = [p["ids"] for p in heldout_prompts(tok, 2, 24, None)]
    with decode_mode(target, drafter, slack=16, fp32=True):  # why fp32: see report.py
        ar = generate(target, prompts=prompts, max_new_tokens=12)
        dd = generate(target, drafter, prompts, max_new_tokens=12, budget=4)
    print(f"smoke pair: AR == DDTree tokens: {ar.tokens == dd.tokens}; tau {dd.tokens_per_step:.2f}")
    if ar.tokens != dd.tokens:
        raise RuntimeError("smoke pair: DDTree tokens differ from AR")
    return {"tau": dd.tokens_per_step}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn in (("tokenizer", cmd_tokenizer), ("target", cmd_target),
                     ("drafter", cmd_drafter), ("all", None), ("smoke", None)):
        sp = sub.add_parser(name)
        _common(sp)
        sp.add_argument("--steps", type=int)
        sp.add_argument("--batch", type=int)
        sp.add_argument("--seq", type=int)
        sp.add_argument("--lr", type=float)
        sp.add_argument("--max-files", type=int, dest="max_files")
        if name in ("tokenizer", "target", "all", "smoke"):
            sp.add_argument("--vocab", type=int)
            sp.add_argument("--qat-frac", type=float, dest="qat_frac")
        if name in ("drafter",):
            sp.add_argument("--pool", type=int)
            sp.add_argument("--anchors", type=int)
        sp.set_defaults(fn=fn, name=name)
    r = sub.add_parser("report")
    r.add_argument("--pair", default=None, help=f"pair folder (default {TRAINED_DIR})")
    r.add_argument("--device", default="cuda" if _has_cuda() else "cpu")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--prompts", type=int, default=64)
    r.add_argument("--max-new", type=int, default=128, dest="max_new")
    r.add_argument("--budgets", default=None, help="comma-separated (default 1,2,...,64)")
    r.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    r.add_argument("--other-blocks", default=None, dest="other_blocks",
                   help="block sizes besides the trained one, greedy (default 4; '' for none)")
    r.add_argument("--other-block-budgets", default=None, dest="other_block_budgets",
                   help="their budgets (default 8)")
    r.add_argument("--exact-budgets", default=None, dest="exact_budgets",
                   help="fp32 lossless check budgets (default 8,32; empty for none)")
    r.add_argument("--csv", default="traces/acceptance_trained.csv")
    r.add_argument("--md", default="traces/acceptance_trained.md")
    r.set_defaults(fn=cmd_report, name="report")
    m = sub.add_parser("readme", help="write the pair folder's README.md from the run's records")
    m.add_argument("--pair", default=None, help=f"pair folder (default {TRAINED_DIR})")
    m.add_argument("--wall", action="append", default=[], help="stage=seconds, repeatable")
    m.add_argument("--csv", default="traces/acceptance_trained.csv")
    m.set_defaults(fn=cmd_readme, name="readme")
    return p


def cmd_readme(ns) -> int:
    from .readme import write_readme

    walls = {k: float(v) for k, _, v in (w.partition("=") for w in ns.wall)}
    print(f"wrote {write_readme(ns.pair or TRAINED_DIR, walls, ns.csv)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if getattr(ns, "device", "cpu") == "cpu":
        import torch

        # toy and small shapes are latency-bound: threaded MKL spins on a shared box
        torch.set_num_threads(1)
    if ns.name == "smoke":
        ns.smoke = True
    if ns.name in ("all", "smoke"):
        t0 = time.perf_counter()
        # --steps/--batch/--seq/--lr given to `all` apply to the target only
        cmd_target(ns)
        t1 = time.perf_counter()
        for k in ("steps", "batch", "seq", "lr"):  # the target's values would not fit
            setattr(ns, k, None)
        cmd_drafter(ns)
        t2 = time.perf_counter()
        if ns.smoke:
            smoke_check(_out(ns), ns.device)
        else:
            rns = build_parser().parse_args(["report", "--pair", _out(ns), "--device", ns.device])
            cmd_report(rns)
        print(f"wall: target {t1 - t0:.0f} s, drafter {t2 - t1:.0f} s, "
              f"check/report {time.perf_counter() - t2:.0f} s")
        return 0
    out = ns.fn(ns)
    return out if isinstance(out, int) else 0


if __name__ == "__main__":
    sys.exit(main())
