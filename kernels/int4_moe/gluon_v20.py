"""int4_moe gluon_v20: v19's launches with its GEMMs' cold programs written in Gluon as an
explicit producer / consumer kernel (warp specialization): one producer warp keeps STAGES K
tiles in flight, one consumer warpgroup dequantises and multiplies with the next slab's
dequant under the previous slab's MMA.

Why (session 17, traces/gpu/session17/README.md, kernels/int4_moe/README.md "T 1's weight
stream without arithmetic"): v19's K loop, as Triton 3.6 lowers it,
* waits for each 64-deep slab's register-A wgmma to complete (`WARPGROUP.DEPBAR.LE gsb0, 0x0`
  four times a K tile) before the next slab's MMA, and
* issues the next tiles' TMA and the activations' cp.async at the end of the iteration, after
  the tile's arithmetic, one iteration later than their buffer was free;
and at T 1 the GEMMs take 68.4 µs where the same grids stream the weights in 53.2 µs with no
arithmetic (`scripts/probe_int4_stream.py`). Neither is a Triton knob (4 stages and 8 warps
were slower). Here:

    producer (1 warp)     for each (slot chunk, K tile): wait `empty[s]`; the chunk's gathered
                          activation rows [R, 256] as four [R, 64] slabs by cp.async, each
                          lane's copies tracked by `cp.async.mbarrier.arrive` on `ready[s]`
                          (issued first: their pending count is on the barrier before the
                          expect can complete the phase); expect the word and scale bytes;
                          TMA the words [BN, 32] and scales [BN, 8] (2-D boxes over the
                          checkpoint tensors viewed [E N, IN / 8] and [E N, IN / 32])
    consumer (4 warps)    for each tile: wait `ready[s]`; words and scales from shared memory
                          straight into the register layout of the wgmma A operand (no
                          conversion: `convert_layout(..., assert_trivial=True)`); per slab j:
                          v5's bf16x2 dequant (the same PTX), an async wgmma [BN, 64] x
                          [64, R], then `wait(1)`: slab j's MMA runs while slab j + 1 is
                          dequantised, and slab j - 1's A registers are free again; after the
                          tile, `wait(0)` and `empty[s]` is released
    epilogue              acc through shared memory (hi + lo summed as v7: one fp32 add) to
                          the same partial rows v7's program writes

Everything outside the cold GEMM programs is v19's: the router, the permute, the hinted
SiLU, the combine, the tiles and K splits, v16's hot launch for experts with more than HOT
slots. Numerics: each output row is the same chain of m64nRk16 wgmmas in the same K order
from zero as v7's program (v5's dequant PTX), so v19's bits are expected (a GPU test asserts
them).

Shapes: the scale boxes need 16-byte scale rows (IN % 256 == 0; v7's S_TMA). Where they are not
(never at Kimi widths), the GEMM runs v19's Triton program: a documented dispatch by shape,
as v7 dispatches its masked scale loads. Gluon has no interpreter: the variant needs an sm_90
GPU (`python -m workbench.kernels.int4_moe.gluon_v20 --compile` builds it on a CPU box).

Dimension legend: v5's; R = NH BM MMA columns (slot rows, hi and lo halves for down), STAGES
K tiles in flight.
"""

from __future__ import annotations

import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import triton_v5
from .triton_v11 import launch_hinted
from .triton_v16 import grid_gemm_hot, hot_launch, hot_mode
from .triton_v19 import tiles

# (K tiles in flight, registers a thread at launch) by (BN, R): two CTAs an SM at BN 128
# (88 KB of smem at R 16, 84 KB at R 32 with a stage fewer; 128 registers x 256 threads),
# three at BN 64 (74 KB, 80). A stage: BN x 128 B words, BN x 16 B scales, R x 512 B
# activations. Inside the fork the consumer warpgroup runs at 208 (BN 128) / 112 (BN 64)
# registers by setmaxnreg, the producer at 48. R 32 (v10's 32-slot gate/up tile past T 768,
# the down GEMM's 16-slot tile past T 192) only comes with BN 128 (v19 takes BN 64 at decode).
WS_OPTS = {(128, 16): (3, 128), (128, 32): (2, 128), (64, 16): (4, 80)}
ASM0, ASM1, ASM2, ASM3 = (gl.constexpr(a.value) for a in (triton_v5._ASM0, triton_v5._ASM1,
                                                           triton_v5._ASM2, triton_v5._ASM3))


