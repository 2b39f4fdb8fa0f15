"""Swap-AB split-K decode linear (op linear, variant triton_v4, ENGINE-style): linear_triton_v2's
one-launch split-K with the weight's output columns on the MMA's M and the rows on its N.

Why: v2 multiplies x [BM, BK] by w^T, rows on the MMA's M. Triton lowers a 16- or 32-row M to
mma.sync (wgmma needs 64 rows a warpgroup), with the weight tile read from shared memory by
ldmatrix into registers; only BM 64 gets wgmma. cuBLAS's decode kernels swap the operands
(nvjet ..._64x24_...: 64 output columns x 24 rows at 17 rows). Here acc [BN, BM] = w [BN, BK] @
x^T [BK, BM]: BN = 64 / 128 output columns are the wgmma's M (straight from shared memory, no
register copy of the weights) and BM = 16 / 32 / 64 rows its N (m64n16 / n32 / n64), at any
row count up to MAX_ROWS. The sm_90 build (tests/test_linear_op.py, `sm90_report`) is wgmma
with cp.async pipelining at 48-108 registers, where v2 at BM 16 / 32 is mma.sync at 96-124.
Measured (H200, session 20 call 2, `scripts/sweep_linear.py --kernel triton_v4 --cold-mb 400`,
µs at 1 / 9 / 17 rows, weights streamed from HBM): faster on the wide projections (q_a | kv_a
10.9 / 10.9 / 11.5 against v3's 11.1 / 11.3 and cuBLAS's 13.1 at 17; o 6.0 / 6.0 / 6.2; down
3.2 / 3.3 / 3.4), slower on the narrow ones, whose 24 or 8 column tiles must split K (q_b 6.1
against cuBLAS's 5.3 at 17, gate | up 6.6 against v3's 6.2 at 1): linear_triton_v5 takes each
shape's winner.

Everything else is v2's: K slices a program, fp32 partials in the [SPLIT, BM, NP] workspace,
the last slice of a column tile (ticket counter) sums them in slice order 0..SPLIT-1 and resets
its counter; one rounding to x.dtype. Rows > MAX_ROWS and non-bf16/fp16 inputs take
torch_bf16's cuBLAS GEMM. Not bitwise v2 (the MMA's K order inside a step differs), not the
float64 reference, batch-variant past one row tile: engine-only.
Legend: M rows, K in features, N out features, SPLIT K slices, KS = K per slice.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import next_pow2
from .linear_triton_v1 import MAX_ROWS, SMS, fit_smem, run
from .linear_triton_v2 import Tiles, launch, slice_tile, store_or_sum


@triton.jit
def _splitk_t_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, KS, s_xm, s_xk, s_wn, s_wk,
                     s_ym, NP, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, INTERPRET: tl.constexpr):
    acc, m, n, m_ok, n_ok = slice_tile(x_ptr, w_ptr, M, N, K, KS, s_xm, s_xk, s_wn, s_wk, BM,
                                       BN, BK, INTERPRET, TRANS=True)  # acc [BN, BM]
    y = y_ptr + m.to(tl.int64)[None, :] * s_ym + n[:, None]
    # tile: [BN, BM] inside one slice's [BM, NP] partial (v2's workspace layout)
    store_or_sum(acc, y, m_ok[None, :] & n_ok[:, None], m[None, :] * NP + n[:, None], ws_ptr,
                 cnt_ptr, BM, NP, SPLIT)


def tiles(M: int, N: int, K: int) -> Tiles:
    """BM covers M (16 / 32 / 64: the wgmma's N); BN 64 (one warpgroup's wgmma M); SPLIT the
    most of 1 / 2 / 4 / 8 / 16 K slices keeping N / BN x SPLIT <= SMS programs (one wave) and
    >= 2 BK steps of 128 a slice; BK 128, 4 stages where shared memory holds them."""
    BM = max(16, next_pow2(min(M, MAX_ROWS)))
    BN = 64
    n_tiles, split = triton.cdiv(N, BN), 1
    while split < 16 and n_tiles * split * 2 <= SMS and triton.cdiv(K, split * 2) >= 2 * 128:
        split *= 2
    BK, stages = fit_smem(BM, BN, 128, 4)
    return Tiles(BM, BN, BK, split, 4, stages)


def linear(x: Tensor, weight: Tensor, tiles_for=tiles) -> Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x.dtype (the "linear" op's contract; checks
    and cuBLAS dispatch as linear_triton_v1). `tiles_for(M, N, K) -> Tiles` (a sweep passes
    its own)."""
    return run(x, weight, functools.partial(launch, tiles_for=tiles_for,
                                            kernel=_splitk_t_kernel))


def sm90_report(M: int, N: int, K: int) -> dict:
    """The kernel compiled for sm_90a on tiles(M, N, K) as a launch specializes it (unit K
    strides, 16-divisible pointers, widths and row strides; CPU box, no GPU; run without
    TRITON_INTERPRET): ptxas registers / spills, shared memory, and its wgmma / mma.sync /
    cp.async instruction counts."""
    import inspect
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .._sm90 import ptxas_stats

    t = tiles(M, N, K)
    params = list(inspect.signature(_splitk_t_kernel.fn).parameters)
    names = "x_ptr w_ptr y_ptr ws_ptr cnt_ptr M N K KS s_xm s_wn s_ym NP".split()
    types = ["*bf16", "*bf16", "*bf16", "*fp32", "*i32", *["i32"] * 8]
    consts = dict(s_xk=1, s_wk=1, SPLIT=t.SPLIT, BM=t.BM, BN=t.BN, BK=t.BK, INTERPRET=False)
    div16 = [n for n in names if n.endswith("_ptr") or n in ("N", "K", "KS", "s_xm", "s_wn",
                                                               "s_ym", "NP")]
    src = ASTSource(fn=_splitk_t_kernel,
                    signature=dict(zip(names, types)) | {k: "constexpr" for k in consts},
                    constexprs=consts,
                    attrs={(params.index(n),): [["tt.divisibility", 16]] for n in div16})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=t.warps, num_stages=t.stages))
    ptx = k.asm["ptx"]
    regs, spill = ptxas_stats(ptx)
    return dict(regs=regs, spill=spill, smem=k.metadata.shared,
                wgmma=len(re.findall(r"\bwgmma\.mma_async", ptx)),
                mma_sync=len(re.findall(r"\bmma\.sync", ptx)),
                cp_async=len(re.findall(r"\bcp\.async\.c[ag]", ptx)))
