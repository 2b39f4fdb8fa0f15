"""int4_moe cuda_v24: cuda_v21 with the hot experts' gate/up (past WB slots) on a warp-specialised
tensor-core launch: a CTA tile of 256 weight rows x 128 slots, one producer warpgroup filling a
ring by TMA bulk copies, two consumer warpgroups on wgmma with register-A dequant
(cuda_v24.cu's `hot_tc_body`), the activations gathered once a call into the tile's image
(`int4_moe_xgather`).

Why (session 52 call 1, H100 80GB, skewed T 512 at WS 0, `python3 -m
workbench.kernels.int4_moe.cuda_v19 --T 512 --skew 1.2 --by-kernel --cfgs "base;WS=0;..."`):
cuda_v21's cold gate/up launch streams at copy speed (ncu: 1445 µs, DRAM 90 %), while its hot
launches take 921.5 + 228.6 µs of the whole GPU (ncu: DRAM 36 %, issue-active 46 %, 22 % of
an SM's warps); cuda_v19's wgmma form 802 + 233 µs at 32-slot passes, 755 + 232 at 64 (8 warps
an SM, every pass dequantising the expert's weights again). Beside the cold launch (WS 1) they
stretch it from ~1445 to ~2230 µs: the gate/up phase is 2404 of the op's ~3840 µs, where its
bytes at copy speed take ~1850. At up to 128 slots a pass each weight is dequantised once for
that many slots (the REAL bench's draws: ~2900 slots past 16 on 38-43 experts, 48-53 passes),
the tensor cores take the rest (~170 GFLOP; 245-278 µs at tensor peak on 128 CTAs, README),
and one thread moves a 50 KB stage.

What: cuda_v21's op, tiles and dispatch with `launch_bands_tc` as the hot hook: at TC 1 (the
default) the experts past WB (or WT without a band) take `int4_moe_xgather` then the TC launch
(TST ring stages: 4 = 200 KB, one CTA an SM; TY CTA columns, 0: as many as fill the SMs), both
on WS's side stream; cuda_v12's band (9-16 slots) stays cuda_v10's launch. TC 0: cuda_v21's
launches and bits. Numerics: cuda_v19's wgmma form (W = bf16((q - 8) s), fp32 sums inside
wgmma in K order): the reference's tolerance. Graph-safe: xg is allocated from shapes (C x
(S + 128) rows of 128 B) before the fork and held until the join. GPU only (cupy, nvcc 12+
for sm_90a). Dimension legend: cuda_v1.cu's, cuda_v10.cu's, cuda_v19.cu's and cuda_v24.cu's.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from workbench.streams import Side

from . import cuda_v1, cuda_v10, cuda_v12, cuda_v17, cuda_v19, cuda_v21, mma_layout
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

_SRC = os.path.join(os.path.dirname(__file__), "cuda_v24.cu")
TC_DEFAULTS = {"TC": 1, "TST": 4, "TNT": 16, "TY": 0}
P = 128  # the most slots a pass (cuda_v24.cu's TC_P): the stage's activation rows
WU = 8  # consumer warps (row units) a CTA (TC_WU)
THREADS = 384  # the producer warpgroup and two consumer warpgroups
STAGE = 2 * P * 128 + WU * (2048 + 256)  # TC_STG: a stage's activations, weights and scales
KERNEL_ARGS = ("u64 w_ptr, u64 s_ptr, u64 xg_ptr, u64 act_e_ptr, u64 act_start_ptr, "
               "u64 act_cnt_ptr, u64 n_act_ptr, u64 h_ptr, int NU, int C, int SR, int ldo, "
               "int ht, int hi, int max_items")


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v21's tiles and TC_DEFAULTS."""
    return cuda_v21.tiles(T, K, E, D, I, slots) | TC_DEFAULTS


def kernel_name(st: int, nt: int, pw: int = 1, tyh: int = 0) -> str:
    """The TC kernel of ring depth st, nt n-tiles a pass, pw producer warps (cuda_v25's TPW),
    half the columns past tyh items a column (cuda_v26's TYH; 0: never); this version's
    launch: pw 1, tyh 0."""
    return (f"int4_moe_hot_tc_{st}_{nt}" + (f"_p{pw}" if pw != 1 else "")
            + (f"_h{tyh}" if tyh else ""))


