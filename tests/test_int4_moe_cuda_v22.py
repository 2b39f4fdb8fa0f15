"""int4_moe cuda_v22 (cuda_v21 with the hot launch's programs over (hot expert, slot chunk)
items): on the CPU the tile rule, the items grid's rule and HI's refusal by name, and the items
launch itself under the Triton interpreter on triton_v16's op (every hot chunk written once,
triton_v16's whole-expert walk bit for bit at any program count), HS 2's order of streams and
launches; on the GPU the op bit for bit cuda_v21's (skewed and uniform REAL shapes, eager and
graph-replayed, HI 1 / 3 / 64, HS 1 / 2). The
shared suites (EDGE, REAL, EP8, graph replay) run it from tests/test_int4_moe_cuda.py's
CUDA_VERSIONS."""

from __future__ import annotations

import functools

import pytest
import torch
from sm90_compile import compile_sm90
from test_int4_moe_cuda_v10 import _routing as _real_routing
from test_int4_moe_cuda_v10 import same_bits_eager_and_replayed
from test_int4_moe_kernel import _bits_equal, _hot_case, _poisoned_buffers

from workbench.kernels.int4_moe import cuda_v21, cuda_v22, triton_v16
from workbench.reference.int4_moe import int4_moe

KIMI = dict(K=8, D=7168, I=2048)


def test_v22_tiles_are_v21s_with_the_item_programs():
    for T, E, hint in ((1, 384, None), (9, 384, None), (128, 384, None), (512, 384, None),
                       (17, 48, 17), (544, 48, 544)):
        assert cuda_v22.tiles(T, E=E, **KIMI, slots=hint) == (
            cuda_v21.tiles(T, E=E, **KIMI, slots=hint) | {"HI": 16, "HS": 0}), (T, E, hint)


def test_v22_item_programs_are_hi_within_what_the_slots_allow():
    # why: the grid is sized from shapes only (graph-safe); more programs than the expected
    # slots can make items would only launch idle ones
    c = cuda_v22.tiles(512, E=384, **KIMI)  # S_EXP 4096, HOT 64, BM2_HOT 64, BM1_HOT 128
    assert cuda_v22.item_programs(c, 2, 384) == 16
    assert cuda_v22.item_programs(c | {"HI": 200}, 2, 384) == 4096 // 64 + 4096 // 65
    assert cuda_v22.item_programs(c | {"HI": 200}, 1, 384) == 4096 // 128 + 4096 // 65
    assert cuda_v22.item_programs(c | {"S_EXP": 1}, 2, 384) == 1
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match=r"cfg\['HI'\]"):
            cuda_v22.item_programs(c | {"HI": bad}, 2, 384)


@pytest.mark.parametrize("hot, hi, why", [
    (5, 1, "one program an N tile walks all five items of experts 1 and 3 in turn"),
    (5, 2, "two programs: items alternate, a chunk of expert 1 beside one of expert 3"),
    (5, 64, "more programs than items: the rest idle"),
    (0, 3, "every active expert hot (2-20 slots: 1-3 chunks each), the cold launch idle"),
])
def test_v22_hot_items_are_the_whole_expert_walk_bit_for_bit(monkeypatch, hot, hi, why):
    # why: an item is `expert_tile` on one BM chunk, the same tile arithmetic as triton_v16's
    # walk over the expert's chunks; every hot slot row of the partials must be written by
    # exactly one item (intermediates NaN-filled first) whichever program takes it
    _poisoned_buffers(monkeypatch)
    x, ids, w, ex, cfg = _hot_case(22, hot)  # expert 1: 20 slots, 3: 11, 0 / 2 / 4: 2-3
    cfg |= {"BM1_HOT": 8, "BM2_HOT": 8, "HI": hi}  # 8-slot chunks: expert 1 three, 3 two
    T, K, E, D, I = *ids.shape, ex.num_experts, x.shape[1], ex.gate_packed.shape[1]
    assert triton_v16.hot_mode(triton_v16.tiles(T, K, E, D, I) | cfg, T)
    want = triton_v16.int4_moe_triton(x, ids, w, ex, cfg=cfg)
    out = triton_v16.launch_hinted(x, ids, w, ex, None, cfg, None, triton_v16.tiles,
                                   gemm=cuda_v22.grid_gemm_items)
    assert not out.isnan().any()
    assert _bits_equal(out, want), why
    assert torch.allclose(out.float(), int4_moe(x, ids, w, ex).float(), rtol=2e-2, atol=2e-2)


