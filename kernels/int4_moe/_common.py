"""What the int4_moe versions share: host checks, the routing-metadata kernel, the combine kernel,
and the @jit INT4 g32 dequant / bf16 rounding helpers.

Dimension legend: T tokens, K top-k slots, S = T*K slots, E experts, A <= min(E, S) active
experts, D hidden, I expert FFN width; EP, KP rounded up to powers of two. BN output features,
BK reduction columns and BM slot rows per tile.

Routing metadata (`_route_kernel`, one program, no host sync): slot s = t*K + j is routed to
expert ids[t, j]. The kernel histograms the slots per expert, writes the active experts in
ascending id order (`act_e`, with each one's first position `act_start` and slot count
`act_cnt` in the sorted slot list) and their number `n_act`, then scatters the slot ids grouped
by expert, slot order kept within an expert (stable, so deterministic). Buffers have worst-case
sizes known from shapes alone (S slots, min(E, S) active experts); the GEMM grids are sized to
the worst case and programs past `n_act` exit at once. It also flags tokens whose row repeats an
expert or holds an id outside [0, E) (`bad[t]`); a flagged token's output row is NaN (the
sync-free rejection, see `check_inputs`), and an out-of-range id is never routed (memory safe).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from workbench.moe_slots import check_expected_slots

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GROUP = 32  # INT4 scale group along the reduction dim
PACK = 8  # int4 values per int32 word


def _require(ok: bool, arg: str, expected: str, got) -> None:
    if not ok:
        raise ValueError(f"{arg}: expected {expected}, got {got}")


# every knob some int4_moe version reads from its cfg: its tiles' keys, the keys read with a
# default (`c.get`), cuda_v8's KNOBS and cuda_v20's split keys (tests/test_int4_moe_kernel.py
# checks each version's tiles and sources against it). One vocabulary for the op, not one a
# version: a sweep's cfg may hold knobs of the launches another T or hint takes. The sweep CLI
# also refuses a knob no code of its version reads (`_knobs.knobs_read`: another line's).
KNOWN_KNOBS = frozenset({
    "AB", "A_GRID", "BD_COMBINE", "BK1", "BK2", "BM", "BM1", "BM1_HOT", "BM2", "BM2_HOT",
    "BM2_MID", "BN", "BN1", "BN2", "BN_HOT", "CH1", "CH2", "CL", "CU_A_GRID", "DN", "DS", "EA",
    "EF", "F8", "FC", "FL", "FP", "FS", "FUSE_T", "GB", "GS", "GU", "HI", "HOT", "HOT_GRID", "HS",
    "IL", "IT1", "KS1", "KS2", "KW1", "KW2", "L2D", "LMIN1", "LMIN2", "LY", "MID", "MID_GRID",
    "MINB", "MS", "NH2", "NN1", "NN2", "NP", "PF", "PF01", "PF02", "PF1", "PF2", "PH", "PROGS1",
    "PROGS2", "RO", "ROUTE1", "ROUTE_SORT", "RW1", "RW2", "SMB", "SNT", "SPLIT1", "SPLIT2", "SST",
    "SU", "S_EXP", "TB1", "TC", "TLO", "TNT", "TPS1", "TPS2", "TPW", "TST", "TY", "TYH", "U", "U1",
    "U2", "W", "WB", "WBMB", "WBNT", "WBST", "WBU", "WG", "WHI", "WIDE", "WMB", "WNT", "WS", "WST",
    "WT", "WU", "WY", "XB1", "XB2", "maxnreg", "stages", "warps"})


def with_cfg(tiles: dict, cfg: dict | None) -> dict:
    """The call's knobs: tiles | cfg, refusing a cfg key that is no knob of int4_moe
    (KNOWN_KNOBS): a misspelt knob would otherwise be ignored, and a sweep would time the
    defaults under its name."""
    cfg = cfg or {}
    _require(isinstance(cfg, dict), "cfg", "a dict of knob -> value", type(cfg).__name__)
    unknown = sorted(k for k in cfg if k not in tiles and k not in KNOWN_KNOBS)
    _require(not unknown, "cfg", f"knobs of int4_moe (one of {sorted(KNOWN_KNOBS)})", unknown)
    return tiles | cfg


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@functools.cache
def sm_count(device_index: int) -> int:
    """SMs of this GPU (graph-safe: a device constant)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def block_k(k: int, cap: int = 128) -> int:
    """Largest power of two <= cap dividing k (k is a multiple of GROUP = 32)."""
    b = cap
    while k % b:
        b //= 2
    return b


