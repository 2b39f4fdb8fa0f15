"""Supporting ops of the model (rmsnorm, linear, swiglu_mlp, lm_head, moe_route, the
absorbed-MLA projections mla_q_absorb and mla_v_up, and rope), engine-style.

The references (reference/layers.py, reference/moe_route.py) accumulate in float64 so that a
row's result never depends on its batch: the loop is token-exact by construction, but at
Kimi K2.6 size those ops dominate a step (the MLA projections alone are ~100 ms per step in
float64 on the H200: traces/gpu/session2_final/README.md). `torch_bf16` is what a serving
engine runs: bf16 cuBLAS GEMMs with fp32 accumulation, fp32 norms. It is NOT batch-invariant
(cuBLAS picks kernels and split-K by the row count), so it is kept out of the "optimized"
preset, whose loop is token-exact on the GPU, and sits in the "engine" preset (optimized +
these), which the full-size emulation uses to time an engine-like step.

`triton_v1` (rmsnorm only) is that fp32 RMSNorm as one Triton kernel, one program per row
(the drafter's row kernel, kernels/drafter/_fused.py) instead of torch's ~6 elementwise
kernels; rounded once to x.dtype, batch-invariant per row, not bitwise the float64 reference.
The "engine" preset takes it for rmsnorm; `torch_bf16` stays registered as its baseline.
`rmsnorm_triton_v2` is the same kernel with 4 warps a row below D 2048 instead of 1 (session 18:
q_a's layernorm at D 1536 1.5-1.7 vs 2.4-2.5 µs of kernel time in the REAL bench, the EP8
step's rmsnorm launches 88-123 vs 136-167 µs; not v1's bits there, another reduction tree); the
engine preset takes it from session 18.

`rope_triton_v1` (variant `triton_v1` of op rope) is the target MLA's RoPE (q_pe, k_pe) as one
Triton kernel instead of Rope.apply's ~10 torch kernels: cos|sin rows gathered by position
from the table Rope.reserve made, fp32 math (FMA-contracted on the GPU: not bitwise), rounded
once. It needs the reserved table (no on-the-fly fallback); the "engine" preset takes it, the
reference (bitwise Rope.apply) is its baseline. `rope_triton_v2` is the same kernel at 4 rows a
program instead of 32 (v1's bits): on the H200 a program's time grows with its rows while more
programs cost nothing measurable (session 18, `scripts/probe_rope_programs.py`: 1.2-1.4 µs
from 8 to 544 rows of 8 heads, v1 1.8-5.4). In the EP8 step (call 7) its 61 launches take
103-119 µs against v1's 154-390, the step's kernels 7.36 / 15.72 / 10.54 / 30.30 ms against
7.40 / 15.98 / 10.77 / 30.60 (C 1 AR, C 1 DDTree-16, C 8 AR, C 8 DDTree-16): the engine preset
takes v2 from session 18.

`moe_route_triton_v1` (variant `triton_v1` of op moe_route) keeps the router GEMM in cuBLAS
(bf16 in, fp32 out) and does the rest in one Triton kernel instead of ~8 torch kernels: one
program per token, sigmoid + bias, K rounds of "max, lowest index among equals" (the
reference's tie rule, -0.0 == +0.0), the unbiased scores renormalised. Not bitwise (Triton's
fast-exp sigmoid, sum order): the "engine" preset takes it, `torch_bf16` stays its baseline.
On the H200 its ids equal torch_bf16's at REAL widths; both differ from the float64 reference
only at near-ties of the reference's choices (T 544: one row, margin 4.8e-7; session 7,
scripts/diag_moe_route_tie.py); in the emulated EP8 rank it saves ~1.6 ms of kernels a step at
C 1 (traces/gpu/session7). `moe_route_triton_v2` (session 19) is the router in ONE launch up to
32 rows (decode and the C 1 verify), where triton_v1 is three (cuBLAS's split-K GEMM, its
reduce, the top-k: 10.5 µs a layer at C 1 AR for a 5.5 MB weight): a split-K GEMM over
16-expert tiles whose last K slice sums the tile's partials in slice order (linear_triton_v2's
ticket scheme), and whose last tile to finish picks every row's top-k by triton_v1's rule.
Not cuBLAS's logits bits (fixed K order): engine-only like v1. Measured (session 19, H200,
traces/gpu/session19): **slower**, a measured negative kept out of the engine preset. Kernel
µs at T 1 / 9 / 17 (REAL bench, 3 rounds): 13.4 / 27.3 / 36.5 against v1's 9.9 / 10.3 / 10.3
(EP8 C 1 DDTree-16 step +1.6 ms). `scripts/probe_moe_route_phases.py` (call 3) splits it: the
split-K GEMM with its slice sums alone is 5.3-5.9 µs (cuBLAS's GEMM 5.5-5.9 before its reduce),
and the top-k in one program costs ~5-6 µs a step of 4-8 rows (v1's one warp a row takes ~3.5
µs for any T, its rows in parallel programs); a hypothesis for why (not profiled): K rounds of
two reductions over [rows, 512] tiles that Triton spreads over the warps, a barrier each. What
it would take: the GEMM phase
kept, and the selection in parallel programs again (a second launch) or one warp a row.
`moe_route_triton_v3` (session 19) is that: v2's GEMM phases at 32-expert tiles (5.3 / 5.3 / 6.7
µs at T 1 / 9 / 17 in the probe), then v1's selection kernel on their logits; two launches
instead of v1's three. Measured (session 20 call 1, traces/gpu/session20): **no faster**, a
measured negative kept out of the engine preset: REAL bench kernel µs at T 1 / 9 / 17 9.8 / 9.9
/ 10.9 against v1's 10.0 / 10.4 / 10.3; the EP8 step 6.07 / 15.38 ms against 5.99 / 15.33 (C 1
AR / DDTree-16, same call).
The op's `local_experts=(first, n)` (session 22, reference/moe_route.py rule 5) adds a third
output, the ids as an EP rank's int4_moe takes them (id - first on the rank's experts, -1
elsewhere): every version's selection stores it beside the ids, so the EP-local step no longer
gathers them in a launch of its own (session 21's `lut[ids]` gather: ~2.2 / 2.9 µs a layer at C 1
AR / DDTree-16 in session 21's graph replays).

`swiglu_mlp_triton_v1` (variant `triton_v1` of op swiglu_mlp) keeps the three GEMMs in cuBLAS
and makes the five elementwise kernels between them (two fp32 casts, SiLU, product, cast back)
one Triton kernel; not bitwise torch_bf16 (Triton's exp): the "engine" preset takes it.

`mla_kv_write_triton_v1` (variant `triton_v1` of op mla_kv_write) writes a layer's latent cache
rows in one launch: RMSNorm of the latent and RoPE of k_pe (the fp32 math of triton_v1 and
rope_triton_v1) stored straight into slot prefix + row, instead of two ops and ~5 glue
kernels (aranges, add, cat, index_put); engine-only (fp32, not the float64 reference).

`linear_triton_v1` (variant `triton_v1` of op linear) is a skinny GEMM for decode row counts
(<= 64 rows): each program owns BN output columns over all of K, no split-K and no reduce
launch; more rows (compute-shaped) or non-bf16/fp16 inputs take torch_bf16's cuBLAS GEMM, a
documented dispatch. `swiglu_mlp` triton_v2 is triton_v1 on it. Measured on the H200 (session 8,
traces/gpu/session8/bench_linear.csv) it is NOT faster than cuBLAS at the decode widths (q_a |
kv_a at 9 rows: 15.6 vs 12.5 µs of kernel time; elsewhere within ~10 %), so neither is in the
engine preset. `linear_triton_v2` (session 9) splits K across programs in the same launch (the
last slice of a column tile to finish sums the partials in slice order): the small decode
projections are latency, and v1's programs walk up to 28 K steps each. Measured (session 10,
traces/gpu/session10: `bench linear` call 1, `scripts/sweep_linear.py` call 2): it fixes v1's
long-K cases (kv_a 7168->576 at 9 rows: 7.1 vs v1's 14.7 and cuBLAS's 8.3 µs of kernel time;
gate_up/8 at 9 rows, best tiles: 5.6 vs cuBLAS 6.1) but loses on the wide outputs (o 8192->7168
at 1-9 rows: 38-39 vs 32-33 µs; q_b 1536->12288: 18 vs 12). The sweep's best tiles per shape
beat cuBLAS at 1-9 rows (up to 2.1 µs: qkv_a at 1 row 8.1 vs 10.3) and lose at 17-33 rows,
the DDTree verify's row counts (qkv_a at 17: 10.8 vs 9.6): not in the engine preset. Its
default tiles at 33-64 rows asked for 256 KB of shared memory (BM = BN = 64, BK 256, 4
stages) and raised OutOfResources on the H200: v1 and v2 now fit their stages and K step to
sm_90's 227 KB (`linear_triton_v1.fit_smem`).

`linear_triton_v3` (session 19) is v2's kernel on the tiles session 10's sweep found best at 1-9
rows, as a rule of the shape (BN by N and K, SPLIT for one wave of programs, BK by the slice's
length), for up to 16 rows; more rows (the verify) run cuBLAS. Measured (session 19 call 5,
traces/gpu/session19): REAL bench kernel µs at 1 / 9 rows, v3 vs cuBLAS: q_a | kv_a 11.1 / 11.2
vs 12.2 / 12.4, q_b 4.8 / 4.7 vs 5.8 / 4.8, o 5.8 / 6.0 vs 6.0 / 5.9, the shared expert's gate |
up 6.2 vs 6.4 and down 3.7 vs 4.0 at 1 row; in the EP8 step with `swiglu_mlp_triton_v4` (v1's
SiLU launch with its GEMMs on linear v3) the kernels took 6.11 / 15.51 / 10.15 / 30.33 ms
against 6.24 / 15.55 / 10.42 / 30.36 (C 1 AR, C 1 DDTree-16, C 8 AR, C 8 DDTree-16): the engine
preset takes both from session 19.

`linear_triton_v4` (session 20) is v2's one-launch split-K with the operands swapped: 64 output
columns on the wgmma's M and the rows (16 / 32 / 64) on its N, where v2's 16- and 32-row tiles
are mma.sync (sm_90 build: wgmma with cp.async pipelining at 48-108 registers, no spills).
Measured (session 20 call 2, `scripts/sweep_linear.py --kernel triton_v4 --cold-mb 400`: each
call streams its weight from HBM, as in the step; µs at 1 / 9 / 17 rows): it wins the wide
projections, q_a | kv_a 10.9 / 10.9 / 11.5 (v3 11.1 / 11.3, cuBLAS 12.7 / 13.1 / 13.1), o 6.0 /
6.0 / 6.2 (v3 6.4 / 6.5, cuBLAS 6.3-6.4), down 3.2 / 3.3 / 3.4 (v3 3.4 / 3.5, cuBLAS 3.8), and
loses the narrow ones, whose 24 or 8 column tiles must split K: q_b 5.3 / 5.4 / 6.1 (v3 5.2 / 5.1,
cuBLAS 5.3 at 17), gate | up 6.6 / 6.5 / 7.8-8.4 (v3 6.2 / 6.3, cuBLAS 7.2 at 17). In the EP8
step with swiglu_mlp triton_v5 on it (call 2) the kernels took 5.95 / 15.47 / 10.15 / 30.66 ms
(C 1 AR, C 1 DDTree-16, C 8 AR, C 8 DDTree-16): at DDTree-16 the linear op's launches took 1480
vs 1511 µs a step and the shared expert's 847 vs 796 (its narrow gate | up), no net gain.
`linear_triton_v5` takes each shape's winner: v4's kernel for outputs >= 2048 wide, v3's rule
(v2's kernel to 16 rows, cuBLAS above) for the narrow ones; `swiglu_mlp` triton_v6 runs on it.
The engine preset takes both from session 20: in CUDA-graph replays of the EP8 step (call 3,
`emulate --graph`) v5's kernels took 1325 µs a C 1 DDTree-16 step where cuBLAS's took ~1450,
and 1920 against 1964 at C 1 AR; the step totals moved within the int4 GEMMs' run-to-run
spread (5.92 / 15.46 / 10.07 / 30.24 against 5.96 / 15.43 / 10.17 / 30.35 ms, with tree_mla
gluon_v23).

`mla_proj_triton_v1` (variant `triton_v1` of ops mla_q_absorb and mla_v_up) is the absorbed-MLA
per-head products as one Triton kernel instead of torch.bmm: one program per (head, output
columns, row tile) walks the whole contraction (v_up reads W_UV transposed in place), fp32
accumulate in a fixed order, one rounding; non-bf16/fp16 inputs run torch_bf16's bmm. Measured
on the H200 (session 18 call 2, traces/gpu/session18/README.md) it is **not faster**: REAL bench
kernel time at 64 heads, rows 1 / 9 / 65: q_absorb 4.3 / 4.4 / 8.4 µs vs cuBLAS 4.4 / 4.5 /
5.7, v_up 5.5 / 5.6 / 7.7 vs 4.3 / 4.5 / 5.5; in the EP8 emulation its 122 launches a step take
what cuBLAS's took at C 1 AR (431 vs 450 µs) and more elsewhere (C 1 DDTree-16 +58 µs, C 8
AR +66, C 8 DDTree-16 +165). A ~1 MB per-head product costs ~3.5 µs a launch either way:
the launch's fixed cost, not the kernel. Not in the engine preset; kept as the measured
negative.
`mla_proj_triton_v2` (variant `triton_v2` of op mla_v_up) runs triton_v1's kernel only where a
call is at most 32 rows x heads (8 heads, 1-4 rows: an EP8 rank's decode), torch_bf16's GEMM
elsewhere: session 27's probe (`scripts/probe_mla_v_up.py`, 8 heads) had cuBLAS at 4.5-4.6 µs
for 1-4 rows against the kernel's 2.9-3.1, and faster from 8 rows (3.0 vs 3.2). In the EP8
step (call 8) its launches took what cuBLAS's took (267-269 vs 271 µs a C 1 AR step: 4.4 µs
each with the weight cold): a measured negative, not in the engine preset.

`add_rmsnorm_triton_v1` (variant `triton_v1` of op add_rmsnorm) is the residual add and the
next RMSNorm in one program per row (the add bitwise torch's, the norm triton_v1's fp32 math):
the model's two per-layer adds stop being kernels of their own.

`ep_plan_triton_v1` (variant `triton_v1` of op ep_plan) is one rank's expert-parallel
exchange plan (reference/ep_plan.py) as one Triton program of counting sorts instead of ~20
torch kernels and two host syncs a MoE layer; discrete outputs, bitwise the reference's. The
"engine" preset takes it (the emulated EP rank's plan). `ep_combine_triton_v1` is the plan's
other half, the owner's weighted slot sum of what came back, as one kernel instead of the
gather, casts, einsum and padding (fp32: engine-only).

Importing this package imports no Triton; `register()` adds the variants to the registry.
"""

