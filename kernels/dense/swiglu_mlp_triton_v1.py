"""Engine-style SwiGLU MLP (op swiglu_mlp) with the activation as one Triton kernel.

torch_bf16.swiglu_mlp runs the gate and up GEMMs, then five elementwise kernels (two fp32
casts, SiLU, the product, the cast back) before the down GEMM; at Kimi K2.6 size the shared
expert is [T, 7168] x [256, 7168] per rank, so those five are ~7 µs of launches around
~1 µs of data, 61 times a step. Here the GEMMs stay in cuBLAS (bf16 in and out, fp32
accumulate) and SiLU(gate) * up is one kernel (the drafter's, kernels/drafter/_fused.py):
fp32 math on the bf16 GEMM outputs, rounded once to the activation dtype, as torch_bf16
rounds. Not bitwise torch_bf16 (Triton's exp in
the sigmoid): engine-only, within the reference's dtype-derived tolerance.
`swiglu_mlp_v2` (variant triton_v2) runs the same steps with the GEMMs on linear_triton_v1,
`swiglu_mlp_v3` (variant triton_v3) on linear_triton_v2 (split-K in one launch),
`swiglu_mlp_v4` (variant triton_v4) on linear_triton_v3 (v2's kernel on the sweep's decode
tiles up to 16 rows, cuBLAS above), `swiglu_mlp_v5` (variant triton_v5) on linear_triton_v4
(v2's split-K with the operands swapped for wgmma, up to 64 rows), `swiglu_mlp_v6` (variant
triton_v6) on linear_triton_v5 (v4's kernel for wide outputs, v3's rule for narrow ones).
Legend: M rows, D hidden, F width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from ..drafter._fused import _silu_mul_kernel
from .torch_bf16 import adjacent

BLOCK = 1024  # columns a program


def silu_mul(g: Tensor, u: Tensor) -> Tensor:
    """g, u [M, F] -> silu(g) * u [M, F] in g.dtype (fp32 math, one rounding)."""
    M, Fw = g.shape
    narrow = g.dtype in (torch.bfloat16, torch.float16)  # interpreter: torch rounds (rope)
    a = torch.empty(M, Fw, dtype=torch.float32 if INTERPRET and narrow else g.dtype,
                    device=g.device)
    if M and Fw:
        _silu_mul_kernel[(M, triton.cdiv(Fw, min(BLOCK, next_pow2(Fw))))](
            g, u, a, Fw, g.stride(0), u.stride(0), a.stride(0), BLOCK=min(BLOCK, next_pow2(Fw)),
            num_warps=4)
    return a.to(g.dtype)


def swiglu_mlp(x: Tensor, gate: Tensor, up: Tensor, down: Tensor, gemm=F.linear) -> Tensor:
    """down(silu(gate x) * up x): [..., D] -> [..., D] in x.dtype; weights [F, D], [F, D],
    [D, F] (cast to x.dtype when they differ, as torch_bf16 does). When up follows gate in
    one buffer (a model that stacks them: workbench.dist.model.stacked_weight) the two are
    one GEMM [M, 2F] (one launch and one split-K reduce fewer)."""
    _require(x.dim() >= 1 and x.is_floating_point(), "x", "a float tensor [..., D]",
             getattr(x, "dtype", type(x)))
    D = x.shape[-1]
    _require(gate.dim() == 2 and gate.shape[1] == D, "gate", f"[F, {D}]", tuple(gate.shape))
    Fw = gate.shape[0]
    _require(tuple(up.shape) == (Fw, D), "up", f"({Fw}, {D}) (gate's shape)", tuple(up.shape))
    _require(tuple(down.shape) == (D, Fw), "down", f"({D}, {Fw})", tuple(down.shape))
    _require(x.is_cuda or INTERPRET, "x", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             x.device)
    x2 = x.reshape(-1, D)

    def w(t):
        return t if t.dtype == x.dtype else t.to(x.dtype)

    if gate.dtype == x.dtype and adjacent(gate, up):
        gu = gemm(x2, gate.as_strided((2 * Fw, D), (D, 1)))  # [M, 2F]: gate | up
        a = silu_mul(gu[:, :Fw], gu[:, Fw:])
    else:
        a = silu_mul(gemm(x2, w(gate)), gemm(x2, w(up)))  # [M, F]
    return gemm(a, w(down)).view(*x.shape[:-1], D)


def swiglu_mlp_v2(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """triton_v2: v1 with its GEMMs on the skinny linear kernel (linear_triton_v1: no split-K
    for <= 64 rows, cuBLAS above)."""
    from .linear_triton_v1 import linear

    return swiglu_mlp(x, gate, up, down, gemm=linear)


def swiglu_mlp_v3(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """triton_v3: v1 with its GEMMs on linear_triton_v2 (split-K in one launch for <= 64 rows,
    cuBLAS above): the EP8 rank's shared expert is [T, 7168] x [512, 7168] then K = 256."""
    from .linear_triton_v2 import linear

    return swiglu_mlp(x, gate, up, down, gemm=linear)


def swiglu_mlp_v4(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """triton_v4: v1 with its GEMMs on linear_triton_v3 (v2's split-K kernel on session 10's
    best decode tiles up to 16 rows, cuBLAS above)."""
    from .linear_triton_v3 import linear

    return swiglu_mlp(x, gate, up, down, gemm=linear)


def swiglu_mlp_v5(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """triton_v5: v1 with its GEMMs on linear_triton_v4 (swap-AB split-K up to 64 rows, cuBLAS
    above)."""
    from .linear_triton_v4 import linear

    return swiglu_mlp(x, gate, up, down, gemm=linear)


def swiglu_mlp_v6(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """triton_v6: v1 with its GEMMs on linear_triton_v5 (the shared expert's narrow gate | up
    on v3's rule, its wide down on v4's kernel)."""
    from .linear_triton_v5 import linear

    return swiglu_mlp(x, gate, up, down, gemm=linear)
