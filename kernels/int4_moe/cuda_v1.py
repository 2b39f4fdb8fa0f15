"""int4_moe cuda_v1: the expert GEMMs in hand-written CUDA (cupy RawModule, NVRTC), warp-level
mma.sync on weights streamed in the mma fragment order through a per-warp cp.async ring.

Why (session 23's SASS count, kernels/int4_moe/README.md): the Triton GEMMs are issue-bound:
401 SASS a K tile of 128 weights a thread (3.13 a weight; 240 of them the bf16x2 dequant) at
the 64-row decode tiles, where T 1 on 384 experts needs ~2.3 a weight to stream at the copy
bandwidth with the IPC ncu measured (2.7). The wgmma path pays its own: shared-memory words,
the scale broadcast, three CTA barriers and a wgmma wait a K tile. Here a lane's 32 weights
of a 16-row tile and 64 inputs are one 16-byte load in the order its mma A fragments need
(`mma_layout.py`, a one-time exact repack), so a weight costs its dequant (1.875: lop3, sub,
mul a pair, a shift every 8 weights) plus 1/8 of an mma and ~1/16 of a load: ~2.1 expected
(measured 2.34 in the register build). No CTA barrier on the K path; the K parts of a unit meet
once, in shared memory.

Measured (H200, session 24, kernels/int4_moe/README.md "The CUDA versions"): with the weights
only in registers (U 1) the gate/up GEMM ran at triton_v34's speed with 30 % fewer
instructions, latency-bound on ~2 KB of weights in flight a warp; the ring (U 3) makes it 5-8 %
faster than v34's from T 9, while the down GEMM (h twice, ~168 registers) stays 10-20 % slower.
Not BEST.

Launches (four): the routing metadata (Triton, triton_v24's router), gate/up (MODE 0: the
SiLU fused, h written as bf16 hi + lo in sorted-slot order), down (MODE 1: hi and lo through
the same dequantised weights, fp32 rows by slot), the combine (Triton, `_common.combine`). x
is read in its own order: no permute launch. Grids are sized from shapes only (the op's
`expected_slots` hint where given): CUDA-graph capturable once the repack is cached.

Numerics: W = bf16((q - 8) s) exactly (reference/int4.py), bf16 x bf16 products exact in the
mma, fp32 sums: inside an mma step's 16 inputs the tensor core's order, then the steps in input
order within a K part, the K parts in part order; h hi + lo as triton_v3. Not triton_v34's
association: tolerance against the reference, not bits.

GPU only (cupy launches; the CPU twin of its layout is `mma_layout.unpack`, tested bitwise).
Dimension legend: cuda_v1.cu's.
"""

from __future__ import annotations

import functools
import math
import os

import torch
from torch import Tensor

from . import mma_layout
from ._common import _require, check_inputs, combine, with_cfg
from .triton_v26 import expected_active

# the GEMMs whose experts the load step repacks (emulate.load_for): both read the mma layout
REPACKED = ("gate_up", "down")
SMS = 132  # H200 multiprocessors (the tile rule's target; shapes only, not read off a device)
WARPS_TARGET = 24 * SMS  # warps a GEMM launch aims at: ~24 resident a multiprocessor
# warps a CTA splits one unit's K over, by GEMM: the CTA's registers fit one SM at the K
# loop's ~160 a thread (at 14 warps ptxas caps gate/up at 128 and spills)
KW_MAX = {1: 8, 2: 8}
# U: chunk pairs of weights a warp keeps in flight; 1-2 in registers, >= 3 a shared-memory ring
# of U pairs (cp.async, U - 1 in flight). Session 24 call 2: U 1 (registers) streamed T 9's
# gate/up at v34's speed with 30 % fewer instructions: latency-bound, hence the ring
STAGES = 3
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v1.cu")


