"""Does compute-sanitizer's racecheck follow a named-barrier handoff between the two partitions
of a Gluon warp-specialized kernel? (tree_mla gluon_v11, session 13: racecheck reports hazards
between a store before `bar.sync 14, 256` on one warpgroup and a load after it on the other,
SASS in that order.) The probe does only that: warpgroup 0 stores a [64] vector k times, the
warpgroup 1 reads it back after the rendezvous and writes it out; the output is checked.

    compute-sanitizer --tool racecheck python3 scripts/racecheck_named_barrier_probe.py \
        [--mma] [--reverse] [--sync] [--fork]

--mma stores and loads the vector in gluon_v11's row layout (a slice of the m64n64 wgmma
accumulator layout: each row held by the four lanes of a quad), where the session 13 call 7
per-hazard report put every hazard: written by lane 3 of a quad in warpgroup 0, read by lane 0
of the same quad position in warpgroup 1, the value -1e30 (rows no key reaches); the reverse
direction (warpgroup 1 publishing) was never reported. --reverse makes the worker partition
the writer; --sync puts a partition barrier (Gluon's `bar.sync 0, 128` in the default
partition) between the store and the handoff, as v11 has. Session 13 call 8: the plain and
--mma runs have a clean handoff. Session 14 call 1: --mma 228 errors, --mma --reverse 128, the
--sync variants none on the vector (gluon_v13 is v11 with that barrier). --fork: no shared
memory of ours at all, each partition writes its own rows (n, a kernel argument, is read from
the constant bank: the sm_90 SASS keeps only Triton's fork / join state word in shared memory,
stored by the default warps before `BAR.SYNC 0x1`, loaded by the worker after it).

Hazards reported here, on a kernel this small whose result is checked, are the tool's model
(of named barriers, or of Gluon's warp-specialization prologue), not the tree_mla kernel.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _bar(op: gl.constexpr):
    gl.inline_asm_elementwise(op, "=r,~{memory}", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _reader(buf, out_ptr, n, L: gl.constexpr, SYNC: gl.constexpr):
    r = gl.arange(0, 64, layout=L)
    for k in range(n):
        _bar("bar.sync 10, 256; mov.u32 $0, 0;")  # written
        x = buf.load(L)
        gl.store(out_ptr + k * 64 + r, x)
        _bar("bar.sync 11, 256; mov.u32 $0, 0;")  # read: may be rewritten


@gluon.jit
def _writer(buf, out_ptr, n, L: gl.constexpr, SYNC: gl.constexpr):
    r = gl.arange(0, 64, layout=L)
    for k in range(n):
        buf.store((r + k * 64).to(gl.float32))
        if SYNC:  # a partition barrier between the store and the handoff, as in gluon_v11
            gl.thread_barrier()
        _bar("bar.sync 10, 256; mov.u32 $0, 0;")
        _bar("bar.sync 11, 256; mov.u32 $0, 0;")


@gluon.jit
def _captured(out_ptr, n, k: gl.constexpr):
    r = gl.arange(0, 64, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + k * 64 + r, (r + k * n * 32).to(gl.float32))  # n = 2: k * 64


@gluon.jit
def _kernel(out_ptr, n, MMA: gl.constexpr, REVERSE: gl.constexpr, SYNC: gl.constexpr,
            FORK: gl.constexpr):
    if MMA:  # gluon_v11's ROW: rows of the m64n64 accumulator, 4 lanes a row
        L: gl.constexpr = gl.SliceLayout(1, gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
    else:
        L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    buf = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if FORK:  # Triton's fork and join only: rows 0-63 from one partition, 64-127 the other
        gl.warp_specialize([(_captured, (out_ptr, n, 0)), (_captured, (out_ptr, n, 1))],
                           [4], [240])
    elif REVERSE:  # the worker partition writes, the default one reads
        gl.warp_specialize([(_reader, (buf, out_ptr, n, L, SYNC)),
                            (_writer, (buf, out_ptr, n, L, SYNC))], [4], [240])
    else:  # the default partition writes (gluon_v11's reported direction)
        gl.warp_specialize([(_writer, (buf, out_ptr, n, L, SYNC)),
                            (_reader, (buf, out_ptr, n, L, SYNC))], [4], [240])


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mma", action="store_true", help="gluon_v11's row layout")
    ap.add_argument("--reverse", action="store_true", help="the worker writes, the default reads")
    ap.add_argument("--sync", action="store_true",
                    help="a partition barrier between the writer's store and the handoff")
    ap.add_argument("--fork", action="store_true",
                    help="no handoff: each partition writes out its own rows")
    a = ap.parse_args(argv)
    n = 2 if a.fork else 4
    out = torch.full((n * 64,), float("nan"), device="cuda")
    _kernel[(1,)](out, n, MMA=a.mma, REVERSE=a.reverse, SYNC=a.sync, FORK=a.fork, num_warps=4)
    torch.cuda.synchronize()
    ok = torch.equal(out, torch.arange(n * 64, device="cuda", dtype=torch.float32))
    print(f"named-barrier probe: output {'correct' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
