"""What the tree_mla versions share: host checks, the split policy, output allocation.

Dimension legend: B requests, N tree rows per request, H heads, M = N * H query rows of one
request (row m = node m // H, head m % H), T cache slots per request, D = C + R latent width
(C = kv_lora_rank 512, R = rope 64), W = ceil(N / 64) ancestor words, S prefix splits.
CP, RP: C and R rounded up to powers of two (the kernels' tile widths).

The split policy (README.md, "Batch invariance") depends on a request's prefix length P only:
    split_len(P) = max(MIN_SPLIT, ceil(ceil(P / MAX_SPLITS) / BLOCK_N) * BLOCK_N)
    splits(P)    = ceil(P / split_len(P))            (0 for P = 0, at most MAX_SPLITS)
so a row's prefix partition, and therefore its result, never depends on B, N, H or T. The
grid is sized from kv_cache.shape only (graph-safe): splits_grid(T) >= splits(P) for P <= T.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

MIN_SPLIT = 512  # keys: below this a split's fixed cost (Q load, partial store) dominates
MAX_SPLITS = 16  # prefix splits per request at most: bounds the partial buffer
BLOCK_N = 64  # keys per tile (prefix and tree); also the split granularity
FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def split_len(P: int, min_split: int = MIN_SPLIT) -> int:
    """Host twin of the kernels' split length (tests and the README's table use it);
    min_split: the policy's shortest split (v1: MIN_SPLIT; v2 also registers 128)."""
    per = -(-P // MAX_SPLITS)
    return max(min_split, -(-per // BLOCK_N) * BLOCK_N)


def num_splits(P: int, min_split: int = MIN_SPLIT) -> int:
    return -(-P // split_len(P, min_split))


def splits_grid(T: int, min_split: int = MIN_SPLIT) -> int:
    """Split programs per request in the launch: enough for any P <= T, from the shape only."""
    return min(MAX_SPLITS, -(-T // min_split))


def _require(ok: bool, name: str, expected: str, actual) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {actual}")


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def check_inputs(q: Tensor, kv_cache: Tensor, prefix_lens: Tensor, anc_bits: Tensor,
                 softmax_scale, kv_lora_rank) -> tuple[int, int, int, int, int, int]:
    """Shapes, dtypes and devices only (no values read: no sync, graph-capturable).
    Returns (B, N, H, D, T, W)."""
    for name, t in (("q", q), ("kv_cache", kv_cache), ("prefix_lens", prefix_lens),
                    ("anc_bits", anc_bits)):
        _require(isinstance(t, Tensor), name, "a Tensor", type(t).__name__)
    _require(q.dim() == 4, "q", "shape [B, N, H, C+R]", tuple(q.shape))
    B, N, H, D = q.shape
    _require(q.dtype in FLOATS, "q", "dtype bfloat16, float16 or float32", q.dtype)
    _require(N >= 1 and H >= 1, "q", "N >= 1 rows and H >= 1 heads", tuple(q.shape))
    _require(kv_cache.dim() == 3 and kv_cache.shape[0] == B and kv_cache.shape[2] == D,
             "kv_cache", f"shape ({B}, T, {D}) = [B, T, C+R] (as q)", tuple(kv_cache.shape))
    _require(kv_cache.dtype == q.dtype, "kv_cache", f"dtype {q.dtype} (as q)", kv_cache.dtype)
    _require(prefix_lens.shape == (B,), "prefix_lens", f"shape ({B},) = [B]",
             tuple(prefix_lens.shape))
    _require(_is_int_dtype(prefix_lens.dtype), "prefix_lens", "an integer dtype",
             prefix_lens.dtype)
    W = -(-N // 64)
    _require(anc_bits.dim() == 3 and anc_bits.shape[:2] == (B, N) and anc_bits.shape[2] >= W,
             "anc_bits", f"shape ({B}, {N}, >= {W}) = [B, N, W]", tuple(anc_bits.shape))
    _require(anc_bits.dtype == torch.int64, "anc_bits", "dtype int64", anc_bits.dtype)
    _require(isinstance(kv_lora_rank, int) and not isinstance(kv_lora_rank, bool)
             and 1 <= kv_lora_rank < D, "kv_lora_rank", f"an int in [1, {D - 1}] (C < C+R)",
             kv_lora_rank)
    _require(isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool),
             "softmax_scale", "a Python float", type(softmax_scale).__name__)
    for name, t in (("kv_cache", kv_cache), ("prefix_lens", prefix_lens),
                    ("anc_bits", anc_bits)):
        _require(t.device == q.device, name, f"a tensor on {q.device} (as q)", t.device)
    if q.device.type != "cuda":
        _require(q.device.type == "cpu" and interpreting(), "q",
                 "a CUDA tensor, or a CPU tensor with TRITON_INTERPRET=1 set before the "
                 "kernels are imported", f"a tensor on {q.device} (TRITON_INTERPRET="
                 f"{os.environ.get('TRITON_INTERPRET')!r})")
    T = kv_cache.shape[1]
    return B, N, H, D, T, W


def validate_contents(kv_cache: Tensor, prefix_lens: Tensor, N: int) -> None:
    """The reference's content check (P_b + N <= T, P_b >= 0). Reads values: a device sync,
    so only behind validate=True. Without it the kernels clamp slots to [0, T): memory-safe,
    results unspecified."""
    P = prefix_lens.detach().cpu()
    _require(bool((P >= 0).all()), "prefix_lens", "values >= 0", P.tolist())
    need = int((P + N).max()) if P.numel() else 0
    _require(need <= kv_cache.shape[1], "kv_cache",
             f"at least {need} slots for prefix_lens + N", kv_cache.shape[1])
