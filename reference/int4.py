"""INT4 W4A16 format of Kimi K2.6's routed experts (compressed-tensors `pack-quantized`).

Symmetric, group 32 along the input dim, bf16 scales, no zero point. Eight 4-bit values per
int32, lowest bits first, each stored as q + 8:

    W[o, i] = (((uint32(packed[o, i >> 3]) >> (4 * (i & 7))) & 0xF) - 8) * scale[o, i >> 5]

The product is rounded to bf16, as compressed-tensors computes it (q.to(bf16) * scale).
"""

from __future__ import annotations

import sys

import torch

GROUP = 32
PACK = 8  # int4 values per int32 word


def quantize_int4_g32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [O, I] float -> (q int8 [O, I] in [-8, 7], scale bf16 [O, I/32]).

    compressed-tensors' symmetric min-max observer: scale = max|w| / 7.5 per group (bf16), then
    q = clamp(round(w / scale), -8, 7).
    """
    O, I = w.shape
    if I % GROUP:
        raise ValueError(f"w: expected the input dim to be a multiple of {GROUP}, got {I}")
    g = w.float().reshape(O, I // GROUP, GROUP)
    amax = g.abs().amax(-1).clamp_min(1e-8)
    scale = (amax / 7.5).to(torch.bfloat16)
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp(-8, 7).to(torch.int8)
    return q.reshape(O, I), scale


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q int8 [..., I] in [-8, 7] -> int32 [..., I/8], element i at bits 4*(i%8) of word i//8."""
    if q.shape[-1] % PACK:
        raise ValueError(f"q: expected the last dim to be a multiple of {PACK}, got {q.shape[-1]}")
    u = (q.to(torch.int64) + 8).reshape(*q.shape[:-1], -1, PACK)
    shifts = torch.arange(PACK, device=q.device, dtype=torch.int64) * 4
    word = (u << shifts).sum(-1)  # < 2^32
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., I/8] -> int8 [..., I] in [-8, 7].

    Byte k of a word (little-endian, as every device torch runs on stores it) holds elements
    2k (low nibble) and 2k + 1 (high nibble), so the words' bytes, low nibble then high, are
    the elements in order: the format's shifts without widening a word to int64 (session 45:
    30x faster on the CPU, the same values; the tests' CPU time is mostly this)."""
    if sys.byteorder != "little":  # the byte view below assumes it; never a silent misread
        raise RuntimeError(f"unpack_int4: expected a little-endian host, got {sys.byteorder}")
    b = packed.to(torch.int32).contiguous().view(torch.uint8)  # [..., I/8 * 4]
    nib = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)  # [..., I]
    return nib.to(torch.int8) - 8


def dequant_int4_g32(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """packed int32 [..., O, I/8], scale bf16 [..., O, I/32] -> W bf16 [..., O, I]."""
    q = unpack_int4(packed)
    if q.shape[-1] != scale.shape[-1] * GROUP:
        raise ValueError(f"scale: expected {q.shape[-1] // GROUP} groups per row for "
                         f"{q.shape[-1]} inputs, got {scale.shape[-1]}")
    # each group's 32 values times its scale (broadcast, not repeated): the bf16 product,
    # = compressed-tensors
    w = q.to(torch.bfloat16).unflatten(-1, (-1, GROUP)) * scale.unsqueeze(-1)
    return w.flatten(-2)
