"""The drafter's block attention (kernels/drafter/_attention.py) under each split / combine
option, at the tensor-parallel drafter's rank shape (one kv head of G query heads) or the
whole drafter's, each call timed alone in a CUDA graph.

    PYTHONPATH=. python3 scripts/sweep_drafter_attention.py [--world 8] [--batches 1,8]
                                                            [--ctx 4096] [--csv out.csv]

Options swept: (min_tiles, combine) for min_tiles in 1, 2, 4 (triton_v1-v4: 4) and combine
"serial" (one split after the other; 16 rows a program: triton_v2's COMBINE_ROWS) or
"one-load" (`combine_tiles`); layers: a sliding one (the window's 2047 context keys) and the
full one (ctx keys). Each option's output is checked against (4, serial) within 2e-2 (bf16
P.V on the GPU, another merge order) before it is timed.

Why (session 59): the EP8 emulation's C 1 DDTree-16 draft spent 9.8 µs a layer in
`_attn_split_kernel` and 4.9 in `_combine_kernel` (session 58 call 1's glue table) on a
64-row, one-kv-head attention over 2-4k keys: drafter triton_v5 takes one-tile splits and the
one-load combine; this sweep says which pair is fastest at each shape.
Rows: (layer, B, min_tiles, combine, splits, µs), fastest first per (layer, B).
"""

from __future__ import annotations

import argparse
import csv

import torch

from workbench.bench import graph_us
from workbench.config import ModelConfig
from workbench.kernels.drafter._attention import block_attention, splits_for

COMBINE_ROWS = 16  # triton_v2's serial combine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="kimi-k2.6")
    ap.add_argument("--world", type=int, default=8, help="tensor-parallel ranks (1: whole)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    d = ModelConfig.preset(a.preset).drafter
    hq, hkv = d.num_heads // a.world, max(1, d.num_kv_heads // a.world)
    S, D, W = d.block_size, d.head_dim, d.sliding_window
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B in (int(b) for b in a.batches.split(",")):
        T = a.ctx + S

        def rnd(*shape):
            return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

        q, kb, vb = rnd(B, S, hq, D), rnd(B, S, hkv, D), rnd(B, S, hkv, D)
        kc, vc = rnd(B, T, hkv, D), rnd(B, T, hkv, D)
        start = torch.full((B,), a.ctx, device="cuda")
        for layer, sliding in (("sliding", True), ("full", False)):
            span = min(a.ctx, W - 1) if sliding else a.ctx
            base = None
            for min_tiles in (4, 2, 1):
                for combine in ("serial", "one-load"):
                    opts = ({"combine_rows": COMBINE_ROWS} if combine == "serial"
                            else {"one_load": True})

                    def call(t=(q, kb, vb, kc, vc, start), opts=opts, min_tiles=min_tiles,
                             sliding=sliding):
                        return block_attention(*t, sliding, W, False, n_sm,
                                               min_tiles=min_tiles, **opts)

                    o = call().float()
                    if base is None:
                        base = o
                    err = (o - base).abs().max().item()
                    assert err < 2e-2, f"{layer} B {B} ({min_tiles}, {combine}): |d| {err:.3g}"
                    us = graph_us(call)
                    splits = splits_for(B, hkv, span, 64, n_sm, min_tiles)
                    rows.append((layer, B, min_tiles, combine, splits, round(us, 2)))
                    print(f"{layer:8s} B {B:3d} min_tiles {min_tiles} {combine:8s} "
                          f"splits {splits:3d}: {us:7.2f} us", flush=True)
    rows.sort(key=lambda r: (r[0], r[1], r[5]))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["layer", "B", "min_tiles", "combine", "splits", "us"])
            wr.writerows(rows)


if __name__ == "__main__":
    main()
