"""drafter materialize_v1 (op `drafter_materialize`, variant `triton_v1`): the context
materialisation of `DFlashDrafter.materialize` with no host sync (CUDA-graph capturable); the
DDTree step calls it in its commit phase, inside the step's graph (workbench/generate.py).

For the M = B*N rows of one call (all rows: shapes may not depend on `count`):
    c    = hidden_norm(target_hidden @ Wfc^T)              cuBLAS bf16 GEMM + Triton RMSNorm
           (a tensor-parallel shard's D/w GEMM columns all-gathered between: drafter.fc_out)
    kv   = c @ [Wk_0; Wv_0; ...; Wk_{l-1}; Wv_{l-1}]^T      ONE cuBLAS bf16 GEMM for every layer
    cache.k[l, b, pos] = RoPE(k_norm_l(k_l)),  cache.v[l, b, pos] = v_l
                                                          one Triton pass, grid (M, layers)
The last pass skips (masked loads and stores) every row with i >= count[b] and every position
outside [0, T): rows past count are never read beyond their position, never written. The GEMMs
stay cuBLAS: at decode sizes (M <= B * block_size when the caller passes only the rows that
can be accepted) they stream the weights (fc 43008 x 7168 and the K/V stack 6 x 2048 x 7168:
793 MB at kimi-k2.6, 186 us at 4.26 TB/s), which cuBLAS does near copy bandwidth.

Differences from the reference (reference/drafter.py `materialize`), all forced by "no sync":
  * positions are not validated (that reads them on the host): a row whose position lies
    outside [0, T) is dropped, not raised on; negative or too large counts are clamped by the
    row mask (i < count[b]).
  * the fc and K/V GEMMs run over every row, accepted or not (fixed shapes); NaN/Inf in rows
    past count stay in their own GEMM rows and are never stored.
Numerics: bf16 GEMMs with fp32 accumulation (the reference accumulates in float64); rounding to
bf16 at the reference's op boundaries: fc out, hidden norm out, k/v GEMM out, k norm out,
RoPE out. Under TRITON_INTERPRET=1 the kernel rounds to bf16 with integer round-to-nearest-even
(the interpreter's own fp32 -> bf16 cast truncates), so the interpreter sees the GPU's values.

Legend: B batch, N rows per call, F = nT * D concatenated target features, D hidden,
Hkv kv heads, d head_dim, T cache slots, l drafter layers, M = B * N.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, _require, next_pow2, rope_tables, to_bf16
from ._fused import rmsnorm


@triton.jit
def _round_bf16(x, RNE_BITS: tl.constexpr):
    """fp32 -> the nearest bf16 value (ties to even), still fp32. RNE_BITS: integer rounding
    for the interpreter, whose cast truncates; the GPU's cvt.rn already rounds to nearest."""
    if RNE_BITS:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _kv_scatter_kernel(kv_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, cnt_ptr, ck_ptr, cv_ptr,
                       N, T, HKV, s_kv, sk_l, sk_b, sk_t, sk_h, sv_l, sv_b, sv_t, sv_h, eps,
                       BLOCK_H: tl.constexpr, HALF: tl.constexpr, RNE_BITS: tl.constexpr):
    # grid (M, layers): one program per (row, layer) handles all Hkv heads of that row. The
    # GEMM row is [k_0 | v_0 | k_1 | v_1 | ...], each Hkv * d wide.
    row = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    b = row // N
    i = row % N
    p = tl.load(pos_ptr + row)  # int64
    cnt = tl.load(cnt_ptr + b)
    ok = (i < cnt) & (p >= 0) & (p < T)  # the row is written iff ok
    h = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    c = tl.arange(0, HALF)[None, :]  # [1, HALF]: rotate-half pairs (c, c + d/2)
    m = ok & (h < HKV) & (c < HALF)  # [BLOCK_H, HALF]
    src = kv_ptr + row * s_kv + layer * (2 * HKV * 2 * HALF) + h * (2 * HALF) + c
    x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
    w1 = tl.load(kw_ptr + layer * (2 * HALF) + c).to(tl.float32)
    w2 = tl.load(kw_ptr + layer * (2 * HALF) + HALF + c).to(tl.float32)
    r = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
    n1 = _round_bf16(x1 * r * w1, RNE_BITS)  # the reference rounds the normed head before RoPE
    n2 = _round_bf16(x2 * r * w2, RNE_BITS)
    cs = tl.load(cos_ptr + row * HALF + c)
    sn = tl.load(sin_ptr + row * HALF + c)
    k1 = _round_bf16(n1 * cs - n2 * sn, RNE_BITS)
    k2 = _round_bf16(n2 * cs + n1 * sn, RNE_BITS)
    dk = ck_ptr + layer * sk_l + b * sk_b + p * sk_t + h * sk_h + c
    tl.store(dk, k1.to(tl.bfloat16), mask=m)
    tl.store(dk + HALF, k2.to(tl.bfloat16), mask=m)
    # v: a bf16 copy of the GEMM output (no norm, no rotation)
    v1 = tl.load(src + HKV * (2 * HALF), mask=m, other=0.0)
    v2 = tl.load(src + HKV * (2 * HALF) + HALF, mask=m, other=0.0)
    dv = cv_ptr + layer * sv_l + b * sv_b + p * sv_t + h * sv_h + c
    tl.store(dv, v1, mask=m)
    tl.store(dv + HALF, v2, mask=m)


