"""Sweep tree_mla's split policy (v4's kernels, kernels/tree_mla/triton_v4.Policy) at the few-head
shapes of an EP8 / TP8 rank: GPU busy time of one call (attention + combine, the union of their
kernel intervals under PDL) per (N, P, policy), from CUDA-graph replays.

    PYTHONPATH=. python3 scripts/sweep_tree_mla_policy.py [--heads 8] [--rows 1,9,17,33]
        [--prefix 1024,4096] [--batch 1]
        [--version triton_v4|gluon_v13|triton_v15|triton_v16|gluon_v13_c8|...]
        [--policies v4,s512,...] [--merges 8x8x128,...] [--csv out.csv]

Why: in the emulated EP8 rank tree_mla v7 takes ~31 µs a layer at N 17, H 8, P 1024 against a
0.4 µs floor (traces/gpu/session8); the policy (keys per split, parts) is the one knob that
needs no kernel change. At 64 heads the other way round (session 13): v4's 32 splits past
P = 2048 give N 129 x P 8192 33 parts, so [33, 8256, 512] fp32 partials (558 MB) are written
and read back by the combine; the "long*" policies keep v4's short splits and take fewer,
longer ones past 2048. --batch (session 19): B requests of the same P a launch, for the engine
preset's tree_mla gluon_v20, whose policy follows the launch's rows B x N. --merges (session
19): the merge's tiles instead of the policies ("RxCxCH": triton_v8's combine kernel at BLOCK_R
R, BLOCK_C C, CH parts a round, one round where the grid's parts fit CH), behind the version's
attention under the first of --policies. Policies "wS" (session 20): every prefix split into at
most S parts of whole 64-key tiles (short_upto 0, max_splits S) plus the tree part, so a launch
of B requests x RB row blocks can be sized to one wave (B x RB x (S + 1) <= the SMs), as
FlashMLA sizes its splits by batch.
"""

from __future__ import annotations

import argparse
import csv
import functools

import torch

from workbench.kernels.tree_mla import (
    gluon_v9,
    gluon_v11,
    gluon_v24,
    triton_v4,
    triton_v8,
    triton_v15,
    triton_v17,
)
from workbench.kernels.tree_mla.triton_v4 import Policy, num_parts
from workbench.loopbench import busy_us
from workbench.reference.tree_mla import causal_anc_bits

POLICIES = {  # name: Policy (short_upto, short_len, long_min, max_splits)
    "v4": Policy(),
    "v7": Policy(short_upto=2048, short_len=128, long_min=128, max_splits=64),
    "s64": Policy(short_upto=2048, short_len=64, long_min=64, max_splits=128),
    # v7's 128-key splits up to P 2048, v4's past it (session 15, call 1: at 8 heads v7 wins
    # at P 1024 and loses 2x at P 8192 from N 9 up)
    "s128": Policy(short_upto=2048, short_len=128),
    "s256": Policy(short_upto=2048, short_len=256, long_min=256, max_splits=32),
    "s512": Policy(short_upto=2048, short_len=512, long_min=512, max_splits=16),
    "s1024": Policy(short_upto=2048, short_len=1024, long_min=1024, max_splits=8),
    "long512": Policy(long_min=512, max_splits=16),
    "long1024": Policy(long_min=1024, max_splits=8),
    "long2048": Policy(long_min=2048, max_splits=4),
    # gluon_v11_long's past 2048 with fewer, longer short splits (a 64-head verify at P <= 2048:
    # v4's 256-key parts leave N 129 x P 1024 at ~27 % of the ceiling, session 13)
    "s512long1024": Policy(short_upto=2048, short_len=512, long_min=1024, max_splits=8),
    "s1024long1024": Policy(short_upto=2048, short_len=1024, long_min=1024, max_splits=8),
}
# the launchers taking a Policy: (q, kv, P, anc, scale, C, validate, policy)
LAUNCH = {"triton_v4": triton_v4._launch,
          "gluon_v10": functools.partial(gluon_v9._launch, p_smem=True),
          "gluon_v11": gluon_v11._launch,
          "gluon_v13": functools.partial(gluon_v11._launch, publish=True),
          "triton_v15": triton_v15._launch,
          # triton_v16 (v15's attention, v8's combine) and gluon_v13 with v8's combine
          "triton_v16": functools.partial(triton_v15._launch, combine=triton_v8._launch_combine),
          "gluon_v13_c8": functools.partial(gluon_v11._launch, publish=True,
                                            combine=triton_v8._launch_combine),
          # triton_v17's one-round merge behind v4's attention (triton_v17) and gluon_v13's
          # (gluon_v18), whatever the head count
          "triton_v17": functools.partial(triton_v4._launch,
                                          combine=triton_v17._launch_combine),
          "gluon_v18": functools.partial(gluon_v11._launch, publish=True,
                                         combine=triton_v17._launch_combine),
          # gluon_v19's reciprocal epilogue: behind v4's merge, and behind v17's (gluon_v18's)
          "gluon_v19": functools.partial(gluon_v11._launch, publish=True, rcp=True),
          "gluon_v18_rcp": functools.partial(gluon_v11._launch, publish=True, rcp=True,
                                             combine=triton_v17._launch_combine),
          # triton_v15's transposed attention (keys on M: 8 rows not padded to 64) behind the
          # one-round merge: a candidate for the engine's short-part decode (gluon_v20)
          "triton_v15_c17": functools.partial(triton_v15._launch,
                                              combine=triton_v17._launch_combine)}


