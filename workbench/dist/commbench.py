"""Measured collectives: time of all_reduce, all_gather and all_to_all on the ranks at hand,
and the emulator's interconnect model (`emulate.Link`) fitted to them (issue #10: "the
emulation's communication model corrected from the measured collectives").

    python -m workbench.dist.commbench --device cuda --world 2 --csv traces/commbench.csv
    python -m workbench.dist.commbench                      # 2 gloo ranks on the CPU (smoke)
    python -m workbench.dist.emulate ... --measured-link traces/commbench.csv

Sizes are in the Link's own convention (`Link.seconds(kind, nbytes, world)`), so a row and the
model price the same thing: all_reduce `nbytes` = the tensor, all_gather = each rank's piece,
all_to_all = the bytes a rank sends to the others (an equal chunk to each). Each (kind, size)
is timed after `warmup` calls two ways (`_time`), each the slowest rank's: `seconds`, the median
of `iters` calls timed alone (an eager loop's cost: host launch and rank skew included), and
`stream_seconds`, the mean of `iters` calls issued back to back (a CUDA-graphed step's cost).
The fit is one latency and one bandwidth for all kinds, least squares on relative error (small
messages weigh as much as large ones): t = alpha + factor(kind, world) * nbytes / bw, on
stream_seconds (the CLI; read_link falls back to `seconds` for CSVs without it).
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


def _time(fn, iters: int, warmup: int, cuda: bool) -> tuple[float, float]:
    """(median seconds of one call timed alone, mean seconds a call of `iters` issued back to
    back) on this rank. Alone = events around each call on NCCL: it includes the host's launch
    and the wait for the other ranks' launches (what an eager loop pays); back to back = one
    event pair around all calls: the collectives queue on the stream (what a CUDA-graphed step
    pays, close to NCCL's own latency). On gloo both come from the wall clock."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters + 1)]
        dist.barrier()
        for s, e in ev[:iters]:
            s.record()
            fn()
            e.record()
        dist.barrier()
        torch.cuda.synchronize()
        s, e = ev[iters]
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        alone = [s.elapsed_time(e) * 1e-3 for s, e in ev[:iters]]
        return float(np.median(alone)), ev[iters][0].elapsed_time(ev[iters][1]) * 1e-3 / iters
    dist.barrier()
    alone = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        alone.append(time.perf_counter() - t0)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(np.median(alone)), (time.perf_counter() - t0) / iters


def bench_rank(rank: int, world: int, kinds=KINDS, sizes=SIZES, iters: int = 20,
               warmup: int = 3) -> list[dict]:
    """One rank's part (run it on every rank, e.g. under launch.run_distributed); returns the
    rows on every rank: kind, nbytes (Link convention), world, seconds (a call alone) and
    stream_seconds (a call of a back-to-back stream), each the slowest rank's."""
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rows = []
    for kind in kinds:
        for nbytes in sizes:
            worst = torch.tensor(_time(_op(kind, nbytes, world, device), iters, warmup, cuda),
                                 dtype=torch.float64, device=device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            alone, stream = worst.tolist()
            rows.append({"kind": kind, "nbytes": int(nbytes), "world": world,
                         "seconds": alone, "stream_seconds": stream,
                         "backend": dist.get_backend()})
    return rows


def fit_link(rows: list[dict], name: str = "measured", column: str = "seconds") -> Link:
    """The Link (latency alpha, bandwidth bw, efficiency 1) minimising the relative error of
    t = alpha + factor(kind, world) * nbytes / bw over the rows (t = row[column])."""
    if not rows:
        raise ValueError("rows: expected at least 2 measurements, got none")
    x = np.array([_factor(r["kind"], r["world"]) * r["nbytes"] for r in rows], dtype=float)
    y = np.array([r[column] for r in rows], dtype=float)
    if len(rows) < 2 or np.ptp(x) == 0 or not np.all(y > 0):
        raise ValueError(f"rows: expected >= 2 positive times at different sizes, got "
                         f"{len(rows)} rows, sizes {sorted(set(x.tolist()))[:4]}")
    w = 1.0 / y  # relative error: every size counts
    (alpha, slope), *_ = np.linalg.lstsq(np.stack([w, w * x], 1), w * y, rcond=None)
    slope = max(float(slope), 1e-30)
    return Link(name, bw_gbps=1.0 / slope / 1e9, alpha_us=max(float(alpha), 0.0) * 1e6,
                efficiency=1.0)


def compare(rows: list[dict], links, column: str = "seconds") -> list[dict]:
    """Each row with every link's predicted µs and predicted / measured (row[column])."""
    out = []
    for r in rows:
        row = {**r, "measured_us": r[column] * 1e6}
        for link in links:
            us = link.seconds(r["kind"], r["nbytes"], r["world"]) * 1e6
            row[f"{link.name}_us"] = us
            row[f"{link.name}_ratio"] = us / row["measured_us"]
        out.append(row)
    return out


def read_link(csv_path: str, name: str = "measured") -> Link:
    """fit_link over a commbench CSV (the rows this module writes): on the back-to-back times
    where the CSV has them (a graphed step's collectives), else on the lone calls'."""
    import pandas as pd

    df = pd.read_csv(csv_path)
    column = "stream_seconds" if "stream_seconds" in df else "seconds"
    return fit_link(df[["kind", "nbytes", "world", column]].to_dict(orient="records"), name,
                    column)


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
    fit = fit_link(rows, f"fit_w{a.world}", "stream_seconds")
    table = pd.DataFrame(compare(rows, (NVLINK4, PCIE5, fit), "stream_seconds"))
    table["alone_us"] = table["seconds"] * 1e6
    print(table[["kind", "nbytes", "alone_us", "measured_us", "NVLink4_us", f"{fit.name}_us"]]
          .rename(columns={"measured_us": "stream_us"})
          .to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    for k in kinds:  # how far one latency and one bandwidth are from each kind's own
        mine = [r for r in rows if r["kind"] == k]
        own, lone = fit_link(mine, k, "stream_seconds"), fit_link(mine, k)
        print(f"{k}: back to back alpha {own.alpha_us:.1f} us, {own.bw_gbps:.1f} GB/s; "
              f"alone alpha {lone.alpha_us:.1f} us, {lone.bw_gbps:.1f} GB/s")
    print(f"fitted (all kinds): {fit}; the model's NVLink4: "
          f"{NVLINK4.bw_gbps * NVLINK4.efficiency:.0f} GB/s effective, {NVLINK4.alpha_us} us")
    if a.csv:
        meta = run_metadata(a.device)
        table.assign(**{k: v for k, v in meta.items()}).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
