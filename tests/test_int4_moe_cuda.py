"""int4_moe cuda_v1 ... cuda_v11 (hand-written CUDA through cupy): the fragment
layout and the kernels' reading of it on the CPU (the CPU twin), the launch rule, the sm_90 build,
and on the H200 the op against the reference (EDGE, REAL, an EP8 rank, graph replay; the harness
NaN-poisons the outputs)."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from unittest import mock

import pytest
import torch

from workbench.kernels.int4_moe import mma_layout as L
from workbench.reference.int4 import dequant_int4_g32, pack_int4, quantize_int4_g32
from workbench.reference.int4_moe import int4_moe

CUDA_VERSIONS = ("cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4", "cuda_v5", "cuda_v6", "cuda_v7",
                 "cuda_v8", "cuda_v9", "cuda_v10", "cuda_v11", "cuda_v12", "cuda_v13",
                 "cuda_v14", "cuda_v15", "cuda_v16", "cuda_v17", "cuda_v18", "cuda_v19",
                 "cuda_v20", "cuda_v21", "cuda_v22", "cuda_v23", "cuda_v24", "cuda_v25",
                 "cuda_v26", "cuda_v27", "cuda_v28", "cuda_v29", "cuda_v30")


def _mats(E, N, KI, n, seed):
    """n checkpoint matrices (packed int32 [E, N, KI/8], scales bf16 [E, N, KI/32])."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        q, s = quantize_int4_g32(torch.randn(E * N, KI, generator=g))
        out.append((pack_int4(q).view(E, N, KI // 8), s.view(E, N, KI // 32)))
    return out


# ------------------------------------------------------------------ the layout (CPU)


@pytest.mark.parametrize("E, N, KI", [(2, 64, 128), (1, 48, 96), (3, 40, 320), (1, 7, 32)])
@pytest.mark.parametrize("gate_up", [True, False], ids=["gate_up", "down"])
def test_repack_is_exact(E, N, KI, gate_up):
    # why: the one-time repack is a permutation of the checkpoint's nibbles and scales plus
    # q = 0 padding: its inverse through the same index math gives reference/int4.py's W bit
    # for bit; N not a multiple of 16 / 32 rows, KI of 128 inputs (96, 320, 32) pad
    mats = _mats(E, N, KI, 2 if gate_up else 1, seed=E * N + KI)
    words, scales = L.repack(tuple(p for p, _ in mats), tuple(s for _, s in mats))
    NU, C, KP = L.dims(N, KI, gate_up)
    assert tuple(words.shape) == (E, NU, C, 2, 32, 4) and words.dtype == torch.int32
    assert tuple(scales.shape) == (E, NU, C // 2, 2, 8, 8) and KP % L.KALIGN == 0
    got = L.unpack(words, scales, N, KI, gate_up)
    want = torch.cat([dequant_int4_g32(p, s) for p, s in mats], dim=1)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_repack_is_cached_per_tensor():
    # why: the repack is a load step, not a per-call cost; an in-place change repacks again
    (p, s), = _mats(2, 32, 128, 1, seed=5)
    a = L.repacked((p,), (s,))
    assert L.repacked((p,), (s,)) is a
    p.add_(0)  # bumps the version counter
    assert L.repacked((p,), (s,)) is not a


def _twin_unit(words, scales, act, u, post):
    """One warp's K loop on unit u (both tiles, all chunks), lane by lane as cuda_v1.cu reads
    the layout and as the PTX ISA lays out mma.m16n8k16's fragments (A row-major 16 x 16: a0
    = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..); B 16 x 8: b0
    = (2t..2t+1, g), b1 = (2t+8.., g)). act [8, KP] float64 (column n = slot n). -> [2, 16, 8]
    float64 (tile, row, column)."""
    C = words.shape[1]
    out = torch.zeros(2, 16, 8, dtype=torch.float64)
    wu = words[u].to(torch.int64) & 0xFFFFFFFF  # [C, 2, 32, 4]
    su = scales[u].view(torch.int16).to(torch.int64) & 0xFFFF  # [C/2, 2, 8, 8] bf16 bits
    bf = lambda bits: (bits << 16).to(torch.int32).view(torch.float32).double()  # noqa: E731
    for c in range(C):
        for tile in range(2):
            for hf in range(2):  # a scale group: mma steps 2 hf, 2 hf + 1
                part = torch.zeros(16, 8, dtype=torch.float64)
                corr = torch.zeros(16, 8, dtype=torch.float64)
                s_entry = su[c // 2, tile, :, 4 * (c % 2) + 2 * hf: 4 * (c % 2) + 2 * hf + 2]
                for jj in range(2):
                    j = 2 * hf + jj
                    A = torch.zeros(16, 16, dtype=torch.float64)
                    B = torch.zeros(16, 8, dtype=torch.float64)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        q = int(wu[c, tile, lane, j])
                        for i in range(4):  # a_i: nibbles (i, i + 4) of the word
                            row = g + 8 * (i & 1)
                            kap = 2 * t + 8 * (i >> 1)
                            s_bits = su.new_tensor(int(s_entry[g, i & 1]))
                            for half, nib in ((0, (q >> 4 * i) & 0xF), (1, (q >> 4 * (i + 4)) & 0xF)):
                                if post:
                                    A[row, kap + half] = 128 + nib
                                else:  # bf16((q - 8) s): exact product, then one rounding
                                    w = torch.tensor((nib - 8) * float(bf(s_bits)))
                                    A[row, kap + half] = w.to(torch.bfloat16).double()
                        k0 = 64 * c + 32 * hf + 8 * t + 4 * jj  # the lane's x inputs of step j
                        B[2 * t: 2 * t + 2, g] = act[g, k0: k0 + 2]
                        B[2 * t + 8: 2 * t + 10, g] = act[g, k0 + 2: k0 + 4]
                    if post:
                        part += A @ B
                        corr += torch.full((16, 16), -136.0, dtype=torch.float64) @ B
                    else:
                        out[tile] += A @ B
                if post:
                    rows_s = bf(s_entry[torch.arange(16) % 8, torch.arange(16) // 8])  # [16]
                    out[tile] += rows_s[:, None] * (part + corr)
    return out


@pytest.mark.parametrize("post", [0, 1], ids=["cuda_v1", "cuda_v2"])
@pytest.mark.parametrize("gate_up", [True, False], ids=["gate_up", "down"])
def test_kernels_reading_of_the_layout_is_the_matrix(post, gate_up):
    # why: the CPU twin of one warp's K loop (which word, which shift, which scale half, which
    # x inputs feed which mma fragment element) gives the matrix the checkpoint holds: W x
    # with W = bf16((q - 8) s) for cuda_v1, the exact (q - 8) s for cuda_v2; two units, an N
    # tail, KI padded (96 inputs of 128)
    E, N, KI = 1, 40 if gate_up else 56, 96
    mats = _mats(E, N, KI, 2 if gate_up else 1, seed=11 + post)
    words, scales = L.repack(tuple(p for p, _ in mats), tuple(s for _, s in mats))
    NU, C, KP = L.dims(N, KI, gate_up)
    act = torch.zeros(8, KP, dtype=torch.float64)
    act[:, :KI] = torch.randn(8, KI, generator=torch.Generator().manual_seed(3)).bfloat16().double()
    assert all(torch.isfinite(s.float()).all() for _, s in mats)
    if post:
        W = torch.cat([((dequant_int4_g32(p, torch.ones_like(s)).double())
                        * s.double().repeat_interleave(32, -1)) for p, s in mats], 1)[0]
    else:
        W = torch.cat([dequant_int4_g32(p, s) for p, s in mats], 1)[0].double()
    want = W @ act[:, :KI].T  # [rows (x 2), 8]
    for u in range(NU):
        got = _twin_unit(words[0], scales[0], act, u, post)
        for tile in range(2):
            rows = (torch.arange(16) + u * 16 + tile * N) if gate_up else \
                (torch.arange(16) + u * 32 + tile * 16)
            ok = rows < (tile + 1) * N if gate_up else rows < N
            torch.testing.assert_close(got[tile][ok], want[rows[ok]], rtol=1e-12, atol=1e-9)


def _local_experts(E, D, I, seed):
    from workbench.dist.moe import LocalExperts

    m = LocalExperts(E, D, I, 32)
    for proj, (n, k) in (("gate", (I, D)), ("up", (I, D)), ("down", (D, I))):
        (p, s), = _mats(E, n, k, 1, seed=seed + n + k + len(proj))
        getattr(m, f"{proj}_packed").copy_(p)
        getattr(m, f"{proj}_scale").copy_(s)
    return m


def test_replace_with_repacked_frees_the_checkpoint_copy():
    # why: the load step for a full-size rank (two copies of 71 GB do not fit): each buffer
    # becomes a checkpoint-shaped view of the repacked tensor, `repacked` returns those words
    # without a copy, and they are `repack`'s bits for the original checkpoint
    m = _local_experts(2, 128, 256, seed=3)
    want1 = L.repack((m.gate_packed, m.up_packed), (m.gate_scale, m.up_scale))
    want2 = L.repack((m.down_packed,), (m.down_scale,))
    shapes = {n: tuple(b.shape) for n, b in m.named_buffers()}
    L.replace_with_repacked(m)
    assert {n: tuple(b.shape) for n, b in m.named_buffers()} == shapes
    assert all(getattr(b, L.LAYOUT_ATTR) == "mma" for b in m.buffers())
    got1 = L.repacked((m.gate_packed, m.up_packed), (m.gate_scale, m.up_scale))
    got2 = L.repacked((m.down_packed,), (m.down_scale,))
    for got, want in ((got1, want1), (got2, want2)):
        assert all(torch.equal(g.view(torch.int16) if g.dtype == torch.bfloat16 else g,
                               w.view(torch.int16) if w.dtype == torch.bfloat16 else w)
                   for g, w in zip(got, want))
    assert got1[0].data_ptr() == m.gate_packed.data_ptr()  # a view, not a second copy
    assert got1[0].view(-1)[m.gate_packed.numel():].data_ptr() == m.up_packed.data_ptr()
    assert got2[1].data_ptr() == m.down_scale.data_ptr()


def test_shared_memory_opt_in_follows_the_kernel_not_its_wrapper(monkeypatch):
    # why: cupy makes a new RawKernel wrapper a get_function (and caches a cubin path's
    # module), so two wrappers can hold one kernel (cuda_v19 / v20 kept one a KPAD value); a
    # smaller request through one must not lower the limit below what the other's record says
    # it asked (sessions 46 / 48 / 49: the next launch above the lowered limit failed with
    # CUDA_ERROR_INVALID_VALUE). The double has RawKernel's shape: no `ptr` of its own, the
    # handle on `kernel` (session 48's fix read `fn.ptr` and silently keyed by the wrapper)
    from workbench.kernels.int4_moe import cuda_v1

    class Function:  # cupy.cuda.function.Function: the CUfunction, one limit
        def __init__(self):
            self.ptr, self.limit = 0x7F00_0000_1000, 0

    class RawKernel:  # cupy's RawKernel: a wrapper whose `kernel` is the Function
        __slots__ = ("kernel",)

        def __init__(self, kernel):
            self.kernel = kernel

        @property
        def max_dynamic_shared_size_bytes(self):
            return self.kernel.limit

        @max_dynamic_shared_size_bytes.setter
        def max_dynamic_shared_size_bytes(self, v):
            self.kernel.limit = v

    monkeypatch.setattr(cuda_v1, "_SMEM_SET", {})
    k = Function()
    a, b = RawKernel(k), RawKernel(k)
    for fn, smem in ((a, 200_000), (b, 100_000), (a, 150_000), (b, 180_000)):
        cuda_v1.opt_in(fn, smem)
        assert k.limit >= smem  # every launch may ask what it asks
    assert k.limit == 200_000  # asked once a size, never lowered


def test_replaced_experts_are_refused_by_the_checkpoint_versions():
    # why: after the load step the buffers hold the fragment layout under checkpoint shapes; a
    # version that reads the checkpoint layout must say so, not compute with them
    from workbench.kernels.int4_moe._common import check_inputs
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(2, 128, 128, seed=4)
    L.replace_with_repacked(m)
    ex = Int4Experts(m.gate_packed, m.gate_scale, m.up_packed, m.up_scale, m.down_packed,
                     m.down_scale)
    x, ids, w = torch.randn(1, 128).bfloat16(), torch.tensor([[0]]), torch.ones(1, 1)
    with pytest.raises(ValueError, match="experts.gate_packed: expected the checkpoint layout"):
        check_inputs(x, ids, w, ex, validate=False)
    check_inputs(x, ids, w, ex, validate=False, mma_ok=True)


def test_replace_gate_up_only_leaves_down_to_the_checkpoint_versions():
    # why: cuda_v4 streams gate / up repacked and down through triton_v34's checkpoint-layout
    # GEMM; its load step replaces gate / up only, and the checks let exactly those through
    from workbench.kernels.int4_moe._common import check_inputs
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(2, 128, 96, seed=9)  # I = 96: down would pad, gate / up do not
    down = (m.down_packed.clone(), m.down_scale.clone())
    want = L.repack((m.gate_packed, m.up_packed), (m.gate_scale, m.up_scale))
    L.replace_with_repacked(m, ("gate_up",))
    tagged = {n for n, b in m.named_buffers() if getattr(b, L.LAYOUT_ATTR, None) == "mma"}
    assert tagged == set(L.GATE_UP)
    assert torch.equal(m.down_packed, down[0]) and torch.equal(m.down_scale, down[1])
    got = L.repacked((m.gate_packed, m.up_packed), (m.gate_scale, m.up_scale))
    assert torch.equal(got[0], want[0]) and got[0].data_ptr() == m.gate_packed.data_ptr()
    ex = Int4Experts(m.gate_packed, m.gate_scale, m.up_packed, m.up_scale, m.down_packed,
                     m.down_scale)
    x, ids, w = torch.randn(1, 128).bfloat16(), torch.tensor([[0]]), torch.ones(1, 1)
    check_inputs(x, ids, w, ex, validate=False, mma_ok=L.GATE_UP)
    with pytest.raises(ValueError, match="experts.gate_packed: expected the checkpoint layout"):
        check_inputs(x, ids, w, ex, validate=False)
    m2 = _local_experts(2, 128, 128, seed=10)
    L.replace_with_repacked(m2, ("down",))
    ex2 = Int4Experts(m2.gate_packed, m2.gate_scale, m2.up_packed, m2.up_scale,
                      m2.down_packed, m2.down_scale)
    with pytest.raises(ValueError, match="experts.down_packed: expected the checkpoint layout"):
        check_inputs(x, ids, w, ex2, validate=False, mma_ok=L.GATE_UP)
    with pytest.raises(ValueError, match="gemms: expected a non-empty subset"):
        L.replace_with_repacked(m2, ("gate",))


def test_presets_run_their_versions_where_they_can_and_portable_elsewhere():
    # why: the engine preset (what the full-size emulation times) takes ENGINE (cuda_v28 from
    # session 57), the optimized one (the decode loop's) BEST; a machine without CUDA or cupy
    # (this CPU box, the demo) gets PORTABLE, triton_v34, not an error
    from workbench import ops
    from workbench.kernels import int4_moe

    assert ops.PRESETS["engine"]["int4_moe"] == int4_moe.ENGINE == "cuda_v28"
    assert ops.PRESETS["optimized"]["int4_moe"] == int4_moe.BEST
    assert int4_moe.PORTABLE == "triton_v34"
    for preset, version in (("engine", int4_moe.ENGINE), ("optimized", int4_moe.BEST)):
        runs = ops.op_spec("int4_moe").variant(version).unavailable_reason() is None
        want = version if runs else int4_moe.PORTABLE
        assert ops.resolve_selection(preset)["int4_moe"] == want


def test_v4_tiles_take_two_n_tiles_where_an_expert_expects_more_than_one():
    # why: one 8-slot n-tile a pass re-streams an expert's weights per 8 slots (REAL T 512:
    # 4703 vs v34's 3399 µs); two a pass need 12 warps an SM and two K parts (one spills)
    from workbench.kernels.int4_moe import cuda_v4

    for T, E, hint, nn in ((1, 384, None, 1), (128, 384, None, 1), (512, 384, None, 2),
                           (17, 48, 17, 1), (136, 48, 136, 1), (544, 48, 544, 2)):
        c = cuda_v4.tiles(T, 8, E, 7168, 2048, hint)
        assert c["NN1"] == nn, (T, hint)
        assert nn == 1 or (c["KW1"], c["RW1"]) == (2, 2)
        assert {"BM2", "KS2", "BN"} <= set(c)  # v34's down GEMM and combine knobs


def test_v5_tiles_fill_one_wave_only_without_a_hint():
    # why: at 128 registers 16 warps an SM are resident, so cuda_v1's ~24-an-SM K parts make
    # T 1 / 2 on 384 experts 1.5-2 waves (H200: T 1 gate/up 42 vs 38 µs at one wave); an EP
    # rank's active experts vary by draw, so hinted calls keep cuda_v4's tiles (and bits)
    from workbench.kernels.int4_moe import cuda_v4, cuda_v5, mma_layout

    NU = mma_layout.dims(2048, 7168, True)[0]
    for T, kw in ((1, 2), (2, 1)):
        c = cuda_v5.tiles(T, 8, 384, 7168, 2048)
        assert (c["KW1"], c["RW1"]) == (kw, 4 // kw), T
        assert NU * kw * cuda_v5.expected_active(384, 8 * T) <= cuda_v5.WAVE_WARPS
        assert c == cuda_v4.tiles(T, 8, 384, 7168, 2048) | {"KW1": kw, "RW1": 4 // kw}
    for T, E, hint in ((3, 384, None), (9, 384, None), (512, 384, None), (1, 48, 1),
                       (8, 48, 8), (17, 48, 17), (136, 48, 136)):
        assert cuda_v5.tiles(T, 8, E, 7168, 2048, hint) == cuda_v4.tiles(T, 8, E, 7168, 2048,
                                                                          hint), (T, hint)
    assert cuda_v5.one_wave_parts(NU, 56, 40.0, 8) is None  # one part past a wave
    assert cuda_v5.REPACKED == cuda_v4.REPACKED  # the load step repacks what cuda_v4 reads


def test_v6_asks_l2_for_down_weights_only_where_few_experts_are_active():
    # why: the prefetch pays only while the gate/up stream leaves DRAM idle and the down
    # blocks fit L2 beside it: an EP8 rank's decode (hints 1-2), not T 1 on 384 experts (66 MB)
    from workbench.kernels.int4_moe import cuda_v4, cuda_v5, cuda_v6
    from workbench.reference.int4_moe import Int4Experts

    for T, E, hint, on in ((1, 48, 1, 1), (2, 48, 2, 1), (4, 48, 4, 0), (17, 48, 17, 0),
                           (1, 384, None, 0), (9, 384, None, 0)):
        c = cuda_v6.tiles(T, 8, E, 7168, 2048, hint)
        assert c == cuda_v5.tiles(T, 8, E, 7168, 2048, hint) | {"L2D": on}, (T, hint)
    assert cuda_v6.down_bytes(7168, 2048) == 7168 * 1024 + 7168 * 64 * 2
    (p, s), = _mats(3, 64, 128, 1, seed=2)
    ex = Int4Experts(p, s, p, s, p, s)
    w, sc, wb, sb = cuda_v4.l2_blocks(ex)
    assert (w.data_ptr(), sc.data_ptr(), wb, sb) == (p.data_ptr(), s.data_ptr(), 64 * 16 * 4,
                                                     64 * 4 * 2)
    strided = Int4Experts(p, s, p, s, p[:, ::2], s[:, ::2])
    with pytest.raises(ValueError, match="experts: expected contiguous 16-byte aligned down"):
        cuda_v4.l2_blocks(strided)


def test_v7_splits_one_unhinted_token_into_two_routings_of_its_halves():
    # why: the two halves must cover the token's K slots exactly once between them (each slot
    # routed in one half, -1 in the other) and leave the caller's ids alone; only decode
    # without an EP hint is split (an EP rank's one expert has no second half)
    from workbench.kernels.int4_moe import cuda_v7

    ids = torch.tensor([[5, 17, 2, 300, 41, 9, 88, 120]])
    a, b = cuda_v7.halves(ids)
    assert a.tolist() == [[5, 17, 2, 300, -1, -1, -1, -1]]
    assert b.tolist() == [[-1, -1, -1, -1, 41, 9, 88, 120]]
    assert ids.tolist() == [[5, 17, 2, 300, 41, 9, 88, 120]]
    assert torch.equal(torch.where(a >= 0, a, b), ids)
    odd = cuda_v7.halves(torch.tensor([[1, 2, 3]], dtype=torch.int32))
    assert [t.tolist() for t in odd] == [[[1, -1, -1]], [[-1, 2, 3]]] and odd[0].dtype == torch.int32
    assert cuda_v7.split_here(ids, None)
    assert not cuda_v7.split_here(ids, 1)  # an EP rank's hinted decode
    assert not cuda_v7.split_here(torch.zeros(2, 8, dtype=torch.long), None)
    assert not cuda_v7.split_here(torch.zeros(1, 1, dtype=torch.long), None)
    assert not cuda_v7.split_here(torch.zeros(0, 8, dtype=torch.long), None)
    four = cuda_v7.parts(ids, 4)
    assert four.tolist() == [[[5, 17, -1, -1, -1, -1, -1, -1]], [[-1, -1, 2, 300, -1, -1, -1, -1]],
                             [[-1, -1, -1, -1, 41, 9, -1, -1]], [[-1, -1, -1, -1, -1, -1, 88, 120]]]
    assert torch.equal(four.max(0).values, ids)  # every slot in exactly one part
    assert cuda_v7.split_here(ids, None, 4) and not cuda_v7.split_here(ids[:, :3], None, 4)


def test_v7_rejects_a_bad_part_count():
    # why: NP is a user knob of the A/B CLI; a count below 2 must name the knob, not fail
    # inside the launcher
    from workbench.kernels.int4_moe import cuda_v7

    ids = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"cfg\['NP'\]: expected an int >= 2"):
        cuda_v7.int4_moe_cuda(torch.zeros(1, 16), ids, torch.ones(1, 8), None, cfg={"NP": 1})


def test_v4_h_rows_are_triton_v5s_permutation():
    # why: cuda_v4's gate/up GEMM writes h where triton_v34's down GEMM reads it: input i of a
    # 256-input tile at column 64 (i % 4) + 2 (i // 8 % 32) + (i // 4 % 2) (cuda_v1.cu's HOUT
    # 1, mirrored by cuda_v4.h_column); triton_v5's permute kernel puts x[t, _src(o)] at o,
    # so at h_column(i) it must hold input i
    from workbench.kernels.int4_moe import cuda_v4
    from workbench.kernels.int4_moe.triton_v5 import _permute_kernel

    D = 512
    x = torch.arange(D, dtype=torch.float32).bfloat16()[None].contiguous()
    xp = torch.full((1, D), float("nan"), dtype=torch.bfloat16)
    _permute_kernel[(1, D // 256)](x, x.stride(0), x.stride(1), xp, D, D)
    cols = torch.tensor([cuda_v4.h_column(i) for i in range(D)])
    assert sorted(cols.tolist()) == list(range(D))
    assert torch.equal(xp[0, cols], x[0])


def test_replace_with_repacked_needs_unpadded_matrices():
    # why: a padded layout has more elements than the checkpoint tensor it would replace
    # (I = 96: the down GEMM's 96 inputs pad to 128)
    m = _local_experts(1, 128, 96, seed=5)
    with pytest.raises(ValueError, match="holder.down_packed: expected a matrix"):
        L.replace_with_repacked(m)


def test_emulation_loads_the_fragment_layout_only_for_cuda_versions():
    # why: `emulate --kernels ...,int4_moe=cuda_vN` repacks every rank layer's experts in place
    # before the first step; any other selection leaves the checkpoint layout alone
    from workbench.dist.emulate import load_for

    class Rank(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = _local_experts(1, 128, 128, seed=6), _local_experts(1, 128, 128, 7)

    r = Rank()
    for sel in (None, "engine", {"int4_moe": "triton_v34"}):
        load_for(sel, r)
        assert not any(hasattr(b, L.LAYOUT_ATTR) for b in r.buffers())
    load_for({"int4_moe": "cuda_v4"}, r)  # gate / up only: cuda_v4.REPACKED
    assert {n.split(".")[1] for n, b in r.named_buffers()
            if getattr(b, L.LAYOUT_ATTR, None) == "mma"} == set(L.GATE_UP)
    r = Rank()
    load_for({"int4_moe": "cuda_v2", "linear": "triton_v5"}, r)
    assert all(getattr(b, L.LAYOUT_ATTR) == "mma" for b in r.buffers())


@pytest.mark.parametrize("v", CUDA_VERSIONS)
def test_every_cuda_version_names_the_gemms_the_load_step_repacks(v):
    # why: the EP8 emulation repacks a rank's experts in place by the version's REPACKED; session
    # 57's cuda_v28 lacked the name, the load step's old default repacked its down weights too,
    # and its Triton down GEMM refused them mid-step on the GPU. cuda_v1-v3 read both GEMMs in
    # the mma layout (check_inputs' mma_ok=True); from cuda_v4 the down GEMM reads the checkpoint
    mod = importlib.import_module(f"workbench.kernels.int4_moe.{v}")
    both = v in ("cuda_v1", "cuda_v2", "cuda_v3")
    assert mod.REPACKED == (("gate_up", "down") if both else ("gate_up",))


def test_emulation_load_step_refuses_a_cuda_version_without_repacked(monkeypatch):
    # why: no silent default layout: a version that does not say what it reads is an error
    import sys
    import types

    from workbench.dist.emulate import load_for

    monkeypatch.setitem(sys.modules, "workbench.kernels.int4_moe.cuda_v999",
                        types.ModuleType("cuda_v999"))
    with pytest.raises(ValueError, match=r"kernels\['int4_moe'\].*REPACKED.*cuda_v999"):
        load_for({"int4_moe": "cuda_v999"}, torch.nn.Module())


# ------------------------------------------------------------------ the launch rule (CPU)


@pytest.mark.parametrize("T, hint", [(1, None), (9, None), (17, None), (65, None), (512, None),
                                     (1, 1), (8, 8), (17, 17), (136, 136)])
def test_tiles_split_k_into_whole_chunk_pairs(T, hint):
    # why: every K part is a whole number of chunk pairs (one scale load covers a pair), a CTA
    # holds at most 32 warps, and the experts' CTAs never exceed the worst case's experts; at
    # Kimi shapes on 384 experts, or one EP8 rank of 48 with the loop's hint
    from workbench.kernels.int4_moe import cuda_v1

    E = 384 if hint is None else 48
    c = cuda_v1.tiles(T, 8, E, 7168, 2048, hint)
    for n, (N, KI, gu) in ((1, (2048, 7168, True)), (2, (7168, 2048, False))):
        NU, C, _ = L.dims(N, KI, gu)
        assert (C // 2) % c[f"KW{n}"] == 0 and c[f"KW{n}"] * c[f"RW{n}"] <= 32
    assert 1 <= c["A_GRID"] <= min(E, T * 8)


@pytest.mark.parametrize("T, hint", [(1, None), (3, None), (8, None), (1, 1), (8, 8)])
def test_v3_tiles_fit_its_cta(T, hint):
    # why: cuda_v3's one CTA shape serves both GEMMs: each K split divides the W warps and its
    # GEMM's chunk pairs; the decode shapes it fuses (T K <= 64) at Kimi's dims
    from workbench.kernels.int4_moe import cuda_v3

    E = 384 if hint is None else 48
    c = cuda_v3.tiles(T, 8, E, 7168, 2048, hint)
    for n, (N, KI, gu) in ((1, (2048, 7168, True)), (2, (7168, 2048, False))):
        NU, C, _ = L.dims(N, KI, gu)
        assert c["W"] % c[f"KW{n}"] == 0 and (C // 2) % c[f"KW{n}"] == 0
    assert T * 8 <= cuda_v3.SMAX


def test_operands_are_the_repacked_experts():
    # why: both CUDA launchers take their GEMM operands from `cuda_v1.operands`: the cached
    # repack of each GEMM, its unit / chunk counts, x with 16-byte rows, and a cfg whose K
    # parts do not divide a GEMM's chunk pairs refused by name
    from workbench.kernels.int4_moe import cuda_v1
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(2, 128, 256, seed=9)
    ex = Int4Experts(m.gate_packed, m.gate_scale, m.up_packed, m.up_scale, m.down_packed,
                     m.down_scale)
    x = torch.randn(3, 2 * 128).bfloat16()[:, ::2]  # a stride-2 view: 2-byte row pieces
    xx, (w1, s1, NU1, C1), (w2, s2, NU2, C2, KP2) = cuda_v1.operands(x, ex, {"KW1": 1, "KW2": 2})
    assert xx.is_contiguous() and torch.equal(xx, x)
    assert (NU1, C1, NU2, C2, KP2) == (*L.dims(256, 128, True)[:2], *L.dims(128, 256, False))
    assert w1 is L.repacked((m.gate_packed, m.up_packed), (m.gate_scale, m.up_scale))[0]
    assert w2 is L.repacked((m.down_packed,), (m.down_scale,))[0]
    with pytest.raises(ValueError, match="cfg: expected KW2 dividing 2 chunk pairs"):
        cuda_v1.operands(x, ex, {"KW1": 1, "KW2": 4})


def test_cuda_versions_refuse_cpu_tensors():
    # why: a CPU tensor gets an error naming x, not a cupy failure inside a launch
    from workbench.kernels import int4_moe

    (p, s), = _mats(2, 32, 64, 1, seed=1)
    ex = (p, s, p, s, p[:, :, :4].repeat(1, 2, 1).contiguous(), s[:, :, :1].repeat(1, 2, 1))
    x, ids, w = torch.randn(1, 64).bfloat16(), torch.tensor([[0]]), torch.ones(1, 1)
    for mod in (importlib.import_module(f"{int4_moe.__name__}.{v}") for v in CUDA_VERSIONS):
        with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
            mod.int4_moe_cuda(x, ids, w, ex)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
@pytest.mark.parametrize("post", [0, 1])
def test_kernels_build_for_sm90_without_spills(tmp_path, post):
    # why: the instances the launch rule picks at Kimi shapes (T 1 / 17 on 384 experts, an EP8
    # rank's decode) compile for sm_90 with mma.sync on bf16 (HMMA.16816) and no local memory
    # in the K loop (a few bytes of the K parts' reduction may spill at 128 registers)
    from workbench.kernels.int4_moe import cuda_v1

    picks = set()
    for T, E, hint in ((1, 384, None), (17, 384, None), (1, 48, 1), (17, 48, 17)):
        c = cuda_v1.tiles(T, 8, E, 7168, 2048, hint)
        for mode in (0, 1):
            n = mode + 1
            picks.add((mode, post, 0, c[f"KW{n}"], c[f"RW{n}"], c[f"NN{n}"], c[f"U{n}"]))
    log, sass = _build_mma_instances(tmp_path, picks)
    spills = [int(b) for b in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(spills) == len(picks) and max(spills) <= 16, log  # outside the K loop
    assert "HMMA.16816.F32.BF16" in sass
    _assert_mma_loops_off_local_memory(sass)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v4_gate_up_instances_build_for_sm90_without_local_memory_in_the_k_loop(tmp_path):
    # why: cuda_v4's gate/up writes h into triton_v5's rows (HOUT 1), takes (expert, pass)
    # work items (ITEMS 1) and two n-tiles a pass past 8 slots an expert (168 registers); at
    # the instances its rule picks (decode, the verify, T 512, an EP8 rank) the innermost mma
    # loop keeps off local memory
    from workbench.kernels.int4_moe import cuda_v4

    picks = set()
    for T, E, hint in ((1, 384, None), (17, 384, None), (512, 384, None), (17, 48, 17),
                       (544, 48, 544)):
        c = cuda_v4.tiles(T, 8, E, 7168, 2048, hint)
        for items in (0, 1):  # the default launch and the work-item knob (IT1 1)
            picks.add((0, 1, 0, c["KW1"], c["RW1"], c["NN1"], c["U1"], c["XB1"], 1, items))
    assert any(p[5] == 2 for p in picks)
    log, sass = _build_mma_instances(tmp_path, picks)
    assert "HMMA.16816.F32.BF16" in sass and "SHFL.BFLY" in sass  # the h runs' gather
    _assert_mma_loops_off_local_memory(sass)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v3_fused_kernel_builds_for_sm90_without_spills_in_its_k_loops(tmp_path):
    # why: the one-launch kernel holds both GEMMs' K loops; at the instances cuda_v3's rule
    # picks (Kimi decode on 384 experts, an EP8 rank) neither loop touches local memory at the
    # registers its __launch_bounds__ allows (MINB CTAs an SM)
    from workbench.kernels.int4_moe import cuda_v1, cuda_v3

    picks = set()
    for T, E, hint in ((1, 384, None), (8, 384, None), (1, 48, 1), (8, 48, 8)):
        c = cuda_v3.tiles(T, 8, E, 7168, 2048, hint)
        picks.add((1, 0, 0, c["W"], c["KW1"], c["KW2"], c["U"], c["MINB"]))
    sig = ",".join(["u64"] * 3 + ["int"] * 4 + ["u64"] * 4 + ["int"] * 4 + ["u64"] + ["int"] * 3
                   + ["u64"] + ["int"] * 2 + ["u64"] * 3 + ["int"] * 8)
    src = tmp_path / "fused.cu"
    src.write_text(f'#include "{cuda_v1._SRC}"\n#include "{cuda_v3._SRC}"\n' + "".join(
        f"template __global__ void int4_moe_fused<{', '.join(map(str, p))}>({sig});\n"
        for p in sorted(picks)))
    _, sass = _build_sm90(src)
    fns = sass.split("Function : ")[1:]
    assert len(fns) == len(picks)
    for fn in fns:
        loops = _mma_loops(fn)
        assert len(loops) >= 2, fn[:80]  # gate/up's and down's innermost K loops
        for loop in sorted(loops, key=len)[:2]:
            assert not any(("LDL" in i or "STL" in i) for i in loop), fn[:80]


def _build_mma_instances(tmp_path, picks) -> tuple[str, str]:
    """(ptxas log, SASS) of cuda_v1.cu's int4_moe_mma at the template argument tuples picks."""
    from workbench.kernels.int4_moe import cuda_v1

    sig = "u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,int,int,int,int,int,int,int,int,int," \
          "u64,u64,u64,u64"
    src = tmp_path / "inst.cu"
    src.write_text(f'#include "{cuda_v1._SRC}"\n' + "".join(
        f"template __global__ void int4_moe_mma<{', '.join(map(str, p))}>({sig});\n"
        for p in sorted(picks)))
    return _build_sm90(src)


def _assert_mma_loops_off_local_memory(sass: str) -> None:
    for fn in sass.split("Function : ")[1:]:  # each kernel's innermost loop that issues mmas
        loop = _innermost_mma_loop(fn)
        assert loop and not any(("LDL" in i or "STL" in i) for i in loop), fn[:80]


def _build_sm90(src) -> tuple[str, str]:
    """nvcc's ptxas report and cuobjdump's SASS of the sm_90 cubin built from src."""
    cubin = src.with_suffix(".cubin")
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v",
                        "-o", str(cubin), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    dump = shutil.which("cuobjdump")
    if dump is None:
        import os

        import triton

        dump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([dump, "-sass", str(cubin)], capture_output=True, text=True).stdout
    return r.stderr, sass


def _mma_loops(sass: str) -> list[list[str]]:
    """Every backward-branch range of one kernel's SASS that holds an HMMA."""
    ins = [(int(a, 16), i) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    out = []
    for a, i in ins:
        m = re.search(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", i)
        if m and int(m.group(1), 16) < a:
            body = [x for b, x in ins if int(m.group(1), 16) <= b <= a]
            if any("HMMA" in x for x in body):
                out.append(body)
    return out


def _innermost_mma_loop(sass: str) -> list[str]:
    """The instructions of the shortest backward-branch range of one kernel's SASS that holds
    an HMMA (the K loop)."""
    return min(_mma_loops(sass), key=len, default=[])


def test_by_kernel_phase_rates_span_each_gemms_launches():
    # why: the hot gate/up launch runs beside the cold one on a side stream, so a phase's time
    # is its launches' span, not their sum. Session 47 call 1's cuda_v18 row at skewed T 128
    # (µs @ mean start): the gate/up phase from the hot launch's start (231) to the cold one's
    # end (296 + 1186.1), the down phase over both down launches
    from workbench.kernels.int4_moe.triton_v5 import phase_rates

    by = {"_route_count_kernel": 2.3, "void int4_moe_hot<0, 8, 4, 6, 1>(unsigne": 323.4,
          "void int4_moe_mma<0, 1, 0, 1, 4, 1, 3, 2": 1186.1, "_gemm_kernel": 687.2,
          "_gemm_hot_kernel": 55.7, "_combine_kernel": 11.2}
    at = {"_route_count_kernel": 0, "void int4_moe_hot<0, 8, 4, 6, 1>(unsigne": 231,
          "void int4_moe_mma<0, 1, 0, 1, 4, 1, 3, 2": 296, "_gemm_kernel": 1485,
          "_gemm_hot_kernel": 2174, "_combine_kernel": 2231}
    line = phase_rates(by, at, 3.253e9, 1.627e9)
    assert line == "      phases: gate/up 1251.1 µs, 2.60 TB/s; down 744.7 µs, 2.18 TB/s"
    def wg(d):  # cuda_v19's wgmma hot launch has an extern "C" name
        return {k.replace("void int4_moe_hot<0, 8, 4, 6, 1>(unsigne", "int4_moe_hot_wg_8_4_6_1"): v
                for k, v in d.items()}

    assert phase_rates(wg(by), wg(at), 3.253e9, 1.627e9) == line
    # a Triton version runs _gemm_kernel for both GEMMs: no phase line rather than a wrong one
    assert phase_rates({"_gemm_kernel": 900.0, "_gemm_kernel#2": 500.0},
                       {"_gemm_kernel": 10.0, "_gemm_kernel#2": 920.0}, 1e9, 5e8) is None


# ------------------------------------------------------------------ the H200


def _variant(version):
    from workbench.kernels.int4_moe import register
    from workbench.ops.registry import op_spec

    register()
    return op_spec("int4_moe").variant(version).load()


def _check(version, cases):
    from workbench.check import check
    from workbench.kernels.int4_moe import register

    register()
    df = check("int4_moe", version, cases=cases)
    bad = df[~df["pass"]]
    assert bad.empty, bad.to_string()


def test_kernel_args_pass_tensors_as_pointers_and_the_rest_as_i32():
    # why: every raw launch (cuda_v1 / v3 / v10 / v19 / v24) converts its arguments here; a
    # tensor passed as an int32, or a stride as a pointer, reads the wrong memory
    import numpy as np

    from workbench.kernels.int4_moe import cuda_v1

    t = torch.zeros(4)
    got = cuda_v1.kernel_args((t, 7, 2**31 - 1))
    assert [type(v) for v in got] == [np.uint64, np.int32, np.int32]
    assert got == (np.uint64(t.data_ptr()), np.int32(7), np.int32(2**31 - 1))


@pytest.mark.gpu
def test_a_refused_launch_names_what_it_asked_gpu():
    # why: a bare CUDA_ERROR_INVALID_VALUE names neither the launch nor the kernel's limits
    # (sessions 46-49 bisected one by tests); 300 KB of shared memory is past any sm_90 limit
    from workbench.kernels.int4_moe import cuda_v1, cuda_v19

    fn = cuda_v19._xperm_kernel()
    with pytest.raises(RuntimeError, match=r"grid \(1,\), block \(32,\), 307200 B .*refused"):
        cuda_v1.run_kernel(fn, (1,), (32,), (), 300 * 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("version", CUDA_VERSIONS)
def test_edge_cases_match_reference_gpu(version):
    from workbench.ops.cases import int4_moe_cases

    for seed in (0, 1):
        _check(version, [c for c in int4_moe_cases("edge", seed, device="cuda")
                         if "duplicate" not in c.label])


@pytest.mark.gpu
@pytest.mark.parametrize("version", CUDA_VERSIONS)
@pytest.mark.parametrize("skew", [0.0, 1.2], ids=["uniform", "skewed"])
@pytest.mark.parametrize("T", (1, 9, 17, 33, 65, 128, 512))
def test_real_shapes_gpu(real_experts, version, T, skew):
    from workbench.ops.case import Case
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K, D = cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden_size
    for seed in (0, 1):
        r = _Rand(100 + seed + T, "cuda")
        ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
        w = r.uniform(T, K) + 0.05
        x = r.normal(T, D)
        dims = dict(T=T, D=D, I=cfg.moe_intermediate, E=E, K=K,
                    E_touched=int(ids.unique().numel()))
        _check(version, [Case("int4_moe", f"T={T} skew={skew}", (x, ids, w, ex), dims=dims,
                              kind="real")])


@pytest.mark.gpu
@pytest.mark.parametrize("version", CUDA_VERSIONS)
@pytest.mark.parametrize("T", (1, 8, 17, 136))
def test_ep8_rank_gpu(real_experts, version, T):
    # why: one EP8 rank on the replicated stream (48 of 384 experts, -1 elsewhere, the hint the
    # loop passes): the launch rule's widest K splits (hint 1) and the verify's shapes
    from workbench.ops.cases import _Rand

    fn = _variant(version)
    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(700 + T, "cuda")
    ids = r.distinct(E, K, T)
    here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
    ex48 = type(ex)(*(t[:48] for t in ex))
    x, w = r.normal(T, cfg.hidden_size), r.uniform(T, K) + 0.05
    out = fn(x, here, w, ex48, expected_slots=-(-T * K // 8))
    ref = int4_moe(x, here, w, ex48)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("version", CUDA_VERSIONS)
@pytest.mark.parametrize("T", (1, 33))
def test_cuda_graph_replay_equals_eager_gpu(real_experts, version, T):
    from workbench.ops.cases import _Rand

    fn = _variant(version)
    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(40 + T, "cuda")
    ids, w, x = r.distinct(E, K, T), r.uniform(T, K) + 0.05, r.normal(T, cfg.hidden_size)
    fn(x, ids, w, ex)  # warm-up: compiles, repacks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # the launch path must not sync
    try:
        fn(x, ids, w, ex)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(x, ids, w, ex)
    ids.copy_(r.distinct(E, K, T))
    x.copy_(r.normal(T, cfg.hidden_size))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fn(x, ids, w, ex))


def _rank_or_full(real_experts, seed, T, hint):
    """(x, ids, w, experts) of T uniform tokens: on all 384 experts (hint None) or on one EP8
    rank (48 experts, -1 elsewhere; the caller passes its hint)."""
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(seed, "cuda")
    ids = r.distinct(E, K, T)
    if hint is not None:
        ids = torch.where(ids < 48, ids, torch.full_like(ids, -1))
        ex = type(ex)(*(t[:48] for t in ex))
    return r.normal(T, cfg.hidden_size), ids, r.uniform(T, K) + 0.05, ex


@pytest.mark.gpu
@pytest.mark.parametrize("T, hint", [(3, None), (33, None), (1, 1), (17, 17), (136, 136)])
def test_v5_is_v4_wherever_its_tiles_are_gpu(real_experts, T, hint):
    # why: cuda_v5 changes the gate/up K parts of unhinted T 1 / 2 only; everywhere else (the
    # EP8 step's hinted calls, T >= 3) it must be cuda_v4's launches, so cuda_v4's bits
    from workbench.kernels.int4_moe import cuda_v4, cuda_v5

    x, ids, w, ex = _rank_or_full(real_experts, 900 + T, T, hint)
    a = cuda_v5.int4_moe_cuda(x, ids, w, ex, expected_slots=hint)
    assert torch.equal(a, cuda_v4.int4_moe_cuda(x, ids, w, ex, expected_slots=hint))


@pytest.mark.gpu
@pytest.mark.parametrize("T, hint", [(1, 1), (2, 2), (1, None), (17, 17)])
def test_v6_prefetch_changes_no_bit_gpu(real_experts, T, hint):
    # why: the L2 prefetch is a hint: with it on (L2D 1, forced where the rule leaves it off
    # too) cuda_v6's outputs are cuda_v5's bit for bit, graph-replayed as eager
    from workbench.kernels.int4_moe import cuda_v5, cuda_v6

    x, ids, w, ex = _rank_or_full(real_experts, 950 + T, T, hint)
    want = cuda_v5.int4_moe_cuda(x, ids, w, ex, expected_slots=hint)
    got = cuda_v6.int4_moe_cuda(x, ids, w, ex, expected_slots=hint, cfg={"L2D": 1})
    assert torch.equal(got, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cuda_v6.int4_moe_cuda(x, ids, w, ex, expected_slots=hint, cfg={"L2D": 1})
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(33, 1.2), (128, 1.2), (512, 0.0)])
def test_v4_work_items_are_bitwise_by_expert_gpu(real_experts, T, skew):
    # why: cuda_v4's (expert, pass) work items (knob IT1, off by default: slower) only move a
    # pass to another CTA column: each pass computes what it did in its expert's column, so
    # the outputs are the same bits
    from workbench.kernels.int4_moe import cuda_v4
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K, D = cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden_size
    r = _Rand(970 + T, "cuda")
    ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
    x, w = r.normal(T, D), r.uniform(T, K) + 0.05
    by_item = cuda_v4.int4_moe_cuda(x, ids, w, ex, cfg={"IT1": 1})
    by_expert = cuda_v4.int4_moe_cuda(x, ids, w, ex)
    assert not by_item.isnan().any() and torch.equal(by_item, by_expert)


@pytest.mark.gpu
def test_v4_work_items_past_the_shared_counts_gpu():
    # why: past ITEM_SMEM (512) active experts the CTAs read the counts from global memory;
    # 640 small experts, 200 tokens (~587 active): the work items (IT1 1) give the by-expert
    # launch's bits, which equal the reference
    from workbench.kernels.int4_moe import cuda_v4
    from workbench.ops.case import Case
    from workbench.ops.cases import _Rand
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(640, 256, 256, seed=12).cuda()
    ex = Int4Experts(m.gate_packed, m.gate_scale, m.up_packed, m.up_scale, m.down_packed,
                     m.down_scale)
    r = _Rand(980, "cuda")
    x, ids, w = r.normal(200, 256), r.distinct(640, 8, 200), r.uniform(200, 8) + 0.05
    assert ids.unique().numel() > 512
    out = cuda_v4.int4_moe_cuda(x, ids, w, ex, cfg={"IT1": 1})
    assert torch.equal(out, cuda_v4.int4_moe_cuda(x, ids, w, ex, cfg={"IT1": 0}))
    dims = dict(T=200, D=256, I=256, E=640, K=8, E_touched=int(ids.unique().numel()))
    _check("cuda_v4", [Case("int4_moe", "640 experts", (x, ids, w, ex), dims=dims,
                            why="counts past ITEM_SMEM from global memory", kind="edge")])


@pytest.mark.gpu
@pytest.mark.parametrize("T", (1, 3, 8))
def test_v3_fused_routing_edges_gpu(real_experts, T):
    # why: the fused launch routes in each CTA's shared memory: int32 ids, an int64 strided
    # view, every token on one expert, bf16 weights, a rank with nothing routed (zeros), a
    # token naming one expert twice (its row NaN, the other rows the reference's)
    from workbench.ops.cases import _Rand

    fn = _variant("cuda_v3")
    ex, cfg = real_experts
    E, K, D = cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden_size
    r = _Rand(900 + T, "cuda")
    x, w, ids = r.normal(T, D), r.uniform(T, K) + 0.05, r.distinct(E, K, T)
    rest = r.distinct(E - 1, K - 1, T)
    one = torch.cat([torch.full_like(ids[:, :1], 5), rest + (rest >= 5).to(rest.dtype)], 1)
    for label, i, wt in (("int32", ids.int(), w), ("strided", torch.stack([ids, ids], 2)[..., 0], w),
                         ("one expert", one, w), ("bf16 weights", ids, w.bfloat16())):
        out = fn(x, i, wt, ex)
        ref = int4_moe(x, i.long(), wt.float(), ex)
        assert not out.isnan().any(), label
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2, msg=label)
    none = fn(x, torch.full_like(ids, -1), w, ex)
    assert torch.equal(none, torch.zeros_like(none))
    dup = ids.clone()
    dup[0, 1] = dup[0, 0]
    out = fn(x, dup, w, ex)
    assert out[0].isnan().all()
    if T > 1:
        ref = int4_moe(x[1:], dup[1:], w[1:], ex)
        torch.testing.assert_close(out[1:].float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_v3_counters_reset_between_launches_gpu(real_experts):
    # why: each launch's last CTA zeroes the work counters the next launch starts from: 24
    # launches over changing T and routings (a rank with nothing routed among them), then the
    # first input again gives the first output bit for bit (deterministic, nothing left over)
    from workbench.ops.cases import _Rand

    fn = _variant("cuda_v3")
    ex, cfg = real_experts
    E, K, D = cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden_size
    r = _Rand(950, "cuda")
    first = (r.normal(2, D), r.distinct(E, K, 2), r.uniform(2, K) + 0.05)
    want = fn(*first, ex).clone()
    for n in range(24):
        T = 1 + n % 8
        ids = r.distinct(E, K, T) if n % 5 else torch.full((T, K), -1, device="cuda")
        fn(r.normal(T, D), ids, r.uniform(T, K), ex)
    assert torch.equal(fn(*first, ex), want)


@pytest.mark.gpu
@pytest.mark.parametrize("T", (1, 9, 33))
def test_one_activation_buffer_is_bitwise_two_gpu(real_experts, T):
    # why: XB only moves the activation loads (one pair ahead, or right before the pair's mma
    # steps); the arithmetic and its order are the same, so either buffering gives the same bits
    from workbench.kernels.int4_moe import cuda_v2
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K, D = cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden_size
    r = _Rand(970 + T, "cuda")
    x, ids, w = r.normal(T, D), r.distinct(E, K, T), r.uniform(T, K) + 0.05
    two = cuda_v2.int4_moe_cuda(x, ids, w, ex, cfg={"XB1": 2, "XB2": 2})
    one = cuda_v2.int4_moe_cuda(x, ids, w, ex, cfg={"XB1": 1, "XB2": 1})
    assert not two.isnan().any() and torch.equal(one, two)


@pytest.mark.gpu
def test_replaced_experts_give_the_same_bits_gpu():
    # why: the in-place load step hands the kernels the words `repacked` would have built, so
    # cuda_v2 / cuda_v3 / cuda_v4 outputs before and after it are equal bit for bit
    from workbench.kernels.int4_moe import cuda_v2, cuda_v3, cuda_v4
    from workbench.ops.cases import _Rand
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(6, 256, 512, seed=8).cuda()
    r = _Rand(990, "cuda")
    x, ids, w = r.normal(5, 256), r.distinct(6, 2, 5), r.uniform(5, 2) + 0.05
    stack = lambda: Int4Experts(m.gate_packed, m.gate_scale, m.up_packed, m.up_scale,  # noqa: E731
                                m.down_packed, m.down_scale)
    before = [mod.int4_moe_cuda(x, ids, w, stack()) for mod in (cuda_v2, cuda_v3, cuda_v4)]
    L.replace_with_repacked(m, cuda_v4.REPACKED)  # gate / up: cuda_v4 reads those repacked
    mid = cuda_v4.int4_moe_cuda(x, ids, w, stack())
    L.replace_with_repacked(m, ("down",))
    after = [mod.int4_moe_cuda(x, ids, w, stack()) for mod in (cuda_v2, cuda_v3)]
    for b, a in zip(before, [*after, mid]):
        assert not b.isnan().any() and torch.equal(a, b)


# ------------------------------------------------------------------ cuda_v8's decode launches


def _v8_experts(E, D, I, seed, device="cpu"):
    from workbench.reference.int4_moe import Int4Experts

    m = _local_experts(E, D, I, seed)
    return Int4Experts(*(getattr(m, f"{p}_{k}").to(device) for p in ("gate", "up", "down")
                         for k in ("packed", "scale")))


def test_v8_fuses_one_token_calls_on_the_layout_it_reads():
    # why: the rule reads shapes, strides and pointers only (graph-safe) and must send to
    # cuda_v5 every call the two launches cannot serve: more than one token, an EP hint (unless
    # F8 forces it, for measuring), I not a whole number of 128-input slices
    from workbench.kernels.int4_moe import cuda_v8

    ex = _v8_experts(2, 256, 256, seed=5)
    x1, x2 = torch.zeros(1, 256).bfloat16(), torch.zeros(2, 256).bfloat16()
    ids = torch.zeros(1, 8, dtype=torch.long)
    assert cuda_v8.fused_here(x1, ids, ex, None)
    assert not cuda_v8.fused_here(x2, ids.repeat(2, 1), ex, None)
    assert not cuda_v8.fused_here(x1, ids, ex, 1)
    assert cuda_v8.fused_here(x1, ids, ex, 1, force=True)
    assert not cuda_v8.fused_here(x1, ids, _v8_experts(2, 256, 96, seed=5), None)
    x128 = torch.zeros(1, 128).bfloat16()  # one gate/up chunk pair: KW 2 cannot split it
    assert not cuda_v8.fused_here(x128, ids, _v8_experts(2, 128, 256, seed=5), None)
    with pytest.raises(ValueError, match=r"cfg\['F8'\]: expected 0 or 1, got 2"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"F8": 2})
    with pytest.raises(ValueError, match=r"cfg\['DN'\]: expected one of"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"DN": 10})
    with pytest.raises(ValueError, match=r"cfg\['CL'\]: expected one of"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"CL": 3})
    assert not cuda_v8.fused_here(x1, torch.zeros(1, cuda_v8.KMAX + 1, dtype=torch.long), ex, None)
    with pytest.raises(ValueError, match=r"cfg\['LY'\]: expected 0, 1, 2 or 3, 0 with CL > 1"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"LY": 1, "CL": 2})
    with pytest.raises(ValueError, match=r"cfg\['LY'\]: expected 1 or 2 with DN 3"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"DN": 3})
    with pytest.raises(ValueError, match=r"cfg\[.IL.\]: expected 0 or 1, and 0 unless DN 0, 3, 5"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"IL": 1, "DN": 2})
    with pytest.raises(ValueError, match=r"cfg\[.EF.\]: expected 0 or 1, and 0 unless DN 2"):
        cuda_v8.int4_moe_cuda(x1, ids, torch.ones(1, 8), ex, cfg={"EF": 1})


def test_v8_slice_major_down_is_the_checkpoint_reordered():
    # why: LY 1 reads the down experts from a copy made at first use; it must hold the same
    # words and scales (exact), slice s of row n at [e, s, n], and be made once per tensor
    from workbench.kernels.int4_moe import cuda_v8

    ex = _v8_experts(3, 64, 384, seed=8)
    w, s = cuda_v8.by_slice(ex.down_packed, ex.down_scale)
    E, D, IW = ex.down_packed.shape
    assert w.shape == (E, 3, D, 16) and s.shape == (E, 3, D, 4) and w.is_contiguous()
    for sl in range(3):
        assert torch.equal(w[:, sl], ex.down_packed[:, :, 16 * sl:16 * sl + 16])
        assert torch.equal(s[:, sl], ex.down_scale[:, :, 4 * sl:4 * sl + 4])
    assert cuda_v8.by_slice(ex.down_packed, ex.down_scale)[0] is w
    # LY 2: row n's 4-word group g at position g ^ ((n >> 1) & 3), the scales as LY 1's
    ws, ss = cuda_v8.by_slice(ex.down_packed, ex.down_scale, ly=2)
    assert torch.equal(ss, s) and ws is not w
    for n in range(D):
        for g in range(4):
            p = g ^ ((n >> 1) & 3)
            assert torch.equal(ws[:, :, n, 4 * p:4 * p + 4], w[:, :, n, 4 * g:4 * g + 4])
    with pytest.raises(ValueError, match=r"cfg\['LY'\]: expected 0, 1, 2 or 3, .* 2 only with DN"):
        cuda_v8.int4_moe_cuda(torch.zeros(1, 64).bfloat16(), torch.zeros(1, 8, dtype=torch.long),
                              torch.ones(1, 8), ex, cfg={"LY": 2})
    for bad in ({"LY": 3, "DN": 6}, {"LY": 1, "DN": 8}):  # LY 3 exactly with DN 8
        with pytest.raises(ValueError, match=r"cfg\['LY'\]: .* 3 exactly with DN 8"):
            cuda_v8.int4_moe_cuda(torch.zeros(1, 64).bfloat16(),
                                  torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8), ex,
                                  cfg=bad)


def test_v8_lane_major_down_holds_each_lanes_nibble_pairs():
    # why: DN 8 reads row n's 16 bytes at lane t's piece and extracts raw(u >> 4 j) for word j
    # of each group (cuda_v8.cu's tile_mma_lanes); a CPU twin of that extraction must give the
    # nibbles tile_mma takes from the slice-major row, raw(word >> 4 t): nibbles t and t + 4 of
    # word 4 c + j, for every row, lane, group and word, sign bits included
    from workbench.kernels.int4_moe import cuda_v8

    ex = _v8_experts(2, 32, 256, seed=9)
    ex.down_packed[0, 0, 0] = -1  # every nibble 15: the u32 past 2^31
    w, s1 = cuda_v8.by_slice(ex.down_packed, ex.down_scale)
    lanes, s3 = cuda_v8.by_slice(ex.down_packed, ex.down_scale, ly=3)
    assert lanes.shape == w.shape and lanes.dtype == torch.int32 and torch.equal(s3, s1)
    u = lanes.long() & 0xFFFFFFFF
    word = w.long() & 0xFFFFFFFF
    for t in range(4):
        for c in range(4):
            U = u[..., 4 * t + c]
            for j in range(4):
                src = word[..., 4 * c + j] >> (4 * t)  # tile_mma's raw(word >> 4 t)
                got = U >> (4 * j)  # tile_mma_lanes' raw(u >> 4 j)
                assert torch.equal(got & 0xF, src & 0xF)
                assert torch.equal((got >> 16) & 0xF, (src >> 16) & 0xF)
    # together the pairs hold every nibble of the row once: the same multiset of values
    assert torch.equal(torch.sort(((u[..., None] >> 4 * torch.arange(8)) & 15).flatten(-2))[0],
                       torch.sort(((word[..., None] >> 4 * torch.arange(8)) & 15).flatten(-2))[0])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v8_decode_kernel_builds_for_sm90_at_one_cta_an_sm_without_spills(tmp_path):
    # why: the fused kernel holds cuda_v1's gate/up K loop and the down partial's 32 h values a
    # lane; at 512 threads and one CTA an SM it must fit 128 registers with no local memory
    from workbench.kernels.int4_moe import cuda_v1, cuda_v8

    sig = ",".join(["u64"] * 4 + ["int"] * 8 + ["u64"] * 2 + ["long long", "int"] * 2 + ["u64"])
    src = tmp_path / "v8.cu"
    src.write_text(f'#include "{cuda_v1._SRC}"\n#include "{cuda_v8._SRC}"\n' + "".join(
        f"template __global__ void int4_moe_decode<{k}, {dn}>({sig},int,long long,long long,u64,int,u64,u64);\n"
        for k in (0, 1)
        for dn in cuda_v8.DOWN_FORMS) + "".join(
        f"template __global__ void int4_moe_decode<{k}, {dn}, {gu}, {gb}>({sig},int,long long,"
        "long long,u64,int,u64,u64);\n" for k in (0, 1) for dn, rings in cuda_v8.RINGS_OF.items()
        for gu, gb in rings) + "".join(
        f"template __global__ void int4_moe_decode_cl<{k}, {cl}>({sig});\n" for k in (0, 1)
        for cl in cuda_v8.CLUSTERS))
    log, sass = _build_sm90(src)
    rings = sum(len(r) for r in cuda_v8.RINGS_OF.values())
    n = 2 * (len(cuda_v8.DOWN_FORMS) + rings + len(cuda_v8.CLUSTERS)) + 1
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    assert len(regs) == n and max(regs) <= 128, log
    # DN 2 (the down partial on the tensor cores, its 32 B-fragment registers live through the
    # row loop) spills at most 32 bytes (8 before EF's L2 policy and LY 2's swizzle, runtime
    # flags), a few 4-byte reloads a tile; DN 4 / 6 (the same math on the bulk rings) at most
    # 32; the other forms and the combine none
    spills = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"entry function '(\w+)'.*?(\d+) bytes spill stores", log, re.S)}
    assert len(spills) == n, log
    for name, b in spills.items():
        dn = int(m.group(1)) if (m := re.search(r"decodeILi\dELi(\d)E(?:Li\dELi\dE)?Ev",
                                                name)) else -1
        assert b <= {2: 32, 4: 32, 6: 32, 8: 32, 9: 32}.get(dn, 0), (name, b)
    assert "HMMA.16816.F32.BF16" in sass  # the gate/up phase on tensor cores
    # the bulk forms (DN 3 / 4 / 6 / 7 / 8): TMA bulk copies into the ring, its mbarrier waits
    assert "UBLKCP.S.G" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass
    # GB 2 reads each group's correction instead of computing it: phase 1's K loop (the
    # innermost loop that issues bulk copies and mmas and loads x from global memory; the
    # down loop loads nothing from there) holds 16 of GB 1's 24 mmas a pair
    phase1 = {}
    for fn in sass.split("Function : ")[1:]:
        if m := re.match(r"_Z15int4_moe_decodeILi0ELi8ELi3ELi([12])E", fn):
            loop = min((lp for lp in _mma_loops(fn) if any("UBLKCP" in i for i in lp)
                        and any(i.lstrip("@!P0123456789 ").startswith("LDG") for i in lp)), key=len)
            phase1[m.group(1)] = sum("HMMA" in i for i in loop)
    assert phase1["2"] * 3 == phase1["1"] * 2 and phase1["2"] > 0, phase1


@pytest.mark.gpu
@pytest.mark.parametrize("D, I", [(256, 256), (192, 384)], ids=["aligned", "kpad"])
def test_v8_decode_matches_reference_gpu(D, I):
    # why: the two launches themselves (the rule sends these shapes to them), through the
    # harness (NaN-poisoned outputs, bf16-derived tolerances): -1 slots add nothing, int32 /
    # int64 and strided ids, bf16 weights (as their fp32 copy), K parts past a chunk-pair multiple of D (KPAD); a
    # token with an id outside [-1, E) or an expert twice comes back NaN (the router's rule)
    # without a host check; a hinted call forced onto the path (F8) is the same launches
    from workbench.kernels.int4_moe import cuda_v8
    from workbench.ops.case import Case

    E, K = 6, 4
    ex = _v8_experts(E, D, I, seed=11, device="cuda")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, D, generator=g).bfloat16().cuda()
    w = (torch.rand(1, K, generator=g) + 0.1).cuda()
    all_ids = [torch.tensor([[3, 0, 5, 1]]), torch.tensor([[2, -1, 4, -1]], dtype=torch.int32),
               torch.tensor([[1, 9, 3, 0, 5, 7, 2, 8]])[:, ::2]]
    cases = []
    for n, ids in enumerate(all_ids):
        ids = ids.cuda()
        assert cuda_v8.fused_here(x, ids, ex, None)
        cases.append(Case("int4_moe", f"v8 D={D} I={I} ids {n}", (x, ids, w, ex),
                          dims=dict(T=1, D=D, I=I, E=E, K=K)))
        wb = w.bfloat16()  # bf16 weights: the op's fp32 copy of them
        assert torch.equal(cuda_v8.int4_moe_cuda(x, ids, wb, ex),
                           cuda_v8.int4_moe_cuda(x, ids, wb.float(), ex))
    _check("cuda_v8", cases)
    for bad in ([[3, 3, 5, 1]], [[3, 0, E, 1]], [[3, 0, -2, 1]]):
        out = cuda_v8.int4_moe_cuda(x, torch.tensor(bad).cuda(), w, ex, validate=False)
        assert out.isnan().all()
    hinted = torch.tensor([[3, -1, -1, -1]]).cuda()
    forced = cuda_v8.int4_moe_cuda(x, hinted, w, ex, expected_slots=1, cfg={"F8": 1})
    assert not forced.isnan().any()
    assert torch.equal(forced, cuda_v8.int4_moe_cuda(x, hinted, w, ex))


@pytest.mark.gpu
@pytest.mark.parametrize("dn, cl, ro, ly, il, ef", [
    (0, 1, 0, 0, 0, 0), (1, 1, 0, 0, 0, 0), (2, 1, 0, 0, 0, 0), (0, 2, 0, 0, 0, 0),
    (0, 4, 0, 0, 0, 0), (0, 8, 0, 0, 0, 0), (0, 1, 1, 0, 0, 0), (0, 1, 0, 1, 0, 0),
    (2, 1, 0, 1, 0, 0), (3, 1, 0, 1, 0, 0), (4, 1, 0, 1, 0, 0), (0, 1, 0, 0, 1, 0),
    (0, 1, 0, 1, 1, 0), (3, 1, 0, 1, 1, 0), (5, 1, 0, 0, 0, 0), (5, 1, 0, 1, 0, 0),
    (5, 1, 0, 1, 1, 0), (6, 1, 0, 1, 0, 0), (7, 1, 0, 1, 0, 0), (7, 1, 0, 1, 1, 0),
    (2, 1, 0, 1, 0, 1), (2, 1, 0, 0, 0, 1), (4, 1, 0, 1, 0, 1), (6, 1, 0, 1, 0, 1),
    (2, 1, 0, 2, 0, 1), (4, 1, 0, 2, 0, 1), (6, 1, 0, 2, 0, 1), (8, 1, 0, 3, 0, 0),
    (8, 1, 0, 3, 0, 1)])
def test_v8_down_forms_match_reference_at_kimi_shapes_gpu(real_experts, dn, cl, ro, ly, il, ef):
    # why: the ways the down partial streams its rows (cuda_v8.cu's DN: registers, a cp.async
    # ring, tensor cores with the permuted K order; CL: clusters sharing h through DSMEM) are
    # the A/B's configs; each must be the op at T 1 on 384 experts, -1 slots and int32 ids
    # included
    from workbench.kernels.int4_moe import cuda_v8
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    for seed in (0, 1):
        r = _Rand(900 + seed, "cuda")
        ids, w, x = r.distinct(E, K, 1), r.uniform(1, K) + 0.05, r.normal(1, cfg.hidden_size)
        if seed:
            ids = torch.where(torch.arange(K, device="cuda") % 3 == 1, -1, ids).int()
        assert cuda_v8.fused_here(x, ids, ex, None)
        cfg8 = {"DN": dn, "CL": cl, "RO": ro, "LY": ly, "IL": il, "EF": ef}
        out = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg8)
        ref = int4_moe(x, ids, w, ex)
        assert not out.isnan().any()
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
        twice = ids.clone()
        twice[0, 2] = twice[0, 0]  # one expert twice: the router's NaN row
        assert cuda_v8.int4_moe_cuda(x, twice, w, ex, validate=False, cfg=cfg8).isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("dn", [3, 4, 6, 7, 8])
@pytest.mark.parametrize("D, I", [(256, 256), (192, 384), (7168 - 64, 256)],
                         ids=["whole", "tail", "many"])
def test_v8_bulk_down_forms_match_reference_gpu(dn, D, I):
    # why: DN 3 / 4 stream the down rows in 128 / 256-row blocks through a ring of 7 / 3 stages
    # whose first ones are asked for before phase 1, DN 7 / 6 through 16 / 8 stages in the gate/up
    # ring's shared memory once phase 1 is done (DN 8: DN 6 on the lane-major copy): D 192 ends
    # inside a block (DN 4 / 6 / 8: the only block), D 7104 refills every stage several times and ends in a partial block; each must be
    # the reference (the harness's bf16-derived tolerance; DN 0, the default, alongside) and
    # deterministic, -1 slots included
    from workbench.kernels.int4_moe import cuda_v8
    from workbench.ops.case import Case
    from workbench.ops.cases import compare

    E, K = 6, 4
    ex = _v8_experts(E, D, I, seed=13, device="cuda")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, D, generator=g).bfloat16().cuda()
    w = (torch.rand(1, K, generator=g) + 0.1).cuda()
    for ids in (torch.tensor([[3, 0, 5, 1]]), torch.tensor([[2, -1, 4, -1]], dtype=torch.int32)):
        ids = ids.cuda()
        assert cuda_v8.fused_here(x, ids, ex, None)
        case = Case("int4_moe", f"v8 DN {dn} D={D}", (x, ids, w, ex),
                    dims=dict(T=1, D=D, I=I, E=E, K=K))
        ref = int4_moe(x, ids, w, ex)
        for cfg in ({}, {"DN": dn, "LY": 3 if dn == 8 else 1}):
            out = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg)
            rep = compare(ref, out, case)
            assert rep["pass"] and not out.isnan().any(), (cfg, rep)
            assert torch.equal(out, cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg))
    with pytest.raises(ValueError, match=r"cfg\['LY'\]: expected (1 or 2 with DN|.* 3 exactly)"):
        cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={"DN": dn})


@pytest.mark.gpu
@pytest.mark.parametrize("D, I", [(256, 256), (192, 384), (7168 - 64, 256)],
                         ids=["one-pair", "kpad", "many"])
def test_v8_gate_rings_are_bitwise_the_cp_async_ring_gpu(D, I):
    # why: GU / GB change only how phase 1's weights reach shared memory (deeper cp.async rings,
    # TMA bulk copies with one mbarrier a stage); the arithmetic is the default ring's, so the
    # output must be its bits: one pair a warp (D 256: no refill), KPAD's masked inputs (D 192),
    # and every stage refilled many times (D 7104: 28 pairs a warp); -1 slots included
    from workbench.kernels.int4_moe import cuda_v8

    E, K = 6, 4
    ex = _v8_experts(E, D, I, seed=17, device="cuda")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, D, generator=g).bfloat16().cuda()
    w = (torch.rand(1, K, generator=g) + 0.1).cuda()
    for ids in (torch.tensor([[3, 0, 5, 1]]), torch.tensor([[2, -1, 4, -1]], dtype=torch.int32)):
        ids = ids.cuda()
        base = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={"DN": 8, "LY": 3, "EF": 1})
        assert not base.isnan().any()
        for dn, rings in cuda_v8.RINGS_OF.items():  # DN 9: DN 8's math on a shorter ring
            for gu, gb in ((3, 0), *rings):
                cfg = {"DN": dn, "LY": 3, "EF": 1, "GU": gu, "GB": gb}
                assert torch.equal(cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg), base), cfg
        # EA 1: the down ring's first stages asked for before phase 1, in the bytes its bulk
        # ring leaves free (D 7104: 28 blocks, every stage reused; D 192 / 256: one block)
        cfg = {"DN": 8, "LY": 3, "EF": 1, "GB": 1, "EA": 1}
        assert torch.equal(cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg), base)