def policy(name: str) -> Policy:
    """POLICIES[name], or "wS": at most S prefix parts of whole 64-key tiles at any P."""
    if name in POLICIES:
        return POLICIES[name]
    if name.startswith("w") and name[1:].isdigit() and int(name[1:]) >= 1:
        return gluon_v24.wave_policy(int(name[1:]))
    raise SystemExit(f"--policies: expected names of {sorted(POLICIES)} or wS (S >= 1), "
                     f"got {name!r}")


def merge_launcher(R: int, C: int, CH: int):
    """A `combine` hook (triton_v4._launch's signature) running triton_v8's merge kernel on
    R rows x C columns a program, CH parts a round (one round where G <= CH)."""
    return functools.partial(triton_v17.launch_merge, R, C, CH)


def time_call(fn, reps: int = 20) -> tuple[float, float]:
    """(median busy µs of one call, median µs of its first kernel alone: the attention, the
    rest being the combine's tail past it) over `reps` profiled graph replays."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    out, first = [], []
    cuda_type = torch.autograd.DeviceType.CUDA
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        out.append(busy_us(prof))
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == cuda_type and e.time_range.end > e.time_range.start)
        first.append(spans[0][1] - spans[0][0] if spans else 0.0)
    return sorted(out)[len(out) // 2], sorted(first)[len(first) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rows", default="1,9,17,33")
    ap.add_argument("--prefix", default="1024,4096")
    ap.add_argument("--batch", default="1", help="requests a launch (comma list)")
    ap.add_argument("--version", choices=list(LAUNCH), default="triton_v4")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--merges", default=None, help='merge tiles "RxCxCH,..." (see above)')
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    _launch = LAUNCH[a.version]
    policies = {k: policy(k) for k in a.policies.split(",")}
    launches = {name: (_launch, pol) for name, pol in policies.items()}
    if a.merges:  # the first policy, one merge hook each
        name0, pol0 = next(iter(policies.items()))
        launches = {f"{name0}/{m}": (functools.partial(_launch, combine=merge_launcher(
            *map(int, m.split("x")))), pol0) for m in a.merges.split(",")}
    dev, C, R = "cuda", 512, 64
    rows = []
    shapes = [(B, P, N) for B in map(int, a.batch.split(",")) for P in map(int,
              a.prefix.split(",")) for N in map(int, a.rows.split(","))]
    for B, P, N in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(B, N, a.heads, C + R, generator=g, device=dev).to(torch.bfloat16)
        cache = torch.randn(B, P + N, C + R, generator=g, device=dev).to(torch.bfloat16)
        pre = torch.full((B,), P, device=dev)
        anc = causal_anc_bits(N, B, dev)
        want = _launch(q, cache, pre, anc, 0.1447, C, False, POLICIES["v7"])[0].float()
        for name, (launch, pol) in launches.items():
            call = functools.partial(launch, q, cache, pre, anc, 0.1447, C, False, pol)
            err = float((call()[0].float() - want).abs().max())  # any policy: same math
            us, attn = time_call(call)
            parts = num_parts(P, policy=pol)[1]
            rows.append(dict(version=a.version, H=a.heads, B=B, N=N, P=P, policy=name,
                             parts=parts, busy_us=us, attn_us=attn, max_diff_vs_v7=err))
            print(f"{a.version} H {a.heads} B {B:2d} N {N:3d} P {P:5d} {name:8s} "
                  f"parts {parts:3d} "
                  f"{us:7.2f} us (attention kernel {attn:6.2f})"
                  f"  |diff| {err:.1e}", flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
