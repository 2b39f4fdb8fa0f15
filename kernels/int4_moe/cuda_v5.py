"""int4_moe cuda_v5: cuda_v4 with the gate/up GEMM's K parts chosen so that, without an
expert-parallel hint, its grid fits one wave of the GPU where it can.

Why (H200, session 27 calls 1-2, `python -m workbench.kernels.int4_moe.cuda_v4 --by-kernel`,
traces/gpu/session27): cuda_v1's rule takes the fewest K parts that give the launch ~24 warps
an SM (WARPS_TARGET), but the instance it runs holds 128 registers a thread, so at most 16
warps an SM are resident (65536 registers) and a launch of 24 an SM is 1.5 waves: a second,
part-full wave whose CTAs each stream a whole K part. At T 1 on 384 experts (8 active experts
x 128 units x KW1 4 = 4096 warps, 1.94 waves) the gate/up GEMM took 42.0-42.4 µs; at KW1 2
(2048 warps, 0.97 of a wave) 37.8-39.0 µs, the op 71.3-72.8 µs against 75.3-76.3 (four
rounds in two calls). At T 2 (~16 experts) KW1 1 (2010 warps): 72.0-72.2 against 76.5-76.7.

Where the rule does not apply: an EP rank's hinted calls. The active-expert count of a rank
varies from draw to draw around its expectation, and the one-wave pick lost there in call 2
(hint 8: the gate/up at KW1 2 65 µs against 55.5; hint 17 at KW1 1: the op 104.0 against
102.1 µs, after 124.2 against 126.9 on call 1's draw), so hinted calls keep cuda_v4's tiles. Where even one K part
is more than a wave (T >= 3 on 384 experts) the tiles are cuda_v4's too.

Measured (call 3): GPU tests 26 passed (cuda_v4's bits at T 3 / 33 and hints 1 / 17 / 136);
in-process A/B against cuda_v4, 3 rounds, T 1 73.5 vs 77.2 µs, T 2 126.3 vs 131.0; REAL bench T
1 73.7 uniform / 72.7 skewed (cuda_v4 77.4 / 76.8, Humming 91.1 / 91.0); the EP8 step as
cuda_v4's (C 1 AR 5.270 ms, C 1 DDTree-16 14.03). The engine preset's int4_moe from session 27.

Everything else is cuda_v4's: the same kernels, instances and numerics (a different K
association of gate/up at T 1 / 2: tolerance against the reference, as cuda_v4).
Dimension legend: cuda_v1.cu's (CUDA) and triton_v16's (Triton).
"""

from __future__ import annotations

from . import cuda_v1, cuda_v4, mma_layout
from .cuda_v4 import REPACKED, h_column  # noqa: F401  (the load step reads REPACKED)
from .triton_v26 import expected_active

# warps resident an SM at the gate/up instances' 128 registers a thread (65536 / (128 x 32));
# the ring's shared memory (9 KB a warp at U 3) allows them: 147 KB an SM
WAVE_WARPS = 16 * cuda_v1.SMS


def one_wave_parts(NU: int, pairs: int, active: float, kw_max: int) -> int | None:
    """The most K parts (a divisor of the chunk pairs, <= kw_max) whose launch of NU units x
    parts warps for each of `active` experts fits WAVE_WARPS; None if one part does not."""
    fits = [k for k in range(1, min(kw_max, pairs) + 1)
            if pairs % k == 0 and NU * k * active <= WAVE_WARPS]
    return fits[-1] if fits else None


def tiles(T: int, K: int, E: int, D: int, I: int, slots: int | None = None) -> dict:
    """Shapes only (graph-safe): cuda_v4's tiles, with the gate/up K parts (KW1, RW1) of one
    wave where the call has no hint and one K part fits one (T 1 / 2 on 384 experts)."""
    c = cuda_v4.tiles(T, K, E, D, I, slots)
    if slots is not None or c["NN1"] != 1:
        return c
    NU, C, _ = mma_layout.dims(I, D, True)
    kw = one_wave_parts(NU, C // 2, max(1.0, expected_active(E, T * K)), cuda_v1.KW_MAX[1])
    if kw is None:
        return c
    return c | {"KW1": kw, "RW1": max(1, 4 // kw)}


# the op and its CLI: cuda_v4's launches on this file's tiles
int4_moe_cuda, _main = cuda_v4.on_tiles(tiles, "v=cuda_v4;base")


if __name__ == "__main__":
    raise SystemExit(_main())