@dataclass
class _Weights:
    kv: Tensor  # [l * 2 * Hkv * d, D]: every layer's [Wk; Wv], one GEMM for all layers
    k_norm: Tensor  # [l, d] the k_norm weights, stacked
    key: tuple


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepared_kv(drafter) -> _Weights:
    """The stacked K/V weights (an extra 176 MB at kimi-k2.6), made on the first call (keep it
    outside a graph capture) and rebuilt when a parameter was replaced (data pointers change)."""
    key = tuple(p.data_ptr() for p in drafter.parameters())
    w = _WEIGHTS.get(drafter)
    if w is None or w.key != key:
        kv = torch.cat([t for layer in drafter.layers for t in (layer.self_attn.k_proj.weight,
                                                                 layer.self_attn.v_proj.weight)])
        kn = torch.stack([layer.self_attn.k_norm.weight for layer in drafter.layers])
        drafter.rope.inv_freq_on(drafter.device)  # now, outside a capture: no host copy later
        w = _Weights(kv, kn.contiguous(), key)
        _WEIGHTS[drafter] = w
    return w


def check_materialize_args(drafter, cache, target_hidden, positions, count) -> tuple[int, int]:
    """Shape / dtype / device checks that read no tensor values (no sync). Returns (B, N)."""
    c = drafter.cfg
    dev = drafter.device
    Fin = drafter.fc.weight.shape[1]
    _require(isinstance(target_hidden, Tensor) and target_hidden.dim() == 3, "target_hidden",
             f"a 3-d tensor [B, N, {Fin}]", getattr(target_hidden, "shape", type(target_hidden)))
    B, N, Fh = target_hidden.shape
    _require(Fh == Fin, "target_hidden", f"[B, N, {Fin}] (fc in-features)",
             tuple(target_hidden.shape))
    _require(target_hidden.dtype == torch.bfloat16, "target_hidden", "bfloat16",
             target_hidden.dtype)
    _require(isinstance(positions, Tensor) and tuple(positions.shape) == (B, N), "positions",
             f"shape ({B}, {N})", getattr(positions, "shape", type(positions)))
    _require(not positions.is_floating_point() and positions.dtype != torch.bool, "positions",
             "an integer dtype", positions.dtype)
    _require(isinstance(count, Tensor) and tuple(count.shape) == (B,), "count", f"shape ({B},)",
             getattr(count, "shape", type(count)))
    _require(not count.is_floating_point() and count.dtype != torch.bool, "count",
             "an integer dtype", count.dtype)
    want = (c.num_layers, B, None, c.num_kv_heads, c.head_dim)
    for name, t in (("cache.k", cache.k), ("cache.v", cache.v)):
        _require(t.dim() == 5 and t.shape[:2] == want[:2] and t.shape[3:] == want[3:], name,
                 f"[{c.num_layers}, {B}, T, {c.num_kv_heads}, {c.head_dim}]", tuple(t.shape))
        _require(t.dtype == torch.bfloat16, name, "bfloat16", t.dtype)
        _require(t.stride(-1) == 1, name, "unit stride along head_dim", t.stride())
    _require(cache.k.shape[2] == cache.v.shape[2], "cache.v", f"T = {cache.k.shape[2]}",
             cache.v.shape[2])
    for name, t in (("target_hidden", target_hidden), ("positions", positions),
                    ("count", count), ("cache.k", cache.k), ("cache.v", cache.v)):
        _require(t.device == dev, name, f"on {dev} (the drafter's device)", t.device)
    _require(c.head_dim >= 2 and c.head_dim % 2 == 0 and next_pow2(c.head_dim) == c.head_dim,
             "drafter.head_dim", "a power of two (rotate-half tiles)", c.head_dim)
    return B, N


def materialize_triton(drafter, cache, target_hidden: Tensor, positions: Tensor,
                       count: Tensor) -> None:
    """Same contract as `DFlashDrafter.materialize` (written in place, returns None):
    target_hidden [B, N, nT*D] bf16, positions [B, N] int, count [B] int; rows i < count[b] are
    written at slot positions[b, i] of every layer's cache.k / cache.v; other rows are ignored.
    No host sync; positions outside [0, T) are skipped, not raised on (see the module doc)."""
    B, N = check_materialize_args(drafter, cache, target_hidden, positions, count)
    if B == 0 or N == 0:
        return
    c = drafter.cfg
    Hkv, d, nl = c.num_kv_heads, c.head_dim, c.num_layers
    w = prepared_kv(drafter)
    M, T = B * N, cache.k.shape[2]
    x = target_hidden.reshape(M, target_hidden.shape[2])  # copies only if not viewable
    ctx = to_bf16(rmsnorm(drafter.fc_out(F.linear(x, drafter.fc.weight)),
                          drafter.hidden_norm.weight, c.rms_norm_eps))  # [M, D]
    kv = F.linear(ctx, w.kv)  # [M, l * 2 * Hkv * d] bf16
    pos = positions.reshape(M).to(torch.int64)  # [M]
    cos, sin = rope_tables(drafter, pos)  # [M, d/2] fp32, the reference's angles
    cnt = count.to(torch.int64)
    ck, cv = cache.k, cache.v
    _kv_scatter_kernel[(M, nl)](kv, w.k_norm, cos, sin, pos, cnt, ck, cv, N, T, Hkv,
                                kv.stride(0), *ck.stride()[:4], *cv.stride()[:4],
                                c.rms_norm_eps, BLOCK_H=next_pow2(Hkv), HALF=d // 2,
                                RNE_BITS=INTERPRET, num_warps=4 if Hkv * d >= 512 else 1)


def materialize(drafter, cache, hidden: Tensor, pos: Tensor, count: Tensor) -> None:
    """Registry-free drop-in for `drafter.materialize(cache, hidden, pos, count)` (the argument
    order of the loop's call sites)."""
    materialize_triton(drafter, cache, hidden, pos, count)
