"""MoE router in TWO launches (op moe_route, variant triton_v3): moe_route_triton_v2's split-K
router GEMM (its expert tiles' last K slices sum the partials in slice order into fp32 logits)
without its one-program top-k, then triton_v1's selection kernel (one program a row).

Why (H200, session 19 call 3, `scripts/probe_moe_route_phases.py`, kernel µs at T 1 / 9 /
17): v2's GEMM phases alone take 5.3 / 5.3 / 6.7 µs at 32-expert tiles, against cuBLAS's
split-K GEMM 5.5 / 5.8 / 5.9 plus its splitKreduce launch (1.6-1.9 µs in the EP8 step); v2's
top-k in one program costs 5-6 µs a step of rows where v1's selection kernel takes ~3.5 µs at
any T (its rows in parallel programs). Expected: triton_v1's three launches (10.5 µs at C 1 AR
in the EP8 step) become two (~9 µs).
Measured (session 20 call 1, traces/gpu/session20): **no faster, a measured negative** kept
registered. REAL bench kernel µs, triton_v1 / v3, 3 interleaved rounds: T 1 10.0 / 9.8, T 9
10.4 / 9.9, T 17 10.3 / 10.9 (T 33 / 65: v1's launch); the phase probe at T 1 / 9 / 17: 9.0 /
9.4 / 9.4 against 8.8 / 8.9 / 10.2. In the EP8 step (`--kernels engine,moe_route=triton_v3`)
the kernels took 6.07 / 15.38 / 10.30 / 30.51 ms against the engine preset's 5.99 / 15.33 /
10.22 / 30.46 (C 1 AR, C 1 DDTree-16, C 8 AR, C 8 DDTree-16, same call): within the runs'
spread, and slower at the verify's 17 rows. The ~1.5 µs the second launch should have saved
is not there; why is not profiled.

Tiles: v2's rule at BN 32 (12 expert tiles x 16 K slices at Kimi's E 384, D 7168), the
probe's fastest GEMM phase. Rows beyond v2's MAX_T and non-bf16/fp16 inputs: triton_v1
(documented dispatch). Numerics: v2's logits (fixed K order, not cuBLAS's), v1's selection:
engine-only.
Legend: v2's.
"""

from __future__ import annotations

from torch import Tensor

from . import moe_route_triton_v1, moe_route_triton_v2

GEMM_TILES = dict(BN=32)  # session 19 call 3: 5.3 / 5.3 / 6.7 µs at T 1 / 9 / 17 (BN 16: 5.9)


def moe_route(h: Tensor, gate_weight: Tensor, bias: Tensor, top_k: int, scaling: float,
              local_experts: tuple[int, int] | None = None) -> tuple:
    """h [T, D] -> (ids int64 [T, K], weights fp32 [T, K][, local ids int64 [T, K]]);
    gate_weight [E, D], bias [E] (the "moe_route" op's contract and errors: triton_v1's
    checks run first)."""
    moe_route_triton_v1.check_args(h, gate_weight, bias, top_k, local_experts)
    if not moe_route_triton_v2.runs_here(h, gate_weight):
        return moe_route_triton_v1.moe_route(h, gate_weight, bias, top_k, scaling,
                                             local_experts)
    logits = moe_route_triton_v2.launch(h, gate_weight, bias, top_k, scaling, GEMM_TILES,
                                        topk=False)[2]
    return moe_route_triton_v1.select(logits, bias, top_k, scaling, local_experts)
