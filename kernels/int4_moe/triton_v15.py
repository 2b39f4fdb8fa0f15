"""int4_moe triton_v15: v14's PDL chain with the two GEMMs' weight streams started before they
wait: each GEMM program first lets the next launch in (griddepcontrol.launch_dependents), then
asks L2 for the first PF K tiles of its weight rows and scales (cp.async.bulk.prefetch.L2, one
bulk request a row), and only then waits for its predecessor (griddepcontrol.wait); the SiLU
lets the down GEMM in before it waits too (`_common.pdl_start`'s EARLY order).

Why (H200, session 14, traces/gpu/session14/README.md): at T = 1 v13's two GEMMs stream the 8
experts' 198 MB at 64.6 % (gate/up, 0.65 waves) and 47.5 % (down, 1.13 waves) of DRAM
bandwidth under ncu; with v14's wait-then-trigger order a GEMM's CTAs can only start their
loads once the previous launch has finished and flushed, so HBM idles through every launch's
tail and the next one's ramp. The weights never depend on the previous launch: only on which
experts are active, and the router has finished before either GEMM is launched (below).
With the trigger first, the down GEMM's CTAs become resident in the SMs the gate/up GEMM
leaves free (T = 1: 256 of ~396 CTA slots) and pull their weights into L2 while gate/up and
the SiLU still run; the gate/up GEMM's do so while the permute runs.

Safety (the order of the chain): router (ordinary launch) -> permute (waits, then triggers:
v14's order) -> gate/up -> SiLU -> down -> combine (v14's order). A launch starts only after
every CTA of its predecessor has triggered; the permute triggers only after its wait, i.e.
after the router finished and flushed, so both GEMMs start after the router's writes (the
active experts, their starts and counts) are in L2. Before its wait a GEMM program reads only
those (`.cg`: from L2, never a stale L1 line) and issues prefetches, which write nothing; every
read of a predecessor's output (x permuted, g, h) still follows the program's own wait, and
each predecessor waited for its own. The prefetch is a hint: its bytes go to L2 only, so what
a program computes is v13's (v13's bits, `test_pdl_versions_bitwise_v13_gpu`).

PF (a tile knob, `tiles`; 0 = no prefetch: v14's chain with the early SiLU and GEMM
triggers): K tiles of KT = 256 inputs a row, i.e. 128 bytes of words and 16 of scales a tile,
clamped to the program's split. Under the interpreter (no PDL) v15 is v13.

Measured (session 15, README.md "v14 and v15"): slower than v13 at every T, and the more it
prefetches the slower (T 9: 458 / 491 / 501 / 544 µs at PF 0 / 2 / 4 / 8 against v13's 462):
the early CTAs' L2 requests compete with the running GEMM's stream, which is at 85-88 % of
copy from T 9, and are partly evicted before use. Kept as a measured negative.

Dimension legend: v5's (T tokens, K slots, S = T K, E experts, D hidden, I expert FFN width;
KT inputs a K tile; BN weight rows a program; TPS K tiles a split).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .triton_v3 import KT
from .triton_v7 import expert_tile
from .triton_v11 import launch_hinted
from .triton_v13 import tiles as _tiles_v13

PF = 4  # K tiles prefetched a row before the wait (the first guess; PF 0 / 2 / 8 no better)
_KT = tl.constexpr(KT)  # a K tile a row: KT / 2 bytes of words, KT / 16 of bf16 g32 scales


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """v13's tiles and splits, plus PF. Shapes only (graph-safe)."""
    return _tiles_v13(T, K, E, D, I, slots) | dict(PF=PF)


