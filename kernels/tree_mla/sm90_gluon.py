"""Compile tree_mla's Gluon attention kernel (gluon_v9) for sm_90 on a machine without a GPU and
report what sm90.py reports for the Triton versions: registers, spills, wgmma shapes, shared
memory, TMA copies, and the TMA boxes the driver will encode.

    python -m workbench.kernels.tree_mla.sm90_gluon [--version 9|10|11|12|13|14|19] [--heads 64]
        [--rows 9]

sm90.py runs a launcher under the interpreter with its kernels swapped for recorders; Gluon
kernels have no interpreter and gluon_v9's launcher wants a GPU, so the signature is built
here from the launcher's constants (tensor descriptors as `tensordesc<bf16[block],layout>`).
"""

from __future__ import annotations

import argparse
import os
import re

import torch


def compile_attn(heads: int = 64, rows: int = 9, ctx: int = 4096, C: int = 512, R: int = 64,
                 dtype=torch.bfloat16, p_smem: bool = False, version: int | None = None,
                 policy=None, rcp: bool = False) -> dict:
    """sm_90 build of gluon_v9._attn_kernel (p_smem=True or version 10: gluon_v10's; version
    11: gluon_v11's seesaw kernel; 12: the same with 64-column K chunks; 13: with a partition
    barrier before each publishing rendezvous; 14: and each partition's own geometry) with
    the constexprs its launcher passes for q [1, rows, heads, C + R] and a [1, ctx, C + R]
    cache; ints not specialised (a launch
    with ints equal to 1 would fold them: close enough for registers); policy: the split
    policy's constexprs (triton_v4.V4 by default; gluon_v18: triton_v7.policy_for(heads));
    rcp: gluon_v19's reciprocal epilogue (version 19: version 13 with it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from workbench.kernels._sm90 import ptxas_stats
    from workbench.kernels.tree_mla import _common, gluon_v9, gluon_v11
    from workbench.kernels.tree_mla.triton_v4 import V4, parts_grid

    el = "bf16" if dtype == torch.bfloat16 else "fp16"
    p_smem = p_smem or version == 10

    def desc(block):
        return f"tensordesc<{el}[{block[0]},{block[1]}],{gluon_v9._smem(block, dtype)!r}>"

    pol = policy or V4
    policy = dict(SHORT_UPTO=pol.short_upto, SHORT_LEN=pol.short_len, LONG_MIN=pol.long_min,
                  MAX_SPLITS=pol.max_splits, BLOCK_N=gluon_v9.BLOCK_N,
                  USE_PDL=parts_grid(ctx, policy=pol) > 1)
    ptrs = dict(plen_ptr="*i64", anc_ptr="*i64", o_ptr=f"*{el}", lse_ptr="*fp32",
                opart_ptr="*fp32", lpart_ptr="*fp32", qk_scale="fp32")
    rcp = rcp or version == 19
    if version in (11, 12, 13, 14, 19):  # gluon_v11's kernel; 12: K halves in 64-column chunks
        fn, warps, rp = gluon_v11._attn_kernel, 4, gluon_v11.RP
        nch = (C // 2) // min(64, C // 2) if version == 12 else 1
        descs = dict(qh_desc=desc([64, C // 2]), qr_desc=desc([64, rp]),
                     kh_desc=desc([64, C // 2 // nch]), kr_desc=desc([64, rp]))
        const = dict(C=C, PW=min(64, C // 2), NCH=nch, PUB=version >= 13, OWN=version == 14,
                     **policy)
    else:
        fn, warps = gluon_v9._attn_kernel, 8
        rp = max(16, _common.next_pow2(R))  # gluon_v9._launch's rope box
        descs = dict(qc_desc=desc([64, C]), qr_desc=desc([64, rp]), kc_desc=desc([64, C]),
                     kr_desc=desc([64, rp]), kv_ptr=f"*{el}")
        const = dict(C=C, R=R, RP=rp, P_SMEM=p_smem, **policy)
    if rcp:  # gluon_v19's epilogue
        const["RCP"] = True
    for prm in fn.params:  # constexprs the launch leaves at their defaults (gluon_v11's RCP)
        if prm.is_constexpr and prm.has_default and prm.name not in const:
            const[prm.name] = prm.default
    sig = {name: "i32" for name in fn.arg_names}
    sig.update(descs, **ptrs)
    for name in const:
        sig[name] = "constexpr"
    ck = triton.compile(GluonASTSource(fn, signature=sig, constexprs=const),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = ck.asm["ptx"]
    regs, spill = ptxas_stats(ptx)
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)
    return {"regs": regs, "spill": spill, "smem": ck.metadata.shared,
            "wgmma": {s: shapes.count(s) for s in sorted(set(shapes))},
            "tma": ptx.count("cp.async.bulk.tensor"), "gdc": ptx.count("griddepcontrol"),
            "boxes": [m["block_size"] for m in (ck.metadata.tensordesc_meta or [])],
            "ptx": ptx, "cubin": ck.asm.get("cubin")}


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: Gluon kernels compile only")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--rows", type=int, default=9)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--version", type=int, choices=(9, 10, 11, 12, 13, 14, 19), default=9)
    a = p.parse_args(argv)
    r = compile_attn(a.heads, a.rows, a.ctx, version=a.version)
    print(f"gluon_v{a.version} _attn_kernel: {r['regs']} regs, {r['spill']} B spill, smem {r['smem']} B, "
          f"wgmma (PTX sites) {r['wgmma']}, tma {r['tma']}, gdc {r['gdc']}, boxes {r['boxes']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
