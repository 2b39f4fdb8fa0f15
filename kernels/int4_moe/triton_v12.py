"""int4_moe triton_v12: v11 with both GEMMs on a persistent grid that splits the weight stream
into equal runs of K tiles (stream-K), so every CTA streams the same number of weight bytes.

Why (H200, session 6 ncu of v8 at T = 1, README.md "Session 6"): at decode sizes the GEMMs run
at 2.5 (gate/up) / 2.0 (down) TB/s, against 3.5-3.7 at T >= 9. v11's grid is (N tile, active
expert, K split) with the splits from a table: at T = 1 gate/up is 32 x 8 x 4 = 1024 programs
of 7 K tiles (2.59 waves of 396 resident CTAs), down 56 x 8 x 3 = 1344 programs of 3 or 2 K
tiles (3.4 waves): the last wave runs part-full (ncu: SMs idle 17 % of the gate/up time) and
a 3-tile program is all pipeline fill, no steady state.

v12 (everything else is v11's: routing, the hinted tiles and SiLU, the dequant, the K tile,
the combine):
* One program per resident CTA (PROGSn = SMs x 3: 168 registers and 61.5 KB smem per CTA; x 2
  where the slot tile is 32 MMA columns wide, 86 KB).
  A GEMM's work is n_act x NT x KTN units (active expert, N tile, K tile of 256 inputs), in
  that order; program p takes units [p L, (p + 1) L) with L = max(ceil(units / PROGSn), LMIN),
  read from the routing count on the device (no host sync: graph-safe). At T = 1: gate/up
  7168 units, 19 a program; down 3584, 10 a program.
* A run of a program that covers part of an N tile is a K split of that tile: piece j = p -
  (first program of the tile) is stored as partial j of g / y (v11's [KS, S, *] buffers, KS =
  PMAX), and the program that ends the tile stores zeros as the pieces after its own, so the
  SiLU and the combine sum PMAX partials in order, as they sum v11's KS. PMAX and LMIN come
  from the shapes: LMIN = ceil((KTN - 1) / (PMAX - 1)) bounds a tile's pieces by PMAX whatever
  the routing count; PMAX = min(4, 1 + ceil((KTN - 1) / L_est)), L_est from the expected
  active experts (min(E, slots)), so LMIN binds only when fewer experts are routed.
* Where an expert holds more than BM slots the tile's K run is repeated per slot chunk (v11's
  loop), so a program's work is then more than its unit count: v12 balances bytes, not slots;
  at large T (every expert several chunks) v11's grid is the better shape.

Numerics: a piece sums its K tiles as v11's K loop does; the pieces and their boundaries depend
on n_act (the routing), so outputs are within the harness tolerance of the reference, not
v11's bits (v11 is not batch-invariant either: its splits follow T).

Measured (H200, session 11; README.md "v12"): 86.7 vs v11's 91.7 µs at T = 1, slower at every
other REAL T (a run crossing N tiles drains the K pipeline; a hot expert's run repeats per slot
chunk: 4x at skewed T 128). Not BEST: the balanced grid is worth ~5 % at T = 1 only.

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, D hidden, I expert FFN width;
KT = 256 inputs per K tile, KTN K tiles of a GEMM; NT N tiles of BN rows; PMAX partials).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, sm_count
from .triton_v3 import KT
from .triton_v7 import expert_tile, launch
from .triton_v9 import _router
from .triton_v11 import _silu
from .triton_v11 import tiles as _tiles_v11

_KT = tl.constexpr(KT)

def ctas_per_sm(R: int) -> int:
    """Resident CTAs of the GEMM an SM (sm_90, `sm90.py`): 168 registers x 128 threads and
    61.5 KB of shared memory at R <= 16 MMA columns (3), 86 KB at R = 32 (2)."""
    return 3 if R <= 16 else 2

MAX_PIECES = 4  # partials of one N tile at most (each costs the tile's rows of fp32 a pass)


@triton.jit
def _gemm_persistent_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                       w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                       n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, NT, LMIN,
                       K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                       TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                       OUT_BY_SLOT: tl.constexpr, PMAX: tl.constexpr, ABLATE: tl.constexpr,
                       INTERPRET: tl.constexpr):
    """Program p: units [p L, (p + 1) L) of n_act x NT x KTN (active expert, N tile, K tile),
    one `expert_tile` call per N tile it touches, its run stored as that tile's piece."""
    KTN = tl.cdiv(IN, _KT)
    units = tl.load(n_act_ptr) * NT * KTN
    L = tl.maximum(tl.cdiv(units, tl.num_programs(0)), LMIN)
    p = tl.program_id(0)
    u = p * L
    u_end = tl.minimum(u + L, units)
    while u < u_end:
        tile = u // KTN
        kt0 = u - tile * KTN
        kt1 = tl.minimum(KTN, kt0 + u_end - u)
        a = tile // NT
        piece = p - (tile * KTN) // L  # programs before p that hold a piece of this tile
        zero_to = tl.where(kt1 == KTN, PMAX, 0)  # the tile's last piece: zeros after it
        expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                    s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr,
                    s_ok, s_or, NOUT, NT1, IN, a, tile - a * NT, kt0, kt1, piece, zero_to, K,
                    BN, BM, NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT, True, ABLATE, INTERPRET)
        u += kt1 - kt0


