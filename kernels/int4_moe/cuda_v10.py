"""int4_moe cuda_v10: cuda_v9 (one-token calls: cuda_v8's one launch) and, past one token,
cuda_v5 with the gate/up GEMM of the hot experts -- more than WT slots -- on a second CUDA
launch of wide n-tiles (cuda_v10.cu's `int4_moe_hot`), the CUDA launch (cuda_v1.cu's SKIP)
taking the others.

Why (H200, session 33 call 1, traces/gpu/session33, `python -m
workbench.kernels.int4_moe.cuda_v5 --T 17,65,128,512 --skew 1.2 --cfgs "v=triton_v34;base"
--rounds 3 --by-kernel`): cuda_v5's CUDA gate/up took 292-304 / 790-862 / 1300-1327 /
3257-3760 µs at skewed T 17 / 65 / 128 / 512 against triton_v34's 279-299 / 721-743 /
1026-1047 (+48) / 1551-1637 (+465-503), and 2644-2793 against 1779-1823 at uniform T 512: a
cuda_v5 warp streams its expert's weights once a pass of 8 slots (16 at NN1 2) and every
32-row unit reads its slots' activations itself.

What: a hot CTA takes WU row units of one pass of up to 8 WNT slots of a hot expert; the
pass's activations are staged once a CTA in shared memory beside each warp's weight ring, so
an expert's weights stream once a pass of 32 (64) slots and an activation row is read once a
CTA. Cold experts keep cuda_v5's launch at one 8-slot n-tile (NN1 1: with
the hot launch no cold expert holds more than WT <= 8 slots by default).
Knobs (cfg; `tiles` sets them by shape): WIDE (1; 0: cuda_v5's launches and bits exactly), WT
(8; 16 up to 32 tokens), WU (8), WNT (n-tiles a pass: 4; 8 from 8 slots expected an expert),
WST (stages: 6; 5 at WNT 8), WMB (CTAs an SM the kernel's registers allow: 2 at WNT 2, else 1;
2 at WNT 4 fits 116 registers: session 34 found it faster at uniform T 512, slower at
skewed T 512; cuda_v11 takes it there; up to 8 where HOT_REGS fit, e.g. WNT 2 at 3 CTAs of 8
warps or 6 of 4), WY (CTA columns; default: one wave of the
resident CTAs, at most the items possible), WS (0; 1: the hot launch on a high-priority side
stream, concurrent with the cold launch and joined before the down GEMM: the same kernels and
bits; hot CTAs that find no item leave their SM to cold CTAs at once).
WHI (None: every expert past WT hot; an int: only those of at most WHI slots, cuda_v12's band
launch).
Numerics: cold experts cuda_v5's (POST 1: the scales on the groups' fp32 partials); hot ones
cuda_v1's dequant (POST 0: W = bf16((q - 8) s), the reference's rounding) with K summed in
input order in one warp; h hi + lo, the down GEMM and the combine triton_v34's. A token's
bits depend on how many slots its experts got in the call (hot or cold): tolerance against
the reference, as triton_v16's hot split (not batch invariant).
Graph-safe: grids and shared memory from shapes only (the hot list bound below), no sync.
Load step: cuda_v5's (gate / up repacked in place). GPU only (cupy).
Dimension legend: cuda_v1.cu's and cuda_v10.cu's.
"""

from __future__ import annotations

import functools
import os

from torch import Tensor

from workbench.streams import Side

from . import cuda_v1, cuda_v4, cuda_v5, cuda_v8, cuda_v9, mma_layout
from ._common import _require
from .cuda_v4 import REPACKED  # noqa: F401  (the load step reads REPACKED)

