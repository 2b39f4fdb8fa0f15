"""Can Gluon express the tree_mla tile that Triton cannot: S = Q K^T split over the two
warpgroups by keys instead of duplicated? Compiles one 64-row x 64-key tile of absorbed-MLA
attention for sm_90 on a machine without a GPU and prints, per S layout, the wgmma count of
the PTX (instructions a warpgroup issues), the shared memory and ptxas's registers.

    python3 scripts/gluon_mla_tile_probe.py      # no TRITON_INTERPRET (Gluon has no interpreter)

Why (kernels/tree_mla/README.md, v3 and v4 under ncu): Triton lays the QK^T dot of a chained
QK^T -> PV out with every warp along M (`warpsPerCTA = [8, 1]`), so at 64 rows both warpgroups
compute the whole S [64, 64] (72 HGMMA.64x32x16 each) before each computes its half of the 512
value columns: 13.6 MFLOP issued a tile for 8.9 of work, at 255 registers with spills. FlashMLA
splits the work between its warpgroups. In Gluon the layouts are the program's:
  S  NVMMADistributedLayout(warps_per_cta=[4, 2], instr m64n32k16): warpgroup w computes the
     scores of keys 32 w .. 32 w + 31 over all 576 dims (36 wgmma), no duplicate;
  the row max and sum over the two halves: gl.max / gl.sum over axis 1 (the compiler reduces
     across the warpgroups through shared memory);
  P  converted to the A operand of O's layout (DotOperandLayout(0, O, k_width 2)): both
     warpgroups get all 64 keys of their 64 rows (a [64, 64] bf16 exchange through shared
     memory);
  O  NVMMADistributedLayout(warps_per_cta=[4, 2], instr m64n256k16): warpgroup w owns value
     columns 256 w .. 256 w + 255 (FlashMLA's O_L / O_R), 4 wgmma.
The [8, 1] row prints Triton's choice for comparison. One tile, operands from plain loads
stored to 128-byte-swizzled shared memory: what it measures is the instruction split and the
register budget, not the pipeline (TMA, mbarriers: the kernel's job); `compile_loop` adds the loop.
"""

from __future__ import annotations

import os
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

LOAD = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))  # 8 warps, 16 B a thread
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16]))


@gluon.jit
def _rows(ptr, first, N: gl.constexpr, C: gl.constexpr, R: gl.constexpr):
    """Latent rows first .. first + N - 1 of a [*, C + R] bf16 matrix as (c [N, C], r [N, R])
    registers in the load layout (the probe's stand-in for the kernel's TMA copies)."""
    rows = first + gl.arange(0, N, layout=gl.SliceLayout(1, LOAD))
    cc = gl.arange(0, C, layout=gl.SliceLayout(0, LOAD))
    cr = gl.arange(0, R, layout=gl.SliceLayout(0, LOAD))
    base = ptr + rows[:, None] * (C + R)
    return gl.load(base + cc[None, :]), gl.load(base + C + cr[None, :])


@gluon.jit
def _scores(qc, qr, kc, kr, S_LAYOUT: gl.constexpr):
    """S [M, NK] fp32 = Qc Kc^T + Qr Kr^T from shared memory, in S_LAYOUT."""
    M: gl.constexpr = qc.shape[0]
    NK: gl.constexpr = kc.shape[0]
    s = warpgroup_mma(qc, kc.permute((1, 0)), gl.zeros([M, NK], gl.float32, layout=S_LAYOUT))
    return warpgroup_mma(qr, kr.permute((1, 0)), s)  # + the rope part


@gluon.jit
def _tile_kernel(q_ptr, k_ptr, o_ptr, S_LAYOUT: gl.constexpr, M: gl.constexpr,
                 NK: gl.constexpr, C: gl.constexpr, R: gl.constexpr):
    """o [M, C] fp32 = softmax2(Q K^T) V for one tile: q [M, C + R], k [NK, C + R] bf16
    (V = K's first C columns, as absorbed MLA's latent rows); unnormalised, one tile."""
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    q_c, q_r = _rows(q_ptr, 0, M, C, R)
    k_c, k_r = _rows(k_ptr, 0, NK, C, R)
    qc = gl.allocate_shared_memory(gl.bfloat16, [M, C], smem, q_c)
    qr = gl.allocate_shared_memory(gl.bfloat16, [M, R], smem, q_r)
    kc = gl.allocate_shared_memory(gl.bfloat16, [NK, C], smem, k_c)
    kr = gl.allocate_shared_memory(gl.bfloat16, [NK, R], smem, k_r)
    fence_async_shared()
    s = _scores(qc, qr, kc, kr, S_LAYOUT)  # [M, NK]
    p = gl.exp2(s - gl.max(s, axis=1)[:, None])
    pa = gl.convert_layout(p.to(gl.bfloat16),
                           gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2))
    o = warpgroup_mma(pa, kc, gl.zeros([M, C], gl.float32, layout=O_LAYOUT))  # [M, C]
    ro = gl.arange(0, M, layout=gl.SliceLayout(1, O_LAYOUT))
    co = gl.arange(0, C, layout=gl.SliceLayout(0, O_LAYOUT))
    gl.store(o_ptr + ro[:, None] * C + co[None, :], o)


