"""int4_moe cuda_v3: cuda_v2's GEMMs with the whole decode MoE in one launch (T K <= 64 slots):
routing, gate/up with the SiLU, down and the weighted combine (`cuda_v3.cu`); cuda_v2's four
launches past 64 slots.

Why (session 24, traces/gpu/session24): T 1 on 384 experts took 75.6 µs of kernels (router
2.9, gate/up 41.7, down 28.1, combine 2.9) and 81.2 graph-replayed against a 48.5 µs floor;
each launch pays its ramp and its tail, and the down GEMM (16 µs of weights) its own waves.
One persistent launch takes work items from a counter: gate/up items first, then down items
that issue their weights before they wait for their expert's h, and the combine done by the
CTA that finishes a row block's last expert. The routing is every CTA's own (S <= 64 slots in
shared memory), so nothing runs before the GEMMs.

Measured (H200, session 25, kernels/int4_moe/README.md "One launch for decode"): correct (25
GPU tests) and slower than the four launches it replaces: REAL T 1 95.3 µs against triton_v34's
79.6 and Humming's 91.6; T 8 on 384 experts 528-560 against cuda_v2's 412-422; an EP8 rank's
T 1 29.2-29.7 against 25-27. ncu (T 8): DRAM at 62 % against cuda_v2's gate/up 81 %; one
register budget (the down path's 168) holds both phases to 12 warps an SM. Not BEST.

Numerics: cuda_v2's (POST 1) in each GEMM, the combine's j order of `_common._combine_kernel`;
tolerance against the reference, not bits. Graph-safe: grid and buffers from shapes and the
device's occupancy only; the work counters are zeroed by the last CTA of each launch, so
replays need no memset. One buffer of counters a (device, stream): two launches of this op
must not run at once on one stream's buffer (a stream orders its own).
GPU only (cupy NVRTC). Dimension legend: cuda_v1.cu's and cuda_v3.cu's.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from . import mma_layout
from ._common import _require, check_inputs, with_cfg
from .cuda_v1 import _SRC as _SRC_V1
from .cuda_v1 import (  # noqa: F401  (REPACKED: the load step reads it)
    REPACKED,
    WARPS_TARGET,
    kernel_args,
    launch,
    operands,
    opt_in,
    run_kernel,
)
from .triton_v26 import expected_active

SMAX = 64  # slots the fused launch routes in one CTA's shared memory (cuda_v3.cu)
W = 4  # warps a CTA: both GEMMs' K parts x units
STAGES = 3  # cuda_v1's ring depth
PF_ALL = 1 << 16  # PF0n "every pair of the slice"
MINB = 3  # CTAs an SM __launch_bounds__ asks registers for: 168 a thread at W 4 (at 4, 128: the
# down path spills ~400 B, nvcc sm_90)
_SRC = os.path.join(os.path.dirname(__file__), "cuda_v3.cu")
_CTR: dict = {}  # (device, stream, n) -> int32 [n] zeros: the launches' work counters


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only: per GEMM n the K parts KWn (a divisor of W and of its C / 2 chunk pairs):
    the fewest that give ~WARPS_TARGET warps over the experts expected active (cuda_v1's
    rule with the CTA fixed at W warps); the L2 prefetch PF0n / PFn (cuda_v1's keys) off:
    PF02 = PF_ALL (a down item asks for its whole slice before it waits for h) measured
    0.2-4 µs slower (session 25 call 3)."""
    S = T * K if slots is None else slots
    active = max(1.0, expected_active(E, S))
    c = {"W": W, "U": STAGES, "MINB": MINB, "PF01": 0, "PF1": 0, "PF02": 0, "PF2": 0}
    for n, (N, KI, gate_up) in ((1, (I, D, True)), (2, (D, I, False))):
        NU, C, _ = mma_layout.dims(N, KI, gate_up)
        kws = [k for k in (1, 2, 4, 8) if W % k == 0 and (C // 2) % k == 0]
        c[f"KW{n}"] = next((k for k in kws if NU * k * active >= WARPS_TARGET), kws[-1])
    return c


@functools.cache
def _kernel(*targs: int):
    """int4_moe_fused<POST, KPAD1, KPAD2, W, KW1, KW2, U, MINB> (cuda_v1.cu + cuda_v3.cu through
    NVRTC, cached)."""
    import cupy

    name = f"int4_moe_fused<{', '.join(map(str, targs))}>"
    code = "".join(open(p).read() + "\n" for p in (_SRC_V1, _SRC))
    mod = cupy.RawModule(code=code, options=("-std=c++17",), name_expressions=[name])
    return mod.get_function(name)


@functools.cache
def _grid_cap(fn, threads: int, smem: int, device_index: int) -> int:
    """CTAs of one wave: the CTAs an SM holds by the compiled kernel's registers (allocated 256
    a warp at a time), its shared memory (static + dynamic + 1 KB reserved a CTA) and threads,
    times the SMs. An overestimate only adds CTAs that find no work item left."""
    a = fn.attributes
    p = torch.cuda.get_device_properties(device_index)
    warps = threads // 32
    regs_warp = -(-a["num_regs"] * 32 // 256) * 256
    by_regs = getattr(p, "regs_per_multiprocessor", 65536) // (regs_warp * warps)
    by_smem = getattr(p, "shared_memory_per_multiprocessor", 233472) // (
        a["shared_size_bytes"] + smem + 1024)
    by_threads = getattr(p, "max_threads_per_multi_processor", 2048) // threads
    return max(1, min(by_regs, by_smem, by_threads, 32)) * p.multi_processor_count


def _counters(device: torch.device, n: int) -> Tensor:
    key = (device, torch.cuda.current_stream(device).cuda_stream, n)
    if key not in _CTR:
        _CTR[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _CTR[key]


def int4_moe_cuda(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, experts, *,
                  validate: bool | None = None, cfg: dict | None = None,
                  expected_slots: int | None = None) -> Tensor:
    """The contract of `workbench.reference.int4_moe.int4_moe` (cuda_v1's); T K <= 64 in one
    launch, more slots through cuda_v2's four. cfg: overrides of `tiles`' keys, for sweeps."""
    _require(x.device.type == "cuda", "x", "a CUDA tensor (cuda_v3 launches CUDA C++ through cupy)",
             f"a tensor on {x.device}")
    T, K = topk_ids.shape if topk_ids.dim() == 2 else (0, 0)
    if T * K > SMAX:
        return launch(x, topk_ids, topk_weights, experts, validate, None, expected_slots, post=1)
    check_inputs(x, topk_ids, topk_weights, experts, validate, expected_slots, mma_ok=True)
    D = x.shape[1]
    E, I = experts[0].shape[:2]  # gate_packed [E, I, D / 8]
    if T == 0:
        return torch.empty(0, D, dtype=x.dtype, device=x.device)
    c = with_cfg(tiles(T, K, E, D, I, expected_slots), cfg)
    w = c["W"]
    _require(w in (2, 4, 8) and all(w % c[f"KW{n}"] == 0 for n in (1, 2)) and c["U"] >= 3
             and w * c["U"] * 3 <= 200 and c["MINB"] >= 1, "cfg",
             "W in (2, 4, 8), KW1 and KW2 dividing W, U >= 3, the ring <= 200 KB", c)
    x, (w1, s1, NU1, C1), (w2, s2, NU2, C2, KP2) = operands(x, experts, c)
    wt = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    S = T * K
    h = torch.empty(2, S, KP2, dtype=torch.bfloat16, device=x.device)  # [hi / lo, S sorted, I]
    y = torch.empty(S, D, dtype=torch.float32, device=x.device)  # [S, D] slot order
    out = torch.empty(T, D, dtype=torch.bfloat16, device=x.device)
    NB2 = -(-NU2 // (w // c["KW2"]))
    ctr = _counters(x.device, 2 + SMAX + NB2)
    fn = _kernel(1, int(D % mma_layout.KALIGN != 0), int(I % mma_layout.KALIGN != 0), w,
                 c["KW1"], c["KW2"], c["U"], c["MINB"])
    smem = w * c["U"] * 6 * 32 * 16  # the rings: [warp][stage][6][32] uint4
    opt_in(fn, smem)  # before the occupancy query below (run_kernel's own opt-in is a no-op)
    n_items = min(E, S) * (-(-NU1 // (w // c["KW1"])) + NB2)
    grid = min(n_items, _grid_cap(fn, 32 * w, smem, x.device.index or 0))
    args = (w1, s1, x, x.stride(0), D, NU1, C1, w2, s2, h[0], h[1], KP2, I, NU2, C2,
            topk_ids, int(topk_ids.dtype == torch.int64), topk_ids.stride(0), topk_ids.stride(1),
            wt, wt.stride(0), wt.stride(1), y, out, ctr, ctr.numel(), T, K, E,
            c["PF01"], c["PF1"], c["PF02"], c["PF2"])
    run_kernel(fn, (grid,), (32 * w,), kernel_args(args), smem)
    return out


def _main(argv=None) -> int:
    """Graph-replayed µs per T x config at Kimi shapes on CUDA (v5's CLI, cuda_v3's launcher):

        python -m workbench.kernels.int4_moe.cuda_v3 [--ep 8] [--T 1,8] [--cfgs "v=34;base"]"""
    from .triton_v5 import _main as v5_main

    return v5_main(argv, launcher=int4_moe_cuda, default_cfgs="v=34;base")


if __name__ == "__main__":
    raise SystemExit(_main())
