"""int4_moe cuda_v19 (cuda_v18 with the hot gate/up launch on wgmma): on the CPU the logical-k
permute against the fragment layout's index math, its CPU twin, the tile rule, the knob check
and the sm_90a build (wgmma, no local memory); on the GPU the permute kernel against its twin
bit for bit, the hot launch's forms against the reference, WG 0 bitwise cuda_v18 and the CTA
columns changing no bit. The shared suites (EDGE, REAL, EP8, graph replay) run it from
tests/test_int4_moe_cuda.py's CUDA_VERSIONS."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from test_int4_moe_cuda_v10 import _close, _routing, every_expert_hot_on_edge_cases

from workbench.kernels.int4_moe import cuda_v18, cuda_v19, mma_layout

KIMI = dict(K=8, E=384, D=7168, I=2048)


def test_logical_k_perm_puts_activations_under_the_fragments_columns():
    # why: wgmma reads B's k in order while the repacked A fragment's logical column 2t + b (+ 8)
    # of step (G, jj) holds input 8t + 4jj + b (+ 2) of group G: every A element of every step
    # must meet the activation of its own input, or the GEMM sums wrong products silently
    NU, C = 2, 4  # two chunk pairs
    _, k = mma_layout._index(NU, C, True, "cpu")  # [NU, C, 2, 32 lanes, 4 words, 8 nibbles]
    perm = mma_layout.logical_k_perm(C * mma_layout.CHUNK)
    c = torch.arange(C).view(C, 1, 1, 1)
    lane = torch.arange(32).view(1, 32, 1, 1)
    j = torch.arange(4).view(1, 1, 4, 1)
    p = torch.arange(8).view(1, 1, 1, 8)
    i, b, t = p & 3, p >> 2, lane & 3  # nibble p feeds A register i (dq(q >> 4 i)), half b
    col = 2 * t + b + 8 * (i >> 1)  # mma / wgmma A fragment: register i's logical column
    G, jj = 2 * (c % 2) + (j >> 1), j & 1
    pos = 128 * (c // 2) + 16 * (2 * G + jj) + col  # the step's logical k in xp
    for u in range(NU):
        for tile in range(2):
            assert torch.equal(perm[pos.expand(C, 32, 4, 8)], k[u, :, tile]), (u, tile)
    assert torch.equal(perm.sort().values, torch.arange(C * mma_layout.CHUNK))


def test_xperm_reference_permutes_within_groups_and_zero_fills():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 200, generator=g).to(torch.bfloat16)
    xp = cuda_v19.xperm_reference(x, 160, 256)  # k_real 160 of a 200-wide row, KP 256
    perm = mma_layout.logical_k_perm(256)
    assert xp.shape == (3, 256)
    assert torch.equal(perm // 32, torch.arange(256) // 32)  # inside each 32-input group
    for pos in range(256):
        want = x[:, perm[pos]] if perm[pos] < 160 else torch.zeros(3, dtype=torch.bfloat16)
        assert torch.equal(xp[:, pos], want), pos


def test_v19_tiles_are_v18s_with_the_wgmma_hot_launch():
    for T, slots, E in ((1, None, 384), (17, None, 384), (128, None, 384), (512, None, 384),
                        (17, 17, 48), (136, 136, 48)):
        want = cuda_v18.tiles(T, KIMI["K"], E, KIMI["D"], KIMI["I"], slots) | {"WG": 1}
        assert cuda_v19.tiles(T, KIMI["K"], E, KIMI["D"], KIMI["I"], slots) == want


def test_v19_wg_knob_refused_by_name():
    with pytest.raises(ValueError, match=r"cfg\['WG'\].*0 or 1"):
        cuda_v19.launch_bands_wg({"WG": 2}, None, None, None, None, 0, 0, None)


def test_v19_kernel_source_wraps_each_config_once():
    src = cuda_v19.source(((8, 4, 6, 1), (4, 2, 3, 4)))
    assert src.count("extern \"C\" __global__ void __launch_bounds__(256, 1) "
                     "int4_moe_hot_wg_8_4_6_1(") == 1
    assert "__launch_bounds__(128, 4) int4_moe_hot_wg_4_2_3_4(" in src
    assert "hot_wg_body<4, 2, 3>(" in src


def _k_loops(fn_sass: str, per_pair: int = 16) -> list[list[str]]:
    """The K loops of one kernel's SASS: innermost backward-branch ranges holding one pair's
    per_pair HGMMAs (4 scale groups x 2 k16 steps x gate / up; cuda_v20: one tile a warp, 8)."""
    ins = [(int(a, 16), i) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", fn_sass)]
    ranges = []
    for a, i in ins:
        m = re.search(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", i)
        if m and int(m.group(1), 16) < a:
            ranges.append((int(m.group(1), 16), a))
    inner = [(lo, hi) for lo, hi in ranges  # holding no other loop
             if not any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2 in ranges)]
    bodies = [[x for b, x in ins if lo <= b <= hi] for lo, hi in inner]
    return [body for body in bodies if sum("HGMMA" in x for x in body) == per_pair]


_NO_REG_WRITE = ("ST", "RED", "BRA", "BAR", "SYNCS", "WARPGROUP", "EXIT", "BSSY", "BSYNC",
                 "WARPSYNC", "NOP", "ISETP", "FSETP", "PLOP3", "VOTEU", "R2UR", "U", "S2UR",
                 "MEMBAR", "FENCE", "CCTL", "ELECT", "HGMMA")


def _written_regs(ins: str) -> set[int]:
    """The general registers a SASS instruction writes (its first operand; .64 / .WIDE two,
    .128 four); none for stores, branches, barriers, predicate and uniform-register writes."""
    parts = re.sub(r"^@!?U?P\w+\s+", "", ins).split(None, 1)
    if len(parts) < 2 or parts[0].startswith(_NO_REG_WRITE):
        return set()
    m = re.fullmatch(r"R(\d+)", parts[1].split(",")[0].strip())
    width = 4 if ".128" in parts[0] else 2 if (".64" in parts[0] or ".WIDE" in parts[0]) else 1
    return set(range(int(m.group(1)), int(m.group(1)) + width)) if m else set()


def _a_register_hazards(fn_sass: str) -> list[str]:
    """Instructions of a loop holding HGMMAs that write an A register of a wgmma still in
    flight (issued, its group not yet retired by WARPGROUP.DEPBAR.LE gsb0, n). A wgmma reads
    its register A operand until it is done, so such a write changes its product, depending on
    timing. Each backward-branch range is walked twice in address order (its back edge: the
    last groups of one trip are in flight at the top of the next), forward branches ignored
    (both sides' writes count)."""
    ins = [(int(a, 16), i.strip()) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);",
                                                            fn_sass)]
    at = {a: k for k, (a, _) in enumerate(ins)}
    found = []
    for k, (a, i) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", i)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in at:
            continue
        body = ins[at[int(m.group(1), 16)]:k + 1]
        if not any("HGMMA" in x for _, x in body):
            continue
        groups, open_ = [], set()  # A registers of the committed groups in flight, the open one
        for a2, x in body + body:
            if x.startswith("HGMMA"):
                areg = re.fullmatch(r"R(\d+)", x.split(None, 1)[1].split(",")[1].strip())
                if areg:  # (a descriptor A reads shared memory: nothing to overwrite)
                    open_ |= set(range(int(areg.group(1)), int(areg.group(1)) + 4))
                if "gsb0" in x:
                    groups, open_ = groups + [open_], set()
            elif x.startswith("WARPGROUP.DEPBAR.LE"):
                keep = int(x.split(",")[-1], 16)
                groups = groups[len(groups) - keep:] if keep else []
            elif _written_regs(x) & open_.union(*groups):
                found.append(f"{a2:#x}: {x}")
    return found


