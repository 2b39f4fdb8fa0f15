"""Is a RoPE launch's time its program count? rope triton_v1 at the engine's q_pe shapes with
BLOCK_ROWS (rows a program) varied, GPU kernel µs (profiler) and graph-replayed µs:

    PYTHONPATH=. python3 scripts/probe_rope_programs.py [--rows 8,64,136,544] [--blocks 4,8,32,256]

Why (session 18 call 5, `bench rope --shapes real`): triton_v1's kernel takes 1.8-2.4 µs where
the call is one program (<= 32 (position, head) rows) and 5.0-5.4 µs at 2-17 programs, and the
EP8 step's q_pe RoPE 2.5 µs at C 1 AR (8 rows) against 5.7 at DDTree-16 (136): the per-program
work is the same 32 rows, so the program count, not the rows, is what the probe varies.
Rows are (position, head) pairs: H = 8 heads of R = 64 (the EP8 rank), positions near 4096.
"""

from __future__ import annotations

import argparse

import torch

from workbench.bench import time_calls
from workbench.kernels.dense import rope_triton_v1
from workbench.reference.rope import target_rope


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="8,64,136,544", help="(position, head) rows a call")
    p.add_argument("--blocks", default="4,8,32,64,256", help="BLOCK_ROWS values")
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    a = p.parse_args(argv)
    H, dev = 8, a.device
    from workbench.models import resolve_config

    rope = target_rope(resolve_config("kimi-k2.6"))
    rope.reserve(8192, dev)
    table = rope.table(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    print("rows  BLOCK_ROWS  programs  kernel_us  graph_us")
    for rows in map(int, a.rows.split(",")):
        M = rows // H
        q = torch.randn(M, H, 192, generator=g, device=dev).to(torch.bfloat16)
        out = torch.empty(M, H, 576, dtype=torch.bfloat16, device=dev)
        pos = 4096 + torch.arange(M, device=dev)
        for blk in map(int, a.blocks.split(",")):
            t = time_calls(rope_triton_v1.rope,
                           [((q[..., 128:], pos, table, True),
                             {"out": out[..., 512:], "block_rows": blk})], dev,
                           a.seconds, "on" if dev == "cuda" else "off")
            progs = -(-rows // blk)
            print(f"{rows:<5} {blk:>10}  {progs:>8}  {t.kernel_us or float('nan'):9.2f}  "
                  f"{t.us:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
