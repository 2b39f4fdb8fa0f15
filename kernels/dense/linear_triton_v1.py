"""Engine-style skinny linear (op linear) for decode row counts: one Triton kernel, no split-K.

At decode and tree-verify sizes (M = B x N rows, 1..64) a projection is a weight stream: the
EP8 rank's q_a | kv_a is [2112, 7168] bf16 (30 MB, 7.1 µs at 4.26 TB/s) against 17 rows.
cuBLAS picks split-K kernels there (nvjet ..._splitK + a splitKreduce launch): in the emulated
rank at C 1 the target's GEMMs took ~54 µs a layer against a ~15 µs floor (session 8, call 1).
Here each program owns BN output columns of every row and walks all of K (the weight read once,
in BK-wide tiles the compiler pipelines), BN chosen so that N / BN fills the GPU: no partials,
no second launch, and a row's result does not depend on how many rows share the call (the K
order is fixed).

Rows > MAX_ROWS (64) re-read the weight per row tile and are compute-shaped: those calls run
torch_bf16's cuBLAS GEMM (documented dispatch, as engines switch kernels by M), as do inputs
that are not bf16/fp16 (the ACC proof path). Numerics: fp32 accumulate, rounded once to
x.dtype; not bitwise cuBLAS (different K order): engine-only.
Legend: M rows, K in features, N out features.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from . import torch_bf16

MAX_ROWS = 64
SMS = 132  # H200 SMs: BN is picked so that N / BN gives about one program per SM or more
# sm_90's shared memory a block (227 KB). Triton keeps `stages` copies of the x [BM, BK] and
# w [BN, BK] tiles there and refuses to launch past it (OutOfResources at rows 33-64, session 10)
SMEM_BYTES = 232448


def fit_smem(BM: int, BN: int, BK: int, stages: int, elem: int = 2) -> tuple[int, int]:
    """(BK, stages) within SMEM_BYTES: fewer stages first (down to 2), then narrower K steps."""
    while stages > 2 and (BM + BN) * BK * elem * stages > SMEM_BYTES:
        stages -= 1
    while BK > 16 and (BM + BN) * BK * elem * stages > SMEM_BYTES:
        BK //= 2
    return BK, stages


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, s_xm, s_xk, s_wn, s_wk, s_ym,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   INTERPRET: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    k = tl.arange(0, BK)
    n_ok, m_ok = n < N, m < M
    x_rows = x_ptr + m.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * s_wn
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + k
        k_ok = kk < K
        x = tl.load(x_rows + kk[None, :] * s_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + kk[None, :] * s_wk, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if INTERPRET:  # the interpreter's bf16 dot is wrong (DESIGN.md §10): exact in fp32
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
        else:
            acc += tl.dot(x, tl.trans(w))
    y = y_ptr + m.to(tl.int64)[:, None] * s_ym + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def widest_bn(N: int, groups: int = 1, max_bn: int = 128, programs: int = SMS) -> int:
    """The widest BN of 16, 32, .. max_bn whose groups x ceil(N / BN) column tiles still number
    >= `programs` (16 when none does). linear v1 / v2 and mla_proj v1 size their tiles by it."""
    BN = 16
    while BN < max_bn and groups * triton.cdiv(N, 2 * BN) >= programs:
        BN *= 2
    return BN


def tiles(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BM, BN, BK): the row tile covers M (16 / 32 / 64), BN the widest of 16..128 that still
    gives >= SMS programs (16 when none does), BK 256 (less for short K)."""
    BM = max(16, next_pow2(min(M, MAX_ROWS)))
    return BM, widest_bn(N), max(16, min(256, next_pow2(K)))


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x.dtype (the "linear" op's contract)."""
    return run(x, weight, _launch)


def _launch(x2: Tensor, weight: Tensor, y: Tensor, M: int, N: int, K: int) -> None:
    BM, BN, BK = tiles(M, N, K)
    BK, stages = fit_smem(BM, BN, BK, 4)
    _skinny_kernel[(triton.cdiv(N, BN), triton.cdiv(M, BM))](
        x2, weight, y, M, N, K, x2.stride(0), x2.stride(1), weight.stride(0),
        weight.stride(1), y.stride(0), BM=BM, BN=BN, BK=BK, INTERPRET=INTERPRET,
        num_warps=4, num_stages=stages)


def kernel_takes(x: Tensor, w: Tensor) -> bool:
    """bf16 / fp16 activations with weights of the same dtype (anything else is the ACC proof
    path, which the callers hand to cuBLAS); then x must be on CUDA (or interpreted), named
    otherwise. Shared with mla_proj_triton_v1."""
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype:
        return False
    _require(x.is_cuda or INTERPRET, "x", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             x.device)
    return True


def run(x: Tensor, weight: Tensor, launch) -> Tensor:
    """The linear op around a kernel `launch(x2 [M, K], weight, y [M, N], M, N, K)` (M, N, K
    >= 1): the argument checks, the cuBLAS dispatch (> MAX_ROWS rows, non-bf16/fp16 inputs),
    the output buffer and the empty cases. Shared by linear_triton_v1 and v2."""
    _require(isinstance(x, Tensor) and x.dim() >= 1 and x.is_floating_point(), "x",
             "a float tensor [..., K]", getattr(x, "dtype", type(x)))
    K = x.shape[-1]
    _require(isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[1] == K,
             "weight", f"[N, {K}]", tuple(getattr(weight, "shape", ())))
    _require(weight.device == x.device, "weight", f"on {x.device} (x's device)", weight.device)
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], weight.shape[0]
    if M > MAX_ROWS or not kernel_takes(x, weight):
        return torch_bf16.linear(x, weight)  # compute-shaped or ACC rows: cuBLAS (docstring)
    # under the interpreter fp32 -> bf16 stores truncate (drafter/_common): there the kernel
    # writes fp32 and torch rounds (round-to-nearest-even, as cvt.rn does on the GPU)
    y = torch.empty(M, N, dtype=torch.float32 if INTERPRET else x.dtype, device=x.device)
    if M and N:
        if K == 0:
            return y.zero_().to(x.dtype).view(*x.shape[:-1], N)
        launch(x2, weight, y, M, N, K)
    return y.to(x.dtype).view(*x.shape[:-1], N)