# ------------------------------------------------------------------------------ layouts
# The wgmma A operand [BN, 64] bf16 (k_width 2) of one warpgroup is, as a linear layout,
# reg [0, 1] [8, 0] [0, 8] [0, 16] [0, 32] (+ [64, 0] at BN 128), lane [0, 2] [0, 4] [1, 0]
# [2, 0] [4, 0], warp [16, 0] [32, 0]. Slab position k = 2 w + h holds nibble j + 4 h of word
# w (v5's permuted order), with the scale of group k // 8: words [BN, 32] and scales [BN, 8]
# are loaded in the layouts whose broadcast to [BN, 32, 2] / [BN, 8, 8] reshapes to exactly
# that layout (checked at compile time by convert_layout(assert_trivial=True)).

@gluon.constexpr_function
def _rows(BN):
    return [[64, 0, 0]] if BN == 128 else []


@gluon.constexpr_function
def words_layout3(BN):
    """[BN, 32, 2]: (row, word, h) -> A's (row, 2 word + h)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0]] + _rows(BN),
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[BN, 32, 2])


@gluon.constexpr_function
def scales_layout3(BN):
    """[BN, 8, 8]: (row, group, i) -> A's (row, 8 group + i)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0], [0, 1, 0], [0, 2, 0], [0, 4, 0]] + _rows(BN),
        lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[BN, 8, 8])


@gluon.jit
def _dequant(p, s8, ASM: gl.constexpr, BN: gl.constexpr, A_L: gl.constexpr):
    """Slab [BN, 64] bf16 in A_L from words p [BN, 32] and scales s8 [BN, 8] (v5's PTX)."""
    pd = gl.convert_layout(gl.expand_dims(p, 2).broadcast_to([BN, 32, 2]).reshape([BN, 64]),
                           A_L, assert_trivial=True)
    sd = gl.convert_layout(gl.expand_dims(s8, 2).broadcast_to([BN, 8, 8]).reshape([BN, 64]),
                           A_L, assert_trivial=True)
    return gl.inline_asm_elementwise(ASM, "=r,r,r,r", [pd, sd], dtype=gl.bfloat16,
                                     is_pure=True, pack=2)


# ----------------------------------------------------------------------------- partitions

