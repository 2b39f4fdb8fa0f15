"""One int4_moe version's op on one Kimi MoE layer against the reference, per T and routing:
the max |error|, whether it passes the suites' tolerance (rtol = atol = 2e-2) and one eager
call's µs. A first GPU look at a new kernel before its test files: a call that hangs ends at
the caller's timeout with the rows printed so far.

    python3 scripts/int4_moe_smoke.py cuda_v24 [--T 128,512] [--skew 1.2] [--no-ref]

--no-ref runs the op alone (twice a T) for compute-sanitizer: the reference's bf16 dequant of a
layer's experts did not fit beside memcheck's shadow memory on an 80 GB H100 (session 53 call 1,
session 54 call 7: OutOfMemoryError inside the reference, 6 errors that are the OOM's)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def kimi_layer():
    """One Kimi K2.6 MoE layer's routed experts on the GPU (seed 0) -> (experts, E, K, D)."""
    from workbench.config import ModelConfig
    from workbench.ops.cases import _experts, _Rand

    cfg = ModelConfig.preset("kimi-k2.6")
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    return (_experts(_Rand(0, "cuda"), E, cfg.hidden_size, cfg.moe_intermediate), E, K,
            cfg.hidden_size)


def draw(T: int, skew: float, E: int, K: int, D: int):
    """T tokens' routing on the GPU, seed T: (x [T, D], ids [T, K] (Zipf(skew), or uniform
    distinct at skew 0), weights [T, K])."""
    from workbench.ops.cases import _Rand

    r = _Rand(T, "cuda")
    ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
    return r.normal(T, D), ids, r.uniform(T, K) + 0.05


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", help="an int4_moe module, e.g. cuda_v24")
    ap.add_argument("--T", default="128,512", help="token counts, comma-separated")
    ap.add_argument("--skew", type=float, default=1.2, help="Zipf skew (0: uniform distinct)")
    ap.add_argument("--no-ref", action="store_true",
                    help="the op alone, no reference (for compute-sanitizer)")
    a = ap.parse_args(argv)
    from workbench.reference.int4_moe import int4_moe

    op = importlib.import_module(f"workbench.kernels.int4_moe.{a.version}").int4_moe_cuda
    ex, E, K, D = kimi_layer()
    ok_all = True
    for T in (int(t) for t in a.T.split(",")):
        x, ids, w = draw(T, a.skew, E, K, D)
        op(x, ids, w, ex)  # build and warm up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = op(x, ids, w, ex)
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) * 1e6
        if a.no_ref:
            nan = bool(out.isnan().any())
            ok_all &= not nan
            print(f"{a.version} T {T} skew {a.skew}: ran (no reference), "
                  f"{'NaN in the output' if nan else 'no NaN'}, {us:.1f} µs eager", flush=True)
            continue
        ref = int4_moe(x, ids, w, ex).float()
        err = (out.float() - ref).abs()
        bad = out.isnan().any(1) | (err > 2e-2 + 2e-2 * ref.abs()).any(1)  # [T] tokens
        ok = not bool(bad.any())
        ok_all &= ok
        # where it fails: how many tokens, and how many of their top-k experts are "hot" (the
        # most-routed experts, more than 16 slots: the launches a new hot path takes)
        cnt = torch.bincount(ids.flatten(), minlength=E)
        hot = (cnt[ids] > 16).any(1)  # [T] tokens with a hot expert
        where = "" if ok else (f" ({int(bad.sum())} of {T} tokens wrong, "
                               f"{int((bad & hot).sum())} of them routed to an expert of > 16 "
                               f"slots; {int(hot.sum())} such tokens)")
        print(f"{a.version} T {T} skew {a.skew}: max |err| {err.max().item():.3e}, "
              f"{'ok' if ok else 'FAILED'}{where}, {us:.1f} µs eager", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
