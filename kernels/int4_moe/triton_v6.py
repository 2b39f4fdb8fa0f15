"""int4_moe triton_v6: v5 made batch-invariant. A token's output does not depend on how many
tokens share the launch (T) or on which experts the other tokens use, so AR decoding (T = C
rows) and DDTree verify (T = C (budget + 1) rows) give bitwise-identical rows.

What depended on T in v5 (README.md, "v6", has the full list and the cost model):
* the split-K counts KS1 / TPS1, KS2 / TPS2 came from `_splits(..., programs)` with programs
  ~ A = min(E, T K): at T = 1 a row's K sum was (c0 + c1 + c2 + c3) of 4 partials summed by the
  SiLU kernel, at T >= 9 one accumulator over all 28 tiles: another fp32 association;
* BM2 = 8 if S <= 4 E else 16 changed the down GEMM's wgmma from m64n16 to m64n32.

v6 fixes both from the weight shapes alone:
* **chunks**: the K tiles of each weight matrix are cut into chunks of CH tiles, CH from
  (K tiles, output tiles, top-k) only (`chunking`; Kimi: gate/up 4 chunks of 7 tiles, down
  3 chunks of 3, 3, 2: v5's T = 1 splits). A row's result is always
  total = ((0 + c0) + c1) + c2 ... in fp32 over its chunks in chunk order, each chunk
  accumulated from zero in the same MMA sequence (tile order, 4 slabs of K 64, hi + lo summed
  once per chunk for the down GEMM). The launch picks the parallelism from T without changing
  that association: SPLIT (one program per (N tile, expert, chunk), per-chunk partials reduced
  in chunk order by the SiLU / combine kernels, as v5's split-K) when the grid is small, FUSED
  (one program per (N tile, expert) looping over all chunks in one pipelined K loop: the MMA
  accumulator restarts at a chunk's first tile, the chunk is added to a running fp32 total at
  its last) otherwise. Both run the same kernel code: a program's K range is PT tiles (SPLIT:
  PT = CH, FUSED: PT = all tiles), the chunk boundaries are absolute (kt % CH).
* **slot tile fixed**: BM1 = 16 (gate/up, m64n16) and BM2 = 8 (down, hi + lo = 16 MMA columns,
  m64n16) at every T: v5's small-T shapes. An expert with more slots loops over slot chunks
  (each re-streams its weight slice; the cost at T >= 256 is in the README).
Everything else is v5's (packed bf16x2 dequant, K order, hi + lo down GEMM, fixed-order
combine, cp.async pipeline, maxnreg 168).

Remaining assumption (GPU-tested, not provable on CPU): a wgmma output column's value depends
only on its own A row, B column and accumulator, not on the other columns of the instruction
(a slot's column position inside the BM tile still follows the routing). The restart itself is
the same code in both modes (a select to zero before a chunk's first tile: Triton 3.6 turns it
into the wgmma's use_acc flag on sm_100 only), so a chunk always starts from a zeroed register. `tests/test_int4_moe_kernel.py::test_v6_batch_invariance_gpu` checks
the rows bitwise at Kimi shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, check_inputs, next_pow2, route, with_cfg
from .triton_v3 import KT, PROGRAMS, WS_BYTES, _combine_kernel
from .triton_v5 import _ablate, _k_tile, _permute_kernel, _silu_kernel, dequant  # noqa: F401

_KT = tl.constexpr(KT)


@triton.jit
def _halves(acc, NH: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """[BN, NH BM] MMA columns -> [BN, BM]: hi + lo, one fixed-order fp32 add (NH = 2)."""
    if NH == 2:
        return tl.sum(tl.reshape(acc, (BN, 2, BM)), axis=1)
    else:
        return acc


@triton.jit
def _gemm_kernel(in_ptr, s_in, s_half,
                 w1p_ptr, w1s_ptr, w2p_ptr, w2s_ptr, s_pe, s_pn, s_se, s_sn,
                 slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, PT,
                 CH: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                 BY_TOKEN: tl.constexpr, OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """v5's program (N tile, active expert, K range of PT tiles) with the K reduction in fixed
    chunks of CH tiles: out[ks] = ((0 + c0) + c1) + ... over the chunks of the range, chunk c
    accumulated from zero over its tiles. PT is a multiple of CH (or covers all tiles)."""
    a = tl.program_id(1)
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    pid_n = tl.program_id(0)
    ks = tl.program_id(2)
    e = tl.load(act_e_ptr + a).to(tl.int64)
    start = tl.load(act_start_ptr + a)
    cnt = tl.load(act_cnt_ptr + a)
    if pid_n < NT1:
        wp = w1p_ptr
        wsc = w1s_ptr
        n0 = pid_n * BN
        col0 = n0
    else:
        wp = w2p_ptr
        wsc = w2s_ptr
        n0 = (pid_n - NT1) * BN
        col0 = n0 + NOUT
    n = n0 + tl.arange(0, BN)  # [BN] weight rows
    nm = n < NOUT
    p_row = wp + e * s_pe + n[:, None].to(tl.int64) * s_pn  # [BN, 1]
    s_row = wsc + e * s_se + n[:, None].to(tl.int64) * s_sn
    words = IN // 8
    nt = tl.cdiv(IN, _KT)  # all K tiles; the chunks are [c CH, (c + 1) CH) of these
    kt0 = ks * PT
    kt1 = tl.minimum(kt0 + PT, nt)
    kf = tl.minimum(kt1, IN // _KT)  # full tiles end here; [kf, kt1) is the masked tail
    i = tl.arange(0, NH * BM)  # [R] MMA columns: slot i % BM, half i // BM
    for m0 in range(0, cnt, BM):
        r = m0 + i % BM
        rm = r < cnt
        slot = tl.load(slots_ptr + start + r, mask=rm, other=0)
        if BY_TOKEN:
            row = slot // K
        else:
            row = start + r
        # int32 offsets (the launcher bounds the buffers below 2^31 elements): fewer registers
        in_off = (row * s_in + (i // BM) * s_half)[:, None] + tl.arange(0, 64)[None, :]
        zero = tl.zeros([BN, NH * BM], tl.float32)
        acc = zero
        total = tl.zeros([BN, BM], tl.float32)
        for kt in range(kt0, kf):
            if kt % CH == 0:  # a chunk's first tile restarts the MMA chain: 8 FSEL per tile
                acc = zero  # (Triton 3.6 runs its use_acc pass on sm_100 only)
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kt, words, False, BN, ABLATE,
                          INTERPRET)
            if ((kt + 1) % CH == 0) | (kt + 1 == nt):  # a chunk's last tile: add the chunk
                total += _halves(acc, NH, BN, BM)  # to the running total (a branch: 8 FADD)
        if kf < kt1:  # the tail tile (the last of all), outside the pipelined loop
            if kf % CH == 0:
                acc = zero
            acc = _k_tile(acc, p_row, s_row, in_ptr, in_off, rm, nm, kf, words, True, BN, ABLATE,
                          INTERPRET)
            total += _halves(acc, NH, BN, BM)
        rs = m0 + tl.arange(0, BM)
        rsm = rs < cnt
        if OUT_BY_SLOT:
            orow = tl.load(slots_ptr + start + rs, mask=rsm, other=0)
        else:
            orow = start + rs
        out = (out_ptr + ks * s_ok + orow[None, :].to(tl.int64) * s_or
               + (col0 + tl.arange(0, BN))[:, None])
        tl.store(out, total, mask=rsm[None, :] & nm[:, None])


# ------------------------------------------------------------------------------------ launcher


def chunking(n_tiles_k: int, n_tiles_n: int, topk: int) -> int:
    """K tiles per chunk of one weight matrix, from its shape and the model's top-k only (never
    T or the routing): v5's split at T = 1 (one active expert per slot), i.e. enough chunks for
    PROGRAMS programs when A = topk. Kimi: gate/up (28 tiles, 64 N tiles) -> 7; down (8, 112) -> 3."""
    ks = max(1, min(n_tiles_k, -(-PROGRAMS // (n_tiles_n * topk))))
    return -(-n_tiles_k // ks)


def tiles(T: int, K: int, E: int, D: int, I: int) -> dict:
    """Shapes only (graph-safe). CH1 / CH2 (tiles per chunk) depend on the weights' shapes and
    top-k alone; SPLIT1 / SPLIT2 (one program per chunk) on T, which only moves work between
    programs, never the association."""
    S = T * K
    A = min(E, S)
    BN = 64
    nk1, nk2 = triton.cdiv(D, KT), triton.cdiv(I, KT)
    nn1, nn2 = 2 * triton.cdiv(I, BN), triton.cdiv(D, BN)
    ch1, ch2 = chunking(nk1, nn1, K), chunking(nk2, nn2, K)

    def split(nk, ch, nn, ws):  # v5's rule: split while the grid is short of PROGRAMS
        chunks = triton.cdiv(nk, ch)
        return chunks > 1 and nn * A < PROGRAMS and chunks * ws <= WS_BYTES

    return dict(BN=BN, BM1=16, BM2=8, CH1=ch1, CH2=ch2,
                SPLIT1=split(nk1, ch1, nn1, S * 2 * I * 4), SPLIT2=split(nk2, ch2, nn2, S * D * 4),
                warps=4, stages=4, maxnreg=168)


def _grid_k(IN: int, ch: int, split: bool) -> tuple[int, int]:
    """(programs along K, tiles per program) for a matrix of IN inputs in chunks of ch tiles."""
    nk = triton.cdiv(IN, KT)
    return (triton.cdiv(nk, ch), ch) if split else (1, nk)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    buffers: dict | None = None, expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout, used as is) -> [T, D] bf16; the contract of
    `workbench.reference.int4_moe.int4_moe`; `validate` see `_common.check_inputs`.
    cfg: tile overrides (keys of `tiles`), for sweeps and tests (CHn changes the association,
    SPLITn and stages / warps / maxnreg do not). buffers: a dict that receives the fp32
    intermediates g [KS1, S, 2I] (expert-sorted positions), y [KS2, S, D] (slot order) and
    the routing, for tests."""
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots)
    gp, gs, up, us, dp, ds = experts
    T, D = x.shape
    K = topk_ids.shape[1]
    E, I = gp.shape[0], gp.shape[1]
    if T == 0:
        return torch.empty(0, D, dtype=x.dtype, device=x.device)
    for a, b, name in ((gp, up, "up_packed"), (gs, us, "up_scale")):
        if a.stride() != b.stride():  # gate and up share one offset computation
            raise ValueError(f"experts.{name}: expected the strides of its gate twin "
                             f"{a.stride()}, got {b.stride()}")
    c = with_cfg(tiles(T, K, E, D, I), cfg)
    S, Dp, Ip = T * K, triton.cdiv(D, KT) * KT, triton.cdiv(I, KT) * KT
    if max(T * Dp, S * 2 * Ip) >= 2**31:  # the GEMM's activation offsets are int32
        raise ValueError(f"x: expected T * K * 2 * ceil(I / {KT}) * {KT} < 2^31 activation "
                         f"elements, got T={T}, K={K}, I={I}")
    ks1, pt1 = _grid_k(D, c["CH1"], c["SPLIT1"])
    ks2, pt2 = _grid_k(I, c["CH2"], c["SPLIT2"])
    dev = x.device
    run = dict(num_warps=c["warps"], num_stages=c["stages"], maxnreg=c["maxnreg"])
    ablate = _ablate()
    r = route(topk_ids, E)
    xp = torch.empty(T, Dp, dtype=torch.bfloat16, device=dev)  # [T, Dp] permuted x
    _permute_kernel[(T, Dp // KT)](x, x.stride(0), x.stride(1), xp, D, Dp, num_warps=4)
    g = torch.empty(ks1, S, 2 * I, dtype=torch.float32, device=dev)  # [KS1, S, 2I] sorted
    nt1 = triton.cdiv(I, c["BN"])
    _gemm_kernel[(2 * nt1, r.max_active, ks1)](
        xp, Dp, 0, gp, gs, up, us, gp.stride(0), gp.stride(1), gs.stride(0), gs.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, g, g.stride(0), g.stride(1),
        I, nt1, D, pt1, CH=c["CH1"], K=K, BN=c["BN"], BM=c["BM1"], NH=1, BY_TOKEN=True,
        OUT_BY_SLOT=False, ABLATE=ablate, INTERPRET=INTERPRET, **run)
    h = torch.empty(S, 2, Ip, dtype=torch.bfloat16, device=dev)  # [S, 2, Ip] permuted hi, lo
    _silu_kernel[(S, Ip // KT)](g, g.stride(0), I, Ip, h, KS=ks1, INTERPRET=INTERPRET,
                                num_warps=2)
    y = torch.empty(ks2, S, D, dtype=torch.float32, device=dev)  # [KS2, S, D] slot order
    nt2 = triton.cdiv(D, c["BN"])
    _gemm_kernel[(nt2, r.max_active, ks2)](
        h, 2 * Ip, Ip, dp, ds, dp, ds, dp.stride(0), dp.stride(1), ds.stride(0), ds.stride(1),
        r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, y, y.stride(0), y.stride(1),
        D, nt2, I, pt2, CH=c["CH2"], K=K, BN=c["BN"], BM=c["BM2"], NH=2, BY_TOKEN=False,
        OUT_BY_SLOT=True, ABLATE=ablate, INTERPRET=INTERPRET, **run)
    out = torch.empty(T, D, dtype=torch.bfloat16, device=dev)
    BD = min(1024, next_pow2(D))
    _combine_kernel[(T, triton.cdiv(D, BD))](
        y, y.stride(0), topk_weights, topk_weights.stride(0), topk_weights.stride(1),
        topk_ids, topk_ids.stride(0), topk_ids.stride(1), r.bad, out,
        D, K=K, KS=ks2, BD=BD, INTERPRET=INTERPRET, num_warps=4)
    if buffers is not None:
        buffers.update(g=g, h=h, y=y, routing=r)
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (triton_v5's CLI, v6's launcher):

        python -m workbench.kernels.int4_moe.triton_v6 [--T 1,9,33,128,512]
            [--cfgs "base;SPLIT1=0,SPLIT2=0;BM2=16"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base")


if __name__ == "__main__":
    raise SystemExit(_main())
