"""How torch.profiler links a kernel to the code that launched it, on this torch build: one
cuBLAS GEMM and one Triton kernel, each inside a `record_function` range, and every event of
the run printed with the fields a per-op kernel table would join on.

    PYTHONPATH=. python3 scripts/probe_profiler_links.py [--device cuda]

Why (session 18 calls 12-13, traces/gpu/session18/README.md): `emulate --op-table` charged
cuBLAS kernels through their frontend (aten) event but lost every Triton kernel, and a second
form that joined device kernels to CPU runtime events by `linked_correlation_id` charged every
kernel to no op. Which event carries which id (and whether the runtime launch events are in
`prof.events()` at all) decides the join; this prints it instead of guessing.
Columns: device type, id, linked_correlation_id, CPU start / end µs, the CPU parent's name,
the kernels a frontend event lists, the name.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    dev = a.device
    from workbench.kernels.dense.rope_triton_v2 import rope
    from workbench.reference.rope import Rope

    r = Rope(64, 50000.0, 1.0, 4096, 32.0, 1.0, interleaved=True)
    r.reserve(64, dev)
    x = torch.randn(4, 8, 64, device=dev).to(torch.bfloat16)
    pos = torch.arange(4, device=dev)
    a_, b_ = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
    rope(x, pos, r.table(dev), True)  # compile outside the profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        with record_function("op::linear"):
            a_ @ b_
        with record_function("op::rope"):
            rope(x, pos, r.table(dev), True)
        if dev == "cuda":
            torch.cuda.synchronize()
    print("dev   id      linked  start_us     end_us       parent               kernels  name")
    for e in prof.events():
        parent = e.cpu_parent.name[:20] if e.cpu_parent is not None else "-"
        kern = ",".join(k.name[:16] for k in getattr(e, "kernels", ())) or "-"
        print(f"{str(e.device_type).split('.')[-1]:<5} {e.id:<7} "
              f"{getattr(e, 'linked_correlation_id', -1):<7} {e.time_range.start:<12.1f} "
              f"{e.time_range.end:<12.1f} {parent:<20} {kern[:30]:<8} {e.name[:60]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
