"""Small dense ops the model uses: RMSNorm, linear, SwiGLU MLP. fp32 math, bf16 in and out.

Every reference op computes in fp32 and rounds its result to the activation dtype (bf16), the
same boundary an optimized kernel has, so swapping one op changes only that op's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> [..., D] in x.dtype; y = x / rms(x) * weight, in fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T -> [..., out] in x.dtype (fp32 accumulate)."""
    return F.linear(x.float(), weight.float()).to(x.dtype)


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    """down(silu(gate x) * up x): the dense first layer and the shared expert. [..., D] -> [..., D]."""
    xf = x.float()
    a = F.silu(F.linear(xf, gate.float())) * F.linear(xf, up.float())
    return F.linear(a, down.float()).to(x.dtype)


def lm_head(h: torch.Tensor, weight: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """h [..., D] -> logits [..., V] fp32. Vocab chunks bound the fp32 copy of the weight."""
    hf = h.float()
    return torch.cat([F.linear(hf, weight[i : i + chunk].float())
                      for i in range(0, weight.shape[0], chunk)], dim=-1)
