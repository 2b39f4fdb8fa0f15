"""In-order issue model of a pop loop, from the sm_90a SASS and its control bits (no GPU).

    python -m workbench.kernels.tree_build.sass_model [--versions 8,9] [--budget 64] [--depth 7]

One warp per request issues in program order, so a pop costs what its instruction stream
costs: each SASS instruction carries control bits (ptxas's schedule) in the upper word of its
128-bit encoding: a stall count (cycles before the next instruction may issue: fixed-latency
results, the 16-lane ALU pipe's 2 cycles per warp instruction), a write / read scoreboard it
sets (variable-latency results: REDUX, SHFL, LDG, F2F.F64, LDC, R2UR...) and the scoreboards it
waits on. The model replays the common path of each pop loop (a backward branch whose body holds
a REDUX; forward branches over a REDUX.MIN region, the tie branch, taken; the others fall
through) for a few iterations:

    issue[k] = max(issue[k-1] + stall[k-1] (+ TAKEN on a taken branch), ready of every
                   scoreboard k waits on);  a write scoreboard is ready at issue + latency(op),
                   a read scoreboard at issue + RD.

Variable latencies are the model's inputs (H100/H200 microbenchmark ballparks; REDUX is not
published: sweep it). The stall counts are ptxas's own, so the model sees what an issue model at
one instruction per cycle does not: 2-cycle ALU issue, fixed DADD / IMAD / ISETP->BRA latencies.
The compile is specialized as a GPU launch of contiguous tensors is (unit strides as
constexprs, 16-divisible pointers), see `compile_cubin`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import tempfile

import torch

# variable latencies in SM cycles (prefix of the opcode -> cycles); RD: a read scoreboard
LATENCY = dict(REDUX=64, SHFL=30, LDG=40, F2F=12, LDC=14, S2R=20, S2UR=20, R2UR=12, MUFU=16,
               LDS=30, RD=4, default=20)
_TAKEN = 0  # extra cycles of a taken branch (unknown; the calibration against the GPU absorbs it)


def _nv(tool: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def disassemble(cubin: bytes) -> tuple[list[tuple[int, str, dict]], dict[str, int]]:
    """[(address, instruction text, control bits)], {label: address} of a cubin's kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        hexed = subprocess.run([_nv("nvdisasm"), "-hex", "-c", f.name], capture_output=True,
                               text=True, check=True).stdout
        plain = subprocess.run([_nv("nvdisasm"), "-c", f.name], capture_output=True,
                               text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    lines = hexed.splitlines()
    ins = []
    for k, line in enumerate(lines):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* 0x[0-9a-f]{16} \*/", line)
        if m:
            hi = int(re.search(r"/\* (0x[0-9a-f]{16}) \*/", lines[k + 1]).group(1), 16)
            ins.append((int(m.group(1), 16), m.group(2).strip(), dict(
                stall=(hi >> 41) & 0xF, wbar=(hi >> 46) & 7, rbar=(hi >> 49) & 7,
                wait=(hi >> 52) & 0x3F)))
    labels, pending = {}, []
    for line in plain.splitlines():
        m = re.match(r"(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if m:
            labels.update((p, int(m.group(1), 16)) for p in pending)
            pending = []
    return ins, labels


def pop_loops(ins, labels) -> list[tuple[int, int, list]]:
    """(head, end, common path [(address, text, ctrl, taken)]) of every loop holding a REDUX
    and at most 3 SHFL per 40 instructions of body (the pop loops, not the epilogue's)."""
    idx = {a: k for k, (a, _, _) in enumerate(ins)}
    out = []
    for k, (a, t, _) in enumerate(ins):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", t)
        if not (m and labels[m.group(1)] < a):
            continue
        head = labels[m.group(1)]
        body = " ".join(x[1] for x in ins[idx[head]:k])
        if "REDUX" not in body:
            continue
        seq, j = [], idx[head]
        while j != k:
            aa, tt, cc = ins[j]
            mm = re.search(r"BRA `\((\.L_x_\d+)\)", tt)
            if mm and tt.startswith("@") and labels[mm.group(1)] > aa:
                tgt = idx[labels[mm.group(1)]]
                if "REDUX.MIN" in " ".join(x[1] for x in ins[j + 1:tgt]):
                    seq.append((aa, tt, cc, True))
                    j = tgt
                    continue
            seq.append((aa, tt, cc, False))
            j += 1
        seq.append((*ins[k], True))
        if sum("SHFL.BFLY" in x[1] for x in seq) == 0:  # (the epilogue's gathers use BFLY)
            out.append((head, a, seq))
    return out


def _latency(text: str, lat: dict) -> int:
    op = text.split()[1] if text.startswith("@") else text.split()[0]
    return next((v for p, v in lat.items() if op.startswith(p)), lat["default"])


def cycles_per_pop(seq, lat: dict | None = None, iters: int = 6, taken: int = _TAKEN,
                   trace: bool = False) -> float:
    """Steady-state cycles per iteration of the common path `seq` (see the module doc)."""
    lat = dict(LATENCY, **(lat or {}))
    ready, t, stall, starts, rows = [0.0] * 6, 0.0, 0, [], []
    for it in range(iters):
        starts.append(t + stall)
        for a, text, c, tk in seq:
            issue = max([t + stall] + [ready[b] for b in range(6) if c["wait"] >> b & 1])
            if trace and it == iters - 2:
                wait = f"+{issue - t - stall:.0f}" if issue > t + stall + 0.5 else ""
                rows.append(f"{a:05x} {issue - starts[-1]:6.0f} {wait:>4}  {text}")
            t = issue
            if c["wbar"] != 7:
                ready[c["wbar"]] = max(ready[c["wbar"]], t + _latency(text, lat))
            if c["rbar"] != 7:
                ready[c["rbar"]] = max(ready[c["rbar"]], t + lat["RD"])
            stall = max(c["stall"], 1) + (taken if tk else 0)
    if trace:
        print("\n".join(rows))
    return (starts[-1] - starts[-3]) / 2


def compile_cubin(version: int, depth: int = 7, budget: int = 64, **launcher_kwargs) -> bytes:
    """sm_90a cubin of triton_v{version}'s kernel for a [2, depth, 200] top-`budget` table, with
    the specialization a CUDA launch of contiguous tensors gets (unit strides as constexprs,
    16-divisible pointers)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from workbench.kernels.tree_build.sm90 import capture
    from workbench.reference.tree_build import topk_logprobs

    module = importlib.import_module(f"workbench.kernels.tree_build.triton_v{version}")
    lp, ids = topk_logprobs(torch.randn(2, depth, 200), budget)
    zeros = torch.zeros(2, dtype=torch.int64)
    sig, const, warps = capture(module, lp, ids, budget, zeros, zeros, **launcher_kwargs)
    for key in ("TUPLE_REDUCE", "PREFETCH"):  # the CUDA defaults
        if key in const:
            const[key] = True
    for name in ("s_lk", "s_ik", "s_root", "s_prefix"):  # == 1: specialized by the JIT
        sig[name], const[name] = "constexpr", 1
    attrs = {(k,): [["tt.divisibility", 16]] for k, n in enumerate(sig) if sig[n].startswith("*")}
    ck = triton.compile(ASTSource(fn=module._tree_build_kernel, signature=sig, constexprs=const,
                                  attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return ck.asm["cubin"]


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: sm_90 compilation needs JIT kernels")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", default="8,9")
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--depth", type=int, default=7)
    p.add_argument("--redux", default="16,32,64,100", help="REDUX latencies to model")
    p.add_argument("--trace", action="store_true", help="print each loop's issue cycles")
    args = p.parse_args(argv)
    rs = [int(r) for r in args.redux.split(",")]
    print(f"L {args.depth} x budget {args.budget}; cycles per pop at REDUX latency "
          f"{'/'.join(map(str, rs))} (SHFL {LATENCY['SHFL']}, LDG {LATENCY['LDG']}, "
          f"F2F {LATENCY['F2F']})")
    for v in args.versions.split(","):
        ins, labels = disassemble(compile_cubin(int(v), args.depth, args.budget))
        for head, end, seq in pop_loops(ins, labels):
            stalls = sum(max(c["stall"], 1) for _, _, c, _ in seq)
            count = {op: sum(op in t for _, t, _, _ in seq) for op in ("REDUX", "SHFL", "LDG")}
            cyc = [cycles_per_pop(seq, dict(REDUX=r)) for r in rs]
            print(f"v{v} loop {head:05x}-{end:05x}: {len(seq)} instructions, stall sum {stalls}, "
                  f"{count['REDUX']} REDUX, {count['SHFL']} SHFL, {count['LDG']} LDG: "
                  f"{' / '.join(f'{c:.0f}' for c in cyc)}")
            if args.trace:
                cycles_per_pop(seq, trace=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
