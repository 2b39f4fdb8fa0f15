"""The fragment layout of int4_moe cuda_v1: the checkpoint's experts repacked, exactly, so that
one warp's mma.sync m16n8k16 A fragments come out of one 16-byte load a lane and chunk.

Legend (cuda_v1.cu's): E experts, N output rows, KI reduction inputs (padded to KP, a multiple
of 128), C = KP / 64 chunks, NU row units of 32 rows (gate/up: unit u = gate rows 16u..16u+15
as tile 0 and the same up rows as tile 1; down: rows 32u..32u+31 as tiles 0, 1), lane = 4 g + t.

Weights, int32 [E, NU, C, 2 tiles, 32 lanes, 4 words]: word j of lane (g, t) in chunk c holds
the 8 nibbles (stored q + 8) its mma step j reads:

    nibble p  ->  row  g + 8 (p & 1)  of the tile,
                  input  64 c + 32 (j >> 1) + 8 t + 4 (j & 1) + e(p),  e(p) = (p >> 2) + 2 ((p >> 1) & 1)

so `lop3(word >> 4 i, 0x000F000F, ...)` for i = 0..3 gives the A registers a0..a3 (rows g,
g + 8, g, g + 8; inputs (+0, +1), (+0, +1), (+2, +3), (+2, +3)). The mma's logical k index
2t + {0, 1} and 2t + 8 + {0, 1} of step j are those inputs + {0, 1} and + {2, 3}: steps 0-1
cover scale group 2c, steps 2-3 group 2c + 1 (each mma step inside one group: cuda_v2 scales
its fp32 partials a group at a time), and a lane's B operand over a chunk is its 8 contiguous
inputs 8 t .. 8 t + 7 of each group (two 16-byte loads of x or h in their natural order, no
permute launch). A K sum's association is not the reference's (the mma's inside a step).

Scales, bf16 [E, NU, C / 2, 2 tiles, 8 g, 8]: the 16 bytes of lane group g of a chunk pair hold
(chunk 0: group 0 row g, group 0 row g + 8, group 1 row g, group 1 row g + 8; chunk 1: the
same), groups counted within the pair's 4; the four lanes t of a g read the same 16 bytes (no
scale stored twice). Padding: weights q = 0 (stored 8), scales 0.

`repack` is the one-time load step (cached per checkpoint tensor); `unpack` is its inverse
through the same index math, W [N, KI] bf16 as the kernel dequantises it: the CPU twin the
tests hold against `reference/int4.py` bit for bit.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

CHUNK = 64  # inputs a chunk (four mma k-steps)
KALIGN = 128  # KP: a whole number of chunk pairs (one scale load covers two chunks)
UNIT = 32  # output rows a unit (two 16-row mma tiles)
_CACHE: dict = {}


def _e(p: Tensor) -> Tensor:
    return (p >> 2) + 2 * ((p >> 1) & 1)


def _index(NU: int, C: int, gate_up: bool, device) -> tuple[Tensor, Tensor]:
    """(row, input) of every nibble of the layout, each [NU, C, 2, 32, 4, 8] int64: row in the
    source matrix (gate/up: tile 1 indexes the up matrix, rows offset by NU * 16) and input."""
    ar = lambda n: torch.arange(n, device=device)  # noqa: E731
    u = ar(NU).view(NU, 1, 1, 1, 1, 1)
    c = ar(C).view(1, C, 1, 1, 1, 1)
    tile = ar(2).view(1, 1, 2, 1, 1, 1)
    lane = ar(32).view(1, 1, 1, 32, 1, 1)
    j = ar(4).view(1, 1, 1, 1, 4, 1)
    p = ar(8).view(1, 1, 1, 1, 1, 8)
    g, t = lane >> 2, lane & 3
    r_in = g + 8 * (p & 1)
    row = tile * NU * 16 + u * 16 + r_in if gate_up else u * UNIT + tile * 16 + r_in
    k = CHUNK * c + 32 * (j >> 1) + 8 * t + 4 * (j & 1) + _e(p)
    return row.expand(NU, C, 2, 32, 4, 8), k.expand(NU, C, 2, 32, 4, 8)


def _scale_index(NU: int, C: int, gate_up: bool, device) -> tuple[Tensor, Tensor]:
    """(row, group) of every scale entry, each [NU, C / 2, 2, 8, 8] int64."""
    ar = lambda n: torch.arange(n, device=device)  # noqa: E731
    u = ar(NU).view(NU, 1, 1, 1, 1)
    cc = ar(C // 2).view(1, C // 2, 1, 1, 1)
    tile = ar(2).view(1, 1, 2, 1, 1)
    g = ar(8).view(1, 1, 1, 8, 1)
    v = ar(8).view(1, 1, 1, 1, 8)  # chunk v >> 2, group (v >> 1) & 1 of the chunk, row + 8 (v & 1)
    r_in = g + 8 * (v & 1)
    row = tile * NU * 16 + u * 16 + r_in if gate_up else u * UNIT + tile * 16 + r_in
    group = 4 * cc + (v >> 1)
    shape = (NU, C // 2, 2, 8, 8)
    return row.expand(shape), group.expand(shape)


def logical_k_perm(KP: int, device=None) -> Tensor:
    """int64 [KP]: the input each logical k of the A fragments reads, in the order wgmma walks
    k (cuda_v19: B from shared memory, k in order). Step s = 2 G + jj of 32-input group G takes
    logical k 2 t + b and 2 t + 8 + b from inputs 8 t + 4 jj + b and 8 t + 4 jj + 2 + b of G
    (`_index`'s nibbles), so xp = x[:, perm] puts B's rows where the fragments' columns are:
    perm[32 G + 16 jj + 8 kc + 2 t + b] = 32 G + 8 t + 4 jj + 2 kc + b."""
    i = torch.arange(KP, device=device)
    G, r = i // 32, i % 32
    jj, kc, t, b = r // 16, (r // 8) % 2, (r // 2) % 4, r % 2
    return 32 * G + 8 * t + 4 * jj + 2 * kc + b


def dims(N: int, KI: int, gate_up: bool) -> tuple[int, int, int]:
    """(NU, C, KP) of an [N, KI] matrix (gate/up: N rows of each of the two)."""
    NU = -(-N // (16 if gate_up else UNIT))
    KP = -(-KI // KALIGN) * KALIGN
    return NU, KP // CHUNK, KP


def _nibbles(packed: Tensor, rows: int, KP: int) -> Tensor:
    """int32 [N, KI/8] -> the stored nibbles uint8 [rows, KP] (padding: 8, i.e. q = 0)."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.int32) * 4
    nib = ((packed.unsqueeze(-1) >> shifts) & 0xF).flatten(-2).to(torch.uint8)
    N, KI = nib.shape
    return torch.nn.functional.pad(nib, (0, KP - KI, 0, rows - N), value=8)


def repack(packed: tuple[Tensor, ...], scale: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """Checkpoint tensors of one expert stack -> (words int32 [E, NU, C, 2, 32, 4], scales bf16
    [E, NU, C/2, 2, 8, 8]). packed / scale: (gate, up) for the gate/up GEMM, (down,) for the
    down GEMM; int32 [E, N, KI/8] and bf16 [E, N, KI/32] each. Exact (a permutation of nibbles
    and scales, plus q = 0 / scale 0 padding); one expert at a time bounds the temporaries."""
    gate_up = len(packed) == 2
    E, N, words = packed[0].shape
    KI = words * 8
    NU, C, KP = dims(N, KI, gate_up)
    rows = NU * (16 if gate_up else UNIT)
    dev = packed[0].device
    row, k = _index(NU, C, gate_up, dev)
    srow, sgrp = _scale_index(NU, C, gate_up, dev)
    shifts = torch.arange(8, device=dev, dtype=torch.int64) * 4
    w_out = torch.empty(E, NU, C, 2, 32, 4, dtype=torch.int32, device=dev)
    s_out = torch.empty(E, NU, C // 2, 2, 8, 8, dtype=torch.bfloat16, device=dev)
    for e in range(E):
        nib = torch.cat([_nibbles(p[e], rows, KP) for p in packed])  # [rows (x 2), KP]
        word = (nib[row, k].to(torch.int64) << shifts).sum(-1)  # [NU, C, 2, 32, 4] < 2^32
        w_out[e] = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
        sc = torch.cat([torch.nn.functional.pad(s[e], (0, KP // 32 - KI // 32, 0, rows - N))
                        for s in scale])  # [rows (x 2), KP / 32]
        s_out[e] = sc[srow, sgrp]
    return w_out, s_out


def unpack(words: Tensor, scales: Tensor, N: int, KI: int, gate_up: bool) -> Tensor:
    """The inverse of `repack` through the kernel's index math: W bf16 [E, N (x 2), KI] as the
    kernel's dequant computes it, bf16((q - 8) s) (gate/up: the gate rows, then the up rows)."""
    E, NU, C = words.shape[:3]
    rows = NU * (16 if gate_up else UNIT)
    dev = words.device
    row, k = _index(NU, C, gate_up, dev)
    srow, sgrp = _scale_index(NU, C, gate_up, dev)
    shifts = torch.arange(8, device=dev, dtype=torch.int64) * 4
    nib = ((words.to(torch.int64).unsqueeze(-1) & 0xFFFFFFFF) >> shifts) & 0xF
    n_src = rows * (2 if gate_up else 1)
    q = torch.empty(E, n_src, C * CHUNK, dtype=torch.int64, device=dev)
    q[:, row.flatten(), k.flatten()] = nib.flatten(1)
    s = torch.empty(E, n_src, C * CHUNK // 32, dtype=torch.bfloat16, device=dev)
    s[:, srow.flatten(), sgrp.flatten()] = scales.flatten(1)
    w = (q - 8).to(torch.bfloat16) * s.repeat_interleave(32, dim=-1)
    keep = torch.cat([torch.arange(N, device=dev) + i * rows for i in range(2 if gate_up else 1)])
    return w[:, keep, :KI]


def repacked(packed: tuple[Tensor, ...], scale: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """`repack`, cached per checkpoint tensor (weakly: freed with it; an in-place change of a
    tensor, its `_version`, repacks again). The cache holds a second copy of the experts,
    except after `replace_with_repacked`: then its entry is the only copy."""
    key = _key(packed, scale)
    hit = _CACHE.get(key)
    if hit is not None and all(r() is t for r, t in zip(hit[0], (*packed, *scale))):
        return hit[1]
    value = repack(packed, scale)
    _remember(packed, scale, value)
    return value


def _key(packed, scale) -> tuple:
    return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t._version, t.device)
                 for t in (*packed, *scale))


def _remember(packed, scale, value) -> None:
    """Cache `value` for these checkpoint tensors, weakly (dropped with packed[0])."""
    key = _key(packed, scale)
    _CACHE[key] = (tuple(weakref.ref(t) for t in (*packed, *scale)), value)
    weakref.finalize(packed[0], _CACHE.pop, key, None)


LAYOUT_ATTR = "_int4_layout"  # set to "mma" on checkpoint-shaped views holding this layout
# the expert buffers each GEMM reads, by the names `replace_with_repacked` takes
GEMM_BUFFERS = {"gate_up": ("gate_packed", "gate_scale", "up_packed", "up_scale"),
                "down": ("down_packed", "down_scale")}
GATE_UP = frozenset(GEMM_BUFFERS["gate_up"])


def replace_with_repacked(holder, gemms: tuple[str, ...] = ("gate_up", "down")) -> None:
    """The load step for where two copies of the experts do not fit (the full-size EP8 rank:
    71 GB of experts on a 141 GB GPU): repack `holder`'s six expert buffers (gate / up / down
    `_packed` and `_scale`, checkpoint layout: `workbench.dist.moe.LocalExperts`) one GEMM at
    a time and replace each buffer by a view of the repacked tensor with the checkpoint's
    shape, so the old storage is freed and `repacked` hands the kernels the fragment layout
    without a copy. The views hold the fragment layout, not the checkpoint's: they are
    tagged (`LAYOUT_ATTR`), and `_common.check_inputs` refuses them to every version that
    reads the checkpoint layout. Needs D and I multiples of 128 (no padding: the repacked
    tensors then have exactly the checkpoint's element counts). gemms: the GEMMs whose
    buffers are replaced (keys of GEMM_BUFFERS; cuda_v4 reads down in the checkpoint
    layout, so its load step replaces gate / up only)."""
    bad = [g for g in gemms if g not in GEMM_BUFFERS]
    if bad or not gemms:
        raise ValueError(f"gemms: expected a non-empty subset of {tuple(GEMM_BUFFERS)}, got "
                         f"{gemms!r}")
    names = (*GEMM_BUFFERS["gate_up"], *GEMM_BUFFERS["down"])
    gp, gs, up, us, dp, ds = (getattr(holder, n) for n in names)
    I, D = gp.shape[1], gp.shape[2] * 8
    shapes = {"gate_up": ("gate_packed", I, D, True), "down": ("down_packed", D, I, False)}
    for what, n, KI, gu in (shapes[g] for g in gemms):
        NU, C, KP = dims(n, KI, gu)
        rows = NU * (16 if gu else UNIT)
        if KP != KI or rows != n:
            raise ValueError(f"holder.{what}: expected a matrix of {'16' if gu else '32'}-row "
                             f"units over a multiple of {KALIGN} inputs (no padding), got "
                             f"{n} rows x {KI} inputs")
    parts = {"gate_up": ((gp, up), (gs, us), ("gate_packed", "up_packed"),
                         ("gate_scale", "up_scale")),
             "down": ((dp,), (ds,), ("down_packed",), ("down_scale",))}
    for packed, scale, pn, sn in (parts[g] for g in GEMM_BUFFERS if g in gemms):
        words, scales = repack(packed, scale)
        views = []
        for src, dst in ((packed, words), (scale, scales)):
            flat, at = dst.view(-1), 0
            for t in src:
                v = flat[at:at + t.numel()].view(t.shape)
                at += t.numel()
                setattr(v, LAYOUT_ATTR, "mma")
                views.append(v)
        for v, name in zip(views, (*pn, *sn)):
            setattr(holder, name, v)  # the checkpoint tensor is freed when this call returns
        pv, sv = views[:len(packed)], views[len(packed):]
        _remember(pv, sv, (words, scales))