def test_v22_without_a_hot_launch_is_the_idle_last_grid(monkeypatch):
    # why: where triton_v16 makes no hot launch (T <= HOT, or a GEMM split along K) the hook
    # must be cuda_v21's, not an items launch over nothing
    from workbench.kernels.int4_moe import triton_v29

    seen = []
    monkeypatch.setattr(cuda_v22, "grid_gemm_idle_last", lambda *a: seen.append(a[0]))
    monkeypatch.setattr(cuda_v22, "hot_items_launch", lambda *a: seen.append("items"))

    class R:  # the router's result as the hook reads it: T rows of bad flags
        bad = torch.zeros(64)
        max_active = 384

    c = cuda_v22.tiles(64, E=384, **KIMI)
    cuda_v22.grid_gemm_items(2, c, R, 56, (), {})
    cuda_v22.grid_gemm_items(2, c | {"KS2": 2}, R, 56, (), {})
    assert seen == [2, 2]
    assert triton_v29.grid_gemm_idle_last is not cuda_v22.grid_gemm_idle_last  # patched here only


def test_v22_hs_refused_by_name_and_both_launches_made(monkeypatch):
    # why: HS picks where the items run; a value outside 0 / 1 would silently be one of them
    seen = []
    monkeypatch.setattr(cuda_v22, "grid_gemm", lambda *a: seen.append("cold"))
    monkeypatch.setattr(cuda_v22, "hot_items_launch", lambda *a: seen.append("items"))

    class R:
        bad = torch.zeros(512)
        max_active = 384

    c = cuda_v22.tiles(512, E=384, **KIMI)
    args = (torch.empty(1),)  # the hook reads the device off h
    for bad in (3, -1, True, 1.0):
        with pytest.raises(ValueError, match=r"cfg\['HS'\]"):
            cuda_v22.grid_gemm_items(2, c | {"HS": bad}, R, 56, args, {})
        with pytest.raises(ValueError, match=r"cfg\['HS'\]"):  # the hot hook names it too
            cuda_v22.launch_bands_items(c | {"HS": bad}, None, *[None] * 6)
    for hs in (0, 1, 2):  # HS 0: cuda_v21's order; HS 1 / 2 queue the items first (on the
        cuda_v22.grid_gemm_items(2, c | {"HS": hs}, R, 56, args, {})  # CPU: the current stream)
    assert seen == ["cold", "items", "items", "cold", "items", "cold"]


class _Side:
    """workbench.streams.Side as the hooks drive it, each call recorded in `seen`."""

    seen: list = []

    def __init__(self, device, on, key="model", priority=0):
        self.key = key

    def fork(self):
        self.seen.append(("fork", self.key))

    def run(self, fn):
        self.seen.append(("run", self.key))
        return fn()

    def join(self):
        self.seen.append(("join", self.key))


def test_v22_hs2_queues_the_items_behind_the_hot_gate_up_launches(monkeypatch):
    # why: HS 2's items must not fork again (that would wait for the cold gate/up launch, the
    # point of HS 2 lost), so their output y must come from before the hot launches' fork
    # (else the side stream may get a block a later current-stream launch still uses), and
    # the current stream must wait for the hot gate/up launches before the cold down (it
    # reads rows of experts of WT + 1 .. HOT slots that they write) and for the items before
    # the combine
    from workbench.kernels.int4_moe import cuda_v10, cuda_v12, cuda_v13

    seen = _Side.seen = []
    monkeypatch.setattr(cuda_v22, "Side", _Side)
    monkeypatch.setattr(cuda_v13, "down_partials", lambda p: seen.append("y") or "Y")
    monkeypatch.setattr(cuda_v12, "launch_bands",
                        lambda *a: seen.append("bands") or (8, lambda: seen.append("join1")))
    monkeypatch.setattr(cuda_v22, "grid_gemm", lambda *a: seen.append("cold"))
    monkeypatch.setattr(cuda_v22, "hot_items_launch", lambda *a: seen.append("items"))
    monkeypatch.setattr(cuda_v22, "combine_partials", lambda p, y, *a: seen.append(("sum", y)))

    class R:
        bad = torch.zeros(512)
        max_active = 384

    c = cuda_v22.tiles(512, E=384, **KIMI) | {"HS": 2}
    p = type("P", (), {"r": R, "c": c})
    _, join = cuda_v22.launch_bands_items(c, p, *[None] * 6)
    assert seen == ["y", "bands"] and isinstance(join, cuda_v13.SplitJoin) and join.y == "Y"

    def down_gemm(p, h, y, ds, gemm, select, dep):  # the tail's down GEMM, through its hook
        seen.append(("down", y))
        gemm(2, c, R, 56, (torch.empty(1),), {})

    monkeypatch.setattr(cuda_v22, "down_gemm", down_gemm)
    cuda_v22.tail_items(p, None, join, None, None, [None] * 6)
    side = cuda_v10.SIDE_KEY
    assert seen[2:] == ["join1", ("down", "Y"), ("run", side), "items", "cold", ("join", side),
                        ("sum", "Y")]
    # no side stream for the hot launches (WS 0), HS 0 / 1, or no hot down launch: the bands
    # alone, and the tail forks (HS 1 / 2) as cuda_v4's down_tail does
    for other in ({"WS": 0}, {"HS": 0}, {"HS": 1}, {"HOT": 512}):
        seen.clear()
        _, join = cuda_v22.launch_bands_items(c | other, p, *[None] * 6)
        assert seen == ["bands"] and not isinstance(join, cuda_v13.SplitJoin), other