@gluon.jit
def _loop_kernel(q_ptr, k_ptr, o_ptr, n_tiles, M: gl.constexpr, NK: gl.constexpr,
                 C: gl.constexpr, R: gl.constexpr):
    """The tile of `_tile_kernel` in a loop over n_tiles key tiles: a 2-slot shared-memory
    ring for K (the next tile's loads issued before this tile's MMAs), base-2 online softmax,
    O rescaled per tile, normalised at the end: the register and shared-memory budget of the
    prefix pass with S split by keys (loads are plain loads here; the kernel's are TMA)."""
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 32, 16])
    q_c, q_r = _rows(q_ptr, 0, M, C, R)
    qc = gl.allocate_shared_memory(gl.bfloat16, [M, C], smem, q_c)
    qr = gl.allocate_shared_memory(gl.bfloat16, [M, R], smem, q_r)
    kc = gl.allocate_shared_memory(gl.bfloat16, [2, NK, C], smem)  # 2 slots of a [NK, C] tile
    kr = gl.allocate_shared_memory(gl.bfloat16, [2, NK, R], smem)
    k_c, k_r = _rows(k_ptr, 0, NK, C, R)
    kc.index(0).store(k_c)
    kr.index(0).store(k_r)
    m_i = gl.full([M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([M, C], gl.float32, layout=O_LAYOUT)
    for t in range(n_tiles):
        cur = t % 2
        # the next tile's rows (wraps: the last load is spare)
        kn_c, kn_r = _rows(k_ptr, ((t + 1) % n_tiles) * NK, NK, C, R)
        fence_async_shared()
        s = _scores(qc, qr, kc.index(cur), kr.index(cur), s_layout)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        pa = gl.convert_layout(p.to(gl.bfloat16),
                               gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2))
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        o = warpgroup_mma(pa, kc.index(cur), o)
        kc.index(1 - cur).store(kn_c)
        kr.index(1 - cur).store(kn_r)
    o = o / gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))[:, None]
    ro = gl.arange(0, M, layout=gl.SliceLayout(1, O_LAYOUT))
    co = gl.arange(0, C, layout=gl.SliceLayout(0, O_LAYOUT))
    gl.store(o_ptr + ro[:, None] * C + co[None, :], o)


def compile_loop() -> dict:
    """sm_90 build of `_loop_kernel` (S split by keys): smem bytes and ptxas's registers and
    spills, the budget question a Gluon prefix kernel must answer first."""
    from workbench.kernels._sm90 import ptxas_report

    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "o_ptr": "*fp32", "n_tiles": "i32",
           "M": "constexpr", "NK": "constexpr", "C": "constexpr", "R": "constexpr"}
    const = {"M": 64, "NK": 64, "C": 512, "R": 64}
    ck = triton.compile(GluonASTSource(_loop_kernel, signature=sig, constexprs=const),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    return {"smem": ck.metadata.shared, "ptxas": ptxas_report(ck.asm["ptx"])}


def compile_tile(s_warps: list[int]) -> dict:
    """sm_90 build of one tile with S's warps_per_cta = s_warps ([4, 2]: split by keys;
    [8, 1]: Triton's); returns wgmma shapes and counts in the PTX, smem bytes, ptxas line."""
    from workbench.kernels._sm90 import ptxas_report

    s_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=s_warps,
                                         instr_shape=[16, 64 // s_warps[1], 16])
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "o_ptr": "*fp32", "S_LAYOUT": "constexpr",
           "M": "constexpr", "NK": "constexpr", "C": "constexpr", "R": "constexpr"}
    const = {"S_LAYOUT": s_layout, "M": 64, "NK": 64, "C": 512, "R": 64}
    ck = triton.compile(GluonASTSource(_tile_kernel, signature=sig, constexprs=const),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = ck.asm["ptx"]
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)
    return {"wgmma": {s: shapes.count(s) for s in sorted(set(shapes))},
            "smem": ck.metadata.shared, "ptxas": ptxas_report(ptx)}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: Gluon kernels compile only")
    for warps, what in (([4, 2], "S split by keys (Gluon)"), ([8, 1], "S duplicated (Triton)")):
        r = compile_tile(warps)
        print(f"{what:<26} wgmma a warpgroup {r['wgmma']}, smem {r['smem']} B, {r['ptxas']}")
    r = compile_loop()
    print(f"{'loop, 2-slot K ring':<26} smem {r['smem']} B, {r['ptxas']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
