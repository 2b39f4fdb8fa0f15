"""Engine-style MoE router as the router GEMM + one Triton kernel, behind the "moe_route" op's
contract (reference/moe_route.py).

torch_bf16.moe_route runs ~8 torch kernels after the GEMM (sigmoid, bias add, the int64 key
build, top-k and its bitonic sort, gather, sum, div-mul): ~20 µs a layer on the H200 at T = 17,
E = 384, K = 8, for a few KB of data. Here the GEMM stays cuBLAS (bf16 in, fp32 out on CUDA;
fp32 F.linear elsewhere, as torch_bf16 does) and everything after it is one launch: one program
per token row loads the row's E fp32 logits (BLOCK_E = next power of two, masked), takes
s = sigmoid in fp32 and choice = s + bias, then picks the K winners in K rounds of
"max, then the lowest index holding it", each winner leaving the candidate set.

Tie rule (the reference's stable descending sort): equal choices -> lowest expert index first;
-0.0 and +0.0 compare equal (IEEE ==), so they tie too. NaN choices are taken as +inf (torch's
sort puts NaN first), so every round's winner is a real expert id < E: a NaN never makes the
kernel read or write out of bounds, and the ids can index the experts downstream (a +inf
choice ties with them by index, where the reference's sort would put the NaN first).

Weights: s at the winners (recomputed from the logits at the K ids: the same sigmoid on the
same fp32 value gives the same bits as the selection saw), summed with tl.sum over the K slots
(a fixed tree order for a given K, independent of T), then w / (sum + 1e-20) * scaling as the
reference. Not bitwise torch_bf16 or the reference (Triton's sigmoid uses the GPU's fast exp;
sum order): engine-only (the "engine" preset, never "optimized"), within the harness's
tolerance; ids equal the reference's wherever choices are a few fp32 ulps apart.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2
from .torch_bf16 import router_logits

MAX_E = 1024  # one row per program in registers; K rounds of two reductions over BLOCK_E lanes
# Up to 512 lanes one warp holds the row (16 a thread): each of the 2K + 1 reductions is then
# shuffles only, no shared-memory round trip and barrier. A latency guess, not yet measured.
ONE_WARP_E = 512


@triton.jit
def _moe_route_kernel(logit_ptr, bias_ptr, ids_ptr, w_ptr, loc_ptr, E, K, s_row, scaling,
                      FIRST, N_LOC, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                      LOCAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    kk = tl.arange(0, BLOCK_K)
    e_ok = e < E
    x = tl.load(logit_ptr + row * s_row + e, mask=e_ok, other=0.0)
    s = tl.sigmoid(x)  # fp32
    choice = s + tl.load(bias_ptr + e, mask=e_ok, other=0.0).to(tl.float32)
    choice = tl.where(choice != choice, float("inf"), choice)  # NaN first, as torch's sort
    avail = e_ok  # the candidate set: padding lanes never win
    ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in range(K):  # K <= E real lanes, so each round has a candidate
        m = tl.max(tl.where(avail, choice, float("-inf")), axis=0)
        # the lowest index among equal maxima (== treats -0.0 and +0.0 as equal)
        win = tl.min(tl.where(avail & (choice == m), e, BLOCK_E), axis=0)
        avail = avail & (e != win)
        ids = tl.where(kk == j, win, ids)
    k_ok = kk < K
    w = tl.sigmoid(tl.load(logit_ptr + row * s_row + ids, mask=k_ok, other=0.0))
    w = tl.where(k_ok, w, 0.0)
    w = w / (tl.sum(w, axis=0) + 1e-20) * scaling
    tl.store(ids_ptr + row * K + kk, ids.to(tl.int64), mask=k_ok)
    tl.store(w_ptr + row * K + kk, w, mask=k_ok)
    if LOCAL:  # the reference's rule 5: this rank's ids, -1 for the other ranks' experts
        here = (ids >= FIRST) & (ids < FIRST + N_LOC)
        tl.store(loc_ptr + row * K + kk, tl.where(here, ids - FIRST, -1).to(tl.int64), mask=k_ok)


def moe_route(h: Tensor, gate_weight: Tensor, bias: Tensor, top_k: int, scaling: float,
              local_experts: tuple[int, int] | None = None) -> tuple:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K]); gate_weight [E, D], bias [E];
    local_experts (first, n): also the local ids [T, K] (reference rule 5), stored by the
    same program.

    CUDA, bf16 h and weight: the router GEMM is one bf16 cuBLAS mm with fp32 output (as
    torch_bf16); otherwise fp32 F.linear. Then one Triton launch (none when T = 0)."""
    T, D, E = check_args(h, gate_weight, bias, top_k, local_experts)
    if T == 0:
        out = tuple(torch.empty(0, top_k, dtype=dt, device=h.device)
                    for dt in (torch.int64, torch.float32, torch.int64))
        return out if local_experts is not None else out[:2]
    # torch_bf16's GEMM
    return select(router_logits(h, gate_weight), bias, top_k, scaling, local_experts)