@pytest.mark.gpu
@pytest.mark.parametrize("dn, gu, gb", [(8, 4, 0), (8, 3, 1), (8, 4, 1), (8, 5, 1), (8, 3, 2),
                                       (9, 3, 1), (9, 3, 2)])
def test_v8_gate_rings_at_kimi_shapes_gpu(real_experts, dn, gu, gb):
    # why: the A/B's phase-1 rings at T 1 on 384 experts (28 pairs a warp, 128 CTAs): the
    # default ring's bits, the reference within tolerance, a duplicated id's NaN row
    from workbench.kernels.int4_moe import cuda_v8
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(931, "cuda")
    ids, w, x = r.distinct(E, K, 1), r.uniform(1, K) + 0.05, r.normal(1, cfg.hidden_size)
    cfg8 = {"DN": 8, "LY": 3, "EF": 1}
    base = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg8)
    out = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={**cfg8, "DN": dn, "GU": gu, "GB": gb})
    assert torch.equal(out, base)
    torch.testing.assert_close(out.float(), int4_moe(x, ids, w, ex).float(), rtol=2e-2, atol=2e-2)
    twice = ids.clone()
    twice[0, 2] = twice[0, 0]
    assert cuda_v8.int4_moe_cuda(x, twice, w, ex, validate=False,
                                 cfg={**cfg8, "DN": dn, "GU": gu, "GB": gb}).isnan().all()


