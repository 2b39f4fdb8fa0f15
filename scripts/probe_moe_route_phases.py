"""Where moe_route triton_v2's one launch spends its time, against triton_v1's three: GPU
kernel µs (profiler, graph-replayed) at the EP8 rank's router rows, Kimi widths (D 7168, E 384,
K 8).

    PYTHONPATH=. python3 scripts/probe_moe_route_phases.py [--rows 1,9,17] [--device cpu]

Why (session 19 call 2): the one launch took 13.4 / 27.3 / 36.5 µs of kernel time at T 1 / 9
/ 17 against triton_v1's 9.9 / 10.3 / 10.3 (cuBLAS GEMM + splitKreduce + top-k kernel): the
top-k's rows cost ~12 µs a step of RB rows, and T 1 is slower too. Rows:
  v1            triton_v1 (cuBLAS GEMM, its reduce, the top-k kernel)
  v1 gemm       its router GEMM alone (torch_bf16.router_logits)
  v2            triton_v2 as the op runs it
  v2 no-topk    the split-K GEMM and the slice sums only (TOPK off)
  v3            triton_v3 (v2's GEMM at 32-expert tiles, then v1's selection kernel)
  v2 <cfg>      tile overrides (moe_route_triton_v2.tiles keywords), with and without top-k
`--device cpu` runs every call once under TRITON_INTERPRET=1 (a smoke test, no timing).
"""

from __future__ import annotations

import argparse
import functools

import torch

from workbench.bench import kernel_us
from workbench.kernels.dense import moe_route_triton_v1 as v1
from workbench.kernels.dense import moe_route_triton_v2 as v2
from workbench.kernels.dense import moe_route_triton_v3 as v3
from workbench.kernels.dense.torch_bf16 import router_logits

CFGS = {"BN32": dict(BN=32), "BK256": dict(BK=256), "split4": dict(max_split=4),
        "RB4": dict(RB=4), "RB16": dict(RB=16), "warps8": dict(warps=8)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,9,17")
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    dev, D, E, K, sc = a.device, 7168, 384, 8, 2.827
    if dev == "cpu":
        D = 256  # the interpreter: a smoke test of every call
    g = torch.Generator(device=dev).manual_seed(0)
    gw = (torch.randn(E, D, generator=g, device=dev) * D**-0.5).to(torch.bfloat16)
    bias = 0.02 * torch.randn(E, generator=g, device=dev)
    for T in map(int, a.rows.split(",")):
        h = torch.randn(T, D, generator=g, device=dev).to(torch.bfloat16)
        calls = {"v1": functools.partial(v1.moe_route, h, gw, bias, K, sc),
                 "v1 gemm": functools.partial(router_logits, h, gw),
                 "v2": functools.partial(v2.moe_route, h, gw, bias, K, sc),
                 "v2 no-topk": functools.partial(v2.moe_route, h, gw, bias, K, sc, topk=False),
                 "v3": functools.partial(v3.moe_route, h, gw, bias, K, sc)}
        for name, cfg in CFGS.items():
            calls[f"v2 {name}"] = functools.partial(v2.moe_route, h, gw, bias, K, sc, cfg=cfg)
            calls[f"v2 {name} no-topk"] = functools.partial(v2.moe_route, h, gw, bias, K, sc,
                                                             cfg=cfg, topk=False)
        want = v1.moe_route(h, gw, bias, K, sc)[0]
        for name, fn in calls.items():
            if "no-topk" not in name and name != "v1 gemm":
                same = bool(torch.equal(fn()[0], want))  # clear margins here: v1's ids
            else:
                same = None
            print(f"T {T:3d} {name:<22} {kernel_us(fn, dev, a.seconds):7.2f} us  ids==v1 {same}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
