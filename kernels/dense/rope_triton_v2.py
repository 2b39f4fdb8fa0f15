"""Engine-style RoPE (op rope), triton_v2: rope_triton_v1's kernel with 4 (position, head) rows a
program instead of 32.

Why (H200, session 18 calls 5-6, `scripts/probe_rope_programs.py`, traces/gpu/session18): a
program's time grows with its rows (kernel µs at 136 rows of 8 heads: 1.28 / 1.49 / 2.28 /
5.32 / 9.30 / 17.2 / 18.8 at 4 / 8 / 16 / 32 / 64 / 128 / 256 rows a program), while more
programs cost nothing measurable (4 rows a program: 1.22-1.40 µs from 8 to 544 rows). v1's 32
rows a program made the EP8 step's q_pe RoPE 2.5 µs at 8 rows and 5.3-5.7 at 64-544 (C 8,
the DDTree verify). Same kernel, same per-element fp32 math: v1's bits.
Legend: rope_triton_v1's.
"""

from __future__ import annotations

from torch import Tensor

from . import rope_triton_v1

BLOCK_ROWS = 4  # (position, head) rows a program: [4, 32] pairs, one a thread at 4 warps


def rope(x: Tensor, positions: Tensor, table: Tensor, interleaved: bool,
         out: Tensor | None = None, validate: bool = False) -> Tensor:
    """rope_triton_v1.rope's contract (x [..., S, (H,) R] at int positions [..., S], the
    reserved fp32 cos|sin table, out=, validate=) at BLOCK_ROWS rows a program."""
    return rope_triton_v1.rope(x, positions, table, interleaved, out, validate,
                               block_rows=BLOCK_ROWS)
