"""Whether two int4_moe versions give the same bits at Kimi's REAL shapes (384 experts, top-8,
D 7168, I 2048; `small`'s MoE too) or at other widths, uniform and skewed routing, on fresh
random inputs a T; NaN-poisoning is the versions' own (each call allocates its output). Exit 1
when any case differs.

    python3 scripts/int4_moe_bitwise.py --a cuda_v16 --b cuda_v15 [--T 1,9,33,128,512]
        [--E 32 --K 4 --D 256 --I 128]   (the trained pair's MoE)
        [--ep 8]   (rank 0 of an expert-parallel 8: E / 8 local experts, -1 slots, the hint)

Why: a version that changes only tiling knobs (cuda_v16's BN / PF1) can inherit the token-exact
evidence of the version it is bitwise, if and only if the bits match at every shape the loops
reach; this says which shapes match and, where not, by how much."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _op(name: str):
    mod = importlib.import_module(f"workbench.kernels.int4_moe.{name}")
    return getattr(mod, "int4_moe_cuda", None) or mod.int4_moe_triton


def main(argv=None) -> int:
    from workbench.ops.cases import _experts, _Rand

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="a version file's name, e.g. cuda_v16")
    p.add_argument("--b", required=True, help="the version to compare with, e.g. cuda_v15")
    p.add_argument("--T", default="1,9,17,33,65,128,512")
    p.add_argument("--seed", type=int, default=4600)
    p.add_argument("--E", type=int, default=384, help="routed experts")
    p.add_argument("--K", type=int, default=8, help="experts a token")
    p.add_argument("--D", type=int, default=7168, help="hidden size")
    p.add_argument("--I", type=int, default=2048, help="an expert's intermediate size")
    p.add_argument("--ep", type=int, default=1,
                   help="rank 0 of N expert-parallel ranks, as the EP8 emulation calls the op: "
                        "E / N local experts, slots of other ranks' experts -1, the hint "
                        "expected_slots = ceil(T K / N)")
    a = p.parse_args(argv)
    if a.ep < 1 or a.E % a.ep:
        raise SystemExit(f"--ep: expected a divisor of --E {a.E}, got {a.ep}")
    if not torch.cuda.is_available():
        raise SystemExit("int4_moe_bitwise: needs a CUDA device (the versions compared are GPU-only)")
    fa, fb = _op(a.a), _op(a.b)
    E, D, I, K = a.E, a.D, a.I, a.K
    E_loc = E // a.ep
    ex = _experts(_Rand(a.seed, "cuda"), E_loc, D, I)
    differ = 0
    for T in map(int, a.T.split(",")):
        for skew in (0.0, 1.2):
            r = _Rand(a.seed + T + int(skew * 10), "cuda")
            ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
            x, w = r.normal(T, D), r.uniform(T, K) + 0.05
            hint = {}
            if a.ep > 1:  # rank 0: its experts keep their local id, the rest are -1
                ids = torch.where(ids < E_loc, ids, -1)
                hint = dict(expected_slots=-(-T * K // a.ep))
            ya, yb = fa(x, ids, w, ex, **hint), fb(x, ids, w, ex, **hint)
            same = torch.equal(ya, yb)
            differ += not same
            diff = (ya.float() - yb.float()).abs()
            print(f"T {T:<4} {'skewed' if skew else 'uniform':<8} {'bitwise' if same else 'DIFFER'}"
                  f"  max |a - b| {diff.max().item():.3g}, elements differing "
                  f"{int((ya != yb).sum())} of {ya.numel()}, NaN {bool(ya.isnan().any())}",
                  flush=True)
    print(f"{a.a} vs {a.b}: {'bitwise at every case' if not differ else f'{differ} case(s) differ'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