@pytest.mark.slow
def test_v22_items_kernel_builds_for_sm90_as_the_hot_kernel_does():
    # why: the items kernel adds a prefix sum and a position search to each program; at
    # cuda_v22's down launch (BN_HOT 64, BM2_HOT 64, NH 1) it must keep the hot kernel's
    # registers, no spill and its shared memory (one CTA an SM: what the tail analysis assumes)
    out = compile_sm90(
        "import triton; from triton.backends.compiler import GPUTarget; "
        "from triton.compiler import ASTSource; "
        "from workbench.kernels.int4_moe import sm90, triton_v34, cuda_v22; out = {}\n"
        "for k, sig, const, attrs, opts in sm90.capture(triton_v34, *sm90.kimi_like(512)):\n"
        "    if k.__name__ == '_gemm_hot_kernel' and const['NH'] == 2:\n"
        "        const = dict(const, NH=1)\n"
        "        for fn in (k, cuda_v22._gemm_hot_items_kernel):\n"
        "            ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, "
        "attrs=attrs), target=GPUTarget('cuda', 90, 32), options=opts)\n"
        "            out[fn.__name__] = [sm90.ptxas_report(ck.asm['ptx']), ck.metadata.shared, "
        "ck.asm['ptx'].count('wgmma.mma_async'), [const['BN'], const['BM']]]")
    hot, items = out["_gemm_hot_kernel"], out["_gemm_hot_items_kernel"]
    assert items[3] == [64, 64], out
    assert items == hot and "0 B spill" in items[0] and items[2] > 0, out


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("T, skew, cfg", [(65, 1.2, None), (128, 1.2, None), (512, 1.2, None),
                                          (512, 0.0, None), (9, 0.0, None), (128, 1.2, {"HS": 1}),
                                          (512, 1.2, {"HS": 1}), (65, 1.2, {"HS": 2}),
                                          (512, 1.2, {"HS": 2}), (512, 0.0, {"HS": 2})])
def test_v22_is_cuda_v21_bit_for_bit_gpu(real_experts, T, skew, cfg):
    # why: the items are the same expert tiles as cuda_v21's whole-expert walk; only which
    # program runs a chunk differs (NaN-filled graph output first); HS 1 forks them onto a
    # side stream, which the graph must capture as a branch joined before the combine; HS 2
    # queues them behind the hot gate/up launches there (the branch joined twice)
    op = functools.partial(cuda_v22.int4_moe_cuda, cfg=cfg)
    same_bits_eager_and_replayed(op, cuda_v21.int4_moe_cuda, real_experts, T, skew, 5400 + T)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{"HI": 1}, {"HI": 3}, {"HI": 64}, {"HOT": 16, "HI": 5},
                                 {"HS": 1}, {"HS": 1, "HI": 3}, {"HS": 2, "HI": 3}],
                         ids=lambda c: ",".join(f"{k}{v}" for k, v in c.items()))
def test_v22_item_program_counts_change_no_bit_gpu(real_experts, cfg):
    # why: HI only deals the same items to more or fewer programs, HS only runs them beside
    # the cold launches (disjoint rows of y); HOT moves experts between the cold and the hot
    # launch, so its twin is cuda_v21 at the same HOT
    x, ids, w, ex = _real_routing(real_experts, 512, 1.2, 5500)
    base = {"HOT": cfg["HOT"]} if "HOT" in cfg else None
    want = cuda_v21.int4_moe_cuda(x, ids, w, ex, cfg=base)
    assert torch.equal(cuda_v22.int4_moe_cuda(x, ids, w, ex, cfg=cfg), want)