def test_v9_defaults_are_v8s_fastest_form_and_keep_an_sm_free():
    # why: cuda_v9 is cuda_v8 with knobs as defaults; FC 1 only where the tail's combiners
    # leave an SM free (cuda_v8 refuses FC 1 otherwise), a caller's cfg still wins; a CPU call
    # gets the defaults untouched (it never reaches the fused kernel)
    from workbench.kernels.int4_moe import cuda_v8, cuda_v9

    x, ids = torch.zeros(1, 7168), torch.zeros(1, 8, dtype=torch.long)
    ex = (torch.zeros(384, 2048, 1),)
    assert cuda_v9.knobs(x, ids, ex) == cuda_v9.DEFAULTS == {
        "DN": 8, "LY": 3, "EF": 1, "GB": 1, "FC": 1, "EA": 1}
    assert set(cuda_v9.DEFAULTS) <= set(cuda_v8.KNOBS)
    # a cfg off EA's ring drops EA unless it names it (then cuda_v8 refuses it by name)
    d = cuda_v9.DEFAULTS
    assert cuda_v9.merged(d, {"GB": 2})["EA"] == 0 and cuda_v9.merged(d, {"DN": 9})["EA"] == 0
    assert cuda_v9.merged(d, {"FC": 0}) == {**d, "FC": 0}
    assert cuda_v9.merged(d, {"GB": 2, "EA": 1})["EA"] == 1
    # a CUDA-shaped call (the device query patched: this machine has none): 128 CTAs, 112
    # combiners at Kimi's D
    xc = mock.Mock(device=torch.device("cuda", 0), shape=(1, 7168), dim=lambda: 2)
    with mock.patch.object(cuda_v9, "sm_count", lambda index: 112):
        assert cuda_v9.knobs(xc, ids, ex)["FC"] == 0  # 112 SMs: none left free
    with mock.patch.object(cuda_v9, "sm_count", lambda index: 132):
        assert cuda_v9.knobs(xc, ids, ex) == cuda_v9.DEFAULTS


