"""First-run diagnostics for int4_moe gluon_v20 against triton_v19 at Kimi shapes: one line per
case with bitwise equality, the largest |difference|, NaNs and the rows that differ, each case
synchronized on its own (a fault or a hang names its case), so one GPU call tells what to fix.

    PYTHONPATH=. python3 scripts/diag_int4_gluon.py [--T 1,9,17,128,512,2080] [--skew 0,1.2]

Why (session 17): gluon_v20 was compiled and reviewed without a GPU; its GPU test asserts
v19's bits and stops at the first failure. This prints every case instead: decode (64-row
tiles, K splits), verify sizes, hot experts (v16's hot launch beside the Gluon programs), and
a hinted EP8 rank's decode and verify.
"""

from __future__ import annotations

import argparse
import time

import torch

from workbench.ops.cases import _experts, _Rand


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Bitwise equality of two bf16 [T, D] outputs, the largest |a - b|, NaN counts and the
    rows (tokens) that differ."""
    same = torch.equal(a.view(torch.int16), b.view(torch.int16))
    d = (a.float() - b.float()).abs()
    rows = (a.view(torch.int16) != b.view(torch.int16)).any(1).nonzero().flatten().tolist()
    top = float(d.nan_to_num(float("inf")).max()) if d.numel() else 0.0
    return {"bitwise": same, "max_abs": top,
            "nan_a": int(a.isnan().sum()), "nan_b": int(b.isnan().sum()), "rows": rows[:8],
            "n_rows": len(rows)}


def cases(Ts, skews, dev):
    """(label, args, kwargs) at Kimi shapes: every T x skew on 384 experts, then a hinted EP8
    rank's decode and verify (its 48 experts, -1 elsewhere)."""
    r = _Rand(0, dev)
    ex = _experts(r, 384, 7168, 2048)
    for s in skews:
        for T in Ts:
            ids = r.distinct(384, 8, T) if s == 0 else r.zipf(384, 8, T, s)
            yield f"T={T} skew={s}", (r.normal(T, 7168), ids, r.uniform(T, 8) + 0.05, ex), {}
    ex48 = type(ex)(*(t[:48] for t in ex))
    for T in (1, 17):
        ids = r.distinct(384, 8, T)
        here = torch.where(ids < 48, ids, torch.full_like(ids, -1))
        hint = T  # T K / 8 slots expected on one of 8 ranks
        yield (f"T={T} EP8 rank hint {hint}",
               (r.normal(T, 7168), here, r.uniform(T, 8) + 0.05, ex48), {"expected_slots": hint})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", default="1,9,17,128,512,2080")
    p.add_argument("--skew", default="0,1.2")
    a = p.parse_args(argv)
    from workbench.kernels.int4_moe import gluon_v20, triton_v19

    bad = 0
    for label, args, kw in cases([int(t) for t in a.T.split(",")],
                                 [float(s) for s in a.skew.split(",")], "cuda"):
        t0 = time.perf_counter()
        want = triton_v19.int4_moe_triton(*args, **kw)
        torch.cuda.synchronize()
        got = gluon_v20.int4_moe_gluon(*args, **kw)
        torch.cuda.synchronize()
        c = compare(got, want)
        bad += not c["bitwise"]
        print(f"{label:<28} bitwise {c['bitwise']!s:<5} max|d| {c['max_abs']:.3e} "
              f"NaN {c['nan_a']}/{c['nan_b']} rows differing {c['n_rows']} {c['rows']} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
