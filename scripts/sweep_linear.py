"""Tiles of the split-K skinny GEMMs (kernels/dense linear_triton_v2, and v4's swap-AB kernel)
at the EP8 rank's decode projections, against cuBLAS and linear_triton_v1, each call timed alone.

    PYTHONPATH=. python3 scripts/sweep_linear.py [--rows 1,9,17,33] [--kernel triton_v2]
                                                 [--cold-mb 0] [--set ep8] [--csv out.csv]

--kernel triton_v4 sweeps v4's kernel (BN 64 / 128, BK 128 / 256, SPLIT around its rule) and
times v3 and v4's defaults beside cuBLAS. --cold-mb N rotates over copies of the weight
totalling >= N MB inside the timed graph, so each call streams its weight from HBM as in the
decode step (the H200's L2 is 50 MB: a lone 30 MB weight replayed back to back stays in it;
session 10's sweep ran warm). --set drafter-tp8 times the DFlash drafter's projections as a
rank of its tensor-parallel layout holds them (workbench/dist/drafter.py; the EP8 emulation's
draft), --set drafter the whole ones (one GPU), each also under the drafter's own rule
(kernels/drafter/_gemm.proj: "drafter" rows), beside linear_triton_v5's dispatch ("triton_v5").

Why: the emulated rank's target GEMMs take ~5 ms a step at C 1, budget 16 (session 8), each a
few µs of latency around 1-7 µs of weight bytes; v2's default policy (`tiles`) is a guess until
this sweep says which (BN, BK, SPLIT, warps, stages) wins per shape. Rows: (shape, rows,
kernel, tiles, µs, GB/s on the weight), best first per (shape, rows), the output checked
against cuBLAS's within one bf16 rounding before it is timed.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools

import torch
import torch.nn.functional as F

from workbench.bench import graph_us
from workbench.config import ModelConfig
from workbench.kernels.dense import linear_triton_v1 as l1
from workbench.kernels.dense import linear_triton_v2 as l2
from workbench.kernels.dense import linear_triton_v3 as l3
from workbench.kernels.dense import linear_triton_v4 as l4
from workbench.kernels.dense import linear_triton_v5 as l5
from workbench.kernels.drafter._gemm import proj


def shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """{name: (K, N)} of an EP8 rank's projections (workbench/ops/cases.py's REAL linear)."""
    F_sh = cfg.moe_intermediate * cfg.n_shared_experts
    return {"qkv_a": (cfg.hidden_size, cfg.q_lora_rank + cfg.latent_dim),
            "q_b/8": (cfg.q_lora_rank, cfg.num_heads // 8 * cfg.qk_head_dim),
            "o/8": (cfg.num_heads // 8 * cfg.v_head_dim, cfg.hidden_size),
            "gate_up/8": (cfg.hidden_size, 2 * F_sh // 8), "down/8": (F_sh // 8, cfg.hidden_size)}


def drafter_shapes(cfg: ModelConfig, world: int) -> dict[str, tuple[int, int]]:
    """{name: (K, N)} of the drafter's projections on one of `world` tensor-parallel ranks
    (its q heads, its KV heads or the one it reads, F / world MLP columns); names are
    kernels/drafter/_gemm.proj's, suffixed /world past one rank."""
    d = cfg.drafter
    hq, hkv = d.num_heads // world, max(1, d.num_kv_heads // world)
    sfx = f"/{world}" if world > 1 else ""
    return {f"qkv{sfx}": (d.hidden_size, (hq + 2 * hkv) * d.head_dim),
            f"o{sfx}": (hq * d.head_dim, d.hidden_size),
            f"gate_up{sfx}": (d.hidden_size, 2 * d.intermediate_size // world),
            f"down{sfx}": (d.intermediate_size // world, d.hidden_size)}


SETS = {"ep8": shapes, "drafter-tp8": lambda cfg: drafter_shapes(cfg, 8),
        "drafter": lambda cfg: drafter_shapes(cfg, 1)}


def rotating(call, ws: list):
    """A no-argument fn calling call(w) on the next of `ws` each time (a graph captured over
    len(ws) calls streams every copy once a round)."""
    state = [0]

    def fn():
        state[0] = (state[0] + 1) % len(ws)
        return call(ws[state[0]])
    return fn


def grid_for(kernel: str, M: int, N: int, K: int) -> list[tuple]:
    """(BN, BK, SPLIT, warps, stages) candidates: v2's 24-tile grid, or around v4's rule."""
    if kernel == "triton_v2":
        return list(itertools.product((16, 32, 64), (128, 256), (1, 2, 4, 8), (4,), (4,)))
    s = l4.tiles(M, N, K).SPLIT
    splits = sorted({max(1, s // 2), s, min(16, 2 * s)})
    return list(itertools.product((64, 128), (128, 256), splits, (4,), (4,)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,9,17,33")
    ap.add_argument("--kernel", default="triton_v2", choices=("triton_v2", "triton_v4"))
    ap.add_argument("--cold-mb", type=float, default=0.0)
    ap.add_argument("--set", default="ep8", choices=sorted(SETS),
                    help="which projections (ep8: the target's on an EP8 rank)")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    cfg = ModelConfig.preset("kimi-k2.6")
    g = torch.Generator(device="cuda").manual_seed(0)
    mod = l2 if a.kernel == "triton_v2" else l4
    rows = []
    for (name, (K, N)), M in itertools.product(SETS[a.set](cfg).items(),
                                               [int(m) for m in a.rows.split(",")]):
        x = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn(N, K, generator=g, device="cuda") * K**-0.5).to(torch.bfloat16)
        copies = max(1, -(-int(a.cold_mb * 1e6) // (N * K * 2)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        reps = max(20, 2 * copies)
        ref = F.linear(x, w).float()
        tol = 2 * 2.0**-8 * ref.abs() + 1e-2

        def us(call, ws=ws, reps=reps):
            return graph_us(rotating(call, ws), reps=reps)
        found = [(name, M, "cuBLAS", "", us(functools.partial(F.linear, x)))]
        found.append((name, M, "triton_v1", str(l1.tiles(M, N, K)),
                      us(functools.partial(l1.linear, x))))
        found.append((name, M, "triton_v2", f"default {tuple(l2.tiles(M, N, K))}",
                      us(functools.partial(l2.linear, x))))
        if a.kernel == "triton_v4":
            found.append((name, M, "triton_v3", f"default {tuple(l3.tiles(M, N, K))}",
                          us(functools.partial(l3.linear, x))))
            found.append((name, M, "triton_v4", f"default {tuple(l4.tiles(M, N, K))}",
                          us(functools.partial(l4.linear, x))))
            found.append((name, M, "triton_v5", "dispatch", us(functools.partial(l5.linear, x))))
        if a.set != "ep8":  # the drafter's own rule for this projection (its name sans /w)
            pname = name.split("/")[0]
            found.append((name, M, "drafter", "proj",
                          us(lambda w, x=x, pname=pname: proj(x, w, pname))))
        bm = max(16, 1 << (min(M, 64) - 1).bit_length())
        for bn, bk, split, warps, stages in grid_for(a.kernel, M, N, K):
            if split > 1 and K // split < bk:  # a slice shorter than one K step
                continue
            bk_, stages_ = l1.fit_smem(bm, bn, bk, stages)
            t = l2.Tiles(bm, bn, bk_, split, warps, stages_)
            tiled = functools.partial(mod.linear, x, tiles_for=lambda *_, t=t: t)
            try:
                if not bool(((tiled(w).float() - ref).abs() <= tol).all()):
                    print(f"{name} M{M} {t}: WRONG, not timed")
                    continue
                found.append((name, M, a.kernel, str(tuple(t)), us(tiled)))
            except Exception as e:  # out of shared memory etc.: say so, keep sweeping
                print(f"{name} M{M} {t}: {type(e).__name__}: {e}"[:160])
        found.sort(key=lambda r: r[-1])
        for r in found[:6] + [r for r in found[6:] if r[2] != a.kernel or
                              r[3].startswith("default")]:
            rows.append((*r, N * K * 2 / r[-1] / 1e3))
    print(f"{'shape':<10} {'M':>3} {'kernel':<10} {'µs':>7} {'GB/s':>6}  tiles")
    for name, M, kern, tiles, t_us, gbs in rows:
        print(f"{name:<10} {M:>3} {kern:<10} {t_us:>7.2f} {gbs:>6.0f}  {tiles}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["shape", "rows", "kernel", "tiles", "us", "GBps"])
            wr.writerows(rows)


if __name__ == "__main__":
    main()