def source(configs=()) -> str:
    """cuda_v1.cu + cuda_v10.cu + cuda_v19.cu + cuda_v24.cu and one extern "C" kernel a (ring
    depth, n-tiles a pass[, producer warps: 1[, TYH: 0]]) of `configs`
    (__launch_bounds__(384, 1) around `hot_tc_body`)."""
    code = cuda_v19.source(files=(_SRC,))
    for st, nt, *form in configs:
        pw, tyh = (*form, *(1, 0)[len(form):])  # the defaults of those not given
        code += (f'extern "C" __global__ void __launch_bounds__({THREADS}, 1) '
                 f"{kernel_name(st, nt, pw, tyh)}({KERNEL_ARGS}) {{\n"
                 f"  hot_tc_body<{st}, {nt}, {pw}, {tyh}>(w_ptr, s_ptr, xg_ptr, act_e_ptr, "
                 "act_start_ptr, act_cnt_ptr, n_act_ptr, h_ptr, NU, C, SR, ldo, ht, hi, "
                 "max_items);\n}\n")
    return code


@functools.cache
def _kernel_tc(st: int, nt: int, pw: int = 1, tyh: int = 0):
    return cuda_v19.module(source(((st, nt, pw, tyh),))).get_function(
        kernel_name(st, nt, pw, tyh))


@functools.cache
def _gather_kernel():
    return cuda_v19.module(source()).get_function("int4_moe_xgather")