from __future__ import annotations

_MOD = "workbench.kernels.dense.torch_bf16"
OPS = ("rmsnorm", "linear", "swiglu_mlp", "lm_head", "moe_route", "mla_q_absorb", "mla_v_up")
VARIANTS: dict[str, dict[str, str]] = {op: {"torch_bf16": f"{_MOD}:{op}"} for op in OPS}
VARIANTS["rmsnorm"]["triton_v1"] = "workbench.kernels.dense.triton_v1:rmsnorm"
VARIANTS["rmsnorm"]["triton_v2"] = "workbench.kernels.dense.rmsnorm_triton_v2:rmsnorm"
VARIANTS["swiglu_mlp"]["triton_v1"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp"
VARIANTS["swiglu_mlp"]["triton_v2"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp_v2"
VARIANTS["swiglu_mlp"]["triton_v3"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp_v3"
VARIANTS["swiglu_mlp"]["triton_v4"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp_v4"
VARIANTS["linear"]["triton_v1"] = "workbench.kernels.dense.linear_triton_v1:linear"
VARIANTS["linear"]["triton_v2"] = "workbench.kernels.dense.linear_triton_v2:linear"
VARIANTS["linear"]["triton_v3"] = "workbench.kernels.dense.linear_triton_v3:linear"
VARIANTS["linear"]["triton_v4"] = "workbench.kernels.dense.linear_triton_v4:linear"
VARIANTS["linear"]["triton_v5"] = "workbench.kernels.dense.linear_triton_v5:linear"
VARIANTS["swiglu_mlp"]["triton_v5"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp_v5"
VARIANTS["swiglu_mlp"]["triton_v6"] = "workbench.kernels.dense.swiglu_mlp_triton_v1:swiglu_mlp_v6"
VARIANTS["moe_route"].update({f"triton_v{v}": f"workbench.kernels.dense.moe_route_triton_v{v}:"
                              "moe_route" for v in (1, 2, 3)})
VARIANTS["rope"] = {f"triton_v{v}": f"workbench.kernels.dense.rope_triton_v{v}:rope"
                    for v in (1, 2)}
VARIANTS["mla_kv_write"] = {
    "triton_v1": "workbench.kernels.dense.mla_kv_write_triton_v1:mla_kv_write"}
VARIANTS["add_rmsnorm"] = {
    "triton_v1": "workbench.kernels.dense.add_rmsnorm_triton_v1:add_rmsnorm"}
VARIANTS["ep_plan"] = {"triton_v1": "workbench.kernels.dense.ep_plan_triton_v1:ep_plan"}
VARIANTS["mla_q_absorb"]["triton_v1"] = "workbench.kernels.dense.mla_proj_triton_v1:mla_q_absorb"
VARIANTS["mla_v_up"]["triton_v1"] = "workbench.kernels.dense.mla_proj_triton_v1:mla_v_up"
VARIANTS["mla_v_up"]["triton_v2"] = "workbench.kernels.dense.mla_proj_triton_v2:mla_v_up"
VARIANTS["ep_combine"] = {
    "triton_v1": "workbench.kernels.dense.ep_combine_triton_v1:ep_combine"}
DESCRIPTIONS: dict[tuple[str, str], tuple[str, tuple]] = {
    ("rmsnorm", "torch_bf16"): ("fp32 RMSNorm, one pass, rounded once (engine-style)", ()),
    ("rmsnorm", "triton_v1"): ("one Triton program per row: fp32 math, rounded once to x.dtype "
                               "(one kernel instead of ~6)", ("triton",)),
    ("rope", "triton_v1"): ("one Triton kernel: cos|sin rows gathered from the reserved table "
                            "by position, fp32 math (FMA-contracted), rounded once to x.dtype "
                            "(one kernel instead of ~10)", ("triton",)),
    ("rmsnorm", "triton_v2"): ("triton_v1's kernel with 4 warps a row below D 2048 instead of "
                               "1 (q_a's D 1536: 1.1 vs 1.7 µs); triton_v1 from D 2048",
                               ("triton",)),
    ("rope", "triton_v2"): ("triton_v1's kernel at 4 (position, head) rows a program instead "
                            "of 32: a program's time grows with its rows, more programs cost "
                            "nothing (v1's bits)", ("triton",)),
    ("mla_kv_write", "triton_v1"): ("one Triton program per (request, row): the latent's fp32 "
                                    "RMSNorm and k_pe's RoPE from the reserved table, written "
                                    "at slot prefix + row (1 kernel instead of ~7)",
                                    ("triton",)),
    ("add_rmsnorm", "triton_v1"): ("one Triton program per row: the residual add rounded once "
                                   "(bitwise torch's), then the fp32 RMSNorm of it (1 kernel "
                                   "instead of 2)", ("triton",)),
    ("ep_plan", "triton_v1"): ("one Triton program: counting sorts over the W destinations "
                               "(histogram, stable positions by cumsum, row-major compaction); "
                               "bitwise the reference, no host sync (1 kernel instead of ~20)",
                               ("triton",)),
    ("ep_combine", "triton_v1"): ("one Triton program per (owned row, column block): gathers "
                                  "its K x tp rows through order, fp32 slot-order sum, zero "
                                  "padding rows (1 kernel instead of ~6)", ("triton",)),
    ("mla_q_absorb", "triton_v1"): ("one Triton kernel: a program per (head, BN output "
                                     "columns, row tile) walks all of dn, fp32 accumulate, "
                                     "rounded once (no batched cuBLAS GEMM)", ("triton",)),
    ("mla_v_up", "triton_v1"): ("one Triton kernel: a program per (head, BN output columns, "
                                "row tile) walks all of C with W_UV read transposed in place, "
                                "fp32 accumulate, rounded once", ("triton",)),
    ("mla_v_up", "triton_v2"): ("triton_v1's kernel where rows x heads <= 32 (an EP8 rank's "
                                "decode: 1-4 rows of 8 heads), torch_bf16's batched cuBLAS "
                                "GEMM above; no faster in the EP8 step", ("triton",)),
    ("linear", "torch_bf16"): ("cuBLAS GEMM in the activation dtype, fp32 accumulate "
                               "(batch-variant)", ()),
    ("swiglu_mlp", "torch_bf16"): ("three cuBLAS GEMMs, SiLU*up rounded to bf16 between them "
                                   "(batch-variant)", ()),
    ("swiglu_mlp", "triton_v1"): ("gate and up GEMMs in cuBLAS, SiLU(gate)*up as one Triton "
                                  "kernel (fp32, one rounding), down GEMM in cuBLAS (4 kernels "
                                  "instead of 8)", ("triton",)),
    ("swiglu_mlp", "triton_v2"): ("triton_v1 with its GEMMs on linear triton_v1 (skinny, no "
                                  "split-K up to 64 rows)", ("triton",)),
    ("swiglu_mlp", "triton_v3"): ("triton_v1 with its GEMMs on linear triton_v2 (split-K in "
                                  "one launch up to 64 rows)", ("triton",)),
    ("swiglu_mlp", "triton_v4"): ("triton_v1 with its GEMMs on linear triton_v3 (the sweep's "
                                  "decode tiles up to 16 rows, cuBLAS above)", ("triton",)),
    ("linear", "triton_v1"): ("skinny Triton GEMM for <= 64 rows: BN output columns a program "
                              "over all of K, no split-K, one launch; more rows or non-bf16/"
                              "fp16 inputs run torch_bf16's cuBLAS GEMM", ("triton",)),
    ("linear", "triton_v2"): ("triton_v1 with split-K in one launch: the last K slice to finish "
                              "a column tile sums the fp32 partials in slice order (ticket "
                              "counter, reset in-kernel: graph-safe, deterministic)",
                              ("triton",)),
    ("linear", "triton_v3"): ("triton_v2's kernel on session 10's best decode tiles (BN, SPLIT, "
                              "BK by shape) up to 16 rows; torch_bf16's cuBLAS GEMM above (the "
                              "verify's rows)", ("triton",)),
    ("linear", "triton_v4"): ("triton_v2's split-K in one launch with the operands swapped: "
                              "64 output columns on the wgmma's M, the rows (16 / 32 / 64) on "
                              "its N, up to 64 rows; torch_bf16's cuBLAS GEMM above",
                              ("triton",)),
    ("swiglu_mlp", "triton_v5"): ("triton_v1 with its GEMMs on linear triton_v4 (swap-AB "
                                  "split-K up to 64 rows)", ("triton",)),
    ("linear", "triton_v5"): ("triton_v4's swap-AB kernel where N >= 2048 (q_a | kv_a, o, "
                              "down), triton_v3's dispatch for narrower outputs (q_b, gate | "
                              "up): the session-20 cold sweep's winners by shape",
                              ("triton",)),
    ("swiglu_mlp", "triton_v6"): ("triton_v1 with its GEMMs on linear triton_v5 (gate | up on "
                                  "triton_v3's rule, down on triton_v4's kernel)",
                                  ("triton",)),
    ("lm_head", "torch_bf16"): ("cuBLAS GEMM, bf16 in, fp32 logits out (batch-variant)", ()),
    ("moe_route", "torch_bf16"): ("router logits in fp32 (fp32 weights), the reference's "
                                  "sigmoid + bias top-k and tie rule", ()),
    ("moe_route", "triton_v1"): ("router GEMM in cuBLAS (fp32 out), then one Triton program "
                                 "per token: sigmoid + bias, K rounds of max / lowest index, "
                                 "renormalised (2 kernels instead of ~9)", ("triton",)),
    ("moe_route", "triton_v2"): ("the router in one launch up to 32 rows: split-K GEMM over "
                                 "expert tiles, the last K slice sums its tile's partials in "
                                 "slice order, the last tile picks the top-k (triton_v1's rule; "
                                 "tickets reset in-kernel); triton_v1 above 32 rows",
                                 ("triton",)),
    ("moe_route", "triton_v3"): ("triton_v2's split-K router GEMM (32-expert tiles) without its "
                                 "top-k, then triton_v1's selection kernel: two launches "
                                 "instead of v1's three; triton_v1 above 32 rows",
                                 ("triton",)),
    ("mla_q_absorb", "torch_bf16"): ("one batched cuBLAS GEMM over the heads, bf16 in/out, fp32 "
                                     "accumulate (batch-variant)", ()),
    ("mla_v_up", "torch_bf16"): ("one batched cuBLAS GEMM over the heads, bf16 in/out, fp32 "
                                 "accumulate (batch-variant)", ()),
}
# the "engine" preset's part from this folder
ENGINE = {**{op: "torch_bf16" for op in OPS}, "rmsnorm": "triton_v2", "rope": "triton_v2",
          "moe_route": "triton_v1", "ep_plan": "triton_v1", "swiglu_mlp": "triton_v6",
          "linear": "triton_v5",
          "mla_kv_write": "triton_v1", "ep_combine": "triton_v1",
          "add_rmsnorm": "triton_v1"}


def register() -> list[str]:
    """Add this folder's variants to the registry (idempotent); see `register_variants`."""
    from workbench.kernels import register_variants

    return register_variants(VARIANTS, DESCRIPTIONS)
