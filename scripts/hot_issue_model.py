"""How much of the hot gate/up launch (cuda_v10.cu's `int4_moe_hot`) is instruction issue, at
the REAL bench's skewed routing: the SASS of its K loop (sm_90, nvcc + cuobjdump, no GPU) and a
per-pass issue model against the hot experts' DRAM time.

    python3 scripts/hot_issue_model.py [--T 128,512] [--skew 1.2] [--seeds 0,1,2]
        [--clock-ghz 1.755 --sms 132 --copy-tbs 2.97]   (H100 80GB; the H200: --copy-tbs 4.26)

Why (issue #6, session 45): skewed T 128 / 512 sit under 85 % of copy, and session 45's sweep
found no hot-launch knob that pays (traces/gpu/session45). A hot CTA's warp takes one 32-row
unit over all of K for one pass of up to 8 NT slots of an expert; an expert past 8 NT slots
is several passes, each dequantising the same weights again (its second stream comes from L2,
its instructions do not). The loop's SASS says how many instructions a pass issues a weight,
the routing how many passes, and an SM issues at most 4 warp instructions a clock: the time
below which the launch cannot issue, beside the time its experts' bytes take at copy speed.

A model, not a measurement of time: perfect issue (4 a clock on every SM, nothing else
running), every warp-instruction counted once, the clock given. It bounds from below what the
hot launch can take; `--by-kernel` on the GPU measures what it does take."""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

WEIGHTS_AN_ITERATION = 32 * 128  # a warp's K-loop step: one 32-row unit x one 128-input pair


def loop_mixes(nts=(2, 4, 8), wu=8, st=6) -> dict[int, collections.Counter]:
    """{NT: the opcode mix of int4_moe_hot<0, WU, NT, ST, 1>'s K loop at NT n-tiles} (the
    shortest backward-branch range holding 16 NT HMMAs: 16 A fragments a step, NT n-tiles)."""
    from test_int4_moe_cuda import _build_sm90, _mma_loops
    from test_int4_moe_cuda_v10 import HOT_SIG  # int4_moe_hot's kernel arguments

    from workbench.kernels.int4_moe import cuda_v1, cuda_v10

    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "hot.cu"
        src.write_text(f'#include "{cuda_v1._SRC}"\n#include "{cuda_v10._SRC}"\n' + "".join(
            f"template __global__ void int4_moe_hot<0, {wu}, {nt}, {st}, 1>({HOT_SIG});\n"
            for nt in nts))
        _, sass = _build_sm90(src)
    out = {}
    for fn in sass.split("Function : ")[1:]:
        nt = int(fn.split("ELi")[2])  # _Z12int4_moe_hotILi0ELi{WU}ELi{NT}ELi{ST}ELi1EE...
        for loop in sorted(_mma_loops(fn), key=len):
            ops = collections.Counter(i.split()[1 if i.startswith("@") else 0].split(".")[0]
                                      for i in loop)
            if ops["HMMA"] == 16 * nt:
                out[nt] = ops
                break
    return out


DEQUANT = ("LOP3", "HADD2", "HMUL2", "SHF", "PRMT")  # IMAD (shifts and addresses) apart


def main(argv=None) -> int:
    import torch

    from workbench.ops.cases import _Rand

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", default="128,512")
    p.add_argument("--skew", type=float, default=1.2)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--clock-ghz", type=float, default=1.755)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--copy-tbs", type=float, default=2.97, help="copy bandwidth, TB/s")
    p.add_argument("--hot-after", type=int, default=8, help="WT: slots past which hot")
    a = p.parse_args(argv)
    E, K, D, I = 384, 8, 7168, 2048
    w_expert = 2 * I * D  # an expert's gate + up weights
    mixes = loop_mixes()
    per_weight = {}
    for nt, ops in sorted(mixes.items()):
        total, deq = sum(ops.values()), sum(ops[k] for k in DEQUANT)
        per_weight[nt] = total / WEIGHTS_AN_ITERATION
        print(f"NT {nt} ({8 * nt}-slot passes): {total} SASS a step of {WEIGHTS_AN_ITERATION} "
              f"weights, {deq} of them dequant ({', '.join(f'{k} {ops[k]}' for k in DEQUANT)}), "
              f"HMMA {ops['HMMA']}, IMAD {ops['IMAD']}, LDS {ops['LDS']}: {per_weight[nt]:.4f} a "
              f"weight a pass")
    issue_rate = 4 * a.sms * a.clock_ghz * 1e9  # warp instructions a second, the whole GPU
    for T in map(int, a.T.split(",")):
        for seed in map(int, a.seeds.split(",")):
            ids = _Rand(seed, "cpu").zipf(E, K, T, a.skew)
            c = torch.bincount(ids.flatten(), minlength=E)
            hot = c[c > a.hot_after]
            dram = len(hot) * w_expert * 0.5 * (1 + 1 / 16) / (a.copy_tbs * 1e12) * 1e6
            row = [f"T {T} seed {seed}: {len(hot)} hot experts of {int((c > 0).sum())} active "
                   f"(most slots {int(c.max())}), their bytes at copy {dram:.0f} µs; issue floor"]
            for nt, ipw in sorted(per_weight.items()):
                passes = int(((hot + 8 * nt - 1) // (8 * nt)).sum())
                row.append(f"NT {nt}: {passes} passes {passes * w_expert * ipw / issue_rate * 1e6:.0f} µs")
            print(row[0] + " " + "; ".join(row[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
