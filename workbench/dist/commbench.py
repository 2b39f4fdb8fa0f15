"""Measured collectives: time of all_reduce, all_gather and all_to_all on the ranks at hand,
and the emulator's interconnect model (`emulate.Link`) fitted to them (issue #10: "the
emulation's communication model corrected from the measured collectives").

    python -m workbench.dist.commbench --device cuda --world 2 --csv traces/commbench.csv
    python -m workbench.dist.commbench                      # 2 gloo ranks on the CPU (smoke)
    python -m workbench.dist.emulate ... --measured-link traces/commbench.csv

Sizes are in the Link's own convention (`Link.seconds(kind, nbytes, world)`), so a row and the
model price the same thing: all_reduce `nbytes` = the tensor, all_gather = each rank's piece,
all_to_all = the bytes a rank sends to the others (an equal chunk to each). Each (kind, size)
is timed `iters` times after `warmup` calls (CUDA events around each call on NCCL, the wall
clock on gloo); a row keeps the median over calls of the slowest rank. The fit is one latency
and one bandwidth for all kinds, least squares on relative error (small messages weigh as much
as large ones): t = alpha + factor(kind, world) * nbytes / bw.
NVLink multicast stays off (launch.NVLS_OFF) unless --nvls.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

from .emulate import NVLINK4, PCIE5, Link

KINDS = ("all_reduce", "all_gather", "all_to_all")
SIZES = tuple(2**k for k in range(10, 27, 2))  # 1 KB .. 64 MB
WIRE = torch.bfloat16  # the loop's wire dtype (emulate.WIRE_BYTES)


def _factor(kind: str, world: int) -> float:
    """Link.seconds' bytes factor, without its latency and efficiency."""
    return Link("unit", bw_gbps=1.0, alpha_us=0.0, efficiency=1.0).seconds(kind, 1e9, world)


def _op(kind: str, nbytes: int, world: int, device):
    """A closure running one collective of `nbytes` (the Link's convention) on fresh buffers."""
    n = max(1, nbytes // 2)  # bf16 elements
    if kind == "all_reduce":
        t = torch.ones(n, dtype=WIRE, device=device)
        return lambda: dist.all_reduce(t)
    if kind == "all_gather":
        t = torch.ones(n, dtype=WIRE, device=device)
        out = torch.empty(world * n, dtype=WIRE, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, t)  # (all_gather_single: torch >= 2.13's name)
    if kind == "all_to_all":
        chunk = max(1, n // max(1, world - 1))
        send = torch.ones(world * chunk, dtype=WIRE, device=device)
        recv = torch.empty_like(send)
        return lambda: dist.all_to_all_single(recv, send)
    raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")


def _time(fn, iters: int, warmup: int, cuda: bool) -> float:
    """Median seconds per call of one rank."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
        dist.barrier()
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e-3 for s, e in ev]
    else:
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_rank(rank: int, world: int, kinds=KINDS, sizes=SIZES, iters: int = 20,
               warmup: int = 3) -> list[dict]:
    """One rank's part (run it on every rank, e.g. under launch.run_distributed); returns the
    rows on every rank: kind, nbytes (Link convention), world, seconds (slowest rank)."""
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rows = []
    for kind in kinds:
        for nbytes in sizes:
            s = _time(_op(kind, nbytes, world, device), iters, warmup, cuda)
            worst = torch.tensor([s], dtype=torch.float64, device=device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            rows.append({"kind": kind, "nbytes": int(nbytes), "world": world,
                         "seconds": float(worst.item()), "backend": dist.get_backend()})
    return rows


def fit_link(rows: list[dict], name: str = "measured") -> Link:
    """The Link (latency alpha, bandwidth bw, efficiency 1) minimising the relative error of
    t = alpha + factor(kind, world) * nbytes / bw over the rows."""
    if not rows:
        raise ValueError("rows: expected at least 2 measurements, got none")
    x = np.array([_factor(r["kind"], r["world"]) * r["nbytes"] for r in rows], dtype=float)
    y = np.array([r["seconds"] for r in rows], dtype=float)
    if len(rows) < 2 or np.ptp(x) == 0 or not np.all(y > 0):
        raise ValueError(f"rows: expected >= 2 positive times at different sizes, got "
                         f"{len(rows)} rows, sizes {sorted(set(x.tolist()))[:4]}")
    w = 1.0 / y  # relative error: every size counts
    (alpha, slope), *_ = np.linalg.lstsq(np.stack([w, w * x], 1), w * y, rcond=None)
    slope = max(float(slope), 1e-30)
    return Link(name, bw_gbps=1.0 / slope / 1e9, alpha_us=max(float(alpha), 0.0) * 1e6,
                efficiency=1.0)


def compare(rows: list[dict], links) -> list[dict]:
    """Each row with every link's predicted µs and predicted / measured."""
    out = []
    for r in rows:
        row = {**r, "measured_us": r["seconds"] * 1e6}
        for link in links:
            us = link.seconds(r["kind"], r["nbytes"], r["world"]) * 1e6
            row[f"{link.name}_us"] = us
            row[f"{link.name}_ratio"] = us / row["measured_us"]
        out.append(row)
    return out


def read_link(csv_path: str, name: str = "measured") -> Link:
    """fit_link over a commbench CSV (the rows this module writes)."""
    import pandas as pd

    return fit_link(pd.read_csv(csv_path)[["kind", "nbytes", "world", "seconds"]]
                    .to_dict(orient="records"), name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.dist.commbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU a rank)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nvls", action="store_true", help="NVLink multicast on (default off)")
    p.add_argument("--csv", help="write the rows (with the fitted and the model links) here")
    a = p.parse_args(argv)
    import pandas as pd

    from workbench.traces_io import run_metadata

    from .launch import run_distributed

    kinds = a.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"--kinds: expected a subset of {','.join(KINDS)}, got {k!r}")
    sizes = [int(s) for s in a.sizes.split(",")]
    backend = "nccl" if a.device == "cuda" else "gloo"
    rows = run_distributed(bench_rank, a.world, kinds, sizes, a.iters, backend=backend,
                           multicast=a.nvls, timeout_s=600)
    fit = fit_link(rows, f"fit_w{a.world}")
    table = pd.DataFrame(compare(rows, (NVLINK4, PCIE5, fit)))
    print(table[["kind", "nbytes", "measured_us", "NVLink4_us", f"{fit.name}_us"]]
          .to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    for k in kinds:  # how far one latency and one bandwidth are from each kind's own
        own = fit_link([r for r in rows if r["kind"] == k], k)
        print(f"{k}: alpha {own.alpha_us:.1f} us, {own.bw_gbps:.1f} GB/s")
    print(f"fitted (all kinds): {fit}; the model's NVLink4: "
          f"{NVLINK4.bw_gbps * NVLINK4.efficiency:.0f} GB/s effective, {NVLINK4.alpha_us} us")
    if a.csv:
        meta = run_metadata(a.device)
        table.assign(**{k: v for k, v in meta.items()}).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