@gluon.jit
def _producer(w1_desc, s1_desc, w2_desc, s2_desc, w_s, s_s, x_s, bars, in_ptr, s_in, s_half,
              slots_ptr, start, cnt, e, n0, up, kt0, kt1, NOUT,
              K: gl.constexpr, BM: gl.constexpr, NH: gl.constexpr, BY_TOKEN: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp: every (slot chunk, K tile) of the program into stage i % STAGES."""
    R: gl.constexpr = NH * BM
    XP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])  # [R, 64], 16 B a copy
    i_r = gl.arange(0, R, layout=gl.SliceLayout(1, XP))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, XP))
    wrow = e * NOUT + n0  # the tile's first row of the [E N, .] views
    i = 0
    for m0 in range(0, cnt, BM):
        r = m0 + i_r % BM
        rm = r < cnt
        slot = gl.load(slots_ptr + start + r, mask=rm, other=0)
        if BY_TOKEN:
            row = slot // K
        else:
            row = start + r
        x0 = in_ptr + (row * s_in + (i_r // BM) * s_half)[:, None] + cols[None, :]
        xm = rm[:, None] & (cols >= 0)[None, :]
        for kt in range(kt0, kt1):
            s = i % STAGES
            mbarrier.wait(bars.index(STAGES + s), ((i // STAGES) & 1) ^ 1)  # empty[s]
            ready = bars.index(s)
            for j in gl.static_range(4):
                async_copy.async_copy_global_to_shared(x_s.index(4 * s + j), x0 + kt * 256
                                                       + 64 * j, mask=xm)
            async_copy.mbarrier_arrive(ready)  # before the expect: see the module docstring
            mbarrier.expect(ready, w1_desc.block_type.nbytes + s1_desc.block_type.nbytes)
            if up:
                tma.async_copy_global_to_shared(w2_desc, [wrow, kt * 32], ready, w_s.index(s))
                tma.async_copy_global_to_shared(s2_desc, [wrow, kt * 8], ready, s_s.index(s))
            else:
                tma.async_copy_global_to_shared(w1_desc, [wrow, kt * 32], ready, w_s.index(s))
                tma.async_copy_global_to_shared(s1_desc, [wrow, kt * 8], ready, s_s.index(s))
            i += 1


@gluon.jit
def _consumer(w_s, s_s, x_s, e_s, bars, out_ptr, s_ok, s_or, slots_ptr, start, cnt, n0, col0,
              ks, kt0, kt1, NOUT, BN: gl.constexpr, BM: gl.constexpr, NH: gl.constexpr,
              OUT_BY_SLOT: gl.constexpr, STAGES: gl.constexpr):
    """One warpgroup: the tiles' dequant and MMAs, then each chunk's partial rows."""
    R: gl.constexpr = NH * BM
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, R, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_L, k_width=2)
    LP: gl.constexpr = gl.SliceLayout(2, words_layout3(BN))
    LS: gl.constexpr = gl.SliceLayout(2, scales_layout3(BN))
    OL: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])  # [BN, BM], n fastest
    n_o = gl.arange(0, BN, layout=gl.SliceLayout(1, OL))
    nm = n0 + n_o < NOUT
    i = 0
    for m0 in range(0, cnt, BM):
        acc = gl.zeros([BN, R], gl.float32, MMA_L)
        for _kt in range(kt0, kt1):
            s = i % STAGES
            mbarrier.wait(bars.index(s), (i // STAGES) & 1)  # ready[s]
            fence_async_shared()  # the cp.async (generic proxy) activations, for the wgmma
            p = w_s.index(s).load(LP)  # [BN, 32] int32
            s8 = s_s.index(s).load(LS)  # [BN, 8] bf16
            a0 = _dequant(p, s8, ASM0, BN, A_L)
            acc = warpgroup_mma(a0, x_s.index(4 * s).permute((1, 0)), acc, is_async=True)
            a1 = _dequant(p, s8, ASM1, BN, A_L)  # under slab 0's MMA
            acc = warpgroup_mma(a1, x_s.index(4 * s + 1).permute((1, 0)), acc, is_async=True)
            acc, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0))
            a2 = _dequant(p, s8, ASM2, BN, A_L)
            acc = warpgroup_mma(a2, x_s.index(4 * s + 2).permute((1, 0)), acc, is_async=True)
            acc, a1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a1))
            a3 = _dequant(p, s8, ASM3, BN, A_L)
            acc = warpgroup_mma(a3, x_s.index(4 * s + 3).permute((1, 0)), acc, is_async=True)
            acc, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a2, a3))
            mbarrier.arrive(bars.index(STAGES + s), count=1)  # empty[s]: the slabs are read
            i += 1
        rs = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, OL))
        rsm = rs < cnt
        if OUT_BY_SLOT:
            orow = gl.load(slots_ptr + start + rs, mask=rsm, other=0)
        else:
            orow = start + rs
        e_s.store(acc)
        gl.thread_barrier()
        y = e_s.slice(0, BM, dim=1).load(OL)
        if NH == 2:  # hi + lo, one fixed-order fp32 add per output (v7)
            y = y + e_s.slice(BM, BM, dim=1).load(OL)
        out = (out_ptr + ks * s_ok + orow[None, :].to(gl.int64) * s_or
               + (col0 + n_o)[:, None])
        gl.store(out, y, mask=rsm[None, :] & nm[:, None])
        gl.thread_barrier()  # e_s is read before the next chunk stores


@gluon.jit
def _gemm_ws_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, slots_ptr,
                    act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, out_ptr, s_ok, s_or,
                    NOUT, NT1, IN, TPS, HOT, K: gl.constexpr, BN: gl.constexpr,
                    BM: gl.constexpr, NH: gl.constexpr, TWO: gl.constexpr,
                    BY_TOKEN: gl.constexpr, OUT_BY_SLOT: gl.constexpr, STAGES: gl.constexpr):
    """v7's program (N tile, active expert a, K split) with v7's arguments (descriptors as
    2-D views, see `descriptors`); HOT >= 0: experts with more than HOT slots are left to
    v16's hot launch."""
    a = gl.program_id(1)
    if a >= gl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    cnt = gl.load(act_cnt_ptr + a)
    if HOT >= 0:
        if cnt > HOT:
            return
    e = gl.load(act_e_ptr + a)
    start = gl.load(act_start_ptr + a)
    pid_n = gl.program_id(0)
    if TWO:  # tiles >= NT1 take the second projection (up), stored at columns NOUT..
        up = pid_n >= NT1
        n0 = gl.where(up, pid_n - NT1, pid_n) * BN
        col0 = gl.where(up, n0 + NOUT, n0)
    else:
        up = pid_n < 0  # never
        n0 = pid_n * BN
        col0 = n0
    ks = gl.program_id(2)
    kt0 = ks * TPS
    kt1 = gl.minimum(kt0 + TPS, gl.cdiv(IN, 256))
    R: gl.constexpr = NH * BM
    X_L: gl.constexpr = gl.NVMMASharedLayout.get_default_for([R, 64], gl.bfloat16)
    w_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 32], w1_desc.layout)
    s_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, 8], s1_desc.layout)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [4 * STAGES, R, 64], X_L)
    E_L: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    e_s = gl.allocate_shared_memory(gl.float32, [BN, R], E_L)
    bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2 * STAGES):  # ready[0..S), empty[S..2S)
        mbarrier.init(bars.index(b), count=1)
    gl.thread_barrier()  # the inits before the fork
    gl.warp_specialize([
        (_consumer, (w_s, s_s, x_s, e_s, bars, out_ptr, s_ok, s_or, slots_ptr, start, cnt, n0,
                     col0, ks, kt0, kt1, NOUT, BN, BM, NH, OUT_BY_SLOT, STAGES)),
        (_producer, (w1_desc, s1_desc, w2_desc, s2_desc, w_s, s_s, x_s, bars, in_ptr, s_in,
                     s_half, slots_ptr, start, cnt, e, n0, up, kt0, kt1, NOUT, K, BM, NH,
                     BY_TOKEN, STAGES)),
    ], [1], [48])  # one producer warp: `ready` counts one expect (lane 0) a phase