def check_inputs(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, validate,
                 expected_slots: int | None = None,
                 mma_ok: bool | frozenset = False) -> None:
    """Shape / dtype / device / stride checks (no values read), then, when `validate` says so,
    the content checks: ids in [0, E) and no expert twice in a token's row. `expected_slots`:
    the op's tile-sizing hint (workbench/moe_slots.py), None or an int in [0, T K]. mma_ok:
    the caller also reads experts that `mma_layout.replace_with_repacked` replaced (True: all
    six, the CUDA versions; a set of buffer names: those, cuda_v4's gate / up); everyone else
    gets an error for them, never the fragment layout read as the checkpoint's.

    validate=None (default): content checks on CPU tensors only, where reading values costs no
    device sync. On CUDA they would cost a sync (and break CUDA-graph capture), so there the
    routing kernel does them on the device and writes NaN into the output row of each offending
    token instead of raising: the rejection stays visible and the launch path stays sync-free.
    validate=True: always check on the host (syncs on CUDA); False: never."""
    gp, gs, up, us, dp, ds = experts
    _require(x.dim() == 2, "x", "a 2-D tensor [T, D]", f"shape {tuple(x.shape)}")
    T, D = x.shape
    _require(x.dtype == torch.bfloat16, "x", "dtype torch.bfloat16", x.dtype)
    _require(topk_ids.dim() == 2 and topk_ids.shape[0] == T, "topk_ids",
             f"shape [T={T}, K]", f"shape {tuple(topk_ids.shape)}")
    K = topk_ids.shape[1]
    _require(K >= 1, "topk_ids", "K >= 1 slots per token", K)
    _require(topk_ids.dtype in (torch.int32, torch.int64), "topk_ids", "dtype int32 or int64",
             topk_ids.dtype)
    _require(tuple(topk_weights.shape) == (T, K), "topk_weights", f"shape ({T}, {K})",
             tuple(topk_weights.shape))
    _require(topk_weights.dtype.is_floating_point, "topk_weights", "a floating dtype",
             topk_weights.dtype)
    check_expected_slots(expected_slots, T, K)
    E, I = gp.shape[0], gp.shape[1]
    expect = {"gate_packed": (gp, (E, I, D // PACK), torch.int32),
              "gate_scale": (gs, (E, I, D // GROUP), torch.bfloat16),
              "up_packed": (up, (E, I, D // PACK), torch.int32),
              "up_scale": (us, (E, I, D // GROUP), torch.bfloat16),
              "down_packed": (dp, (E, D, I // PACK), torch.int32),
              "down_scale": (ds, (E, D, I // GROUP), torch.bfloat16)}
    _require(D % GROUP == 0 and D > 0, "x", f"D a positive multiple of {GROUP}", D)
    _require(I % GROUP == 0 and I > 0, "experts.gate_packed", f"I a positive multiple of {GROUP}", I)
    for name, (t, shape, dtype) in expect.items():
        _require(tuple(t.shape) == shape, f"experts.{name}", f"shape {shape}", tuple(t.shape))
        layout = getattr(t, "_int4_layout", "checkpoint")  # mma_layout.LAYOUT_ATTR
        _require(layout == "checkpoint" or mma_ok is True or name in (mma_ok or ()),
                 f"experts.{name}",
                 "the checkpoint layout (this version reads it)",
                 f"the {layout!r} layout of mma_layout.replace_with_repacked (only the CUDA "
                 "versions read it)")
        _require(t.dtype == dtype, f"experts.{name}", f"dtype {dtype}", t.dtype)
        _require(t.stride(-1) == 1, f"experts.{name}", "stride 1 along the last dim",
                 t.stride())
        _require(t.device == x.device, f"experts.{name}", f"device {x.device}", t.device)
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        _require(t.device == x.device, name, f"device {x.device}", t.device)
    _check_runnable(x.device)
    if validate or (validate is None and x.device.type == "cpu"):
        ids = topk_ids.cpu()
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            _require(lo >= -1 and hi < E, "topk_ids",
                     f"expert ids in [0, {E}), or -1 for a slot not routed here", f"[{lo}, {hi}]")
            s = ids.sort(-1).values
            rep = ((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any(-1).nonzero().flatten()
            _require(rep.numel() == 0, "topk_ids",
                     "distinct experts within each token's row (duplicates are rejected)",
                     f"token {int(rep[0]) if rep.numel() else -1} with ids "
                     f"{ids[int(rep[0])].tolist() if rep.numel() else []}")


def _check_runnable(device: torch.device) -> None:
    if device.type == "cuda":
        return
    _require(device.type == "cpu" and INTERPRET, "x",
             "a CUDA tensor, or a CPU tensor with TRITON_INTERPRET=1 set before this module is "
             "imported", f"a tensor on {device} (TRITON_INTERPRET="
             f"{os.environ.get('TRITON_INTERPRET')!r})")


# ------------------------------------------------------------------------- shared device code


@triton.jit
def _round_bf16(v):
    """fp32 -> the nearest bf16 value (ties to even), still held in fp32. Under the interpreter
    a plain fp32 -> bf16 cast truncates; this integer rounding is exact for finite v."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def pdl_start(PDL: tl.constexpr, EARLY: tl.constexpr = False):
    """A launch of the op after its first, as a programmatic dependent (triton_v14): wait until
    the launch before it has completed and its writes are visible (griddepcontrol.wait: that
    launch itself waited for its own predecessor, so every earlier launch of the op is done),
    then let the next launch start its CTAs as this one's retire. EARLY (triton_v15): let the
    next launch start first, then wait; safe because every launch still waits for its own
    predecessor before it reads what that one wrote. Nothing here without PDL (and never under
    the interpreter, which has no griddepcontrol)."""
    if PDL:
        if EARLY:
            gdc_launch_dependents()
            gdc_wait()
        else:
            gdc_wait()
            gdc_launch_dependents()


def pdl_launch(pdl: bool, early: bool = False) -> dict:
    """The constexprs and launch option of a PDL launch (`pdl_start`; early: its EARLY order):
    {} unless pdl and on the GPU (the interpreter drops neither, and knows neither)."""
    if not pdl or INTERPRET:
        return {}
    return {"PDL": True, "launch_pdl": True} | ({"EARLY": True} if early else {})


@triton.jit
def _to_bf16(v, INTERPRET: tl.constexpr):
    if INTERPRET:
        return _round_bf16(v).to(tl.bfloat16)  # exact: already a bf16 value
    else:
        return v.to(tl.bfloat16)  # cvt.rn: round to nearest even


@triton.jit
def _split_bf16(v, INTERPRET: tl.constexpr):
    """fp32 v -> (hi, lo) bf16 values with hi = bf16(v), lo = bf16(v - hi): hi + lo carries 16
    significant bits (|v - hi - lo| <= 2^-18 |v|). Under the interpreter both come back as fp32
    holding bf16 values (its bf16 tl.dot is wrong)."""
    if INTERPRET:
        hi = _round_bf16(v)
        return hi, _round_bf16(v - hi)
    else:
        hi = v.to(tl.bfloat16)
        return hi, (v - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _dequant(packed, scale, BN: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr):
    """packed int32 [BN, BK/8], scale bf16 [BN, BK/32] -> W [BN, BK] as bf16 values:
    W = bf16((nibble - 8) * scale), exactly reference/int4.py (q * s is exact in fp32: a 4-bit
    times an 8-bit significand; the one rounding is the bf16 cast). Under the interpreter W
    comes back as fp32 holding the bf16 value (its bf16 tl.dot is wrong)."""
    shifts = tl.arange(0, 8) * 4
    q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF  # [BN, BK/8, 8]; >> is arithmetic,
    q = tl.reshape(q, (BN, BK))  # & 0xF takes the nibble anyway; k = word * 8 + nibble
    s = tl.broadcast_to(scale.to(tl.float32)[:, :, None], (BN, BK // 32, 32))
    w = (q - 8).to(tl.float32) * tl.reshape(s, (BN, BK))
    if INTERPRET:
        return _round_bf16(w)
    else:
        return w.to(tl.bfloat16)


@triton.jit
def _dequant_kernel(p_ptr, s_ptr, w_ptr, O, IN, s_po, s_so,
                    BN: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr):
    """The kernels' dequant path on its own, [O, IN] -> W [O, IN] (tests compare it bitwise)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    nm = (n < O)[:, None]
    p = tl.load(p_ptr + n[:, None] * s_po + k0 // 8 + tl.arange(0, BK // 8)[None, :], mask=nm)
    s = tl.load(s_ptr + n[:, None] * s_so + k0 // 32 + tl.arange(0, BK // 32)[None, :], mask=nm)
    w = _dequant(p, s, BN, BK, INTERPRET)
    tl.store(w_ptr + n[:, None] * IN + k0 + tl.arange(0, BK)[None, :], w.to(tl.bfloat16), mask=nm)


def dequant_triton(packed: Tensor, scale: Tensor) -> Tensor:
    """packed int32 [O, IN/8], scale bf16 [O, IN/32] -> W bf16 [O, IN] through `_dequant`."""
    O, words = packed.shape
    IN = words * PACK
    _require(tuple(scale.shape) == (O, IN // GROUP), "scale", f"shape ({O}, {IN // GROUP})",
             tuple(scale.shape))
    _require(packed.stride(-1) == 1 and scale.stride(-1) == 1, "packed/scale",
             "stride 1 along the last dim", (packed.stride(), scale.stride()))
    _check_runnable(packed.device)
    w = torch.empty(O, IN, dtype=torch.bfloat16, device=packed.device)
    BN, BK = 16, block_k(IN)
    _dequant_kernel[(triton.cdiv(O, BN), IN // BK)](packed, scale, w, O, IN, packed.stride(0),
                                                    scale.stride(0), BN=BN, BK=BK,
                                                    INTERPRET=INTERPRET)
    return w


# --- routing metadata: the block helpers both routers share (a block = BT tokens, BT * KP slots)


@triton.jit
def _route_block(ids_ptr, s_it, s_ik, T, E, b, K: tl.constexpr, KP: tl.constexpr,
                 BT: tl.constexpr):
    """Block b's slots flattened in slot order: (expert id or 0, routed?, slot id, token mask
    [BT, KP], ids [BT, KP], in-range [BT, KP], tokens [BT])."""
    SB: tl.constexpr = BT * KP
    j = tl.arange(0, KP)
    t = b * BT + tl.arange(0, BT)
    m = (t < T)[:, None] & (j < K)[None, :]
    e = tl.load(ids_ptr + t[:, None] * s_it + j[None, :] * s_ik, mask=m, other=0)
    in_range = (e >= 0) & (e < E)  # routed; -1 is "not here" (EP: another rank's expert)
    e = e.to(tl.int32)
    ok = tl.reshape(m & in_range, (SB,))
    ef = tl.reshape(tl.where(m & in_range, e, 0), (SB,))
    slot = tl.reshape(t[:, None] * K + j[None, :], (SB,))
    return ef, ok, slot, m, e, in_range, t


@triton.jit
def _route_bad(m, e, in_range, j):
    """[BT] 1 for a token with an id outside [-1, E) or two slots naming one expert (-1, "not
    routed here", may repeat)."""
    r = m & in_range
    rep = (e[:, :, None] == e[:, None, :]) & (j[None, :, None] < j[None, None, :])
    rep = rep & r[:, :, None] & r[:, None, :]
    return tl.max(tl.max(rep.to(tl.int32), 2), 1) | tl.max((m & ~in_range & (e != -1)).to(
        tl.int32), 1)


@triton.jit
def _route_rank(ef, ok, SB: tl.constexpr):
    """[SB] each routed slot's rank among the block's earlier slots of the same expert."""
    idx = tl.arange(0, SB)
    before = (ef[:, None] == ef[None, :]) & (idx[None, :] < idx[:, None]) & ok[None, :]
    return tl.sum(before.to(tl.int32), 1)


@triton.jit
def _route_active(counts, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, EP: tl.constexpr):
    """From the per-expert slot counts [EP]: the active experts in ascending id order (id, first
    sorted position, count) and their number; returns every expert's first position [EP]."""
    ex = tl.arange(0, EP)
    active = counts > 0
    rank = tl.cumsum(active.to(tl.int32), 0) - 1
    start = tl.cumsum(counts, 0) - counts  # exclusive prefix: first sorted position per expert
    tl.store(act_e_ptr + rank, ex, mask=active)
    tl.store(act_start_ptr + rank, start, mask=active)
    tl.store(act_cnt_ptr + rank, counts, mask=active)
    tl.store(n_act_ptr, tl.sum(active.to(tl.int32), 0))
    return start


@triton.jit
def _route_kernel(ids_ptr, s_it, s_ik, T, E,
                  slots_ptr, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, bad_ptr,
                  K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr, BT: tl.constexpr):
    """One program. Pass 1: per-expert slot counts and the bad-token flags; active experts.
    Pass 2: the slots grouped by expert (slot order within an expert)."""
    SB: tl.constexpr = BT * KP  # slots per block, flattened (t, j) row-major = slot order
    j = tl.arange(0, KP)
    counts = tl.zeros([EP], tl.int32)
    for b in range(0, tl.cdiv(T, BT)):
        ef, ok, slot, m, e, in_range, t = _route_block(ids_ptr, s_it, s_ik, T, E, b, K, KP, BT)
        tl.store(bad_ptr + t, _route_bad(m, e, in_range, j).to(tl.int8), mask=t < T)
        counts += tl.histogram(ef, EP, mask=ok)
    nxt = _route_active(counts, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, EP)
    for b in range(0, tl.cdiv(T, BT)):  # nxt: the next free sorted position per expert
        ef, ok, slot, m, e, in_range, t = _route_block(ids_ptr, s_it, s_ik, T, E, b, K, KP, BT)
        pos = tl.gather(nxt, ef, 0) + _route_rank(ef, ok, SB)
        tl.store(slots_ptr + pos, slot, mask=ok)
        nxt += tl.histogram(ef, EP, mask=ok)


@triton.jit
def _combine_kernel(y_ptr, w_ptr, s_wt, s_wk, ids_ptr, s_it, s_ik, bad_ptr, out_ptr, D,
                    K: tl.constexpr, BD: tl.constexpr, INTERPRET: tl.constexpr):
    """out[t, d] = sum_{j = 0..K-1} w[t, j] * y[t*K + j, d] in slot order (fp32, no atomics);
    slots with id -1 (not routed here) add nothing; NaN for a token the routing kernel flagged."""
    t = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    dm = d < D
    acc = tl.zeros([BD], tl.float32)
    for j in tl.static_range(K):
        here = tl.load(ids_ptr + t * s_it + j * s_ik) != -1
        wj = tl.load(w_ptr + t * s_wt + j * s_wk).to(tl.float32)
        yj = tl.load(y_ptr + (t * K + j).to(tl.int64) * D + d, mask=dm & here, other=0.0)
        acc += tl.where(here, wj * yj, 0.0)
    acc = tl.where(tl.load(bad_ptr + t) != 0, float("nan"), acc)
    tl.store(out_ptr + t.to(tl.int64) * D + d, _to_bf16(acc, INTERPRET), mask=dm)


class Routing:
    """Device buffers of the routing metadata (worst-case sizes, filled by `route`)."""

    def __init__(self, T: int, K: int, E: int, device):
        S = T * K
        i32 = dict(dtype=torch.int32, device=device)
        self.max_active = min(E, S)
        self.slots = torch.empty(S, **i32)  # [S] slot ids grouped by expert
        self.act_e = torch.empty(self.max_active, **i32)  # [A] active expert ids, ascending
        self.act_start = torch.empty(self.max_active, **i32)  # [A] first sorted position
        self.act_cnt = torch.empty(self.max_active, **i32)  # [A] slots of that expert
        self.n_act = torch.empty(1, **i32)  # A
        self.bad = torch.empty(T, dtype=torch.int8, device=device)  # [T] 1 = rejected token
        self.xp = None  # [T, Dp] permuted x where the router's launch wrote it (triton_v27)


def block_tokens(K: int) -> int:
    """BT, the tokens of one routing block: 64 slots (K rounded up to a power of two), so the
    block's [SB, SB] rank compare stays small. Both routers use it (the same sorted order)."""
    return max(1, 64 // next_pow2(K))


def route(topk_ids: Tensor, E: int) -> Routing:
    """The routing metadata in one program (`_route_kernel`): ~4 µs per block of 8 tokens on
    the H200 (both passes walk the blocks one after the other), fine for decode, ~250 µs at
    T = 512; `route_parallel` has the same outputs from per-block programs."""
    return launch_router(_route_kernel, topk_ids, E, BT=block_tokens(topk_ids.shape[1]))


def launch_router(kernel, topk_ids: Tensor, E: int, **consts) -> Routing:
    """The Routing that one program of `kernel` fills (`_route_kernel`'s arguments, K / KP / EP
    and `consts` as constexprs): `route`'s launch, and triton_v24's sorted router's."""
    T, K = topk_ids.shape
    r = Routing(T, K, E, topk_ids.device)
    kernel[(1,)](topk_ids, topk_ids.stride(0), topk_ids.stride(1), T, E,
                 r.slots, r.act_e, r.act_start, r.act_cnt, r.n_act, r.bad,
                 K=K, KP=next_pow2(K), EP=next_pow2(E), **consts, num_warps=4)
    return r


# --- the routing metadata from per-block programs (triton_v9) ---------------------------------
# `_route_kernel` runs its two passes over blocks of BT tokens in one program, so its time grows
# with T (H200, session 6: 3.0 / 7.6 / 11.3 µs at T = 1 / 9 / 17, ~4 µs a block). Here each pass
# is a grid over the blocks, with a one-program scan between them:
#   count   (NB programs): block b's bad flags and its per-expert histogram  -> cnt [NB, EP]
#   scan    (1 program):   per expert, the exclusive prefix of cnt over the blocks (tiles of BB
#                          blocks: cumsum down the tile + the carry) -> off [NB, EP], and from
#                          the totals the active-expert lists and each expert's start
#   scatter (NB programs): slot (t, j) of block b goes to start[e] + off[b, e] + its rank among
#                          the block's earlier slots of expert e
# The sorted slot list is the same as `_route_kernel`'s: stable by slot within an expert (block
# order, then slot order inside the block), so the GEMMs see identical metadata.


@triton.jit
def _route_count_kernel(ids_ptr, s_it, s_ik, T, E, cnt_ptr, bad_ptr, K: tl.constexpr,
                        KP: tl.constexpr, EP: tl.constexpr, BT: tl.constexpr):
    b = tl.program_id(0)
    ef, ok, slot, m, e, in_range, t = _route_block(ids_ptr, s_it, s_ik, T, E, b, K, KP, BT)
    tl.store(bad_ptr + t, _route_bad(m, e, in_range, tl.arange(0, KP)).to(tl.int8), mask=t < T)
    tl.store(cnt_ptr + b * EP + tl.arange(0, EP), tl.histogram(ef, EP, mask=ok))


@triton.jit
def _route_scan_kernel(cnt_ptr, off_ptr, NB, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr,
                       EP: tl.constexpr, BB: tl.constexpr):
    ex = tl.arange(0, EP)
    rb = tl.arange(0, BB)
    carry = tl.zeros([EP], tl.int32)
    for b0 in range(0, NB, BB):
        rows = b0 + rb
        c = tl.load(cnt_ptr + rows[:, None] * EP + ex[None, :], mask=(rows < NB)[:, None],
                    other=0)  # [BB, EP]
        tl.store(off_ptr + rows[:, None] * EP + ex[None, :],
                 carry[None, :] + tl.cumsum(c, 0) - c, mask=(rows < NB)[:, None])
        carry += tl.sum(c, 0)
    start = _route_active(carry, act_e_ptr, act_start_ptr, act_cnt_ptr, n_act_ptr, EP)
    tl.store(off_ptr + NB * EP + ex, start)  # row NB of off: the experts' starts


@triton.jit
def _route_scatter_kernel(ids_ptr, s_it, s_ik, T, E, off_ptr, NB, slots_ptr, K: tl.constexpr,
                          KP: tl.constexpr, EP: tl.constexpr, BT: tl.constexpr):
    b = tl.program_id(0)
    ef, ok, slot, m, e, in_range, t = _route_block(ids_ptr, s_it, s_ik, T, E, b, K, KP, BT)
    first = tl.load(off_ptr + NB * EP + ef) + tl.load(off_ptr + b * EP + ef)
    tl.store(slots_ptr + first + _route_rank(ef, ok, BT * KP), slot, mask=ok)


def route_parallel(topk_ids: Tensor, E: int) -> Routing:
    """`route`'s outputs (bitwise: the same sorted slot list, flags and active-expert lists)
    from three launches whose count and scatter passes run one program per block of 8 tokens;
    scratch cnt / off [NB (+1), EP] int32 (NB = ceil(T / 8): 0.5 MB at T = 2080, E = 384)."""
    T, K = topk_ids.shape
    r = Routing(T, K, E, topk_ids.device)
    KP, EP, BT = next_pow2(K), next_pow2(E), block_tokens(K)
    NB = triton.cdiv(T, BT)
    cnt = torch.empty(NB, EP, dtype=torch.int32, device=topk_ids.device)
    off = torch.empty(NB + 1, EP, dtype=torch.int32, device=topk_ids.device)
    args = (topk_ids, topk_ids.stride(0), topk_ids.stride(1), T, E)
    _route_count_kernel[(NB,)](*args, cnt, r.bad, K=K, KP=KP, EP=EP, BT=BT, num_warps=4)
    BB = max(1, min(next_pow2(NB), 8192 // EP))  # a [BB, EP] tile: 8k counts, 64 regs / thread
    _route_scan_kernel[(1,)](cnt, off, NB, r.act_e, r.act_start, r.act_cnt, r.n_act, EP=EP,
                             BB=BB, num_warps=4)
    _route_scatter_kernel[(NB,)](*args, off, NB, r.slots, K=K, KP=KP, EP=EP, BT=BT,
                                 num_warps=4)
    return r


def combine(y: Tensor, topk_ids: Tensor, topk_weights: Tensor, r: Routing, T: int,
            D: int) -> Tensor:
    K = topk_weights.shape[1]
    out = torch.empty(T, D, dtype=torch.bfloat16, device=y.device)
    BD = min(1024, next_pow2(D))
    _combine_kernel[(T, triton.cdiv(D, BD))](y, topk_weights, topk_weights.stride(0),
                                             topk_weights.stride(1), topk_ids, topk_ids.stride(0),
                                             topk_ids.stride(1), r.bad, out, D, K=K, BD=BD,
                                             INTERPRET=INTERPRET, num_warps=4)
    return out
