"""int4_moe cuda_v4: cuda_v2's gate/up GEMM (CUDA mma.sync on repacked weights, the scales on
the groups' fp32 partials, the SiLU fused) and triton_v34's down GEMM and combine (Triton, the
checkpoint layout): each GEMM from the version that streams it faster.

Why (H200, session 25 call 5, `--by-kernel`, traces/gpu/session25/call5_int4_xb_T.txt): at
T 9 / 17 / 33 / 65 on 384 experts cuda_v2's gate/up took 275.6 / 500.8 / 739.6 / 1193.7 µs
against v34's 292.6 / 528.1 / 793.4 / 1303.0, while v34's down took 151.3 / 275.3 / 418.6 /
688.4 against cuda_v2's 165.0 / 319.5 / 481.5 / 776.9. The pair of the faster halves is
expected 4-6 % under v34 from T 9 (the SiLU launch goes too: the CUDA epilogue writes h).

How: v34's router (`triton_v24._router` on v34's tiles: v34's metadata above 8 tokens; at 8 or
fewer this routes sorted where v34 routes unsorted beside its permute, which cuda_v4 does not
need: the CUDA GEMM reads x by token). The gate/up GEMM writes h straight into the rows v34's
down GEMM reads (cuda_v1.cu's HOUT 1: [S, 2, Ip] hi | lo, each 256-input tile permuted as
`triton_v5._src`), then `triton_v7.down_combine` runs v34's down launch and combine.

Load step: only gate / up are repacked (`mma_layout.replace_with_repacked(holder,
("gate_up",))`, REPACKED below); down stays in the checkpoint layout.

Measured (H200, session 26, traces/gpu/session26/README.md): the full-size EP8 step, kernel
ms, ABA against v34 in the same call: C 1 AR 5.244 / 5.255 vs 5.453, C 1 DDTree-16 14.02 /
14.01 vs 14.26, C 8 AR 9.01 / 9.01 vs 9.15, C 8 DDTree-16 29.67 / 29.64 vs 29.65: the engine
preset's int4_moe from session 26. The REAL bench is mixed: faster than v34 at uniform T 1-128
in calls 2-3 (T 17 791-818 vs 824-832 µs), slower at T 512 and under skewed routing from T 17
(an expert's slots past 8 re-stream its weights: skewed T 33 802-834 vs 763; two n-tiles a
pass past 8 expected slots, NN1 2, took T 512 from 4916 to 4021-4094 µs, v34 2988-3424).
Not BEST.

Numerics: h is cuda_v2's (W = (q - 8) s in fp32 on the partials, h hi + lo as triton_v3's
split), the down GEMM and combine are v34's bits on that h. Tolerance against the reference.
GPU only (cupy for the CUDA launch). Knobs (one cfg dict): cuda_v1's gate/up keys (KW1, RW1,
NN1, U1, PF01, PF1, XB1; CU_A_GRID its expert grid; IT1 cuda_v1.cu's ITEMS, off: slower, see
`tiles`; L2D cuda_v6's L2 prefetch of the down experts, off) and v34's keys for the down GEMM
and combine (A_GRID its grid).
Dimension legend: cuda_v1.cu's (CUDA) and triton_v16's (Triton).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import cuda_v1, mma_layout
from ._common import _require
from .triton_v7 import down_combine, prepare
from .triton_v24 import _router as _router_v24
from .triton_v26 import expected_active
from .triton_v29 import grid_gemm_idle_last
from .triton_v34 import tiles as tiles_v34

REPACKED = ("gate_up",)  # the GEMMs whose experts the load step repacks (emulate.load_for)
# cfg keys of the CUDA GEMM (IT1: cuda_v1.cu's ITEMS, (expert, pass) work items; 0: by expert)
CUDA_KEYS = ("KW1", "RW1", "NN1", "U1", "PF01", "PF1", "XB1", "IT1")


def h_column(i: int) -> int:
    """The column of h's input i in triton_v5's permuted row (`_src`'s inverse): where
    cuda_v1.cu's HOUT 1 epilogue stores it (a CPU mirror, tested against triton_v5)."""
    ii = i % 256
    return i - ii + 64 * (ii % 4) + 2 * (ii // 8) + (ii // 4) % 2


def l2_blocks(experts) -> tuple:
    """(down words, down scales, bytes an expert of each): the checkpoint blocks the gate/up
    CTAs ask L2 for under cuda_v6's L2D (cuda_v1.cu's `l2_share`: 16-byte aligned and sized,
    each expert's block contiguous)."""
    out = []
    for t in experts[4:6]:
        nb = t[0].numel() * t.element_size()
        _require(t[0].is_contiguous() and t.stride(0) * t.element_size() == nb and nb % 16 == 0
                 and t.data_ptr() % 16 == 0, "experts", "contiguous 16-byte aligned down "
                 "blocks an expert (cfg L2D 1)", f"strides {t.stride()} of {t.dtype}")
        out.append((t, nb))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v1's gate/up knobs (its expert grid as CU_A_GRID) and
    v34's tiles for everything else. Where an active expert expects more than one 8-slot
    n-tile (T 512 on 384 experts: ~10.7), two n-tiles a pass (NN1 2: 16 slots a weight
    stream instead of 8), at 12 warps an SM and two K parts a unit (KW1 2: at one the K loop
    spills to local memory, sm_90 SASS)."""
    cu = cuda_v1.tiles(T, K, E, D, I, slots)
    # IT1 0: session 26 call 4 measured the work items (IT1 1) slower everywhere (T 33 uniform
    # 1868 vs 1374 µs): every CTA walks all the active experts' counts, and a CTA is short
    c = {k: cu[k] for k in CUDA_KEYS if k in cu} | {"CU_A_GRID": cu["A_GRID"], "IT1": 0}
    S = T * K if slots is None else slots
    pairs = mma_layout.dims(I, D, True)[1] // 2
    if S > 8 * max(1.0, expected_active(E, S)) and pairs % 2 == 0:
        c |= {"NN1": 2, "KW1": 2, "RW1": 2}
    return tiles_v34(T, K, E, D, I, slots) | c


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None, tiles_for=None, hot=None,
                  tail=None) -> Tensor:
    """x [T, D] bf16 (CUDA), topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights
    [T, K] float, experts (Int4Experts: gate / up in the checkpoint layout or repacked in
    place, down in the checkpoint layout) -> [T, D] bf16: the contract of
    `workbench.reference.int4_moe.int4_moe`; `validate` see `_common.check_inputs`. cfg:
    overrides of `tiles`' keys, for sweeps; tiles_for: a later version's tile rule (cuda_v5 / v6),
    with `tiles`' signature; hot: cuda_v10's second gate/up launch, hot(c, p, xq, w1, s1, NU1,
    C1, h) -> (the SKIP threshold of this launch (0: none), join), called before it; join
    (None, or a callable taking no argument) runs after it, before the down GEMM (a hot launch
    on a side stream joins the current one there); tail: what follows the cold launch, tail(p,
    h, join, topk_ids, topk_weights, experts) -> the output (cuda_v13's down GEMM in two
    launches; default: join, then `down_combine`)."""
    _require(x.device.type == "cuda", "x", "a CUDA tensor (cuda_v4 launches CUDA C++ through cupy)",
             f"a tensor on {x.device}")
    p = prepare(x, topk_ids, topk_weights, experts, validate, cfg,
                functools.partial(tiles_for or tiles, slots=expected_slots), router=_router_v24,
                expected_slots=expected_slots, gate_up=False)
    if p is None:
        return torch.empty(0, x.shape[1], dtype=x.dtype, device=x.device)
    c, D, I, K = p.c, p.D, p.I, p.K
    cuda_v1.check_cfg(c, (1,))
    _require(c["IT1"] in (0, 1), "cfg", "IT1 in (0, 1)", c["IT1"])
    l2d = c.get("L2D", 0)  # cuda_v6's knob: the gate/up CTAs ask L2 for down's active experts
    _require(l2d in (0, 1) and not (l2d and c["IT1"]), "cfg", "L2D in (0, 1), 0 with IT1 1",
             {"L2D": l2d, "IT1": c["IT1"]})
    tb1 = check_tb1(c)
    xq, (w1, s1, NU1, C1) = cuda_v1.operands_gate_up(x, experts, c)
    # [S, 2, Ip] hi | lo in v34's permuted rows; padding inputs past I must read as zeros
    alloc = torch.empty if p.Ip == I else torch.zeros
    h = alloc(p.S, 2, p.Ip, dtype=torch.bfloat16, device=x.device)
    skip, join = hot(c, p, xq, w1, s1, NU1, C1, h) if hot else (0, None)
    # SKIP 0 is "skip none" to the cold kernel, so a hot launch past 0 slots (WT 0: every expert
    # on it) must not be joined by a cold launch writing the same rows of h: two writers of
    # unequal numerics made the output depend on which finished last (session 53)
    if join is None or skip > 0:
        cuda_v1._launch(0, 1, D % mma_layout.KALIGN != 0, c | {"A_GRID": c["CU_A_GRID"]}, NU1,
                        (w1, s1, xq, xq, *p.meta, h, h, K, NU1, C1, xq.stride(0), D, I, p.Ip),
                        hout=1, items=c["IT1"], l2=l2_blocks(experts) if l2d else (0, 0, 0, 0),
                        skip=skip, bk=tb1)
    return (tail or down_tail)(p, h, join, topk_ids, topk_weights, experts)


def down_tail(p, h: Tensor, join, topk_ids: Tensor, topk_weights: Tensor, experts,
              gemm=grid_gemm_idle_last) -> Tensor:
    """The default `tail`: the join, then the down GEMM through the launch hook gemm
    (triton_v7's signature; cuda_v22 binds another) and the combine."""
    if join is not None:
        join()
    return down_combine(p, h, topk_ids, topk_weights, experts[5], gemm, down_select=True,
                        dep={})


def check_tb1(c: dict) -> int:
    """cuda_v21's knob TB1 (absent: 0): the cold gate/up launch's weight ring in TB1 stages
    filled by TMA bulk copies (cuda_v1.cu's BK) instead of U1 cp.async stages. It takes the
    ring branch, so U1 >= 3; it has no L2 prefetch (PF01 / PF1 0) and no item list (IT1 0:
    that instance spills in its K loop)."""
    tb1 = c.get("TB1", 0)
    _require(tb1 == 0 or (isinstance(tb1, int) and 2 <= tb1 <= 8), "cfg['TB1']",
             "0 or an int in 2..8 (bulk ring stages)", tb1)
    if tb1:
        _require(c["U1"] >= 3 and c.get("PF01", 0) == 0 and c.get("PF1", 0) == 0
                 and c["IT1"] == 0, "cfg", "U1 >= 3, PF01 0, PF1 0 and IT1 0 with TB1 "
                 "(the bulk ring replaces the cp.async ring and its L2 prefetch)",
                 {k: c.get(k, 0) for k in ("TB1", "U1", "PF01", "PF1", "IT1")})
        ring = cuda_v1.ring_bytes(c["KW1"], c["RW1"], c["U1"], tb1)
        _require(ring <= 227 * 1024, "cfg", "KW1 x RW1 x TB1 x 2312 bytes <= 227 KB", ring)
    return tb1


def on_tiles(tiles_of, default_cfgs: str):
    """(int4_moe_cuda, _main) of a later version that is this op on its own tile rule
    `tiles_of` (`tiles`' signature): cuda_v5, cuda_v6."""

    def op(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
           validate: bool | None = None, cfg: dict | None = None,
           expected_slots: int | None = None) -> Tensor:
        return int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate, cfg=cfg,
                             expected_slots=expected_slots, tiles_for=tiles_of)

    op.__name__ = op.__qualname__ = "int4_moe_cuda"
    op.__module__ = tiles_of.__module__  # the version's op (its CLI's knob check reads it)
    op.__doc__ = f"cuda_v4's op (contract, checks, launches) on {tiles_of.__module__}'s tiles."

    def main(argv=None) -> int:
        from .triton_v5 import _main as v5_main

        return v5_main(argv, launcher=op, default_cfgs=default_cfgs)

    main.__doc__ = (f"Graph-replayed µs per T x config (v5's CLI on {tiles_of.__module__}'s "
                    f"launcher, default --cfgs {default_cfgs!r}).")
    return op, main


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v4's launcher):

        python -m workbench.kernels.int4_moe.cuda_v4 [--ep 8] [--T 9,17,33]
            [--cfgs "v=34;v=cuda_v2;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=34;v=cuda_v2;base")


if __name__ == "__main__":
    raise SystemExit(_main())