# ------------------------------------------------------------------------------ launcher

def descriptors(d, BN: int):
    """Gluon host descriptor over a v7 descriptor's tensor viewed 2-D ([E, N, W] ->
    [E N, W]: a tile's rows stay inside its expert when N % BN == 0, and rows past N only
    feed output rows the store masks), BN-row boxes of v7's width."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    t = d.base
    E, N, W = t.shape
    flat = t.view(E * N, W)  # contiguous only (`grid_gemm_ws` checks): a view, not a copy
    block = [BN, d.block_shape[2]]
    el = gl.int32 if t.element_size() == 4 else gl.bfloat16
    return TensorDescriptor(flat, [E * N, W], list(flat.stride()), block,
                            gl.NVMMASharedLayout.get_default_for(block, el))


def grid_gemm_ws(n: int, c: dict, r, NT: int, args: tuple, kw: dict,
                 opts: dict | None = None) -> None:
    """GEMM n (1 gate/up, 2 down) with its cold programs in `_gemm_ws_kernel` and v16's hot
    launch where `hot_mode`; scale rows that TMA cannot read (not S_TMA), weight tensors that
    are not contiguous [E, N, W] (the 2-D views) or a tile without stage options: v19's
    launches (module docstring). The Gluon programs take no cfg knobs (warps, stages, maxnreg)
    and no `nodequant` ablation: those reach the hot launch and v19's only. opts: the stage
    options by (BN, R) (WS_OPTS; gluon_v21 passes its own)."""
    opts = WS_OPTS if opts is None else opts
    bn, R = kw["BN"], kw["NH"] * kw["BM"]
    if (not kw["S_TMA"] or (bn, R) not in opts  # never at Kimi widths
            or not all(d.base.is_contiguous() for d in args[3:7])):
        return grid_gemm_hot(n, c, r, NT, args, kw)
    T = r.bad.shape[0]
    hot = hot_mode(c, T)
    stages, maxnreg = opts[bn, R]
    (in_ptr, s_in, s_half, w1, s1, w2, s2, _w1s, _w2s, _sse, _ssn, slots, act_e, act_start,
     act_cnt, n_act, out, s_ok, s_or, nout, nt1, n_in) = args
    # the down GEMM passes its one projection twice (v7's never-taken select): one view each
    views = {id(d): descriptors(d, bn) for d in (w1, s1, w2, s2)}
    _gemm_ws_kernel[(NT, r.max_active, c[f"KS{n}"])](
        in_ptr, s_in, s_half, views[id(w1)], views[id(s1)], views[id(w2)], views[id(s2)], slots, act_e, act_start, act_cnt, n_act, out, s_ok, s_or, nout,
        nt1, n_in, c[f"TPS{n}"], c["HOT"] if hot else -1, K=kw["K"], BN=bn, BM=kw["BM"],
        NH=kw["NH"], TWO=kw["TWO"], BY_TOKEN=kw["BY_TOKEN"], OUT_BY_SLOT=kw["OUT_BY_SLOT"],
        STAGES=stages, num_warps=4, maxnreg=maxnreg)
    if hot:
        hot_launch(n, c, r, args, kw)


def int4_moe_gluon(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                   validate: bool | None = None, cfg: dict | None = None,
                   expected_slots: int | None = None) -> Tensor:
    """v19's contract, tiles and launches (`triton_v19.int4_moe_triton`) with the GEMMs'
    cold programs in Gluon (`grid_gemm_ws`); cfg: tile overrides (keys of `tiles`)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, gemm=grid_gemm_ws)