@pytest.mark.gpu
def test_v9_is_v8_with_its_knobs_gpu(real_experts):
    # why: the registered version must be exactly the A/B's form, its bits at Kimi T 1
    from workbench.kernels.int4_moe import cuda_v8, cuda_v9
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(941, "cuda")
    ids, w, x = r.distinct(E, K, 1), r.uniform(1, K) + 0.05, r.normal(1, cfg.hidden_size)
    out = cuda_v9.int4_moe_cuda(x, ids, w, ex)
    assert torch.equal(out, cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cuda_v9.DEFAULTS))
    for off in ({"FC": 0, "GB": 0, "EA": 0}, {"EA": 0}):  # the combine launch, the cp.async ring
        assert torch.equal(out, cuda_v8.int4_moe_cuda(x, ids, w, ex,
                                                      cfg={**cuda_v9.DEFAULTS, **off})), off
    assert torch.equal(out, cuda_v9.int4_moe_cuda(x, ids, w, ex, cfg={"GB": 0}))  # EA dropped


@pytest.mark.gpu
def test_v8_gb2_refuses_a_hidden_size_past_its_table_gpu():
    # why: GB 2 keeps one correction a 32-input group of x in shared memory (CORR_GROUPS); a
    # wider x must be a named error before any launch, not a write past the table
    from workbench.kernels.int4_moe import cuda_v8

    D, I, E = 16640, 128, 2  # 260 chunks: 520 groups (the rule's other conditions hold)
    ex = _v8_experts(E, D, I, seed=23, device="cuda")
    x = torch.randn(1, D).bfloat16().cuda()
    ids, w = torch.tensor([[1, 0]]).cuda(), torch.full((1, 2), 0.5).cuda()
    assert not cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={"DN": 8, "LY": 3, "GB": 1}).isnan().any()
    with pytest.raises(ValueError, match=r"x.shape\[1\]: expected at most 16384"):
        cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={"DN": 8, "LY": 3, "GB": 2})


