"""Does a dense weight prefetched into L2 survive the routed experts' stream? A probe for an
L2 prefetch of the next layer's projections while a MoE layer's experts stream from HBM.

    PYTHONPATH=. python3 scripts/probe_l2_prefetch.py [--rows 1,17] [--stream-mb 0,100,400]
        [--stream sum|copy]
        [--modes none,normal,evict_last] [--persist-mb 0] [--csv out.csv]

Why (session 21 call 1, traces/gpu/session21/README.md): the EP8 rank's dense projections
take 10.9 / 6.0 µs (q_a | kv_a, o at 1 row) streaming their weights from HBM and 7.6 / 4.0
with the weights already in L2; the routed experts before them run ~25-120 µs a layer below
copy speed, so HBM has room to bring the next layer's weights in meanwhile, if the lines
survive the experts' hundreds of MB. The weights are the q_a | kv_a projection [2112, 7168].

Each configuration is one CUDA graph, replayed: (the prefetch of the weight, `mode`), a
read-only stream of `stream_mb` MB (a sum over a bf16 buffer, as the experts' weight reads),
then the projection (linear_triton_v5 at `rows` rows). The profiler gives each kernel's mean
µs over the replays: the projection's µs against `none` at 0 MB (warm: the previous replay's
projection left the weight in L2) and `none` at the largest stream (cold) says how much of
the warm gain the prefetch keeps. Modes: none; normal (cp.async.bulk.prefetch.L2, no hint);
evict_last (the same with an L2::evict_last cache policy). --persist-mb sets the device's
persisting-L2 limit first (cudaDeviceSetLimit, cudaLimitPersistingL2CacheSize), which may
bound what evict_last keeps (session 21 call 2: the H200 VM refused it, cudaErrorInvalidValue).
--stream: the read stream as a sum (session 21 call 3: the projection then ran at 5.7 µs, faster
than warm, with or without the prefetch: the sum's reads did not evict the weight, so that
stream cannot answer) or as a copy of the buffer's halves (ordinary loads and stores). CUDA only.
Measured (session 21 call 4, `--stream copy`): after 100 or 400 MB of copy traffic the
projection took 12.5-13.7 µs whether its weight was prefetched plainly, with evict_last, or not
at all (7.3-8.5 back to back): the prefetched lines do not survive. A measured negative: no L2
prefetch of the next layer's weights was built into the model.
"""

from __future__ import annotations

import argparse
import csv
import ctypes

import torch
import triton
import triton.language as tl

from workbench.kernels.int4_moe.triton_v15 import _prefetch_l2  # the plain bulk prefetch

CH = 4096  # bytes a prefetch instruction asks for
BLOCK = 128  # prefetches a program


@triton.jit
def _prefetch_kernel(ptr, nbytes, CH: tl.constexpr, BLOCK: tl.constexpr,
                     EVICT_LAST: tl.constexpr):
    """Ask L2 for bytes [pid BLOCK CH, ...) of ptr (16-byte aligned, nbytes a multiple of 16):
    one bulk prefetch an element, nothing written (sm_90 PTX)."""
    off = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CH
    n = tl.minimum(nbytes - off, CH).to(tl.int32)
    p = ptr.to(tl.pointer_type(tl.int8)) + tl.where(n > 0, off, 0)
    n = tl.where(n > 0, n, 16)  # past the end: re-ask for the first 16 bytes (harmless)
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "{\n\t.reg .b64 pol;\n\t"
            "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
            "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol;\n\t"
            "mov.u32 $0, 0;\n\t}", "=r,l,r", [p, n], dtype=tl.int32, is_pure=False, pack=1)
    else:
        _prefetch_l2(p, n)


def prefetch(t: torch.Tensor, evict_last: bool) -> None:
    nbytes = t.numel() * t.element_size()
    if nbytes % 16 or t.data_ptr() % 16:
        raise ValueError(f"prefetch: expected a 16-byte aligned tensor of 16-byte multiple "
                         f"size, got {nbytes} bytes at {t.data_ptr():#x}")
    grid = (triton.cdiv(nbytes, CH * BLOCK),)
    _prefetch_kernel[grid](t, nbytes, CH=CH, BLOCK=BLOCK, EVICT_LAST=evict_last)