# WNT 4 / WST 6: five stages in flight (92 KB a CTA; session 33 call 3's WST 4 kept 55 KB, ~22 GB/s
# an SM) and WNT 4 the fastest of 2 / 4 / 8 at skewed T 128 (call 4: 1688 vs triton_v34's 1700 µs);
# `tiles` changes WT, WNT and WST where call 4 measured another form faster
WIDE_DEFAULTS = {"WIDE": 1, "WT": 8, "WU": 8, "WNT": 4, "WST": 6}
WIDE_KEYS = (*WIDE_DEFAULTS, "WY", "WMB", "WS")
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v10.cu")
SIDE_KEY = "int4_moe_hot"  # WS 1's side stream (workbench.streams.Side)
SMEM_MAX = 227 * 1024 - 1024  # a CTA's opt-in dynamic shared memory, the kernel's 128 static B kept


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v5's tiles and WIDE_DEFAULTS; where cuda_v4's rule gives
    two n-tiles a pass (NN1 2: more than 8 slots expected an expert), cuda_v1's one-n-tile
    knobs instead, the hot launch taking every expert past WT. Session 33 call 4 (by kernel,
    skewed routing, medians of 3): up to 32 tokens WT 16 (T 17: 459.3 vs 477.2 µs: a few
    experts of 9-16 slots do not pay for the hot launch's ramp); where T K >= 8 E (8 slots
    expected an expert: T 512 on 384 experts) WNT 8 / WST 5 (3770 vs 3929 µs skewed, 3952 vs
    3960 uniform)."""
    c = cuda_v5.tiles(T, K, E, D, I, slots) | WIDE_DEFAULTS
    if c["NN1"] == 2:
        cu = cuda_v1.tiles(T, K, E, D, I, slots)
        c |= {"NN1": 1, "KW1": cu["KW1"], "RW1": cu["RW1"]}
    if T <= 32:
        c["WT"] = 16
    if T * K >= 8 * E:
        c |= {"WNT": 8, "WST": 5}
    return c


def max_items(S: int, E: int, ht: int, P: int) -> int:
    """An upper bound of the hot work items of any routing of S slots over E experts: each
    hot expert (> ht slots: at most min(E, S // (ht + 1)) of them) takes ceil(cnt / P) <
    cnt / P + 1 passes."""
    return S // P + min(E, S // (ht + 1)) + 1


def smem_bytes(WU: int, NT: int, ST: int, items: int) -> int:
    """cuda_v10.cu's dynamic shared memory: WU weight rings, the activation ring, the list."""
    return ST * (WU * 6 * 32 * 16 + 8 * NT * 256) + -(-4 * items // 16) * 16


def min_blocks(c: dict) -> int:
    """cuda_v10.cu's MB (CTAs an SM its launch bounds ask registers for): cfg WMB, else 2 at
    WNT 2 and 1 above (the kernel's default)."""
    return c.get("WMB") or (2 if c["WNT"] <= 2 else 1)


def ctas_an_sm(mb: int, smem: int) -> int:
    """Hot CTAs resident an SM: MB, or as many as the SM's 228 KB of shared memory hold (at
    least 1; each CTA's 1 KB reserved)."""
    return max(1, min(mb, 228 * 1024 // (smem + 1024)))


# the registers a thread each n-tile count's build needs without spilling (sm_90 ptxas, session
# 35: WNT 2 75-101 at 4-8 warps and 2-6 CTAs an SM, WNT 4 116-122, WNT 8 ~180): WMB CTAs of WU
# warps must leave at least this many of the SM's 64 K registers a thread
HOT_REGS = {2: 80, 4: 128, 8: 255}


def check_shape(c: dict) -> None:
    """This kernel's CTA-shape knobs (WU, WNT, WST, WMB) in ranges it compiles and fits."""
    _require(c["WU"] in (4, 8), "cfg['WU']", "4 or 8", c["WU"])
    _require(c["WNT"] in (2, 4, 8) and 8 * c["WNT"] * 16 % (32 * c["WU"]) == 0, "cfg['WNT']",
             "2, 4 or 8 with 128 WNT a multiple of 32 WU (the pass's activation words "
             "split over the threads)", {"WNT": c["WNT"], "WU": c["WU"]})
    _require(c["WST"] in range(2, 9), "cfg['WST']", "2 .. 8", c["WST"])
    mb = c.get("WMB", 1)
    _require(mb in range(1, 9) and min(255, 65536 // (32 * c["WU"] * mb)) >= HOT_REGS[c["WNT"]],
             "cfg['WMB']", f"1 .. 8 with {HOT_REGS[c['WNT']]} registers a thread left at WNT "
             f"{c['WNT']} (64 K registers over WMB x 32 WU threads; WNT 8's accumulators need "
             "more than 128)", {"WMB": mb, "WU": c["WU"]})


def check_hot(c: dict, S: int, E: int, smem_pad: int = 0, shape=None,
              names: dict | None = None) -> None:
    """The hot knobs in ranges the kernel compiles and fits (names the cfg key); smem_pad: a
    later kernel's extra shared memory (cuda_v19's alignment slack); shape: a later kernel's
    check of its CTA-shape knobs in place of `check_shape` (cuda_v20's two-warp units), and
    names: the cfg keys WU / WNT / WST go by there, for the shared messages."""
    name = lambda k: (names or {}).get(k, k)  # noqa: E731
    _require(c["WIDE"] in (0, 1), "cfg['WIDE']", "0 or 1", c["WIDE"])
    _require(not (c["WIDE"] and c.get("IT1")), "cfg['IT1']", "0 with WIDE 1 (the cold "
             "launch leaves the hot experts to the wide one only by expert, ITEMS 0)", c.get("IT1"))
    _require(isinstance(c["WT"], int) and 0 <= c["WT"] < 2**15, "cfg['WT']",
             "an int in [0, 32768)", c["WT"])
    (shape or check_shape)(c)
    _require(c.get("WS", 0) in (0, 1), "cfg['WS']", "0 or 1", c.get("WS"))
    _require(c.get("WHI") is None or (isinstance(c["WHI"], int) and c["WHI"] > c["WT"]),
             "cfg['WHI']", f"None or an int > WT ({c['WT']}): the band's top slot count",
             c.get("WHI"))
    items = max_items(S, E, c["WT"], 8 * c["WNT"])
    _require(smem_bytes(c["WU"], c["WNT"], c["WST"], items) + smem_pad <= SMEM_MAX, "cfg",
             f"{name('WU')} x {name('WST')} weight rings, the activation ring and the item list "
             "within 227 KB", {name(k): c[k] for k in ("WU", "WNT", "WST")})
    _require(S // (8 * c["WNT"]) < 2**16, "x", f"T K < {2**16 * 8 * c['WNT']} slots (16-bit "
             "passes in the item list)", S)
    _require(E < 2**15, "experts", "fewer than 32768 experts (15-bit indices in the item list)",
             E)


@functools.cache
def _kernel(*targs: int):
    """int4_moe_hot<KPAD, WU, NT, ST, MB> (cuda_v1.cu + cuda_v10.cu through NVRTC, cached)."""
    import cupy

    name = f"int4_moe_hot<{', '.join(map(str, targs))}>"
    code = "".join(open(p).read() + "\n" for p in (cuda_v1._SRC, _SRC))
    mod = cupy.RawModule(code=code, options=("-std=c++17",), name_expressions=[name])
    return mod.get_function(name)


def launch_hot(c: dict, p, xq: Tensor, w1: Tensor, s1: Tensor, NU1: int, C1: int,
               h: Tensor, *, kernel=None, smem_pad: int = 0, warps_a_unit: int = 1,
               check=None) -> tuple:
    """cuda_v4's `hot` hook: the hot launch (CUDA) writing the hot experts' rows of h, on the
    current stream, or at WS 1 on a side stream forked from it (`workbench.streams.Side` under
    SIDE_KEY at the highest priority, so the block scheduler takes the hot CTAs, whole K a warp:
    the long ones, before the cold launch's when both wait); returns (the cold launch's SKIP
    (WT), 0 where WIDE is 0 or no expert can be hot (S <= WT); the join cuda_v4 calls after the
    cold launch, None where no hot launch is made, a no-op on one stream). Graph-safe: the fork and join are events on the
    capturing stream, so a capture records both launches as parallel branches. kernel: a later
    version's build of the same launch (`_kernel`'s signature and arguments: cuda_v19's
    wgmma pass) needing smem_pad more bytes of shared memory, warps_a_unit warps a row unit
    (cuda_v20: 2) and its own knob check (`check_hot`'s signature)."""
    (check or check_hot)(c, p.S, p.E, smem_pad)
    if not c["WIDE"] or p.S <= c["WT"]:
        return 0, None
    wu, nt, st, ht = c["WU"], c["WNT"], c["WST"], c["WT"]
    items = max_items(p.S, p.E, ht, 8 * nt)
    gx = -(-NU1 // wu)
    smem = smem_bytes(wu, nt, st, items) + smem_pad
    mb = min_blocks(c)
    gy = c.get("WY") or max(1, min(ctas_an_sm(mb, smem) * cuda_v1.SMS // gx, items))
    _require(isinstance(gy, int) and gy >= 1, "cfg['WY']", "an int >= 1", gy)
    fn = (kernel or _kernel)(int(p.D % mma_layout.KALIGN != 0), wu, nt, st, mb)
    hi = c.get("WHI") or 2**31 - 1  # cuda_v12's band: only experts of at most WHI slots
    args = (w1, s1, xq, *p.meta, h, p.K, NU1, C1, xq.stride(0), p.D, p.Ip, ht, hi, items)
    conv = cuda_v1.kernel_args(args)
    side = Side(h.device, bool(c.get("WS", 0)), key=SIDE_KEY, priority=-100)
    side.fork()  # h allocated (zeroed), routing and xq written; all freed after the join

    side.run(lambda: cuda_v1.run_kernel(fn, (gx, gy), (32 * wu * warps_a_unit,), conv, smem))
    return ht, side.join


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None, tiles_for=None, hot_for=None,
                  tail_for=None) -> Tensor:
    """The contract of `workbench.reference.int4_moe.int4_moe` (cuda_v5's checks): a call
    cuda_v8 fuses is cuda_v9's, every other one cuda_v4's launches on this file's tiles (or a
    later version's rule `tiles_for`, `tiles`' signature: cuda_v11) with the hot launch
    (module docstring; or a later version's hot hook `hot_for`, `launch_hot`'s signature:
    cuda_v12's bands; and `tail_for`, cuda_v4's `tail`: cuda_v13's down GEMM in two launches)."""
    cfg = dict(cfg or {})
    wide = {k: cfg.pop(k) for k in WIDE_KEYS if k in cfg}  # this file's knobs, the rest passed on
    f8 = bool(cfg.get("F8", cuda_v8.KNOBS["F8"]))
    if x.device.type == "cuda" and x.dim() == 2 and cuda_v8.fused_here(
            x, topk_ids, experts, expected_slots, f8):
        return cuda_v9.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                     cfg=cfg, expected_slots=expected_slots)
    for k in cuda_v8.KNOBS:
        cfg.pop(k, None)
    if wide.get("WIDE", 1) == 0:  # cuda_v5 exactly
        return cuda_v5.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                     cfg=cfg or None, expected_slots=expected_slots)
    return cuda_v4.int4_moe_cuda(x, topk_ids, topk_weights, experts, validate=validate,
                                 cfg=(cfg | wide) or None, expected_slots=expected_slots,
                                 tiles_for=tiles_for or tiles, hot=hot_for or launch_hot,
                                 tail=tail_for)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v10's op):

        python -m workbench.kernels.int4_moe.cuda_v10 [--T 17,128] [--skew 1.2]
            [--cfgs "v=cuda_v5;v=triton_v34;base;WT=16"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=cuda_v5;v=triton_v34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
