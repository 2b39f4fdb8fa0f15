"""Engine-style RoPE as one Triton kernel, behind the "rope" op's contract (reference/rope.py).

Rope.apply launches ~10 torch kernels per call (the table gather, two slices, the fp32 cast,
four products, two sums, stack/cat, the cast back), each ~2 µs of launch on the H200 for a few
KB of data; the full-size rank calls it 122 times a step (61 layers x q_pe, k_pe). This is one
launch: a program takes BLOCK_ROWS (position, head) rows, gathers each row's cos | sin from the
reserved table by position (one table row serves all heads of a position), rotates the pairs
in fp32 and rounds once to x.dtype.

Numerics: the same fp32 products and sums as the reference, but the compiler may contract
x1*cos - x2*sin into an FMA, so on the GPU it is not bitwise Rope.apply (one fp32 rounding
less): it is engine-only (the "engine" preset, never "optimized") and passes the harness's
dtype-derived tolerance. Under the interpreter it is bitwise (numpy does not contract).

Positions: int32 or int64, read on the device and never synced. A position outside
[0, table rows) is a caller bug (cache slots stay below the reserved length): its row reads no
table memory and comes out NaN (loud, not a wrapped or clamped angle); `validate=True` checks
the range on the host first (a sync) and raises.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..drafter._common import INTERPRET, _require, next_pow2

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
BLOCK_ROWS = 32  # (position, head) rows a program: 32 x 32 pairs at R = 64, 2048 elements


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, tab_ptr, y_ptr, rows, H, n_tab, sx_m, sx_h, sx_d, s_pos,
                 s_tab, sy_m, sy_h, INTERLEAVED: tl.constexpr, HALF: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, BLOCK_P: tl.constexpr):
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # row = m * H + h
    p = tl.arange(0, BLOCK_P)  # pair index
    r_ok = r < rows
    m, h = r // H, r % H
    pos = tl.load(pos_ptr + m * s_pos, mask=r_ok, other=0).to(tl.int64)
    in_tab = (pos >= 0) & (pos < n_tab)
    pos = tl.where(in_tab, pos, 0)  # never form an address outside the table
    if INTERLEAVED:  # target MLA: pairs (2i, 2i+1)
        d1, d2 = 2 * p, 2 * p + 1
    else:  # drafter: rotate-half pairs (i, i + R/2)
        d1, d2 = p, p + HALF
    ok = r_ok[:, None] & (p < HALF)[None, :]
    xrow = x_ptr + m.to(tl.int64)[:, None] * sx_m + h.to(tl.int64)[:, None] * sx_h
    x1 = tl.load(xrow + d1[None, :] * sx_d, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(xrow + d2[None, :] * sx_d, mask=ok, other=0.0).to(tl.float32)
    trow = tab_ptr + pos[:, None] * s_tab
    t_ok = ok & in_tab[:, None]
    cos = tl.load(trow + p[None, :], mask=t_ok, other=float("nan"))
    sin = tl.load(trow + HALF + p[None, :], mask=t_ok, other=float("nan"))
    yrow = y_ptr + m.to(tl.int64)[:, None] * sy_m + h.to(tl.int64)[:, None] * sy_h
    tl.store(yrow + d1[None, :], x1 * cos - x2 * sin, mask=ok)
    tl.store(yrow + d2[None, :], x1 * sin + x2 * cos, mask=ok)


def rope(x: Tensor, positions: Tensor, table: Tensor, interleaved: bool,
         out: Tensor | None = None, validate: bool = False, *,
         block_rows: int | None = None) -> Tensor:
    """x [..., S, (H,) R] at int positions [..., S] -> [..., S, (H,) R] in x.dtype.

    table [n, R] fp32: cos in [:, :R/2], sin in [:, R/2:] (Rope.table, after Rope.reserve);
    there is no table-less path. out: a view of x's shape and dtype (unit stride along R) to
    write instead, e.g. the model's q buffer [..., C:]; returned. No host sync unless
    validate=True (positions' range). block_rows: (position, head) rows a program (a power of
    two; BLOCK_ROWS by default, rope_triton_v2 passes its own)."""
    _require(isinstance(table, Tensor), "table",
             "the [n, R] fp32 cos|sin table (Rope.table(device), after Rope.reserve)",
             type(table).__name__)
    _require(isinstance(x, Tensor) and x.dtype in DTYPES, "x",
             f"a tensor of one of {[str(d) for d in DTYPES]}", getattr(x, "dtype", type(x)))
    _require(isinstance(positions, Tensor) and positions.dtype in (torch.int32, torch.int64),
             "positions", "an int32 or int64 tensor", getattr(positions, "dtype", positions))
    pd = positions.dim()
    _require(x.dim() in (pd + 1, pd + 2), "x", f"[..., S, (H,) R] with positions {pd}-d",
             tuple(x.shape))
    _require(tuple(x.shape[:pd]) == tuple(positions.shape), "positions",
             f"x's leading shape {tuple(x.shape[:pd])}", tuple(positions.shape))
    R = x.shape[-1]
    _require(R % 2 == 0, "x", "an even last dim R (pairs)", R)
    _require(table.dim() == 2 and table.shape[1] == R, "table", f"shape [n, {R}]",
             tuple(table.shape))
    _require(table.dtype == torch.float32, "table", "float32", table.dtype)
    _require(table.stride(1) == 1, "table", "unit stride along R", table.stride())
    for name, t in (("positions", positions), ("table", table)):
        _require(t.device == x.device, name, f"on {x.device} (x's device)", t.device)
    _require(x.is_cuda or INTERPRET, "x", "a CUDA tensor (or TRITON_INTERPRET=1 on CPU)",
             x.device)
    if validate and positions.numel():
        lo, hi = int(positions.min()), int(positions.max())  # host sync
        _require(lo >= 0 and hi < table.shape[0], "positions",
                 f"values in [0, {table.shape[0]}) (the table's rows)", f"[{lo}, {hi}]")
    H = x.shape[-2] if x.dim() == pd + 2 else 1
    # [M, H, R]: a view whenever the leading dims flatten (q[..., dn:] and kv[..., C:] do);
    # strides along H and R are passed, so the model's column slices are read in place
    x3 = x.reshape(-1, H, R)
    pos = positions.reshape(-1)  # [M]
    M = pos.shape[0]
    # Under the interpreter fp32 -> bf16 stores truncate instead of rounding (drafter/_common):
    # there the kernel writes fp32 and torch rounds (round-to-nearest-even, as cvt.rn does).
    narrow = x.dtype in (torch.bfloat16, torch.float16)
    if out is not None:
        _require(isinstance(out, Tensor) and out.shape == x.shape and out.dtype == x.dtype,
                 "out", f"a {tuple(x.shape)} {x.dtype} tensor (x's shape and dtype)",
                 (tuple(getattr(out, "shape", ())), getattr(out, "dtype", type(out))))
        _require(out.device == x.device, "out", f"on {x.device} (x's device)", out.device)
        _require(out.stride(-1) == 1 or R <= 1, "out", "unit stride along R", out.stride())
    direct = out is not None and not (INTERPRET and narrow)
    y3 = out.reshape(-1, H, R) if direct else torch.empty(
        M, H, R, dtype=torch.float32 if INTERPRET and narrow else x.dtype, device=x.device)
    if direct:
        same = y3.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        _require(same, "out", "leading dims that flatten to one row stride (a view, not a "
                 "copy)", out.stride())
    rows = M * H
    block = BLOCK_ROWS if block_rows is None else block_rows
    if rows and R:
        _rope_kernel[(triton.cdiv(rows, block),)](
            x3, pos, table, y3, rows, H, table.shape[0], x3.stride(0), x3.stride(1),
            x3.stride(2), pos.stride(0), table.stride(0), y3.stride(0), y3.stride(1),
            INTERLEAVED=bool(interleaved), HALF=R // 2, BLOCK_ROWS=block,
            BLOCK_P=next_pow2(R // 2), num_warps=4)
    if direct:
        return out
    y = y3.to(x.dtype).view(x.shape)
    return y if out is None else out.copy_(y)  # interpreter: torch rounds, then the copy