def set_persisting_l2(nbytes: int) -> None:
    """cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize = 0x06, nbytes) through the CUDA
    runtime this process already loaded."""
    path = next((ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart" in ln), None)
    if path is None:
        raise RuntimeError("--persist-mb: no libcudart in this process")
    rc = ctypes.CDLL(path).cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise RuntimeError(f"cudaDeviceSetLimit(persisting L2, {nbytes}) returned {rc}")


def _step(x, w, src, sink, mode: str, linear, stream: str = "sum"):
    """One configuration's work: the prefetch (mode), the stream over src (its sum into sink,
    or a copy of its first half onto its second), the projection."""
    def step():
        if mode != "none":
            prefetch(w, mode == "evict_last")
        if src.numel() and stream == "sum":
            torch.sum(src, 0, dtype=torch.float32, out=sink)  # out= needs the dim
        elif src.numel():
            h = src.numel() // 2
            src[h : 2 * h].copy_(src[:h])
        return linear(x, w)
    return step


def _mean_us(per: dict, pred) -> float:
    """Mean µs a call of the profiled kernels whose names satisfy pred (`kernel_times`' dict)."""
    hits = [(n, us) for k, (n, us) in per.items() if pred(k)]
    n = sum(h[0] for h in hits)
    return sum(h[1] for h in hits) / n if n else float("nan")


def main(argv=None) -> int:
    from workbench.bench import capture_replays
    from workbench.kernels.dense import linear_triton_v5
    from workbench.loopbench import kernel_times

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,17")
    p.add_argument("--stream-mb", default="0,100,400")
    p.add_argument("--stream", default="sum", choices=("sum", "copy"))
    p.add_argument("--modes", default="none,normal,evict_last")
    p.add_argument("--persist-mb", type=float, default=0.0)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    bad = set(modes) - {"none", "normal", "evict_last"}
    if bad:
        raise ValueError(f"--modes: expected none / normal / evict_last, got {sorted(bad)}")
    if not torch.cuda.is_available():
        raise SystemExit("probe_l2_prefetch: CUDA only")
    torch.cuda.init()
    if a.persist_mb > 0:
        set_persisting_l2(int(a.persist_mb * 2**20))
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(2112, 7168, generator=g, device=dev).to(torch.bfloat16) * 0.01
    mbs = [float(s) for s in a.stream_mb.split(",")]
    big = torch.randn(int(max(mbs) * 2**20) // 2, generator=g, device=dev).to(torch.bfloat16)
    out_rows = []
    print("rows  stream_MB  mode          linear_us  prefetch_us  stream_us", flush=True)
    for rows in map(int, a.rows.split(",")):
        x = torch.randn(rows, 7168, generator=g, device=dev).to(torch.bfloat16)
        ref = x.float() @ w.float().t()
        for mb, mode in ((m, md) for m in mbs for md in modes):
            src = big[: int(mb * 2**20) // 2]
            step = _step(x, w, src, torch.zeros((), device=dev), mode, linear_triton_v5.linear,
                         a.stream)
            y = step()  # compile, and check the projection is the projection
            err = (y.float() - ref).abs().max().item()
            if not err <= 0.05 * ref.abs().max().item():
                raise AssertionError(f"linear at {rows} rows: max error {err}")
            replay = capture_replays([step])[0]
            for _ in range(3):
                replay()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(a.replays):
                    replay()
                torch.cuda.synchronize()
            per = kernel_times(prof, True)
            # the projection and the prefetch are this repo's Triton kernels ("_..."), the
            # stream torch's
            lin = _mean_us(per, lambda k: k.startswith("_") and "prefetch" not in k)
            pre = _mean_us(per, lambda k: "prefetch" in k)
            red = _mean_us(per, lambda k: not k.startswith("_"))
            print(f"{rows:<5} {mb:9.0f}  {mode:<12} {lin:10.2f} {pre:12.2f} {red:10.2f}",
                  flush=True)
            out_rows.append(dict(rows=rows, stream=a.stream, stream_mb=mb, mode=mode,
                                 persist_mb=a.persist_mb,
                                 linear_us=lin, prefetch_us=pre, stream_us=red))
            del replay
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(out_rows[0]))
            wr.writeheader()
            wr.writerows(out_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
