"""Does programmatic dependent launch shorten a decode layer's chain of small launches? A
CUDA-graph chain of "layers" of four launches, each reading its predecessor's output:

    rmsnorm [M, D] -> GEMV [M, D] x [F, D]^T -> rmsnorm [M, F] -> GEMV [M, F] x [D, F]^T

with a fresh pair of bf16 weights a layer (D 7168, F 2112: the EP8 rank's q_a | kv_a
projection both ways, 30 MB each, so every GEMV streams from HBM, as in the step), timed as
graph replays of `--layers` layers, µs a layer, in six modes:

  plain     ordinary launches (the step today)
  pdl       every launch a programmatic dependent: wait for the predecessor
            (griddepcontrol.wait), then let the successor launch (launch_dependents): its CTAs
            start while this one's retire (int4_moe `_common.pdl_start`)
  early     the same, the successor let in before the wait (`pdl_start`'s EARLY order)
  prefetch  pdl, and each GEMV program asks L2 for its weight rows (cp.async.bulk.prefetch.L2,
            8 requests a row, one a thread: triton_v15's `_prefetch_l2`) BEFORE it waits: the
            weights do not depend on the predecessor, so their stream can overlap the norm
            before it and the launch gap
  fused     two launches a layer: each GEMV program computes its input rows' RMSNorm itself
            (fewer launches, the other remedy; plain launches)
  fused_prefetch  fused, with prefetch's PDL and L2 prefetch

Why (session 60): #12's C 1 DDTree-16 step is ~500 launches, ~380 of them under 6 µs, and the
replay idles 0.2-0.5 ms between them (`emulate`'s idle_ms); the bar leaves the kernels 1.008x
their floor once the modelled comm is paid (`floors.bar_budget`), so the per-launch ramp and
gap, not the kernels' inner loops, are the cost. PDL is the generic remedy in serving stacks,
but session 15 measured it slower on int4_moe (triton_v14 / v15: its GEMMs fill the GPU, so
early CTAs had no room and nothing to load); a dense decode layer's launches are small, so the
question is open for them, and against fusing the launches away. The PDL modes run their base
mode's kernels in the same order (`base_of`: plain, or fused), so each must equal its base bit
for bit (a race under PDL would show); every mode is checked against torch (bf16 tolerance).

    PYTHONPATH=. python3 scripts/probe_pdl_chain.py [--rows 1,17] [--layers 8]
        [--modes plain,pdl,early,prefetch,fused,fused_prefetch] [--rounds 20] [--csv out.csv]

`--device cpu` runs every mode once under TRITON_INTERPRET=1 at small widths, each as plain
launches (griddepcontrol and the bulk prefetch are sm_90 PTX the interpreter does not know;
`pdl_launch` drops them there): a smoke test of the kernels' math, no timing.
Legend: M rows, D / F the two widths, L layers, BN weight rows a GEMV program.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from workbench.kernels.drafter._common import INTERPRET, next_pow2
from workbench.kernels.int4_moe._common import pdl_launch, pdl_start
from workbench.kernels.int4_moe.triton_v15 import _prefetch_l2

MODES = ("plain", "pdl", "early", "prefetch", "fused", "fused_prefetch")
FUSED = ("fused", "fused_prefetch")  # two launches a layer: each GEMV norms its own input
BN, BK = 16, 256  # 2112 / 16 = 132 programs: one an SM of an H100 / H200
PF_PARTS = 8  # bulk L2 requests a weight row (the prefetch mode)


@triton.jit
def _norm_kernel(x_ptr, w_ptr, y_ptr, D, eps, BD: tl.constexpr, PDL: tl.constexpr = False,
                 EARLY: tl.constexpr = False):
    pdl_start(PDL, EARLY)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    ok = d < D
    x = tl.load(x_ptr + r * D + d, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + r * D + d, (x * inv * w).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gemv_kernel(y_ptr, w_ptr, z_ptr, nw_ptr, M, N, K, eps, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False,
                 EARLY: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                 INTERP: tl.constexpr = False, PF_PARTS: tl.constexpr = 8,
                 NORM: tl.constexpr = False):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < N
    if PREFETCH:  # the program's weight rows toward L2 before the wait (they are not written):
        # PF_PARTS requests a row, one a thread at BN 16 x 8 parts (a [BN] tensor would be
        # replicated across the 128 threads, each asking for the same row)
        part = tl.arange(0, PF_PARTS)
        row = tl.where(n_ok, n, 0).to(tl.int64)[:, None] * K + (part * (K // PF_PARTS))[None, :]
        _prefetch_l2(w_ptr + row, tl.full([BN, PF_PARTS], 0, tl.int32) + (K // PF_PARTS) * 2)
    pdl_start(PDL, EARLY)
    m = tl.arange(0, BM)
    m_ok = m < M
    if NORM:  # the fused modes: the RMSNorm of the input rows in this program (each reads
        # its rows whole: M x K x 2 B from L2 a program), the norm's weight on the operand
        ss = tl.zeros([BM], tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            v = tl.load(y_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k[None, :] < K),
                        other=0.0).to(tl.float32)
            ss += tl.sum(v * v, 1)
        inv = tl.rsqrt(ss / K + eps)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.load(y_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k[None, :] < K),
                    other=0.0)
        if NORM:  # the norm kernel's rounding: fp32 x * inv * w, one bf16 rounding
            nw = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * inv[:, None] * nw[None, :]).to(y_ptr.dtype.element_ty)
        b = tl.load(w_ptr + n[None, :].to(tl.int64) * K + k[:, None],
                    mask=n_ok[None, :] & (k[:, None] < K), other=0.0)
        if INTERP:  # the interpreter's bf16 dot is wrong (DESIGN.md §10): fp32 there
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(z_ptr + m[:, None] * N + n[None, :], acc.to(z_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def base_of(mode: str) -> str:
    """The mode whose bits `mode` must reproduce: the same kernels in the same order (PDL only
    moves when they start): plain for the four-launch modes, fused for the two-launch ones (its
    in-program norm sums squares in another order than the norm kernel: not plain's bits)."""
    return "fused" if mode in FUSED else "plain"


def _options(mode: str) -> dict:
    """A launch's PDL constexprs and option for `mode` ({} for plain and fused, and on the
    interpreter)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    return {} if mode in ("plain", "fused") else pdl_launch(True, early=mode == "early")


def make_chain(M: int, D: int, F: int, layers: int, mode: str, device, seed: int = 0):
    """(run, x, out, weights): run() launches `layers` layers of (norm D, GEMV D -> F, norm F,
    GEMV F -> D) on x [M, D] bf16 into out [M, D] (mode's launches), with fresh weights a layer
    (bf16, scaled so the activations stay O(1)); weights: [(norm_d, W_a [F, D], norm_f,
    W_b [D, F])] for the torch check."""
    if M < 1 or M > 64:
        raise ValueError(f"rows: expected 1..64 (one row block a GEMV program), got {M}")
    for name, width in (("D", D), ("F", F)):  # bulk requests: 16-byte multiples a part
        if width % (8 * PF_PARTS):
            raise ValueError(f"{name}: expected a multiple of {8 * PF_PARTS} (the prefetch's "
                             f"{PF_PARTS} parts of 16-byte multiples a row), got {width}")
    g = torch.Generator(device=device).manual_seed(seed)
    bf = torch.bfloat16

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(bf)

    x = randn(M, D)
    weights = [(1 + randn(D, scale=0.1), randn(F, D, scale=D ** -0.5),
                1 + randn(F, scale=0.1), randn(D, F, scale=F ** -0.5)) for _ in range(layers)]
    yd, yf = torch.empty(M, D, dtype=bf, device=device), torch.empty(M, F, dtype=bf, device=device)
    zf, out = torch.empty(M, F, dtype=bf, device=device), torch.empty(M, D, dtype=bf, device=device)
    opt = _options(mode)
    prefetch = mode in ("prefetch", "fused_prefetch") and not INTERPRET
    gemv_opt = opt | ({"PREFETCH": True} if prefetch else {}) | (
        {"INTERP": True} if INTERPRET else {})
    BM = max(16, next_pow2(M))
    kw = dict(BM=BM, BN=BN, BK=BK, num_warps=4, num_stages=3, PF_PARTS=PF_PARTS, **gemv_opt)

    def gemv(y, w, z, nw, N, K, norm):
        _gemv_kernel[(triton.cdiv(N, BN),)](y, w, z, nw, M, N, K, 1e-6, NORM=norm, **kw)

    def run():
        src = x
        for nd, wa, nf, wb in weights:
            if mode in FUSED:
                gemv(src, wa, zf, nd, F, D, True)
                gemv(zf, wb, out, nf, D, F, True)
            else:
                _norm_kernel[(M,)](src, nd, yd, D, 1e-6, BD=next_pow2(D), num_warps=8, **opt)
                gemv(yd, wa, zf, nd, F, D, False)
                _norm_kernel[(M,)](zf, nf, yf, F, 1e-6, BD=next_pow2(F), num_warps=4, **opt)
                gemv(yf, wb, out, nf, D, F, False)
            src = out
        return out

    return run, x, out, weights


def torch_chain(x, weights) -> torch.Tensor:
    """The chain in torch: fp32 norms and GEMVs, bf16 between launches, as the kernels round."""
    def norm(v, w):
        v = v.float()
        return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()

    for nd, wa, nf, wb in weights:
        x = (norm(norm(x, nd).float() @ wa.float().T, nf).float() @ wb.float().T).bfloat16()
    return x


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,17")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rounds", type=int, default=20, help="graph replays timed a mode")
    p.add_argument("--device", default="cuda")
    p.add_argument("--widths", default="7168,2112", help="D,F")
    p.add_argument("--csv")
    a = p.parse_args(argv)
    D, F = map(int, a.widths.split(","))
    modes = a.modes.split(",")
    for m in modes:
        _options(m)  # a clear error before anything runs
    cuda = a.device.startswith("cuda")
    if cuda:
        from workbench.bench import capture_replays, replay_us
    rows = []
    print(f"{'rows':>4} {'mode':>14} {'us/layer':>9} {'GB/s':>7}  {'bits vs':>14}  "
          "max |diff| vs torch")
    for M in map(int, a.rows.split(",")):
        outs = {}
        for mode in modes:
            run, x, out, weights = make_chain(M, D, F, a.layers, mode, a.device)
            run()
            outs[mode] = out.clone()
            err = (out.float() - torch_chain(x, weights).float()).abs().max().item()
            us = float("nan")
            if cuda:
                replay = capture_replays([run])[0]
                us = statistics.median(replay_us(replay, a.rounds)) / a.layers
            nbytes = 2 * 2 * D * F  # a layer's two weights, bf16
            rows.append(dict(rows=M, mode=mode, layers=a.layers, D=D, F=F, us_per_layer=us,
                             gbps=nbytes / us / 1e3 if cuda else float("nan"),
                             base=base_of(mode), max_abs_diff_torch=err))
            del run, x, out, weights
        for r in rows[-len(modes):]:  # the same launches in another order: the same bits
            b = outs.get(r["base"])
            r["bitwise_base"] = None if b is None else torch.equal(outs[r["mode"]], b)
            print(f"{M:>4} {r['mode']:>14} {r['us_per_layer']:>9.2f} {r['gbps']:>7.0f}  "
                  f"{r['base'] + ' ' + str(r['bitwise_base']):>14}  {r['max_abs_diff_torch']:.3g}")
    if a.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.csv, index=False)
    return 0 if all(r["bitwise_base"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