_LOOP = """
        /*1880*/                   LDS.64 R20, [R152] ;
        /*1890*/                   HADD2.BF16_V2 {dst}, R154, -136, -136 ;
        /*18a0*/                   WARPGROUP.ARRIVE ;
        /*18b0*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR12], R88, UP0 ;
        /*18c0*/                   HGMMA.64x128x16.F32.BF16 R24, R160, gdesc[UR16], R24, gsb0 ;
        /*18d0*/                   WARPGROUP.DEPBAR.LE gsb0, {keep} ;
        /*18e0*/               @P1 BRA 0x1880 ;
"""


@pytest.mark.parametrize("dst, keep, expected", [("R153", "0x1", 1), ("R162", "0x1", 1),
                                                 ("R170", "0x1", 0), ("R153", "0x0", 0)])
def test_a_register_hazard_check_on_a_synthetic_loop(dst, keep, expected):
    # why: the build tests assert the check finds nothing, which a broken check would also do.
    # Session 53's race in miniature: with DEPBAR keeping one group, the last trip's HGMMAs
    # (A in R152-R155, R160-R163) are in flight at the loop's top, where the HADD2 writes dst;
    # LDS.64 R20 (R20-R21) never counts; nothing is in flight after DEPBAR 0
    found = _a_register_hazards(_LOOP.format(dst=dst, keep=keep))
    assert len(found) == expected and all(dst in f for f in found), found


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_v19_hot_kernels_build_for_sm90a_with_wgmma_and_no_local_memory(tmp_path, monkeypatch):
    # why: the instances the rule picks (WNT 4 / WST 6 and WNT 8 / WST 5 at one 8-warp CTA an
    # SM, cuda_v11's WMB 2 at T K >= 8 E, cuda_v12's band at four 4-warp CTAs) compile for
    # sm_90a with HGMMA and no HMMA, every n-tile count's K loop off local memory; the one-CTA
    # builds spill nothing at all (the band's 128 registers spill 12 bytes in its item loop,
    # outside the K loops); no wgmma's A registers written while it is in flight
    import triton

    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path))
    picks = ((8, 4, 6, 1), (8, 8, 5, 1), (8, 4, 3, 2), (4, 2, 3, 4))
    path, log = cuda_v19.build_cubin(cuda_v19.source(picks))
    blocks = {b.split("'")[1]: b for b in log.split("Compiling entry function")[1:]}
    assert len(blocks) == len(picks) + 1  # + int4_moe_xperm
    for name in ("int4_moe_hot_wg_8_4_6_1", "int4_moe_hot_wg_8_8_5_1", "int4_moe_xperm"):
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in blocks[name]
    dump = shutil.which("cuobjdump") or os.path.join(
        os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([dump, "-sass", path], capture_output=True, text=True).stdout
    for fn in sass.split("Function : ")[1:]:
        name = fn.split("\n")[0].strip()
        if name.startswith("int4_moe_hot_wg"):
            assert re.search(r"HGMMA\.64x\d+x16\.F32\.BF16", fn) and "HMMA" not in fn, name
            loops = _k_loops(fn)
            assert len(loops) >= 2, name  # n-tile counts 2, 4 (, NT)
            for body in loops:
                assert not any("LDL" in x or "STL" in x for x in body), name
            assert not _a_register_hazards(fn), name
    assert cuda_v19.build_cubin(cuda_v19.source(picks))[0] == path  # cached by source


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("T, D, k_real, stride", [(1, 7168, 7168, 7168), (17, 7168, 7168, 7168),
                                                  (3, 96, 96, 104), (5, 256, 200, 256)])
def test_v19_xperm_kernel_is_its_twin_bitwise_gpu(T, D, k_real, stride):
    # why: the permute is exact data movement: any bit off means wrong products in the GEMM;
    # strided rows and K padding (zeros past k_real) included
    g = torch.Generator(device="cuda").manual_seed(T)
    xs = torch.randn(T, stride, device="cuda", generator=g).to(torch.bfloat16)
    x = xs[:, :D]
    KP = -(-D // 128) * 128
    got = cuda_v19.xperm(x, k_real, KP)
    assert torch.equal(got, cuda_v19.xperm_reference(x, k_real, KP))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, {"WT": 0}, {"WNT": 8, "WST": 5, "WMB": 1}, {"WNT": 2, "WST": 3},
                                 {"WU": 4}, {"WNT": 4, "WST": 3, "WMB": 2}, {"WS": 0},
                                 {"WT": 3, "WST": 2}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, skew", [(17, 1.2), (65, 1.2), (128, 0.0), (128, 1.2), (512, 0.0),
                                     (512, 1.2)])
