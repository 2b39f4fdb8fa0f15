"""Where a tree_mla version differs from the reference (GPU): per shape, the relative error of
each column half of o_lat (a Gluon seesaw bug shows up in one warpgroup's half), the worst
64-row block, NaN counts and the lse error; shapes from tiny to REAL.

    python scripts/diag_tree_mla.py --variant gluon_v11 [--shapes all|small]

A first look before the pytest suite (which stops at the first mismatch with less detail).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
from workbench.reference.tree_mla import pack_anc_bits, tree_mla  # noqa: E402

SHAPES = [  # (B, N, H, prefix, C, R): masked-only, one prefix tile, split parts, REAL
    (1, 1, 8, 0, 512, 64), (1, 3, 8, 40, 512, 64), (1, 9, 8, 64, 512, 64),
    (1, 9, 8, 200, 512, 64), (2, 17, 8, 1000, 512, 64), (1, 9, 64, 1024, 512, 64),
    (2, 33, 16, 4100, 512, 64), (1, 129, 64, 8192, 512, 64), (3, 5, 4, 77, 64, 16),
]


def case(B, N, H, prefix, C, R, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = prefix + N + 5
    q = torch.randn(B, N, H, C + R, generator=g).to(torch.bfloat16)
    cache = torch.randn(B, T, C + R, generator=g).to(torch.bfloat16)
    cache[:, prefix + N:] = float("nan")  # past each request's length: must not leak
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)]
    vis = torch.eye(N, dtype=torch.bool)
    for i in range(1, N):
        vis[i] |= vis[parents[i]]
    anc = pack_anc_bits(vis).expand(B, -1, -1).contiguous()
    P = torch.full((B,), prefix, dtype=torch.int64)
    return [t.cuda() for t in (q, cache, P, anc)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="gluon_v11")
    ap.add_argument("--shapes", choices=("all", "small"), default="all")
    a = ap.parse_args(argv)
    import importlib

    from workbench.kernels.tree_mla import VARIANTS

    mod, name = VARIANTS["tree_mla"][a.variant].split(":")
    fn = getattr(importlib.import_module(mod), name)
    shapes = SHAPES if a.shapes == "all" else SHAPES[:5]
    bad = 0
    for B, N, H, prefix, C, R in shapes:
        q, cache, P, anc = case(B, N, H, prefix, C, R)
        t0 = time.time()
        o, lse = fn(q, cache, P, anc, 0.14468, C)
        torch.cuda.synchronize()
        dt = time.time() - t0
        ro, rl = tree_mla(q, cache, P, anc, 0.14468, C)
        ro, o = ro.double(), o.double()
        halves = []
        for h in range(2):
            sl = slice(h * C // 2, (h + 1) * C // 2)
            halves.append(((o[..., sl] - ro[..., sl]).norm() / ro[..., sl].norm()).item())
        rows = (o - ro).reshape(B, N * H, C)
        ref_rows = ro.reshape(B, N * H, C)
        blocks = [((rows[:, i:i + 64]).norm() / ref_rows[:, i:i + 64].norm()).item()
                  for i in range(0, N * H, 64)]
        worst = max(range(len(blocks)), key=lambda i: blocks[i])
        fin = torch.isfinite(rl)
        lse_err = (lse.double()[fin] - rl.double()[fin]).abs().max().item() if fin.any() else 0
        nan = int(torch.isnan(o).sum())
        ok = max(halves) < 2e-2 and nan == 0 and lse_err < 1e-2
        bad += not ok
        print(f"B{B} N{N} H{H} P{prefix} C{C} R{R}: rel err halves {halves[0]:.2e} / "
              f"{halves[1]:.2e}, worst 64-row block {worst} {blocks[worst]:.2e}, NaN {nan}, "
              f"lse max err {lse_err:.2e}, first call {dt * 1e3:.0f} ms  {'ok' if ok else 'BAD'}",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
