"""int4_moe's K-split table swept where it matters for decode: the op at T = 1 on all 384
experts (plain AR on one GPU) and on one EP8 rank (48 experts, the other ranks' slots -1, the
`expected_slots` hint the loop passes), graph-replayed, one line per (case, config).

    PYTHONPATH=. python3 scripts/sweep_int4_splits.py [--variant triton_v11] [--seconds 0.4]

Why (session 11): at T = 1 KS1 3 / KS2 2 ran 84.5 µs against the table's 4 / 3 at 89.1
(`call8_steps.log`); and v11 sizes the splits of a hinted EP rank for min(E, ceil(slots / K) K)
active experts (8 at hint 1) where ~1 is routed there, so its decode grids may be far smaller
than the GPU. The configs are KSn / TPSn overrides of the variant's `cfg` (other fp32
association, the same kernels). Prints µs and the grid's programs per GEMM (BN 128 tiles).
"""

from __future__ import annotations

import argparse
import itertools

import torch

from workbench import ops
from workbench.bench import time_calls
from workbench.kernels.int4_moe import register
from workbench.kernels.int4_moe.triton_v3 import normalised_split
from workbench.ops.cases import _experts, _Rand

KS1 = (1, 2, 3, 4, 7, 14, 28)  # gate/up: 28 K tiles of 256 at D 7168
KS2 = (1, 2, 3, 4, 8)  # down: 8 K tiles at I 2048


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="triton_v11")
    p.add_argument("--seconds", type=float, default=0.4)
    a = p.parse_args(argv)
    register()
    fn = ops.op_spec("int4_moe").variant(a.variant).load()
    r = _Rand(0, "cuda")
    ex = _experts(r, 384, 7168, 2048)
    ex48 = type(ex)(*(t[:48] for t in ex))
    cases = []
    x1, ids1, w1 = r.normal(1, 7168), r.distinct(384, 8, 1), r.uniform(1, 8) + 0.05
    cases.append(("T=1 E=384", (x1, ids1, w1, ex), {}))
    for T in (1, 17):  # C 1 x AR and C 1 x DDTree-16 on one EP8 rank
        ids = r.distinct(384, 8, T)
        here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
        n = -(-T * 8 * 48 // 384)
        cases.append((f"EP8 rank T={T} hint {n} (routed {int((here >= 0).sum())})",
                      (r.normal(T, 7168), here, r.uniform(T, 8) + 0.05, ex48),
                      {"expected_slots": n}))
    print(f"{'case':<36} {'KS1xTPS1':>8} {'KS2xTPS2':>8}      us")
    for label, args, kw in cases:
        base = time_calls(lambda *q, **k: fn(*q, **k), [(args, kw)], "cuda", a.seconds, "on")
        print(f"{label:<36} {'table':>8} {'table':>8} {base.us:8.1f}", flush=True)
        for k1, k2 in itertools.product(KS1, KS2):
            (s1, t1), (s2, t2) = normalised_split(28, k1), normalised_split(8, k2)
            cfg = dict(KS1=s1, TPS1=t1, KS2=s2, TPS2=t2)
            t = time_calls(lambda *q, c=cfg, **k: fn(*q, cfg=c, **k), [(args, kw)], "cuda",
                           a.seconds, "on")
            print(f"{label:<36} {f'{s1}x{t1}':>8} {f'{s2}x{t2}':>8} {t.us:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