def _split(NU: int, C: int, active: float, kw_max: int) -> tuple[int, int]:
    """(KW, RW) of one GEMM: the fewest K parts (a divisor of the C / 2 chunk pairs, <= kw_max)
    that give the launch ~WARPS_TARGET warps over the experts expected active; RW units a CTA
    so that a CTA has at least 4 warps."""
    pairs = C // 2
    kws = [k for k in range(1, min(kw_max, pairs) + 1) if pairs % k == 0]
    kw = next((k for k in kws if NU * k * active >= WARPS_TARGET), kws[-1])
    return kw, max(1, 4 // kw)


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): per GEMM n (1 gate/up, 2 down) the K parts KWn, units a CTA
    RWn, 8-slot n-tiles a pass NNn, chunk pairs loaded ahead Un, the L2 prefetch of a warp's
    slice (PF0n pairs at the start, then PFn pairs ahead; 0: none), activation buffers XBn
    (cuda_v1.cu's XB); A_GRID CTAs along the
    experts (each takes the active experts in turn: a, a + A_GRID, ...)."""
    S = T * K if slots is None else slots
    active = max(1.0, expected_active(E, S))
    # one 8-slot n-tile a pass: at NN 2 the K loop spills (down: 740 B); an expert with more
    # slots streams its weights once a pass (decode and the verify expect 1-3 a rank)
    nn = 1
    c = dict(A_GRID=max(1, min(E, T * K, math.ceil(2 * active))))
    for n, (N, KI, gate_up) in ((1, (I, D, True)), (2, (D, I, False))):
        NU, C, _ = mma_layout.dims(N, KI, gate_up)
        kw, rw = _split(NU, C, active, KW_MAX[n])
        c |= {f"KW{n}": kw, f"RW{n}": rw, f"NN{n}": nn, f"U{n}": STAGES, f"PF0{n}": 0, f"PF{n}": 0,
              f"XB{n}": 2}
    return c


@functools.cache
def _kernel(*targs: int):
    """The compiled instance int4_moe_mma<targs> (`instance`: MODE, POST, KPAD, KW, RW, NN, U,
    XB[, HOUT[, ITEMS[, SKIP[, BK]]]]; NVRTC through cupy, cached)."""
    import cupy

    name = f"int4_moe_mma<{', '.join(map(str, targs))}>"
    with open(_SRC) as f:
        mod = cupy.RawModule(code=f.read(), options=("-std=c++17",), name_expressions=[name])
    return mod.get_function(name)


_SMEM_SET: dict = {}  # CUfunction handle -> the dynamic shared memory it was allowed


def handle(fn) -> int:
    """The CUfunction handle behind fn: a cupy RawKernel (what RawModule.get_function returns:
    its `kernel` is the current device's cupy.cuda.function.Function) or such a Function."""
    return getattr(fn, "kernel", fn).ptr


def opt_in(fn, smem: int) -> None:
    """Let the compiled kernel fn (a cupy RawKernel) launch with smem bytes of dynamic shared
    memory: past 48 KB with the static part a kernel must opt in (session 24 call 3: 48 + 4 KB
    was refused), once a size, never lowering what another launch asked. Keyed by the
    CUfunction handle (`handle`), not the wrapper: cupy makes a new RawKernel a get_function
    and caches the module a cubin path, so two wrappers can hold one kernel (cuda_v19 kept one
    a KPAD value: an EDGE call's smaller request lowered the limit the other's record still
    claimed, and the next launch above it failed with CUDA_ERROR_INVALID_VALUE, sessions 46,
    48 and 49; session 48's fix read `fn.ptr`, which a RawKernel lacks, and fell back to the
    wrapper's id)."""
    key = handle(fn)
    if smem > _SMEM_SET.get(key, 0):
        fn.max_dynamic_shared_size_bytes = smem
        _SMEM_SET[key] = smem


def _attribute(fn, name: str):
    """A kernel attribute for an error message; the driver's error, not a second raise, where
    the query fails too."""
    try:
        return getattr(fn, name)
    except Exception as e:  # noqa: BLE001 (the message must still be raised)
        return f"? ({type(e).__name__})"


def kernel_args(args: tuple) -> tuple:
    """A raw kernel's arguments as cupy passes them: a tensor as its device pointer (u64),
    anything else as an int (i32)."""
    import numpy as np

    return tuple(np.uint64(a.data_ptr()) if isinstance(a, Tensor) else np.int32(a) for a in args)


def run_kernel(fn, grid: tuple, block: tuple, conv: tuple, smem: int) -> None:
    """fn<<<grid, block, smem>>>(conv) on torch's current stream, after `opt_in`. A launch (or
    opt-in) the driver refuses raises with what it was asked and what the kernel allows (a bare
    CUDA_ERROR_INVALID_VALUE names neither: sessions 46-49 bisected one by tests)."""
    import cupy

    try:
        opt_in(fn, smem)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            fn(grid, block, conv, shared_mem=smem)
    except cupy.cuda.driver.CUDADriverError as e:
        allows = {a: _attribute(fn, a) for a in ("max_dynamic_shared_size_bytes",
                                                 "shared_size_bytes", "max_threads_per_block")}
        raise RuntimeError(f"{getattr(fn, 'name', fn)}: the launch grid {grid}, block {block}, "
                           f"{smem} B dynamic shared memory was refused ({e}); the kernel "
                           f"allows {allows}, its opt-in record says "
                           f"{_SMEM_SET.get(handle(fn))}") from e


def _launch(mode: int, post: int, kpad: bool, c: dict, grid_x: int, args: tuple,
            hout: int = 0, items: int = 0, l2: tuple = (0, 0, 0, 0), skip: int = 0,
            bk: int = 0) -> None:
    """One GEMM launch (mode 0 gate/up, 1 down) on cfg c's knobs; hout, items: cuda_v1.cu's
    HOUT (1: h in triton_v5's rows) and ITEMS (1: (expert, pass) work items), for cuda_v4;
    l2: (words, scales, bytes an expert of each) of another GEMM's experts whose active
    blocks the CTAs ask L2 for before their own stream (cuda_v6; zeros: none); skip:
    cuda_v1.cu's SKIP (> 0: experts with more slots left to cuda_v10's hot launch); bk:
    cuda_v1.cu's BK (> 0: the weight ring in bk stages filled by TMA bulk copies, cuda_v21)."""
    import numpy as np

    n = mode + 1
    kw, rw, u = c[f"KW{n}"], c[f"RW{n}"], c[f"U{n}"]
    fn = _kernel(*instance(mode, post, kpad, c, hout, items, skip, bk))
    args = (*args, c.get(f"PF0{n}", 0), c.get(f"PF{n}", 0))
    conv = kernel_args(args)
    conv += tuple(np.uint64(a.data_ptr() if isinstance(a, Tensor) else a) for a in l2)
    smem = ring_bytes(kw, rw, u, bk)
    run_kernel(fn, (-(-grid_x // rw), c["A_GRID"]), (32 * kw * rw,), conv, smem)


def instance(mode: int, post: int, kpad: bool, c: dict, hout: int = 0, items: int = 0,
             skip: int = 0, bk: int = 0) -> tuple[int, ...]:
    """int4_moe_mma's template arguments for one GEMM launch (`_launch`'s): the trailing
    HOUT / ITEMS / SKIP / BK only as far as one is set, so an instance compiled before a later
    argument existed keeps its name (and its cached build) when that argument is 0."""
    n = mode + 1
    base = (mode, post, int(kpad), c[f"KW{n}"], c[f"RW{n}"], c[f"NN{n}"], c[f"U{n}"], c[f"XB{n}"])
    extra = ((hout, items, skip, bk) if bk else (hout, items, skip) if skip
             else (hout, items) if items else (hout,) if hout else ())
    return base + extra


def ring_bytes(kw: int, rw: int, u: int, bk: int = 0) -> int:
    """A CTA's dynamic shared memory in int4_moe_mma: bk > 0, the bulk ring ([warp][stage]
    2304 bytes: a pair's 2 KB of words, 256 B of scales) and its barriers (8 bytes a stage);
    else the cp.async ring from U 3 ([warp][stage][6][32] uint4), none below."""
    if bk:
        return kw * rw * bk * (2304 + 8)
    return kw * rw * u * 6 * 32 * 16 if u >= 3 else 0


def _router(topk_ids: Tensor, E: int, T: int, K: int, D: int, I: int):
    from .triton_v24 import _router as router_v24
    from .triton_v24 import tiles as tiles_v24

    return router_v24(topk_ids, E, tiles_v24(T, K, E, D, I))


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """x [T, D] bf16 (CUDA), topk_ids [T, K] int32/int64, topk_weights [T, K] float, experts
    (Int4Experts, checkpoint layout; repacked once and cached, `mma_layout.repacked`) -> [T, D]
    bf16: the contract of `workbench.reference.int4_moe.int4_moe`; `validate` see
    `_common.check_inputs`. cfg: overrides of `tiles`' keys, for sweeps."""
    return launch(x, topk_ids, topk_weights, experts, validate, cfg, expected_slots, post=0)


def operands(x: Tensor, experts, c: dict):
    """The GEMMs' operands, shared by the CUDA launchers: x with 16-byte rows, and per GEMM
    the repacked weights and scales (`mma_layout.repacked`, cached) with NU, C (and the down
    GEMM's padded input width KP2), after checking that cfg's K parts KW1 / KW2 divide each
    GEMM's chunk pairs."""
    x, gate_up = operands_gate_up(x, experts, c)
    gp, _, _, _, dp, ds = experts
    D, I = x.shape[1], gp.shape[1]
    w2, s2 = mma_layout.repacked((dp,), (ds,))
    NU2, C2, KP2 = mma_layout.dims(D, I, False)
    _require((C2 // 2) % c["KW2"] == 0, "cfg", f"KW2 dividing {C2 // 2} chunk pairs", c["KW2"])
    return x, gate_up, (w2, s2, NU2, C2, KP2)


def repacked_gate_up(experts) -> tuple[Tensor, Tensor]:
    """The gate / up experts in the fragment layout (`mma_layout.repacked`: cached, or views
    of buffers the load step repacked in place)."""
    gp, gs, up, us = experts[:4]
    return mma_layout.repacked((gp, up), (gs, us))


def operands_gate_up(x: Tensor, experts, c: dict):
    """`operands`' half for the gate/up GEMM alone (cuda_v4 reads down in the checkpoint
    layout): x with 16-byte rows, (w1, s1, NU1, C1)."""
    gp = experts[0]
    D, I = x.shape[1], gp.shape[1]
    w1, s1 = repacked_gate_up(experts)
    NU1, C1, _ = mma_layout.dims(I, D, True)
    _require((C1 // 2) % c["KW1"] == 0, "cfg", f"KW1 dividing {C1 // 2} chunk pairs", c["KW1"])
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # 16-byte activation loads
        x = x.contiguous()
    return x, (w1, s1, NU1, C1)


def check_cfg(c: dict, gemms: tuple[int, ...]) -> None:
    """The knobs of GEMMs `gemms` (1 gate/up, 2 down) in ranges the kernel compiles and fits."""
    for n in gemms:
        _require(1 <= c[f"U{n}"] <= 6 and c[f"NN{n}"] in (1, 2) and c[f"KW{n}"] >= 1
                 and c[f"RW{n}"] >= 1 and 32 * c[f"KW{n}"] * c[f"RW{n}"] <= 1024
                 and c[f"KW{n}"] * c[f"RW{n}"] * c[f"U{n}"] * 3 <= 227
                 and c[f"XB{n}"] in (1, 2) and (c[f"XB{n}"] == 2 or c[f"U{n}"] >= 3), "cfg",
                 f"U{n} in 1..6, NN{n} in (1, 2), KW{n} x RW{n} <= 32 warps, their ring "
                 f"<= 227 KB, XB{n} in (1, 2) (1 with the ring only)", c)


def launch(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate, cfg,
           expected_slots, post: int) -> Tensor:
    """The four launches with the dequant of cuda_v1 (post 0: W = bf16((q - 8) s) in the
    mma) or cuda_v2 (post 1: the scales on each group's fp32 partial)."""
    _require(x.device.type == "cuda", "x", "a CUDA tensor (cuda_v1 launches CUDA C++ through cupy)",
             f"a tensor on {x.device}")
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots, mma_ok=True)
    T, D = x.shape
    K = topk_ids.shape[1]
    E, I = experts[0].shape[:2]  # gate_packed [E, I, D / 8]
    if T == 0:
        return torch.empty(0, D, dtype=x.dtype, device=x.device)
    c = with_cfg(tiles(T, K, E, D, I, expected_slots), cfg)
    check_cfg(c, (1, 2))
    x, (w1, s1, NU1, C1), (w2, s2, NU2, C2, KP2) = operands(x, experts, c)
    r = _router(topk_ids, E, T, K, D, I)
    S = T * K
    h = torch.empty(2, S, KP2, dtype=torch.bfloat16, device=x.device)  # [hi / lo, S sorted, I]
    meta = (r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act)
    _launch(0, post, D % mma_layout.KALIGN != 0, c, NU1,
            (w1, s1, x, x, *meta, h[0], h[1], K, NU1, C1, x.stride(0), D, I, KP2))
    y = torch.empty(S, D, dtype=torch.float32, device=x.device)  # [S, D] slot order
    _launch(1, post, I % mma_layout.KALIGN != 0, c, NU2,
            (w2, s2, h[0], h[1], *meta, y, y, K, NU2, C2, KP2, I, D, D))
    return combine(y, topk_ids, topk_weights, r, T, D)


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v1's launcher):

        python -m workbench.kernels.int4_moe.cuda_v1 [--ep 8] [--T 1,9,17]
            [--cfgs "v=34;base;KW1=8"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