def test_v19_hot_forms_match_reference_gpu(real_experts, T, skew, cfg):
    # (WNT 8 names WMB 1: from T K >= 8 E cuda_v11's tiles take WMB 2, which check_hot refuses
    # at WNT 8's registers)
    x, ids, w, ex = _routing(real_experts, T, skew, 1900 + T)
    _close(cuda_v19.int4_moe_cuda(x, ids, w, ex, cfg=cfg or None), x, ids, w, ex)


@pytest.mark.gpu
def test_v19_every_expert_hot_on_edge_cases_gpu():
    # why: WT 0 sends every expert through the wgmma launch: K padding (the permute's zeros),
    # one expert holding every token, K = E, -1 slots, strided x, a warpgroup with padding
    # units (small I)
    every_expert_hot_on_edge_cases(cuda_v19)


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew", [(17, 1.2), (512, 1.2)])
def test_v19_wg_off_is_cuda_v18_gpu(real_experts, T, skew):
    x, ids, w, ex = _routing(real_experts, T, skew, 2000 + T)
    assert torch.equal(cuda_v19.int4_moe_cuda(x, ids, w, ex, cfg={"WG": 0}),
                       cuda_v18.int4_moe_cuda(x, ids, w, ex))


def columns_and_streams_change_no_bit(version, real_experts, T: int, seed: int) -> None:
    """An item is one CTA's whole K, so neither how the hot items spread over CTA columns (WY)
    nor the side stream (WS) may change a bit of `version`'s op (skewed routing)."""
    x, ids, w, ex = _routing(real_experts, T, 1.2, seed)
    a = version.int4_moe_cuda(x, ids, w, ex)
    for cfg in ({"WY": 1}, {"WY": 3}, {"WS": 0}):
        assert torch.equal(a, version.int4_moe_cuda(x, ids, w, ex, cfg=cfg)), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("T", (65, 512))
def test_v19_cta_columns_and_streams_change_no_bit_gpu(real_experts, T):
    columns_and_streams_change_no_bit(cuda_v19, real_experts, T, 2100 + T)
