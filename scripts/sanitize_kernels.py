"""Call kernels on the harness's EDGE cases and a few REAL shapes, on CUDA, for compute-sanitizer
(issues #6 / #7: "compute-sanitizer memcheck (and racecheck) clean"):

    compute-sanitizer --tool memcheck --error-exitcode 1 --target-processes all \\
        python3 scripts/sanitize_kernels.py [--ops int4_moe=triton_v11,tree_mla=triton_v4]

Each variant runs once per case, eagerly, with no reference alongside (the float64 reference
would only slow the instrumented run; the GPU tests check the values). EDGE cases are where
tails, empty experts, NaN past the cache's valid slots and ragged batches live; the REAL shapes
add Kimi's widths (int4_moe: E 384, T 1 / 17 / 136 with an EP8 rank's -1 slots and hint;
tree_mla: MLA_REAL, H 64 and 8, P 1024 to 32768, batches of 1 and 8). Prints one line per
call and exits 0 when every call returned; the sanitizer's exit code says whether it saw an
error.
"""

from __future__ import annotations

import argparse

import torch

from workbench import ops
from workbench.kernels import int4_moe as int4_pkg
from workbench.kernels import tree_mla as mla_pkg
from workbench.ops.cases import int4_moe_cases, tree_mla_cases

DEFAULT = "int4_moe=triton_v11,int4_moe=triton_v12,tree_mla=triton_v4,tree_mla=triton_v7"


def _int4_real(dev) -> list[tuple[str, tuple, dict]]:
    """Kimi widths, E 384 (9.5 GB of experts): decode, a budget-16 verify, an EP8 rank."""
    from workbench.ops.cases import _experts, _Rand

    r = _Rand(1, dev)
    ex = _experts(r, 384, 7168, 2048)
    out = []
    for T in (1, 17):
        out.append((f"T={T} E=384", (r.normal(T, 7168), r.distinct(384, 8, T),
                                    r.uniform(T, 8) + 0.05, ex), {}))
    ex48 = type(ex)(*(t[:48] for t in ex))
    # one EP8 rank (its 48 experts, -1 elsewhere, hinted): C 8 x DDTree-16 (T 136), the C 1
    # verify (T 17), and the decode's K-split grids (T 1 and 2; int4_moe v29-v32), there with
    # all 8 slots of T 1 on the rank too (v30's A_GRID 2 programs take 8 experts in turns)
    for T in (136, 17, 2, 1):
        ids = r.distinct(384, 8, T)
        here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
        out.append((f"T={T} EP8 rank (48 experts, -1 slots, hint {T})",
                    (r.normal(T, 7168), here, r.uniform(T, 8) + 0.05, ex48),
                    {"expected_slots": T}))
    out.append(("T=1 EP8 rank, all 8 slots on it (hint 1)",
                (r.normal(1, 7168), r.distinct(48, 8, 1), r.uniform(1, 8) + 0.05, ex48),
                {"expected_slots": 1}))
    return out


MLA_REAL = ("N=17 H=8 P=1024", "N=129 H=64 P=1024", "N=1 H=64 P=8192", "N=9 H=8 P=8192",
            "B=1 N=9 H=8 P=32768", "B=8 N=17 H=64 P=4096")  # splits, parts, batches


def _mla_real(dev) -> list[tuple[str, tuple, dict]]:
    cases = [c for c in tree_mla_cases("real", 0, device=dev) if c.label in MLA_REAL]
    return [(c.label, c.args, c.kwargs) for c in cases]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=DEFAULT, help="op=variant,... (one entry per variant)")
    p.add_argument("--no-real", action="store_true", help="EDGE cases only")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    a = p.parse_args(argv)
    int4_pkg.register()
    mla_pkg.register()
    dev = a.device
    edge = {"int4_moe": lambda: [c for c in int4_moe_cases("edge", 0, device=dev)
                                 if "duplicate" not in c.label],  # rejected on the host
            "tree_mla": lambda: tree_mla_cases("edge", 0, device=dev)}
    real = {"int4_moe": _int4_real, "tree_mla": _mla_real}
    for item in a.ops.split(","):
        op, variant = item.split("=")
        fn = ops.op_spec(op).variant(variant).load()
        calls = [(c.label, c.args, c.kwargs) for c in edge[op]()]
        if not a.no_real:
            calls += real[op](dev)
        for label, args, kwargs in calls:
            fn(*args, **kwargs)
            if dev == "cuda":
                torch.cuda.synchronize()
            print(f"{op} {variant} {label}: returned", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
