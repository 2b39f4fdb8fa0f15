"""Engine-style supporting ops: the activation dtype in and out, fp32 accumulation in cuBLAS.

Same signatures and output dtypes as the references (reference/layers.py, moe_route.py).
Inputs may also be fp32/float64 (the distributed proof path hands ACC partials): the weights
are then cast to the input's dtype, as the reference computes in the input's precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _w(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return weight if weight.dtype == x.dtype else weight.to(x.dtype)


def adjacent(first: torch.Tensor, second: torch.Tensor) -> bool:
    """True when `second` starts where `first` ends in one storage (both contiguous, same
    dtype): the two weights are row blocks of one buffer, one GEMM can read both (the engine
    path stacks gate | up and q_a | kv_a: workbench.dist.model.stacked_weight)."""
    return (first.is_contiguous() and second.is_contiguous() and first.dtype == second.dtype
            and first.device == second.device and first.shape[1:] == second.shape[1:]
            and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
            and second.data_ptr() == first.data_ptr() + first.numel() * first.element_size())


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> [..., D] in x.dtype; fp32 math."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T -> [..., out] in x.dtype."""
    return F.linear(x, _w(weight, x))


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
               down: torch.Tensor) -> torch.Tensor:
    """down(silu(gate x) * up x): [..., D] -> [..., D] in x.dtype."""
    a = F.silu(F.linear(x, _w(gate, x)).float()) * F.linear(x, _w(up, x)).float()
    return F.linear(a.to(x.dtype), _w(down, x))


def lm_head(h: torch.Tensor, weight: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """h [..., D] -> logits [..., V] fp32, never rounded to bf16 (argmax margins are small).

    CUDA: one cuBLAS GEMM with bf16 inputs and an fp32 output (`torch.mm(..., out_dtype=)`,
    torch >= 2.8). Elsewhere (CPU smoke runs): fp32 GEMMs over vocab chunks of the weight."""
    flat = h.reshape(-1, h.shape[-1])
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16) and weight.dtype == h.dtype:
        out = torch.mm(flat, weight.t(), out_dtype=torch.float32)
    else:
        hf = flat.float()
        out = torch.cat([F.linear(hf, weight[i : i + chunk].float())
                         for i in range(0, weight.shape[0], chunk)], dim=-1)
    return out.view(*h.shape[:-1], weight.shape[0])


def moe_route(h: torch.Tensor, gate_weight: torch.Tensor, bias: torch.Tensor, top_k: int,
              scaling: float, local_experts: tuple[int, int] | None = None) -> tuple:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K][, local ids int64 [T, K] with
    local_experts]); the reference's rule in fp32.

    CUDA, bf16 h and weight: one bf16 cuBLAS GEMM with fp32 accumulation and output (the
    products of bf16 values are exact in fp32, so this is the fp32 GEMM of the upcast
    values up to summation order, without upcasting the [E, D] weight every call or running
    an fp32 SIMT GEMM: ~19 µs a layer at Kimi size on the H200)."""
    s = torch.sigmoid(router_logits(h, gate_weight))  # [T, E] fp32
    choice = s + bias.float()
    ids = stable_topk(choice, top_k)
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scaling
    return (ids, w) if local_experts is None else (ids, w, local_ids(ids, local_experts))


def local_ids(ids: torch.Tensor, local_experts: tuple[int, int]) -> torch.Tensor:
    """The moe_route op's local ids: id - first inside [first, first + n), -1 elsewhere."""
    first, n = local_experts
    return torch.where((ids >= first) & (ids < first + n), ids - first, torch.full_like(ids, -1))


def router_logits(h: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """h [T, D] x gate_weight [E, D]^T -> [T, E] fp32: the bf16 cuBLAS GEMM with fp32 output
    on CUDA for bf16 inputs (see moe_route), else an fp32 GEMM of the upcast values."""
    if h.is_cuda and h.dtype == gate_weight.dtype == torch.bfloat16:
        return torch.mm(h, gate_weight.t(), out_dtype=torch.float32)
    return F.linear(h.float(), gate_weight.float())


def stable_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of the k largest of x [T, E] fp32, equal values lowest index first:
    a stable descending sort's first k (the reference's rule), from one top-k over int64
    keys (the value's order-preserving bits, then E-1-index) instead of a full sort (a
    radix sort of [T, 384] is ~19 µs on the H200, the top-k a few). Any leading dims; the
    vocab-parallel draft head's top-k too (workbench/dist/vocab.py `stable_topk`)."""
    E = x.shape[-1]
    bits = (x + 0.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # -0.0 -> +0.0: equal
    neg = bits >= 0x80000000
    order = torch.where(neg, 0xFFFFFFFF - bits, bits | 0x80000000)  # uint32 order = fp order
    key = (order << 31) | (E - 1 - torch.arange(E, device=x.device))  # E <= 2^31
    return key.topk(k, dim=-1).indices


def mla_q_absorb(q_nope: torch.Tensor, w_uk: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """q_nope [B, N, H, dn] x W_UK [H, dn, C] -> [B, N, H, C]: one batched cuBLAS GEMM over
    the heads, in q_nope.dtype with fp32 accumulation. out: a [B, N, H, C] view (unit stride
    along C, B and N mergeable) the GEMM writes in place: the model's q buffer [..., :C], so no
    cat follows."""
    B, N, H, dn = q_nope.shape
    C = w_uk.shape[-1]
    x = q_nope.reshape(B * N, H, dn).transpose(0, 1)  # [H, BN, dn]
    if out is None:
        return torch.bmm(x, _w(w_uk, q_nope)).transpose(0, 1).reshape(B, N, H, C)
    torch.bmm(x, _w(w_uk, q_nope), out=out.view(B * N, H, C).transpose(0, 1))
    return out


def mla_v_up(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_lat [B, N, H, C] x W_UV [H, dv, C]^T -> [B, N, H, dv]: one batched GEMM, as above."""
    B, N, H, C = o_lat.shape
    x = o_lat.reshape(B * N, H, C).transpose(0, 1)  # [H, BN, C]
    # written straight into a contiguous [B, N, H, dv]: the model's reshape to [B, N, H dv]
    # for o_proj is then a view, not a copy kernel
    out = torch.empty(B, N, H, w_uv.shape[1], dtype=o_lat.dtype, device=o_lat.device)
    torch.bmm(x, _w(w_uv, o_lat).transpose(1, 2),
              out=out.view(B * N, H, w_uv.shape[1]).transpose(0, 1))  # [H, BN, dv]
    return out
