"""What the drafter versions share on the host: argument checks, prepared (fused) weights, the
RoPE tables, and the interpreter switches.

Dimension legend (the reference's): B batch, L = block_size - 1 draft depths, S = L + 1 block
rows, T cache slots, Hq/Hkv heads, G = Hq/Hkv, d head_dim, D hidden, F SwiGLU width, V vocab,
k top-k, M = B*S (or B*L) GEMM rows.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

# Under TRITON_INTERPRET=1 bf16 tl.dot is wrong and fp32 -> bf16 stores truncate instead of
# rounding: kernels then dot in fp32 and write fp32 buffers that the host rounds with torch
# (round-to-nearest-even, as the GPU's cvt.rn does).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_K = 1024  # DDTree's K = min(budget, V) and generate() caps the budget at 1024


def act_dtype() -> torch.dtype:
    """The dtype Triton kernels store activations in (bf16 on a GPU, fp32 when interpreting)."""
    return torch.float32 if INTERPRET else torch.bfloat16


def to_bf16(t: Tensor) -> Tensor:
    return t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16)


def _require(ok: bool, name: str, expected, got) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {got}")


def check_block_args(drafter, cache, bonus: Tensor, start: Tensor) -> None:
    """The block forward's shape / dtype / device checks (no device sync: CUDA-graph
    capturable). Values of `start` are not read (that would sync): the kernels clamp P into
    [0, T] so a bad value cannot read out of bounds."""
    c = drafter.cfg
    dev = drafter.device
    _require(isinstance(bonus, Tensor) and bonus.dim() == 1, "bonus", "a 1-d tensor [B]",
             getattr(bonus, "shape", type(bonus).__name__))
    B = bonus.shape[0]
    _require(not bonus.is_floating_point(), "bonus", "an integer dtype", bonus.dtype)
    _require(isinstance(start, Tensor) and tuple(start.shape) == (B,), "start", f"shape ({B},)",
             getattr(start, "shape", type(start).__name__))
    _require(not start.is_floating_point(), "start", "an integer dtype", start.dtype)
    shape = (c.num_layers, B, None, c.num_kv_heads, c.head_dim)
    for name, t in (("cache.k", cache.k), ("cache.v", cache.v)):
        _require(t.dim() == 5 and t.shape[:2] == shape[:2] and t.shape[3:] == shape[3:], name,
                 f"[{c.num_layers}, {B}, T, {c.num_kv_heads}, {c.head_dim}]", tuple(t.shape))
        _require(t.dtype == torch.bfloat16, name, "bfloat16", t.dtype)
        _require(t.stride(-1) == 1, name, "unit stride along head_dim", t.stride())
        _require(t.device == dev, name, f"on {dev}", t.device)
    _require(cache.k.shape[2] == cache.v.shape[2], "cache.v", f"T = {cache.k.shape[2]}",
             cache.v.shape[2])
    for name, t in (("bonus", bonus), ("start", start)):
        _require(t.device == dev, name, f"on {dev} (the drafter's device)", t.device)
    _require(c.head_dim >= 16 and c.head_dim & (c.head_dim - 1) == 0, "drafter.head_dim",
             "a power of two >= 16 (tl.dot tiles)", c.head_dim)


def check_args(drafter, target, cache, bonus: Tensor, start: Tensor, k) -> int:
    """`check_block_args` plus the LM head and k. Returns k clamped to V, as the reference's
    top-k clamps it."""
    c = drafter.cfg
    V, D = target.lm_head.weight.shape
    _require(D == c.hidden_size, "target.lm_head.weight", f"[V, {c.hidden_size}]",
             tuple(target.lm_head.weight.shape))
    _require(target.lm_head.weight.device == drafter.device, "target.lm_head.weight",
             f"on {drafter.device} (the drafter's device)", target.lm_head.weight.device)
    check_block_args(drafter, cache, bonus, start)
    _require(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", "an int >= 1", k)
    k = min(k, V)
    _require(k <= MAX_K, "k", f"<= {MAX_K} (triton_v1's top-k buffers)", k)
    return k


@dataclass
class Prepared:
    """Per-drafter fused weights (made once, outside any graph capture: the first call)."""

    qkv: list[Tensor]  # per layer [(Hq + 2 Hkv) d, D]: one GEMM for q, k and v
    gate_up: list[Tensor]  # per layer [2F, D]: one GEMM for gate and up
    key: tuple


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepared(drafter) -> Prepared:
    """Concatenated projection weights (costs one extra copy of q/k/v and gate/up: ~4 GB at
    kimi-k2.6 size), rebuilt when a parameter was replaced (data pointers change)."""
    key = tuple(p.data_ptr() for p in drafter.parameters())
    p = _PREPARED.get(drafter)
    if p is None or p.key != key:
        qkv, gu = [], []
        for layer in drafter.layers:
            at = layer.self_attn
            qkv.append(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight], 0))
            gu.append(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight], 0))
        drafter.rope.inv_freq_on(drafter.device)  # now, outside a capture: no host copy later
        p = Prepared(qkv, gu, key)
        _PREPARED[drafter] = p
    return p


def rope_tables(drafter, positions: Tensor) -> tuple[Tensor, Tensor]:
    """positions [...] -> cos, sin [..., d/2] fp32, exactly the reference's (`Rope.cos_sin`:
    rows of its table once a cache was made, else angles in float64), contiguous."""
    cos, sin = drafter.rope.cos_sin(positions)
    return cos.contiguous(), sin.contiguous()


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