def smem_bytes(st: int, items: int) -> int:
    """The TC launch's dynamic shared memory: alignment slack, the ring, the item list."""
    return cuda_v19.SMEM_PAD + st * STAGE + -(-4 * items // 16) * 16


def check_tc(c: dict, S: int, E: int) -> None:
    """The TC knobs in ranges the kernel compiles and fits (names the cfg key)."""
    _require(c.get("TC", 1) in (0, 1), "cfg['TC']", "0 or 1", c.get("TC"))
    _require(c["TST"] in range(2, 5), "cfg['TST']", "2 .. 4 (ring stages of 50 KB)", c["TST"])
    _require(c["TNT"] in (4, 8, 16), "cfg['TNT']", "4, 8 or 16 (8-slot n-tiles a pass)",
             c["TNT"])
    _require(isinstance(c["TY"], int) and c["TY"] >= 0, "cfg['TY']", "an int >= 0 (0: as many "
             "CTA columns as fill the SMs)", c["TY"])
    items = cuda_v10.max_items(S, E, c["WT"], 8 * c["TNT"])
    _require(smem_bytes(c["TST"], items) <= cuda_v10.SMEM_MAX + cuda_v19.SMEM_PAD, "cfg",
             "TST ring stages and the item list within 227 KB", {"TST": c["TST"], "items": items})
    _require(S // (8 * c["TNT"]) < 2**16 and E < 2**15, "x", "fewer than 2^16 passes and 2^15 experts "
             "(the item list's 16-bit fields)", (S, E))


def xg_empty(p, KP: int, device) -> Tensor:
    """An uninitialised xg [C, S + P, 64] bf16 (cuda_v24.cu's layout: S + P rows a chunk, so a
    pass's bulk copy of 128 rows never leaves it)."""
    return torch.empty(KP // mma_layout.CHUNK, p.S + P, 64, dtype=torch.bfloat16, device=device)


def xgather_reference(xq: Tensor, p, ht: int, KP: int) -> Tensor:
    """The CPU twin of `int4_moe_xgather` (tests): xg as the kernel writes it for the routing
    metadata p.meta = (slots, act_e, act_start, act_cnt, n_act) of p.K-wide top-k rows, the
    slots of experts past ht slots; NaN where the kernel writes nothing (other experts' rows,
    the padding rows)."""
    slots, _, act_start, act_cnt, n_act = (t.cpu() for t in p.meta)
    C = KP // mma_layout.CHUNK
    xp = cuda_v19.xperm_reference(xq.cpu(), p.D, KP)  # [T, KP] logical-k order
    xg = torch.full((C, p.S + P, 8, 8), float("nan"), dtype=torch.bfloat16)
    for a in range(int(n_act[0])):
        start, cnt = int(act_start[a]), int(act_cnt[a])
        if cnt <= ht:
            continue
        for s in range(start, start + cnt):
            words = xp[int(slots[s]) // p.K].view(C, 8, 8)  # [chunk][16-byte word][8 inputs]
            xg[:, s, torch.arange(8) ^ ((s - start) & 7)] = words  # word w lands at w ^ r
    return xg.view(C, p.S + P, 64)


def xgather(xq: Tensor, p, ht: int, KP: int, xg: Tensor | None = None) -> Tensor:
    """xg (cuda_v24.cu's layout; `xg_empty` where none is given) with the rows of the slots of
    experts past ht slots written, on the current stream (the other rows left as they were)."""
    cuda_v19.check_rows16(xq)
    xg = xg_empty(p, KP, xq.device) if xg is None else xg
    slots, _, act_start, act_cnt, n_act = p.meta
    if p.S:
        args = (xq, slots, act_start, act_cnt, n_act, xg, p.S + P, p.K, xq.stride(0), p.D, KP,
                ht, 2**31 - 1)
        cuda_v1.run_kernel(_gather_kernel(), (p.S,), (128,), cuda_v1.kernel_args(args), 0)
    return xg


def launch_tc(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int, h: Tensor,
              ht: int, pw: int = 1, tyh: int = 0):
    """The experts past ht slots: `xgather` then the TC launch (pw producer warps, TYH tyh), on
    WS's side stream (cuda_v10's SIDE_KEY, forked after xg is allocated); returns the join
    (which also releases xg)."""
    KP = C1 * mma_layout.CHUNK
    items = cuda_v10.max_items(p.S, p.E, ht, 8 * c["TNT"])
    smem = smem_bytes(c["TST"], items)
    gx = -(-NU1 // WU)
    gy = c["TY"] or max(1, min(cuda_v1.SMS // gx, items))
    xg = xg_empty(p, KP, xq.device)  # on the current stream, held until the join
    side = Side(h.device, bool(c.get("WS", 0)), key=cuda_v10.SIDE_KEY, priority=-100)
    side.fork()

    def run():
        xgather(xq, p, ht, KP, xg)
        args = (w1, s1, xg, *p.meta[1:], h, NU1, C1, p.S + P, p.Ip, ht, 2**31 - 1, items)
        cuda_v1.run_kernel(_kernel_tc(c["TST"], c["TNT"], pw, tyh), (gx, gy), (THREADS,),
                           cuda_v1.kernel_args(args), smem)

    side.run(run)
    held = [xg]

    def join():
        side.join()
        held.clear()  # the side stream is joined: xg's memory may be reused from here

    return join


def launch_bands_tc(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
                    h: Tensor, check=check_tc, pw: int = 1, tyh: int = 0,
                    tlo: int = 0) -> tuple:
    """cuda_v4's `hot` hook: at TC 0, or where no expert can be hot, cuda_v12's `launch_bands`
    (cuda_v21's); else the TC launch (pw producer warps, TYH tyh) for the experts past WB (WT
    where WB is 0) and cuda_v12's band launch (cuda_v10's kernel) for WT + 1 .. WB, both on
    WS's stream; returns (the cold launch's SKIP, WT; a join of both). check: the version's
    knob check (cuda_v25's adds TPW, cuda_v26's TYH). tlo > 0 (cuda_v26's TLO): the experts of
    WB (WT) + 1 .. tlo slots on cuda_v10's hot launch at c's hot knobs (cuda_v21's launch for
    them), the TC launch past tlo only."""
    tc = c.get("TC", 1)
    _require(tc in (0, 1), "cfg['TC']", "0 or 1", tc)
    if not tc or not c["WIDE"] or p.S <= c["WT"]:
        return cuda_v12.launch_bands(c, p, xq, w1, s1, NU1, C1, h)
    check(c, p.S, p.E)
    cuda_v10.check_hot(c, p.S, p.E)  # the cold launch's WT / WS / WIDE, by name
    wb = c.get("WB", 0)
    joins = []
    if wb:
        _require(isinstance(wb, int) and wb > c["WT"], "cfg['WB']",
                 f"0 or an int > WT ({c['WT']})", wb)
        band = cuda_v12.band_knobs(c)
        cuda_v10.check_hot(band, p.S, p.E)
    lo = wb or c["WT"]  # the TC launch's experts: past lo slots (past tlo with a middle tier)
    mid = c | {"WT": lo, "WHI": tlo}  # the middle tier (tlo > lo: the version's check)
    if tlo:
        cuda_v10.check_hot(mid, p.S, p.E)  # named before any launch
    joins.append(launch_tc(c, p, xq, w1, s1, NU1, C1, h, tlo or lo, pw, tyh))
    if tlo:
        joins.append(cuda_v10.launch_hot(mid, p, xq, w1, s1, NU1, C1, h)[1])
    if wb:
        joins.append(cuda_v10.launch_hot(band, p, xq, w1, s1, NU1, C1, h)[1])

    def join():
        for j in joins:
            if j is not None:
                j()

    return c["WT"], join


# the op and its CLI: cuda_v21's dispatch and tiles, the hot experts past WB on the TC launch
int4_moe_cuda, _main = cuda_v17.on_tiles(tiles, "v=cuda_v21;base;TC=0", hot_for=launch_bands_tc)


if __name__ == "__main__":
    raise SystemExit(_main())
