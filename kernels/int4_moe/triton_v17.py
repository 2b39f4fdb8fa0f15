"""int4_moe triton_v17: v16 with, at small T, the SiLU done by the gate/up GEMM's last program
of each (expert, 256-column block) and the combine by the down GEMM's last program of each N
tile: four launches instead of six.

Why (H200, v13 at T 1, `--by-kernel`, sessions 12-15): of 83 µs graph-replayed, the GEMMs are
~70, the router 2.8, the permute 1.2, the SiLU 1.9, the combine 2.9, and the gaps between the
six launches the rest (~4.5). Decode (T 1) and the C 1 verify (T 9 / 17) are the loop's most
frequent calls: an EP8 rank's AR step calls the op 60 times at ~30 µs each, so a launch and
its gap are ~10 % of a call there.

    permute launch    v5's permute, and program (0, 0) zeroes the group counters (one int32
                      a silu group, then one a down N tile) for this call
    gate/up GEMM      v16's program; then every program of an active expert counts itself
                      into its group (expert a, block b = the 256 permuted h columns that
                      gate tiles 2b, 2b + 1 and up tiles 2b, 2b + 1 of BN 128 feed, over all
                      K splits); the program that completes the group computes the SiLU of the
                      expert's slot positions at block b (`triton_v11.silu_position`)
    down GEMM         v16's program; then every program of the grid (idle ones too: they
                      write nothing) counts itself into its N tile's group; the one that
                      completes it combines all T tokens at the tile's BN columns
                      (`triton_v3.combine_cols`) and stores the bf16 output

Only where T <= FUSE_T (32; shapes only, graph-safe): the completing program's epilogue is
serial in T (a down tile's last program reads T K BN fp32 partials). Above it, v16's launches.
Ordering: a program's partial stores, a CTA barrier, then one acq_rel atomic at gpu scope (a
release of the stores its threads made, CUTLASS's semaphore pattern); the completing program's
reads are ".cg" (L2: rows other SMs wrote in this launch). Which program completes a group
varies from run to run; what it computes does not: the same fixed-order arithmetic as v11's
SiLU kernel and v3's combine kernel (shared helpers), so the output is v16's (v13's) bit for
bit (a GPU test asserts it).

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, A active experts, D hidden, I
expert FFN width; BN weight rows a program; KT = 256 inputs a K tile; NT1 N tiles of one
gate/up projection, NT2 of the down GEMM, NB = ceil(NT1 BN / KT) SiLU blocks an expert).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_expected_slots, next_pow2, with_cfg
from .triton_v3 import KT, _to_bf16, combine_cols
from .triton_v5 import _permute_kernel, _src
from .triton_v7 import prepare, split_tile
from .triton_v11 import _router, silu_position
from .triton_v16 import int4_moe_triton as _v16
from .triton_v16 import tiles as _tiles_v16

_KT = tl.constexpr(KT)
FUSE_T = 32  # the most tokens whose SiLU and combine ride on the GEMMs' last programs


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v16's tiles plus FUSE_T. Shapes only (graph-safe)."""
    return _tiles_v16(T, K, E, D, I, slots) | dict(FUSE_T=FUSE_T)


def fused(c: dict, T: int) -> bool:
    """Whether v17 runs its four launches (else v16's six): T <= FUSE_T, and the slot tile's
    N tiles nest in the SiLU's 256-column blocks (BN divides KT). Shapes only."""
    return T <= c["FUSE_T"] and KT % c["BN"] == 0


@triton.jit
def _permute_zero_kernel(x_ptr, s_xt, s_xd, xp_ptr, D, Dp, cnt_ptr, NCNT,
                         BC: tl.constexpr):
    """v5's permute; program (0, 0) also zeroes the NCNT group counters."""
    _permute_kernel(x_ptr, s_xt, s_xd, xp_ptr, D, Dp)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        for c0 in range(0, NCNT, BC):
            i = c0 + tl.arange(0, BC)
            tl.store(cnt_ptr + i, tl.zeros([BC], tl.int32), mask=i < NCNT)


@triton.jit
def _arrive(cnt_ptr, target):
    """Count this program into its group; True for the one that completes it. The barrier
    puts every thread's stores before the release (the atomic is one thread's)."""
    tl.debug_barrier()
    return tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == target - 1


@triton.jit
def _gemm_silu_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                      w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                      n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS, cnt_ptr, h_ptr, Ip,
                      K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                      TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                      OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
                      INTERPRET: tl.constexpr, KS: tl.constexpr):
    """The gate/up GEMM (out = g [KS, S, 2 NOUT]), then the SiLU of its group's block (h [S,
    2, Ip]) by the group's last program. Idle programs (a >= n_act) do nothing: their groups
    are idle whole."""
    a = tl.program_id(1)
    if a < tl.load(n_act_ptr):
        split_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                   w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                   out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS, a, tl.program_id(2), K, BN, BM,
                   NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT, ABLATE, INTERPRET)
        TPB: tl.constexpr = _KT // BN  # N tiles a block
        pid = tl.program_id(0)
        b = tl.where(pid >= NT1, pid - NT1, pid) // TPB  # gate and up tiles share a block
        nb = tl.cdiv(NT1, TPB)
        target = 2 * tl.minimum(TPB, NT1 - b * TPB) * tl.num_programs(2)
        if _arrive(cnt_ptr + a * nb + b, target):
            start = tl.load(act_start_ptr + a)
            o = b * _KT + tl.arange(0, _KT)  # [KT] permuted h columns of block b
            src = _src(o)
            m = src < NOUT
            for pos in range(start, start + tl.load(act_cnt_ptr + a)):
                silu_position(out_ptr, s_ok, NOUT, Ip, h_ptr, tl.cast(pos, tl.int64), o, src,
                              m, KS, INTERPRET, True)