@triton.jit
def _prefetch_l2(ptr, nbytes):
    """Ask L2 for nbytes (a multiple of 16) from ptr (16-byte aligned), elementwise: one bulk
    prefetch a tensor element, nothing written anywhere (sm_90 PTX)."""
    return tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
        [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_rows(w_ptr, s_ptr, rows, kt0, nt, s_pn, s_sn, S_TMA: tl.constexpr):
    """Rows `rows` [BN] of one expert's words (w_ptr: int32 words, row stride s_pn) and scales
    (s_ptr: bf16, row stride s_sn; only where their rows are 16-byte aligned, S_TMA): K tiles
    kt0 .. kt0 + nt - 1."""
    wb = tl.full(rows.shape, 0, tl.int32) + nt * (_KT // 2)
    _prefetch_l2(w_ptr + rows.to(tl.int64) * s_pn + kt0 * (_KT // 8), wb)
    if S_TMA:
        sb = tl.full(rows.shape, 0, tl.int32) + nt * (_KT // 16)
        _prefetch_l2(s_ptr + rows.to(tl.int64) * s_sn + kt0 * (_KT // 32), sb)


@triton.jit
def _gemm_kernel(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                 s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                 out_ptr, s_ok, s_or, NOUT, NT1, IN, TPS, w1p_ptr, w2p_ptr, s_pe, s_pn,
                 K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                 TWO: tl.constexpr, S_TMA: tl.constexpr, BY_TOKEN: tl.constexpr,
                 OUT_BY_SLOT: tl.constexpr, ABLATE: tl.constexpr, INTERPRET: tl.constexpr,
                 PF: tl.constexpr, PDL: tl.constexpr = False):
    """v7's program (N tile, active expert, K split) behind v15's prologue: trigger, prefetch
    the first PF K tiles of the program's weight rows, wait (module docstring). w1p / w2p:
    the words of w1_desc / w2_desc's tensors ([E, N, IN / 8] int32, strides s_pe, s_pn)."""
    a = tl.program_id(1)
    ks = tl.program_id(2)
    kt0 = ks * TPS
    kt1 = tl.minimum(kt0 + TPS, tl.cdiv(IN, _KT))
    if PDL:
        gdc_launch_dependents()
        if PF > 0:
            # the router finished before this launch started: its outputs are in L2
            if a < tl.load(n_act_ptr, cache_modifier=".cg"):
                e = tl.load(act_e_ptr + a, cache_modifier=".cg").to(tl.int64)
                pid_n = tl.program_id(0)
                n0 = pid_n * BN
                wp = w1p_ptr
                sp = w1s_ptr
                if TWO:
                    if pid_n >= NT1:
                        n0 = (pid_n - NT1) * BN
                        wp = w2p_ptr
                        sp = w2s_ptr
                rows = tl.minimum(n0 + tl.arange(0, BN), NOUT - 1)  # rows past NOUT: row NOUT-1
                nt = tl.minimum(kt1 - kt0, PF)
                _prefetch_rows(wp + e * s_pe, sp + e * s_se, rows, kt0, nt, s_pn, s_sn, S_TMA)
        gdc_wait()
    if a >= tl.load(n_act_ptr):  # idle program of the worst-case grid
        return
    expert_tile(in_ptr, s_in, s_half, w1_desc, s1_desc, w2_desc, s2_desc, w1s_ptr, w2s_ptr,
                s_se, s_sn, slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, out_ptr, s_ok,
                s_or, NOUT, NT1, IN, a, tl.program_id(0), kt0, kt1, ks, 0, K, BN, BM, NH, TWO,
                S_TMA, BY_TOKEN, OUT_BY_SLOT, False, ABLATE, INTERPRET)


def grid_gemm(n: int, c: dict, r, NT: int, args: tuple, kw: dict) -> None:
    """v7's grid (N tile, active expert, K split) on v15's program: the words' tensors come
    from the launch's TMA descriptors (args[3], args[5])."""
    w1p, w2p = args[3].base, args[5].base
    if w1p.stride() != w2p.stride():  # gate and up share one word offset computation
        raise ValueError(f"experts.up_packed: expected the strides of its gate twin "
                         f"{w1p.stride()}, got {w2p.stride()}")
    _gemm_kernel[(NT, r.max_active, c[f"KS{n}"])](
        *args, c[f"TPS{n}"], w1p, w2p, w1p.stride(0), w1p.stride(1), PF=c["PF"], **kw)


def int4_moe_triton(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                    validate: bool | None = None, cfg: dict | None = None,
                    expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16, topk_ids [T, K] int32/int64 (-1: not routed here), topk_weights [T, K]
    float, experts (Int4Experts, checkpoint layout; weight words 16-byte aligned) -> [T, D]
    bf16; the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`; expected_slots: the routed slots expected (v13's tiles and splits);
    cfg: tile overrides (keys of `tiles`: PF=0 is v14's chain with the early triggers)."""
    return launch_hinted(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots,
                         tiles, pdl=True, early=True, gemm=grid_gemm)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, v15's launcher):

        python -m workbench.kernels.int4_moe.triton_v15 [--T 1,9,33] [--by-kernel]
            [--cfgs "base;PF=0;PF=2;PF=8"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_triton, default_cfgs="base;PF=0;PF=2;PF=8", pdl=True)


if __name__ == "__main__":
    raise SystemExit(_main())