def select(logits: Tensor, bias: Tensor, top_k: int, scaling: float,
           local_experts: tuple[int, int] | None = None) -> tuple:
    """The selection kernel on fp32 logits [T >= 1, E] (checked inputs): (ids, weights[,
    local ids]), one program a row. Shared with moe_route_triton_v3 (its logits from its own
    GEMM)."""
    T, E = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    w = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    loc = ids if local_experts is None else torch.empty_like(ids)  # not written unless LOCAL
    first, n = local_experts or (0, 0)
    b = bias.float().contiguous()  # a no-op for the model's fp32 bias
    _moe_route_kernel[(T,)](logits, b, ids, w, loc, E, top_k, logits.stride(0), float(scaling),
                            first, n, BLOCK_E=next_pow2(E), BLOCK_K=next_pow2(top_k),
                            LOCAL=local_experts is not None,
                            num_warps=1 if E <= ONE_WARP_E else 4)
    return (ids, w) if local_experts is None else (ids, w, loc)


def check_args(h: Tensor, gate_weight: Tensor, bias: Tensor, top_k: int,
               local_experts: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """The op's input errors, by argument name; returns (T, D, E)."""
    _require(isinstance(h, Tensor) and h.dim() == 2 and h.is_floating_point(), "h",
             "a floating tensor [T, D]", getattr(h, "shape", type(h)))
    T, D = h.shape
    _require(isinstance(gate_weight, Tensor) and gate_weight.dim() == 2
             and gate_weight.shape[1] == D and gate_weight.is_floating_point(), "gate_weight",
             f"a floating tensor [E, {D}]", getattr(gate_weight, "shape", type(gate_weight)))
    E = gate_weight.shape[0]
    _require(isinstance(bias, Tensor) and tuple(bias.shape) == (E,)
             and bias.is_floating_point(), "bias", f"a floating tensor of shape ({E},)",
             getattr(bias, "shape", type(bias)))
    _require(1 <= E <= MAX_E, "gate_weight", f"1 <= E <= {MAX_E} (one row per program)", E)
    _require(isinstance(top_k, int) and not isinstance(top_k, bool) and 1 <= top_k <= E,
             "top_k", f"an int in [1, {E}] (E)", top_k)
    if local_experts is not None:
        ok = (isinstance(local_experts, tuple) and len(local_experts) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in local_experts))
        _require(ok and local_experts[0] >= 0 and local_experts[1] >= 1
                 and local_experts[0] + local_experts[1] <= E, "local_experts",
                 f"None or a tuple (first, n) of ints, first >= 0, n >= 1, first + n <= {E} (E)",
                 local_experts)
    for name, t in (("gate_weight", gate_weight), ("bias", bias)):
        _require(t.device == h.device, name, f"on {h.device} (h's device)", t.device)
    _require(h.is_cuda or INTERPRET, "h", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             h.device)
    return T, D, E