def test_v8_gate_ring_knobs_refused_by_name():
    # why: a ring that is not built (GU 5 by cp.async does not fit shared memory) or a ring knob
    # on a down form without its instances must be a named error, not a missing kernel
    from workbench.kernels.int4_moe import cuda_v8

    assert cuda_v8.ring_bytes() == cuda_v8.RING and cuda_v8.ring_bytes(5, 1) == 16 * 5 * 2304
    assert cuda_v8.shared_bytes(8, 4, 0) == 16 * 4 * 3072 and cuda_v8.shared_bytes(8, 3, 1) == cuda_v8.RING
    # GB 2's corrections past its ring fit the 144 KB the down ring takes anyway
    assert cuda_v8.shared_bytes(8, 3, 2) == cuda_v8.RING
    # DN 9's shorter down ring: phase 1's bulk ring (+ GB 2's corrections) is what it asks for
    assert cuda_v8.shared_bytes(9, 3, 1) == 16 * 3 * 2304 == cuda_v8.DOWN9
    assert cuda_v8.shared_bytes(9, 3, 2) == cuda_v8.DOWN9 + 16 * cuda_v8.CORR_GROUPS
    x = torch.zeros(1, 8)
    for cfg in ({"DN": 8, "LY": 3, "GU": 5}, {"DN": 2, "GB": 1}, {"DN": 8, "LY": 3, "GB": 3},
                {"DN": 8, "LY": 3, "GU": 4, "GB": 2}, {"DN": 9, "LY": 3, "GU": 4, "GB": 1}):
        with pytest.raises(ValueError, match=r"cfg\['GU'\], cfg\['GB'\]: expected"):
            cuda_v8.int4_moe_cuda(x, None, None, None, cfg=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("D, I", [(256, 256), (192, 384), (7168 - 64, 256)],
                         ids=["few-blocks", "kpad", "blocks-past-the-grid"])
def test_v8_fused_combine_is_bitwise_the_combine_launch_gpu(D, I):
    # why: FC 1 moves the combine into the fused launch's tail (tickets, the last CTAs combine,
    # a generation word): the arithmetic is the combine launch's, so the bits must be; D 7104
    # has 111 combine blocks on an 8-CTA grid (each combiner takes several); -1 slots, int32
    # ids, a bad token's NaN row, and many launches in a row on one counter (it must wrap)
    from workbench.kernels.int4_moe import cuda_v8

    E, K = 6, 4
    ex = _v8_experts(E, D, I, seed=19, device="cuda")
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, D, generator=g).bfloat16().cuda()
    w = (torch.rand(1, K, generator=g) + 0.1).cuda()
    for cfg in ({}, {"DN": 8, "LY": 3, "EF": 1, "GB": 1}, {"DN": 8, "LY": 3, "EF": 1, "GB": 2},
                {"DN": 8, "LY": 3, "EF": 1, "GB": 1, "EA": 1}):
        for ids in (torch.tensor([[3, 0, 5, 1]]), torch.tensor([[2, -1, 4, -1]], dtype=torch.int32)):
            ids = ids.cuda()
            base = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg)
            for _ in range(5):
                assert torch.equal(cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg={**cfg, "FC": 1}), base)
        # an expert twice, an id past E, one past int32 (the tail keeps ids as int32: -2), one
        # under -1
        for bad in ([[3, 3, 5, 1]], [[3, 6, 5, 1]], [[3, 2**40, 5, 1]], [[3, -2, 5, 1]]):
            assert cuda_v8.int4_moe_cuda(x, torch.tensor(bad).cuda(), w, ex, validate=False,
                                         cfg={**cfg, "FC": 1}).isnan().all(), bad
    sync = cuda_v8.sync_words(x.device)
    assert sync.numel() == cuda_v8.SYNC_WORDS and int(sync[0]) == 0  # every last ticket wrapped it


