"""Where the drafter step's time goes at kimi-k2.6 widths: the graph-replayed step's kernel
table, and each of its GEMMs / the fused LM head timed alone against the bytes it streams.

    PYTHONPATH=. python3 scripts/profile_drafter.py [--batches 1,8,32] [--ctx 1024]
        [--variant triton_v1] [--csv out.csv] [--steps-only]

Why: issue #11 wants the bs 1 step <= 2302 µs (1.2x torch.compile's 2763); triton_v1 replays in
~2432 µs against a ~2130 µs floor. The table says which kernels own the 300 µs.
Rows: (B, what, µs, GB/s on the bytes the kernel must read). "step" is a graph replay of the
whole draft; "k:<name>" the profiler's per-step device time of one kernel name in that replay;
"gemm:<w>" / "head:<cfg>" one call timed alone (CUDA graph of 10 back-to-back calls).
"""

from __future__ import annotations

import argparse
import csv
import functools

import torch
import torch.nn.functional as F

from workbench.bench import graph_us
from workbench.loopbench import busy_us, kernel_times
from workbench.ops import registry
from workbench.ops.cases import drafter_cases


def step_rows(B: int, fn, nbytes: int) -> list[tuple]:
    from torch.profiler import ProfilerActivity, profile

    rows = [(B, "step", graph_us(fn, reps=1, rounds=9), nbytes)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    n = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    rows.append((B, "busy", busy_us(prof) / n, nbytes))
    per = kernel_times(prof, cuda=True)
    for name, (calls, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        rows.append((B, f"k:{calls // n}x {name[:90]}", us / n, 0))
    return rows


def gemm_rows(B: int, drafter, target, S: int, L: int) -> list[tuple]:
    from workbench.kernels.drafter._common import prepared
    from workbench.kernels.drafter._lm_head_topk import lm_head_topk

    w = prepared(drafter)
    layer = drafter.layers[0]
    M, Mh = B * S, B * L
    dev = drafter.device

    def x(m, k):
        return torch.randn(m, k, device=dev, dtype=torch.bfloat16)

    mats = {"qkv": (w.qkv[0], M), "o": (layer.self_attn.o_proj.weight, M),
            "gate_up": (w.gate_up[0], M), "down": (layer.mlp.down_proj.weight, M),
            "lm_head": (target.lm_head.weight, Mh)}
    rows = []
    for name, (W, m) in mats.items():
        a = x(m, W.shape[1])
        rows.append((B, f"gemm:{name} [{m}x{W.shape[1]}]x[{W.shape[0]}]",
                     graph_us(functools.partial(F.linear, a, W)), W.numel() * 2))
    res = x(M, layer.self_attn.o_proj.weight.shape[0])
    a = x(M, layer.self_attn.o_proj.weight.shape[1])
    Wo = layer.self_attn.o_proj.weight
    rows.append((B, "gemm:o + add", graph_us(lambda: res + F.linear(a, Wo)), Wo.numel() * 2))
    rows.append((B, "gemm:o addmm", graph_us(lambda: torch.addmm(res, a, Wo.t())),
                 Wo.numel() * 2))
    z = x(Mh, target.lm_head.weight.shape[1])
    Wh = target.lm_head.weight
    rows.append((B, "head:lm_head_topk k8", graph_us(lambda: lm_head_topk(z, Wh, 8)),
                 Wh.numel() * 2))
    rows += head_sweep(B, z, Wh)
    if M <= 64:
        for name, (W, m) in mats.items():
            if name != "lm_head":
                rows += skinny_sweep(B, name, x(m, W.shape[1]), W)
    return rows


def skinny_sweep(B: int, name: str, a, W) -> list[tuple]:
    """kernels/dense/linear_triton_v1's no-split-K skinny kernel under other tiles."""
    import triton

    from workbench.kernels.dense.linear_triton_v1 import _skinny_kernel

    M, K = a.shape
    N = W.shape[0]
    y = torch.empty(M, N, dtype=a.dtype, device=a.device)
    bm = max(16, 1 << (M - 1).bit_length())
    rows = []
    for bn, bk, warps, stages in [(16, 256, 4, 4), (16, 512, 4, 3), (32, 256, 4, 4),
                                  (32, 256, 4, 6), (32, 512, 8, 3), (64, 256, 4, 4),
                                  (64, 128, 4, 6), (16, 256, 2, 6)]:
        call = functools.partial(
            _skinny_kernel[(triton.cdiv(N, bn), triton.cdiv(M, bm))],
            a, W, y, M, N, K, a.stride(0), a.stride(1), W.stride(0), W.stride(1), y.stride(0),
            BM=bm, BN=bn, BK=bk, INTERPRET=False, num_warps=warps, num_stages=stages)
        try:
            us = graph_us(call)
        except Exception as e:  # out of shared memory etc.: say so, keep sweeping
            print(f"skinny {name} N{bn} K{bk} w{warps} s{stages}: {type(e).__name__}: {e}"[:200])
            continue
        rows.append((B, f"skinny:{name} [{M}x{K}]x[{N}] BN{bn} BK{bk} w{warps} s{stages}", us,
                     W.numel() * 2))
    return rows


def head_sweep(B: int, z, W, KC: int = 8) -> list[tuple]:
    """The LM head's tile kernel alone under other tile shapes / pipelines (the merge and
    final kernels after it are ~1% of the head)."""
    import triton

    from workbench.kernels.drafter._lm_head_topk import _lm_head_tile_kernel

    M, D = z.shape
    V = W.shape[0]
    rows = []
    cfgs = [(128, 128, 0, 8, 4), (128, 128, 0, 4, 4), (64, 128, 0, 4, 4), (64, 128, 0, 4, 6),
            (64, 128, 0, 4, 5), (64, 64, 0, 4, 8), (64, 128, 0, 8, 6)]
    if M > 64:
        cfgs += [(64, 128, 128, 4, 4), (64, 64, 128, 4, 6), (128, 64, 128, 8, 4),
                 (128, 128, 128, 8, 3), (64, 64, 256, 8, 4), (128, 128, 32, 4, 4)]
    for bv, bd, bm, warps, stages in cfgs:
        bm = bm or (16 if M <= 16 else (32 if M <= 32 else 64))
        nvt = triton.cdiv(V, bv)
        keys = torch.empty(M, nvt * KC, dtype=torch.int64, device=z.device)
        pm = torch.empty(M, nvt, dtype=torch.float32, device=z.device)
        ps = torch.empty_like(pm)

        call = functools.partial(
            _lm_head_tile_kernel[(triton.cdiv(M, bm), nvt)],
            z, W, keys, pm, ps, M, V, D, z.stride(0), W.stride(0), nvt, BLOCK_M=bm,
            BLOCK_V=bv, BLOCK_D=bd, KC=KC, DOT_BF16=True, SORT=True, num_warps=warps,
            num_stages=stages)
        try:
            us = graph_us(call)
        except Exception as e:  # out of shared memory etc.: say so, keep sweeping
            print(f"head tile V{bv} D{bd} w{warps} s{stages}: {type(e).__name__}: {e}"[:200])
            continue
        rows.append((B, f"head:tile V{bv} D{bd} M{bm} w{warps} s{stages}", us, W.numel() * 2))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--variant", default="triton_v1")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--steps-only", action="store_true",
                    help="only the step's kernel table, no GEMM / LM head sweeps")
    a = ap.parse_args()
    batches = {int(b) for b in a.batches.split(",")}
    fn = registry.op_spec("drafter").variant(a.variant).load()
    rows = []
    for c in drafter_cases("real", seed=0, device="cuda"):
        d = c.dims
        if d["B"] not in batches or d["k"] != 8 or d["P_sum"] != d["B"] * a.ctx:
            continue
        drafter, target = c.args[:2]
        from workbench.ops.cases import drafter_roofline

        nbytes = drafter_roofline(c)["bytes"]
        rows += step_rows(d["B"], functools.partial(fn, *c.args), nbytes)
        if not a.steps_only:
            rows += gemm_rows(d["B"], drafter, target, d["L"] + 1, d["L"])
    print(f"{'B':>3} {'µs':>9} {'GB/s':>7}  what")
    for B, what, us, nb in rows:
        print(f"{B:>3} {us:>9.1f} {nb / us / 1e3 if nb else 0:>7.0f}  {what}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["B", "what", "us", "bytes"])
            wr.writerows(rows)


if __name__ == "__main__":
    main()
