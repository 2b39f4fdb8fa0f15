"""Engine-style absorbed-MLA projections (ops mla_q_absorb, mla_v_up) as one Triton kernel each
call: a per-head skinny GEMM instead of cuBLAS's batched GEMM.

Why (H200, EP8 emulation at C 1, traces/gpu/session18/call2_emulate_kernels_engine.csv): at
decode each call is 1 row x 8 heads against 1 MB of weights (W_UK [8, 128, 512], W_UV
[8, 128, 512] bf16: 0.25 µs at copy speed), yet torch.bmm's nvjet kernels take 2.8 µs
(q_absorb, `tst_64x8 ... NNT`) and 4.6 µs (v_up, `tst_8x64 ... TNN`) a layer: 0.45 ms of the
7.35 ms AR step. Here one program owns BN output columns of one head for BM rows and walks the
whole contraction (K = dn = 128 for q_absorb, K = C = 512 for v_up): no split-K, no second
launch, the weight read once per row tile, enough programs (heads x column tiles) to spread
1 MB over the SMs.

One kernel serves both ops through strides: out[r, h, n] = sum_k x[r, h, k] w_h[k, n], where
q_absorb's w_h[k, n] = W_UK[h, k, n] and v_up's w_h[k, n] = W_UV[h, n, k] (its transpose, read
in place). Numerics: fp32 accumulate in a fixed K order, rounded once to x.dtype (a row's value
does not depend on how many rows share the call); not bitwise cuBLAS: engine-only. Inputs that
are not bf16/fp16 (the ACC proof path) run torch_bf16's bmm, as linear_triton_v1 does.

Measured (H200, session 18 call 2): not faster than cuBLAS. This kernel's two launches take
3.5 µs each on average in the EP8 step (431 vs 450 µs a step at C 1 AR, slower at C 1
DDTree-16 and C 8): a launch's fixed cost, not its 1 MB. Not in the engine preset: a measured
negative.
Legend: R = B x N rows, H heads, K contracted width, O output width (C or dv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from . import torch_bf16
from .linear_triton_v1 import kernel_takes, widest_bn

MAX_BM = 64  # rows a program; more rows take more row tiles (the weight tile re-read from L2)


@triton.jit
def _heads_kernel(x_ptr, w_ptr, y_ptr, R, O, K, s_xr, s_xh, s_xk, s_wh, s_wk, s_wo,
                  s_yr, s_yh, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  INTERPRET: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN] output columns of head h
    h = tl.program_id(1)
    r = tl.program_id(2) * BM + tl.arange(0, BM)  # [BM] rows
    k = tl.arange(0, BK)
    n_ok, r_ok = n < O, r < R
    x_rows = x_ptr + r.to(tl.int64)[:, None] * s_xr + h * s_xh  # [BM, 1]
    w_cols = w_ptr + h.to(tl.int64) * s_wh + n.to(tl.int64)[None, :] * s_wo  # [1, BN]
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + k
        k_ok = kk < K
        x = tl.load(x_rows + kk[None, :] * s_xk, mask=r_ok[:, None] & k_ok[None, :],
                    other=0.0)  # [BM, BK]
        w = tl.load(w_cols + kk[:, None] * s_wk, mask=k_ok[:, None] & n_ok[None, :],
                    other=0.0)  # [BK, BN]
        if INTERPRET:  # the interpreter's bf16 dot is wrong (DESIGN.md §10): exact in fp32
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32))
        else:
            acc += tl.dot(x, w)
    y = y_ptr + r.to(tl.int64)[:, None] * s_yr + h * s_yh + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=r_ok[:, None] & n_ok[None, :])


def tiles(R: int, H: int, O: int, K: int) -> tuple[int, int, int]:
    """(BM, BN, BK): BM covers the rows up to 64 (16 at least: tl.dot's M), BN the widest of
    16..128 that still gives >= SMS programs over heads x column tiles (16 when none does), BK
    the whole K up to 128."""
    BM = max(16, next_pow2(min(R, MAX_BM)))
    return BM, widest_bn(O, groups=H), max(16, min(128, next_pow2(K)))


def _heads_gemm(x: Tensor, w: Tensor, y: Tensor, s_wk: int, s_wo: int, O: int) -> None:
    """y [R, H, O] (unit stride along O) = x [R, H, K] . w_h, w_h[k, o] at w + h s_wh + k s_wk
    + o s_wo."""
    R, H, K = x.shape
    if R == 0 or O == 0:
        return
    if K == 0:
        y.zero_()
        return
    BM, BN, BK = tiles(R, H, O, K)
    _heads_kernel[(triton.cdiv(O, BN), H, triton.cdiv(R, BM))](
        x, w, y, R, O, K, x.stride(0), x.stride(1), x.stride(2), w.stride(0), s_wk, s_wo,
        y.stride(0), y.stride(1), BM=BM, BN=BN, BK=BK, INTERPRET=INTERPRET, num_warps=4,
        num_stages=2)


def _check(x: Tensor, w: Tensor, xname: str, wname: str, k_dim: int) -> None:
    """x [B, N, H, K] float; w [H, ., .] with K at dim k_dim, on x's device."""
    _require(isinstance(x, Tensor) and x.dim() == 4 and x.is_floating_point(), xname,
             "a float tensor [B, N, H, K]", tuple(getattr(x, "shape", ())))
    H, K = x.shape[2], x.shape[3]
    want = ["H", "O", "O"]
    want[0], want[k_dim] = str(H), str(K)
    _require(isinstance(w, Tensor) and w.dim() == 3 and w.shape[0] == H and w.shape[k_dim] == K,
             wname, f"[{', '.join(want)}]", tuple(getattr(w, "shape", ())))
    _require(w.device == x.device, wname, f"on {x.device} ({xname}'s device)", w.device)


def _rows(t: Tensor) -> Tensor:
    B, N, H, K = t.shape
    return t.reshape(B * N, H, K)  # a view whenever B and N merge (the model's slices do)


def mla_q_absorb(q_nope: Tensor, w_uk: Tensor, out: Tensor | None = None) -> Tensor:
    """q_nope [B, N, H, dn] x W_UK [H, dn, C] -> [B, N, H, C] in q_nope.dtype (torch_bf16's
    contract, `out=` included: a [B, N, H, C] view with unit stride along C, written in place)."""
    _check(q_nope, w_uk, "q_nope", "w_uk", 1)
    if not kernel_takes(q_nope, w_uk):
        return torch_bf16.mla_q_absorb(q_nope, w_uk, out=out)
    B, N, H, _ = q_nope.shape
    C = w_uk.shape[2]
    if out is not None:
        _require(tuple(out.shape) == (B, N, H, C) and out.dtype == q_nope.dtype
                 and out.stride(-1) == 1, "out", f"a [{B}, {N}, {H}, {C}] {q_nope.dtype} view "
                 "with unit stride along C", (tuple(out.shape), out.dtype, out.stride()))
    # under the interpreter fp32 -> bf16 stores truncate (drafter/_common): there the kernel
    # writes fp32 and torch rounds (round-to-nearest-even, as cvt.rn does on the GPU)
    y = _merged_view(out) if out is not None and not INTERPRET else None
    direct = y is not None
    if not direct:
        y = torch.empty(B * N, H, C, device=q_nope.device,
                        dtype=torch.float32 if INTERPRET else q_nope.dtype)
    _heads_gemm(_rows(q_nope), w_uk, y, w_uk.stride(1), w_uk.stride(2), C)
    if direct:
        return out
    y = y.to(q_nope.dtype).view(B, N, H, C)
    return y if out is None else out.copy_(y)


def _merged_view(out: Tensor) -> Tensor | None:
    """out [B, N, H, C] as [B N, H, C] without a copy, or None when B and N do not merge."""
    try:
        return out.view(out.shape[0] * out.shape[1], *out.shape[2:])
    except RuntimeError:
        return None


def mla_v_up(o_lat: Tensor, w_uv: Tensor) -> Tensor:
    """o_lat [B, N, H, C] x W_UV [H, dv, C]^T -> contiguous [B, N, H, dv] in o_lat.dtype
    (torch_bf16's contract)."""
    _check(o_lat, w_uv, "o_lat", "w_uv", 2)
    if not kernel_takes(o_lat, w_uv):
        return torch_bf16.mla_v_up(o_lat, w_uv)
    B, N, H, _ = o_lat.shape
    dv = w_uv.shape[1]
    y = torch.empty(B, N, H, dv, device=o_lat.device,
                    dtype=torch.float32 if INTERPRET else o_lat.dtype)
    _heads_gemm(_rows(o_lat), w_uv, y.view(B * N, H, dv), w_uv.stride(2), w_uv.stride(1), dv)
    return y.to(o_lat.dtype)