@triton.jit
def _gemm_combine_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                         w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr,
                         act_cnt_ptr, n_act_ptr, out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS,
                         cnt_ptr, T, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr, o_ptr,
                         K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                         NH: tl.constexpr, TWO: tl.constexpr, S_TMA: tl.constexpr,
                         BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
                         ABLATE: tl.constexpr, INTERPRET: tl.constexpr, KS: tl.constexpr):
    """The down GEMM (out = y [KS, S, NOUT] in slot order), then the combine of all T tokens
    at this N tile's columns (o [T, NOUT] bf16) by the tile's last program; every program of
    the grid counts (the group is the grid's (active expert, K split) plane)."""
    a = tl.program_id(1)
    if a < tl.load(n_act_ptr):
        split_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr,
                   w2s_ptr, s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr,
                   out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS, a, tl.program_id(2), K, BN, BM,
                   NH, TWO, S_TMA, BY_TOKEN, OUT_BY_SLOT, ABLATE, INTERPRET)
    pid = tl.program_id(0)
    if _arrive(cnt_ptr + pid, tl.num_programs(1) * tl.num_programs(2)):
        d = pid * BN + tl.arange(0, BN)  # [BN] output columns
        dm = d < NOUT
        for t in range(0, T):
            t64 = tl.cast(t, tl.int64)
            acc = combine_cols(out_ptr, s_ok, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr,
                               NOUT, t64, d, dm, K, KS, True)
            tl.store(o_ptr + t64 * NOUT + d, _to_bf16(acc, INTERPRET), mask=dm)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (v13's tiles and splits);
    cfg: tile overrides (keys of `tiles`: FUSE_T too)."""
    small = (x.dim() == 2 and topk_ids.dim() == 2 and len(experts) == 6
             and experts[0].dim() == 3 and 0 < x.shape[0] <= (cfg or {}).get("FUSE_T", FUSE_T))
    if small:  # else v16 (its checks name a bad argument)
        T, K = topk_ids.shape
        check_expected_slots(expected_slots, T, K)  # before the tiles read it
        E, I = experts[0].shape[:2]  # gate words [E, I, D / 8]
        small = fused(with_cfg(tiles(T, K, E, x.shape[1], I, expected_slots), cfg), T)
    if not small:
        return _v16(x, topk_ids, topk_weights, experts, validate=validate, cfg=cfg,
                    expected_slots=expected_slots)
    p = prepare(x, topk_ids, topk_weights, experts, validate, cfg,
                functools.partial(tiles, slots=expected_slots), _router, expected_slots)
    return _launch_fused(x, topk_ids, topk_weights, experts, p)


def _launch_fused(x, topk_ids, topk_weights, experts, p) -> Tensor:
    """The four launches: permute (+ counters), gate/up GEMM (+ SiLU), down GEMM (+ combine)
    after the router; v16's arguments and knobs otherwise."""
    gs, us, ds = experts[1], experts[3], experts[5]
    c, r, dev, T, D, I, S, Dp, Ip = p.c, p.r, p.dev, p.T, p.D, p.I, p.S, p.Dp, p.Ip
    (w1, w2, w3), (s1, s2, s3), (st1, st2) = p.wd, p.sd, p.st
    nt1, nt2 = triton.cdiv(I, c["BN"]), triton.cdiv(D, c["BN"])
    n_silu = r.max_active * triton.cdiv(nt1, KT // c["BN"])
    cnt = torch.empty(n_silu + nt2, dtype=torch.int32, device=dev)  # zeroed by the permute
    xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)  # [T, Dp] permuted x
    _permute_zero_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, cnt,
                                        cnt.numel(), BC=min(1024, next_pow2(cnt.numel())),
                                        num_warps=4)
    g = torch.empty(c["KS1"], S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    h = torch.empty(S, 2, Ip, dtype=torch.bfloat16, device=dev)  # [S, 2, Ip] permuted hi, lo
    _gemm_silu_kernel[(2 * nt1, r.max_active, c["KS1"])](
        xp, Dp, 0, w1, s1, w2, s2, gs, us, gs.stride(0), gs.stride(1), *p.meta, g, g.stride(0),
        g.stride(1), I, nt1, D, c["TPS1"], cnt, h, Ip, BM=c["BM1"], NH=1, TWO=True, S_TMA=st1,
        BY_TOKEN=True, OUT_BY_SLOT=False, KS=c["KS1"], **p.common)
    y = torch.empty(c["KS2"], S, D, dtype=torch.float32, device=dev)  # [KS2, S, D] slot order
    out = torch.empty(T, D, dtype=torch.bfloat16, device=dev)
    _gemm_combine_kernel[(nt2, r.max_active, c["KS2"])](
        h, 2 * Ip, Ip, w3, s3, w3, s3, ds, ds, ds.stride(0), ds.stride(1), *p.meta, y,
        y.stride(0), y.stride(1), D, nt2, I, c["TPS2"], cnt[n_silu:], T, topk_weights,
        topk_weights.stride(0), topk_weights.stride(1), topk_ids, topk_ids.stride(0),
        topk_ids.stride(1), r.bad, out, BM=c["BM2"], NH=2, TWO=True, S_TMA=st2,
        BY_TOKEN=False, OUT_BY_SLOT=True, KS=c["KS2"], **p.common)
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v17's launcher):

        python -m workbench.kernels.int4_moe.triton_v17 [--T 1,9,17] [--cfgs "v=16;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="v=16;base")


if __name__ == "__main__":
    raise SystemExit(_main())