def pieces(KTN: int, L_est: int, cap: int = MAX_PIECES) -> tuple[int, int]:
    """(PMAX, LMIN) for a GEMM of KTN K tiles whose programs expect L_est units each: a run of
    L >= LMIN units meets at most 1 + ceil((KTN - 1) / L) <= PMAX programs per N tile."""
    if KTN <= 1:
        return 1, 1
    pmax = min(cap, 1 + triton.cdiv(KTN - 1, max(1, L_est)))
    return pmax, triton.cdiv(KTN - 1, pmax - 1)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None,
          sms: int = 1) -> dict:
    """v11's tiles (BN, BM1 / BM2 by the expected slots) with v12's persistent split of GEMM
    n: PROGSn programs (sms x the CTAs an SM holds), KSn = PMAX (the partials the SiLU /
    combine sum) and LMINn. Shapes only (sms: 1 under the interpreter, so small shapes still
    split tiles)."""
    c = _tiles_v11(T, K, E, D, I, slots)
    A = max(1, min(E, T * K if slots is None else slots))  # active experts expected
    for n, (ktn, nt, R) in enumerate(
            ((triton.cdiv(D, KT), 2 * triton.cdiv(I, c["BN"]), c["BM1"]),
             (triton.cdiv(I, KT), triton.cdiv(D, c["BN"]), 2 * c["BM2"])), 1):
        c[f"PROGS{n}"] = progs = sms * ctas_per_sm(R)
        c[f"KS{n}"], c[f"LMIN{n}"] = pieces(ktn, triton.cdiv(A * nt * ktn, progs))
    return c


def persistent_gemm(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """GEMM n on PROGS persistent programs (`triton_v7.launch`'s gemm hook)."""
    _gemm_persistent_kernel[(c[f"PROGS{n}"],)](*args, NT, c[f"LMIN{n}"], PMAX=c[f"KS{n}"], **kw)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (tiles and the split);
    cfg: overrides of `tiles`' keys (PROGSn; KSn with LMINn must keep the bound of `pieces`),
    for sweeps and tests."""
    sms = sm_count(x.device.index or 0) if x.is_cuda and not INTERPRET else 1
    return launch(x, topk_ids, topk_weights, experts, validate, cfg,
                  functools.partial(tiles, slots=expected_slots, sms=sms),
                  down_select=True, router=_router, expected_slots=expected_slots,
                  silu=functools.partial(_silu, slots=expected_slots), gemm=persistent_gemm)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v12's launcher):

        python -m workbench.kernels.int4_moe.triton_v12 [--T 1,9,33] [--by-kernel]
            [--cfgs "base;PROGS1=264,PROGS2=264"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base;PROGS1=264,PROGS2=264")


if __name__ == "__main__":
    raise SystemExit(_main())
