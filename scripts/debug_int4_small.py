"""Which int4_moe calls of the `small` loop's prefill does a kernel get wrong, and why?

    PYTHONPATH=. python3 scripts/debug_int4_small.py [--versions triton_v8,triton_v11,triton_v12]

Session 11 (H200): tests/test_int4_moe_kernel.py::test_decode_token_exact_small_gpu diverged at
request 1's first token (reference margin 2.43) with BEST = triton_v11, while the op's GPU tests
at REAL shapes pass. This runs that test's prefill (prompts of 5 and 3 tokens: T = 10 rows,
2 of them padding) on the reference loop, records every int4_moe call's inputs, and compares
each version against the reference on them: rows outside the checker's band, with the ids'
strides as passed (the reference router returns a [T, 8] view of a [T, 384] sort) and made
contiguous. Prints one line per (layer, version, ids layout).
"""

from __future__ import annotations

import argparse

import workbench
from workbench import ops
from workbench.generate import generate
from workbench.kernels.int4_moe import register
from workbench.ops import registry
from workbench.reference.int4_moe import int4_moe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="triton_v8,triton_v9,triton_v10,triton_v11,triton_v12")
    p.add_argument("--preset", default="small")
    p.add_argument("--device", default="cuda")
    p.add_argument("--loops", action="store_true",
                   help="also the test's whole loops (8 new tokens): the reference twice, each "
                        "version twice; prints the tokens and the first-row logits' gaps")
    a = p.parse_args()
    register()
    target = workbench.build_model(a.preset, seed=0, device=a.device)
    prompts = [[5, 6, 7, 8, 9], [20, 21, 22]]
    if a.loops:
        runs = [("reference", None)] * 2 + [(v, {"int4_moe": v}) for v in
                                            a.versions.split(",") for _ in range(2)]
        for name, kernels in runs:
            res = generate(target, prompts=prompts, max_new_tokens=8, kernels=kernels)
            print(f"loop {name:<11} {res.tokens}", flush=True)
    calls = []

    def wrap(name, fn):
        if name != "int4_moe":
            return fn

        def rec(x, ids, w, ex, **kw):
            calls.append((x.clone(), ids.clone() if ids.is_contiguous() else ids, w.clone(), ex))
            return fn(x, ids, w, ex, **kw)
        return rec

    with registry.wrapping(wrap):
        generate(target, prompts=prompts, max_new_tokens=1)
    for layer, (x, ids, w, ex) in enumerate(calls):
        ref = int4_moe(x, ids, w, ex).float()
        band = 2e-2 * ref.abs() + 2e-2 * ref.pow(2).mean().sqrt()
        print(f"call {layer}: x {tuple(x.shape)} |x| max {x.float().abs().max():.3g}, ids "
              f"{ids.dtype} strides {ids.stride()}, ref |y| max {ref.abs().max():.3g}", flush=True)
        for v in a.versions.split(","):
            fn = ops.op_spec("int4_moe").variant(v).load()
            for label, i in (("as passed", ids), ("contiguous", ids.contiguous())):
                out = fn(x, i, w, ex).float()
                bad = ((out - ref).abs() > band).any(-1) | ~out.isfinite().all(-1)
                print(f"    {v:<11} ids {label:<10} bad rows {bad.nonzero().flatten().tolist()}"
                      f" max err {(out - ref).abs().max():.3g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
