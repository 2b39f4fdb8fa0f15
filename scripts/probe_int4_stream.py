"""How fast can a Triton K loop stream int4_moe's touched weights with no arithmetic? One line per
(matrix, loader, BN, box, warps, stages, K splits), graph-replayed, at T 1's bytes.

    PYTHONPATH=. python3 scripts/probe_int4_stream.py [--quick] [--csv out.csv]

Why (session 17): at T 1 (8 experts, 132 MB of gate/up and 66 MB of down words + scales) the op
runs 84 µs against a 49 µs floor, and session 14's ablation without the dequant still streamed
at only 63 % of copy (73.6 µs). Before writing a producer-warp GEMM (Gluon) for the T 1 bar
(<= 60 µs), this measures the loop shape alone: each program walks its (expert, BN-row tile,
K split) in the checkpoint layout exactly as v7-v16 do (a [1, BN, BOXW] int32 word box and a
[1, BN, BOXW / 4] bf16 scale box a K tile, TMA descriptors or cp.async pointer loads) and only
xor-folds what it loaded, so the time is the stream's: grid, pipeline depth, box size, warps.

Legend: E experts in the tensors (4 disjoint sets of 8 rotate, so no launch reads what the
previous one left in the 50 MB L2), N weight rows, W = IN / 8 words a row, BN rows a program,
BOXW words a K tile, KS K splits; programs = N / BN x 8 x KS.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _stream_kernel(w_desc, s_desc, w_ptr, s_ptr, sets_ptr, out_ptr, W, N, KT_PER,
                   BN: tl.constexpr, BOXW: tl.constexpr, STAGES: tl.constexpr,
                   TMA: tl.constexpr):
    """Program (N tile, expert slot a, K split): xor-fold its [BN, KT_PER * BOXW] words and
    [BN, KT_PER * BOXW / 4] scales; out[pid] = the fold (the loads must be used)."""
    nt, a, ks = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e = tl.load(sets_ptr + a)
    n0 = nt * BN
    SW: tl.constexpr = BOXW // 4
    accw = tl.zeros([BN, BOXW], tl.int32)
    accs = tl.zeros([BN, SW], tl.int16)
    rows = n0 + tl.arange(0, BN)
    for kt in tl.range(ks * KT_PER, (ks + 1) * KT_PER, num_stages=STAGES):
        if TMA:
            w = tl.reshape(w_desc.load([e, n0, kt * BOXW]), (BN, BOXW))
            s = tl.reshape(s_desc.load([e, n0, kt * SW]), (BN, SW))
        else:
            cw = kt * BOXW + tl.arange(0, BOXW)
            cs = kt * SW + tl.arange(0, SW)
            w = tl.load(w_ptr + (e.to(tl.int64) * N + rows[:, None]) * W + cw[None, :])
            s = tl.load(s_ptr + (e.to(tl.int64) * N + rows[:, None]) * (W // 4) + cs[None, :])
        accw ^= w
        accs ^= s.to(tl.int16, bitcast=True)
    fold = tl.xor_sum(tl.xor_sum(accw, 1), 0) ^ tl.xor_sum(tl.xor_sum(accs, 1), 0).to(tl.int32)
    pid = (ks * tl.num_programs(1) + a) * tl.num_programs(0) + nt
    tl.store(out_ptr + pid, fold)


def stream(words: torch.Tensor, scales: torch.Tensor, experts: torch.Tensor, out: torch.Tensor,
           *, BN: int, BOXW: int, KS: int, warps: int, stages: int, tma: bool) -> torch.Tensor:
    """words [E, N, W] int32, scales [E, N, W / 4] bf16, experts [A] int32 -> out [KS A N/BN]."""
    E, N, W = words.shape
    if scales.shape != (E, N, W // 4):
        raise ValueError(f"scales: expected shape {(E, N, W // 4)}, got {tuple(scales.shape)}")
    if BOXW % 32:
        raise ValueError(f"BOXW: expected a multiple of 32 words (a scale box needs 16 bytes), "
                         f"got {BOXW}")
    if N % BN or W % (BOXW * KS):
        raise ValueError(f"BN={BN}, BOXW={BOXW}, KS={KS}: expected N={N} % BN == 0 and "
                         f"W={W} % (BOXW KS) == 0")
    wd = TensorDescriptor(words, list(words.shape), list(words.stride()), [1, BN, BOXW])
    sd = TensorDescriptor(scales, list(scales.shape), list(scales.stride()), [1, BN, BOXW // 4])
    grid = (N // BN, experts.numel(), KS)
    _stream_kernel[grid](wd, sd, words, scales, experts, out, W, N, W // BOXW // KS, BN=BN,
                         BOXW=BOXW, STAGES=stages, TMA=tma, num_warps=warps)
    return out


def _xor_last(t: torch.Tensor) -> torch.Tensor:
    """xor over the last dim (torch has no xor reduction): halve, zero-padded to even."""
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.cat([t, torch.zeros_like(t[..., :1])], -1)
        h = t.shape[-1] // 2
        t = t[..., :h] ^ t[..., h:]
    return t[..., 0]


def fold_reference(words: torch.Tensor, scales: torch.Tensor, experts: torch.Tensor, BN: int,
                   KS: int) -> torch.Tensor:
    """What `stream` stores, from torch: the xor of each program's words, xor the int32
    sign-extension of the xor of its scales' int16 bits; pid order (ks, a, nt)."""
    E, N, W = words.shape
    A, NT = experts.numel(), N // BN
    w = words[experts.long()].view(A, NT, BN, KS, W // KS).permute(3, 0, 1, 2, 4)
    s = scales[experts.long()].view(torch.int16).view(A, NT, BN, KS, W // 4 // KS)
    s = s.permute(3, 0, 1, 2, 4)
    fw = _xor_last(w.reshape(KS, A, NT, -1))
    fs = _xor_last(s.reshape(KS, A, NT, -1)).to(torch.int32)
    return (fw ^ fs).reshape(-1)


MATRICES = {"gate_up": (4096, 896), "down": (7168, 256)}  # (N, W) at Kimi shapes


def configs(quick: bool):
    if quick:
        return [(128, 32, 4, 3, 1, True), (128, 32, 8, 4, 2, True), (128, 32, 4, 3, 1, False)]
    tma = itertools.product((64, 128), (32, 64), (4, 8), (3, 5), (1, 2, 4), (True,))
    ptr = itertools.product((128,), (32,), (4, 8), (3, 5), (1, 2, 4), (False,))
    return list(tma) + list(ptr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="three configs (a smoke run)")
    p.add_argument("--csv", default=None)
    p.add_argument("--max-seconds", type=float, default=float("inf"),
                   help="stop starting new configs after this long (rows so far are kept)")
    a = p.parse_args(argv)
    from workbench.bench import ceilings, graph_us

    t_end = time.monotonic() + a.max_seconds
    dev = "cuda"
    copy = ceilings(dev)["copy_GBps"]
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    print(f"{'matrix':<8} {'ld':<4} {'BN':>4} {'BOXW':>4} {'warps':>5} {'stg':>3} {'KS':>3} "
          f"{'progs':>6} {'us':>8} {'GB/s':>7} {'%copy':>6}")
    for name, (N, W) in MATRICES.items():
        E = 32  # 4 disjoint sets of 8
        words = torch.randint(-2**31, 2**31 - 1, (E, N, W), dtype=torch.int32, device=dev,
                              generator=g)
        scales = torch.randn(E, N, W // 4, device=dev, generator=g).to(torch.bfloat16)
        sets = [torch.arange(8 * i, 8 * i + 8, dtype=torch.int32, device=dev) for i in range(4)]
        nbytes = 8 * N * W * 4 + 8 * N * (W // 4) * 2
        for BN, BOXW, warps, stages, KS, tma in configs(a.quick):
            if W % (BOXW * KS):
                continue
            if time.monotonic() > t_end:
                print(f"--max-seconds {a.max_seconds:g} reached: the remaining configs not run")
                break
            out = torch.empty(KS * 8 * (N // BN), dtype=torch.int32, device=dev)
            kw = dict(BN=BN, BOXW=BOXW, KS=KS, warps=warps, stages=stages, tma=tma)
            try:
                stream(words, scales, sets[1], out, **kw)
                ok = torch.equal(out, fold_reference(words, scales, sets[1], BN, KS))
                state = {"i": 0}

                def call(kw=kw, out=out, state=state, w=words, s=scales, sets=sets):
                    state["i"] += 1  # graph_us captures 16 calls: they rotate the 4 sets
                    stream(w, s, sets[state["i"] % 4], out, **kw)

                us = graph_us(call, reps=16, rounds=5)
                err = "" if ok else "fold differs"
            except Exception as exc:  # a box Triton cannot lower: report, go on
                us, err = float("nan"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            gbs = nbytes / us / 1e3
            row = dict(matrix=name, loader="tma" if tma else "ptr", BN=BN, BOXW=BOXW,
                       warps=warps, stages=stages, KS=KS, programs=KS * 8 * N // BN, us=us,
                       GBps=gbs, pct_copy=100 * gbs / copy, bytes=nbytes, error=err)
            rows.append(row)
            print(f"{name:<8} {row['loader']:<4} {BN:>4} {BOXW:>4} {warps:>5} {stages:>3} "
                  f"{KS:>3} {row['programs']:>6} {us:8.1f} {gbs:7.0f} {row['pct_copy']:6.1f}"
                  f" {err}", flush=True)
    if a.csv:  # each row with the run's GPU, versions and git state (traces_io)
        import pandas as pd

        from workbench.traces_io import run_metadata

        meta = run_metadata(dev)
        pd.DataFrame([r | meta for r in rows]).to_csv(a.csv, index=False)
    return 0 if all(not r["error"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