@pytest.mark.gpu
@pytest.mark.parametrize("gb", [1, 2])
def test_v8_fused_combine_at_kimi_shapes_under_graph_replay_gpu(real_experts, gb):
    # why: the A/B's FC at T 1 on 384 experts (128 CTAs, 112 combiners): the combine launch's
    # bits eagerly and across CUDA-graph replays (the counter and generation word are baked
    # into the graph and must serve every replay), with no host sync inside
    from workbench.kernels.int4_moe import cuda_v8
    from workbench.ops.cases import _Rand

    ex, cfg = real_experts
    E, K = cfg.n_routed_experts, cfg.n_experts_per_tok
    r = _Rand(933, "cuda")
    ids, w, x = r.distinct(E, K, 1), r.uniform(1, K) + 0.05, r.normal(1, cfg.hidden_size)
    cfg8 = {"DN": 8, "LY": 3, "EF": 1, "GB": gb}
    base = cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=cfg8)
    fc = {**cfg8, "FC": 1}
    assert torch.equal(cuda_v8.int4_moe_cuda(x, ids, w, ex, cfg=fc), base)
    torch.testing.assert_close(base.float(), int4_moe(x, ids, w, ex).float(), rtol=2e-2, atol=2e-2)
    xs = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cuda_v8.int4_moe_cuda(xs, ids, w, ex, cfg=fc)  # warm-up on the capture's stream
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cuda_v8.int4_moe_cuda(xs, ids, w, ex, cfg=fc)
    for seed in (934, 935, 936):
        xs.copy_(_Rand(seed, "cuda").normal(1, cfg.hidden_size))
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, cuda_v8.int4_moe_cuda(xs, ids, w, ex, cfg=cfg8))


def test_v8_fused_combine_knob_refused_by_name():
    from workbench.kernels.int4_moe import cuda_v8

    x = torch.zeros(1, 8)
    for cfg in ({"EA": 1}, {"EA": 2, "DN": 8, "LY": 3, "GB": 1}, {"EA": 1, "DN": 8, "LY": 3, "GB": 2},
                {"EA": 1, "DN": 8, "LY": 3, "GU": 4, "GB": 1}):  # EA: only GB 1's free 36 KB
        with pytest.raises(ValueError, match=r"cfg\['EA'\]: expected"):
            cuda_v8.int4_moe_cuda(x, None, None, None, cfg=cfg)

    assert cuda_v8.fc_combiners(7168, 128) == 112 and cuda_v8.fc_combiners(7104, 8) == 8
    x = torch.zeros(1, 8)
    for cfg in ({"FC": 2}, {"FC": 1, "CL": 2}):
        with pytest.raises(ValueError, match=r"cfg\['FC'\]: expected"):
            cuda_v8.int4_moe_cuda(x, None, None, None, cfg=cfg)
