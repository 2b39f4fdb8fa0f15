"""How far the down GEMM's bf16 h (triton_v7's cfg NH2 1: h's hi half only) moves int4_moe's
output from the fp32 reference, against the hi + lo default, at Kimi shapes on the GPU.

    python scripts/probe_int4_h_precision.py [--variant cuda_v13] [--T 9,33,128,512]
        [--skews 0,1.2] [--cfgs "DS=0;DS=0,NH2=1"]

One row a (T, skew, cfg): the global relative error ||out - ref|| / ||ref||, the largest error
as a fraction of the elementwise band (rtol |ref| + floor of int4_moe's tolerance, <= 1
passes) and the harness's verdict (`workbench.check.compare_outputs`). Why: NH2 1 halves the
down GEMM's MMA columns and activation reads; it is worth a version only if its output stays as
far inside the tolerance as the rounding it adds predicts (one bf16 rounding of h)."""

from __future__ import annotations

import argparse
import os
import sys
import types

import torch

# run as a file (python3 scripts/probe_int4_h_precision.py) on a box without the editable
# install (the H200's: session 37 call 1 lost this probe to a ModuleNotFoundError): the package
# is the repo root's
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workbench.check import compare_outputs  # noqa: E402
from workbench.config import ModelConfig  # noqa: E402
from workbench.kernels.int4_moe.triton_v5 import _cli_config  # noqa: E402
from workbench.ops.cases import _experts, _Rand, tolerance  # noqa: E402
from workbench.reference.int4_moe import int4_moe  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="cuda_v13", help="triton_vN's N or cuda_vN")
    ap.add_argument("--T", default="9,33,128,512")
    ap.add_argument("--skews", default="0,1.2")
    ap.add_argument("--cfgs", default="DS=0;DS=0,NH2=1")
    ap.add_argument("--preset", default="kimi-k2.6")
    ap.add_argument("--device", default="cuda", help="cpu: the Triton interpreter (triton_vN)")
    a = ap.parse_args(argv)
    mc = ModelConfig.preset(a.preset)
    E, K, D, I = mc.n_routed_experts, mc.n_experts_per_tok, mc.hidden_size, mc.moe_intermediate
    ex = _experts(_Rand(0, a.device), E, D, I)
    case = types.SimpleNamespace(op="int4_moe", dims={"D": D, "I": I})
    tol = tolerance("int4_moe", "out", torch.bfloat16, case)
    print(f"{'T':>4} {'skew':>4}  {'cfg':<16} {'rel_err':>9} {'max err/band':>12}  verdict")
    for T in (int(t) for t in a.T.split(",")):
        for skew in (float(s) for s in a.skews.split(",")):
            r = _Rand(4100 + T, a.device)
            ids = r.zipf(E, K, T, skew) if skew else r.distinct(E, K, T)
            x, w = r.normal(T, D), r.uniform(T, K) + 0.05
            ref = int4_moe(x, ids, w, ex)
            rf = ref.double()
            floor = max(tol.atol_rms * rf.pow(2).mean().sqrt().item(), tol.atol_abs)
            for name in a.cfgs.split(";"):
                out = _cli_config(f"v={a.variant},{name}" if name != "base"
                                  else f"v={a.variant}", None)(x, ids, w, ex)
                rep = compare_outputs(ref, out, case)
                worst = ((out.double() - rf).abs() / (tol.rtol * rf.abs() + floor)).max().item()
                print(f"{T:>4} {skew:>4}  {name:<16} {rep['rel_err']:>9.3e} {worst:>12.3f}  "
                      f"{'pass' if rep['pass'] else 'FAIL: ' + rep['mismatches'][:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