__all__ = ["int4_moe_gluon", "grid_gemm_ws", "WS_OPTS"]


def compile_sm90(BN: int = 128, BM: int = 16, NH: int = 1, TWO: bool = True,
                 BY_TOKEN: bool = True, OUT_BY_SLOT: bool = False, K: int = 8,
                 opts: dict | None = None) -> dict:
    """sm_90 build of `_gemm_ws_kernel` on a machine without a GPU, with the constexprs and
    options `grid_gemm_ws` launches it with (gate/up: the defaults; down: BM 8, NH 2,
    BY_TOKEN False, OUT_BY_SLOT True) and a launch's 16-divisibility of the pointers and
    strides -> {regs, spill, smem, setmaxnreg, wgmma waits a K tile (PTX), ptx, cubin}; opts:
    the stage options (WS_OPTS by default)."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from workbench.kernels._sm90 import ptxas_stats

    fn = _gemm_ws_kernel
    stages, maxnreg = (WS_OPTS if opts is None else opts)[BN, NH * BM]

    def desc(block, el):
        lay = gl.NVMMASharedLayout.get_default_for(block, gl.int32 if el == "i32"
                                                   else gl.bfloat16)
        return f"tensordesc<{el}[{block[0]},{block[1]}],{lay!r}>"

    sig = {name: "i32" for name in fn.arg_names}
    sig.update(in_ptr="*bf16", slots_ptr="*i32", act_e_ptr="*i32", act_start_ptr="*i32",
               act_cnt_ptr="*i32", n_act_ptr="*i32", out_ptr="*fp32",
               w1_desc=desc([BN, 32], "i32"), w2_desc=desc([BN, 32], "i32"),
               s1_desc=desc([BN, 8], "bf16"), s2_desc=desc([BN, 8], "bf16"))
    const = dict(K=K, BN=BN, BM=BM, NH=NH, TWO=TWO, BY_TOKEN=BY_TOKEN,
                 OUT_BY_SLOT=OUT_BY_SLOT, STAGES=stages)
    sig.update({name: "constexpr" for name in const})
    div = ("in_ptr", "s_in", "s_half", "out_ptr", "s_ok", "s_or", "NOUT", "IN", "slots_ptr")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    ck = triton.compile(GluonASTSource(fn, signature=sig, constexprs=const, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "maxnreg": maxnreg})
    ptx = ck.asm["ptx"]
    regs, spill = ptxas_stats(ptx)
    return {"regs": regs, "spill": spill, "smem": ck.metadata.shared,
            "setmaxnreg": sorted({int(v) for v in re.findall(
                r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}, reverse=True),
            "waits": [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)],
            "wgmma": ptx.count("wgmma.mma_async"), "tma": ptx.count("cp.async.bulk.tensor"),
            "ptx": ptx, "cubin": ck.asm.get("cubin")}


def _main(argv=None, launcher=None, opts: dict | None = None) -> int:
    """`--compile`: the sm_90 builds of the four GEMM shapes v20 launches (no GPU needed);
    otherwise graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v20's
    launcher; `v=19` times v19 in the same process):

        python -m workbench.kernels.int4_moe.gluon_v20 --compile
        python -m workbench.kernels.int4_moe.gluon_v20 --T 1,9,17 --cfgs "v=19;base" --rounds 3
    launcher, opts: gluon_v21's (its launcher and stage options)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    opts = WS_OPTS if opts is None else opts
    if "--compile" in args:
        print("GEMM     BN   R  registers  spill  smem B  setmaxnreg      wgmma waits a K tile")
        down = dict(NH=2, BY_TOKEN=False, OUT_BY_SLOT=True)
        for (bn, R) in opts:
            for name, kw in (("gate/up", dict(BM=R)), ("down", dict(BM=R // 2, **down))):
                r = compile_sm90(BN=bn, opts=opts, **kw)
                sm = "/".join(map(str, r["setmaxnreg"]))
                print(f"{name:<8} {bn:>3} {R:>3}  {r['regs']:>9}  {r['spill']:>5}  "
                      f"{r['smem']:>6}  {sm:>14}  {r['waits']}")
        return 0
    from .triton_v5 import _main as v5_main

    return v5_main(args, launcher=launcher or int4_moe_gluon, default_cfgs="v=19;base")


if __name__ == "__main__":
    raise SystemExit(_main())
