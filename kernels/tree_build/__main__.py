"""Quick check and timing of the tree_build kernels: `python -m workbench.kernels.tree_build`.

Default shape: bs 64, L 7, budget 64 on a GPU; bs 4, budget 16 on the CPU (Triton interpreter,
set up here when no GPU is present; its timings say nothing about the GPU). Every timed case is
first compared field by field, bitwise, with the reference. On a GPU, `--sweep` runs
bs {1, 8, 64, 256} x budget {8, 16, 32, 64, 128}; times are per build, kernel only (profiler),
per CUDA-graph replay of one launch, and the CPU heapq reference with its copies and sync.
The registry benchmark (`python -m workbench.bench tree_build`) is the one that writes traces/.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from workbench.kernels.tree_build import (  # noqa: E402
    triton_v1,
    triton_v2,
    triton_v3,
    triton_v4,
    triton_v5,
    triton_v6,
    triton_v7,
    triton_v8,
    triton_v9,
)
from workbench.kernels.tree_build.triton_v1 import walk_commit_triton  # noqa: E402
from workbench.ops import op_spec  # noqa: E402
from workbench.tree import DDTree  # noqa: E402

# the references this quick check compares against, through the registry (kernels/ never
# imports reference code)
build_ddtree = op_spec("tree_build").variant("reference").load()
walk_tree = op_spec("tree_walk").variant("reference").load()

BUILDERS = {
    "v1": triton_v1.build_ddtree_triton,
    "v2": triton_v2.build_ddtree_triton,
    "v2-noprefetch": lambda *a, **k: triton_v2.build_ddtree_triton(*a, prefetch=False, **k),
    "v3": triton_v3.build_ddtree_triton,
    "v3-builtin": lambda *a, **k: triton_v3.build_ddtree_triton(*a, tuple_reduce=False, **k),
    "v4": triton_v4.build_ddtree_triton,
    "v5": triton_v5.build_ddtree_triton,
    "v5-vectors": lambda *a, **k: triton_v5.build_ddtree_triton(*a, row_stores=False, **k),
    "v6": triton_v6.build_ddtree_triton,
    "v7": triton_v7.build_ddtree_triton,
    "v8": triton_v8.build_ddtree_triton,
    "v9": triton_v9.build_ddtree_triton,
}
FIELDS = ("tokens", "depths", "parents", "scores", "anc_bits", "positions", "node_count",
          "first_child", "next_sibling")


def tree_mismatches(ref: DDTree, out: DDTree) -> list[str]:
    """Fields of `out` that differ from `ref` in dtype, shape or any bit (scores by their bits)."""
    bad = []
    for name in FIELDS:
        r, o = getattr(ref, name).cpu(), getattr(out, name).cpu()
        if r.dtype != o.dtype or r.shape != o.shape:
            bad.append(f"{name}: {o.dtype}{tuple(o.shape)} != {r.dtype}{tuple(r.shape)}")
        elif not torch.equal(r.view(torch.int64) if r.is_floating_point() else r,
                             o.view(torch.int64) if o.is_floating_point() else o):
            bad.append(name)
    return bad


def make_inputs(batch: int, depth: int, budget: int, vocab: int, seed: int, device):
    """Per-depth top-K of random logits (K = min(budget, V)), roots and prefix lengths."""
    from workbench.reference.tree_build import topk_logprobs

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=g) * 3
    lp, ids = topk_logprobs(logits, min(budget, vocab))
    roots = torch.randint(0, vocab, (batch,), generator=g)
    prefix = torch.randint(0, 4096, (batch,), generator=g)
    return [t.to(device) for t in (lp, ids, roots, prefix)]


def kernel_us(fn, reps: int = 50) -> float:
    """Mean device time of the kernels `fn` launches (the benchmark harness's profiler count)."""
    from workbench.bench import kernel_time_us

    fn()
    return kernel_time_us([fn], reps)


def graph_us(fn, reps: int = 200) -> float:
    """Per-replay time of a CUDA graph holding one call of `fn` (launch included)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (JIT compile)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def heapq_us(lp, ids, budget, roots, prefix, reps: int = 3) -> float:
    """The CPU reference as a decode loop would call it on GPU tensors: copies + sync included."""
    build_ddtree(lp, ids, budget, roots, prefix)
    t0 = time.perf_counter()
    for _ in range(reps):
        tree = build_ddtree(lp, ids, budget, roots, prefix)
        if lp.is_cuda:
            torch.cuda.synchronize()
    del tree
    return (time.perf_counter() - t0) * 1e6 / reps


def run_case(version, batch, depth, budget, vocab, seed, device, peer: bool) -> dict:
    build_ddtree_triton = BUILDERS[version]
    lp, ids, roots, prefix = make_inputs(batch, depth, budget, vocab, seed, device)
    out = build_ddtree_triton(lp, ids, budget, roots, prefix)
    ref = build_ddtree(lp.cpu(), ids.cpu(), budget, roots.cpu(), prefix.cpu())
    bad = tree_mismatches(ref, out)
    # the walk on a target that follows each node's first child (long accepted paths)
    target = torch.gather(out.tokens, 1, out.first_child.clamp_min(0))
    walk = walk_commit_triton(out, target)
    acc, lens, bonus = walk_tree(ref, target.cpu())
    if not (torch.equal(acc, walk.accepted_indices.cpu()) and torch.equal(lens, walk.accept_lens.cpu())
            and torch.equal(bonus, walk.bonus.cpu())):
        bad.append("walk")
    row = dict(version=version, bs=batch, L=depth, budget=budget, ok=not bad,
               mismatches=",".join(bad))

    def build():
        return build_ddtree_triton(lp, ids, budget, roots, prefix)

    if device == "cuda":
        row["kernel_us"] = kernel_us(build)
        row["graph_us"] = graph_us(build)
        row["walk_kernel_us"] = kernel_us(lambda: walk_commit_triton(out, target))
    else:
        t0 = time.perf_counter()
        build()
        row["interpreter_ms"] = (time.perf_counter() - t0) * 1e3
    if peer:
        row["cpu_heapq_us"] = heapq_us(lp, ids, budget, roots, prefix)
    return row


def main(argv=None) -> int:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64 if gpu else 4)
    p.add_argument("--budget", type=int, default=64 if gpu else 16)
    p.add_argument("--depth", type=int, default=7, help="L, the draft depth")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="bs {1,8,64,256} x budget {8..128}")
    p.add_argument("--sweep-batches", default="1,8,64,256", help="the sweep's batch sizes")
    p.add_argument("--peer", action="store_true", help="also time the CPU heapq reference")
    p.add_argument("--versions", default="v2", help=f"comma-separated, of {sorted(BUILDERS)}")
    args = p.parse_args(argv)
    device = "cuda" if gpu else "cpu"
    batches = [int(b) for b in args.sweep_batches.split(",")]
    shapes = ([(b, n) for b in batches for n in (8, 16, 32, 64, 128)] if args.sweep
              else [(args.batch, args.budget)])
    where = torch.cuda.get_device_name() if gpu else "CPU (Triton interpreter)"
    print(f"tree_build {args.versions} on {where}")
    rows = [run_case(v, b, args.depth, n, args.vocab, args.seed, device, args.peer)
            for b, n in shapes for v in args.versions.split(",")]
    import pandas as pd

    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0 if table.ok.all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
