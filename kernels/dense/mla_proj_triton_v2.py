"""Engine-style mla_v_up (op mla_v_up, variant triton_v2): mla_proj_triton_v1's Triton kernel
where the call is a few rows of a few heads, torch_bf16's batched cuBLAS GEMM elsewhere.

Why (H200, session 27 call 6, `scripts/probe_mla_v_up.py`, µs a call, 50 calls in one CUDA
graph): at 8 heads (an EP8 rank's) cuBLAS's kernel for 1-4 rows (nvjet ..._8x64_..._TNN) takes
4.5-4.6 µs and its 8-136-row kernel 3.0-3.3, while triton_v1 takes 2.9-3.1 at 1-4 rows and
3.2-3.8 from 8; at 64 heads cuBLAS is faster at every row count (3.4-3.5 vs 3.7-4.5). The
transposed bmm (the weight's rows on the GEMM's M) is cuBLAS's own time (4.63 at one row):
cuBLAS picks by the product's shape, not by the operands' order. The C 1 AR step calls it once
a layer with one row of 8 heads.

Measured in the step (session 27 call 8, the EP8 step ABA): **a measured negative.** Its 61
launches took 266.9-268.6 µs a C 1 AR step against cuBLAS's 271.2 (4.4 µs each, not the
probe's 2.9): in the step the 1 MB weight comes cold from DRAM and the launch follows another
op's kernel, where the probe's back-to-back calls overlap each other's launch and weight read.
Kernel ms a step equal within the runs (C 1 AR 5.274 / 5.278 vs 5.287). Not the engine
preset's.

Rule (shapes only, graph-safe): rows x heads <= ROWS_HEADS (32: 8 heads up to 4 rows; 64
heads never) takes triton_v1's kernel, otherwise torch_bf16's. Numerics: each path's (fp32
accumulate, one rounding; the two differ in K order): engine-only, as both are.
Legend: R = B x N rows, H heads.
"""

from __future__ import annotations

from torch import Tensor

from . import mla_proj_triton_v1, torch_bf16

ROWS_HEADS = 32  # rows x heads up to which the Triton kernel runs (probe: 8 heads x 1-4 rows)


def uses_kernel(o_lat: Tensor) -> bool:
    """The rule: few rows of few heads (o_lat [B, N, H, C])."""
    B, N, H, _ = o_lat.shape
    return B * N * H <= ROWS_HEADS


def mla_v_up(o_lat: Tensor, w_uv: Tensor) -> Tensor:
    """o_lat [B, N, H, C] x W_UV [H, dv, C]^T -> contiguous [B, N, H, dv] in o_lat.dtype
    (torch_bf16's contract): triton_v1's kernel under the rule, torch_bf16's GEMM above it."""
    if o_lat.dim() == 4 and uses_kernel(o_lat):
        return mla_proj_triton_v1.mla_v_up(o_lat, w_uv)
    return torch_bf16.mla_v_up(o_lat, w_uv)
