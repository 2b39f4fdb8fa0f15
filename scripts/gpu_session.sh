#!/usr/bin/env bash
# One device call that gathers a session's GPU evidence (the device tool returns <= 8 files):
#   1. the GPU suite (scripts/gpu_suite.sh): pytest -m gpu + bench of the mission ops at REAL
#      shapes with peers                                             -> $OUT/suite/ (6 files)
#   2. the tree_build sweep (bs x budget grid, chosen versions)      -> $OUT/extra.log
#   3. the single-rank full-size emulation (workbench.dist.emulate)  -> $OUT/emulate.csv (+ log)
# Each stage has its own time limit (seconds, env): SUITE_S, SWEEP_S, EMULATE_S; stages write
# as they go, so a stage cut short still returns what it finished. Extra suite arguments go in
# SUITE_ARGS, the sweep's in SWEEP_ARGS, the emulation's in EMULATE_ARGS. Pass the dev box's
# commit: WORKBENCH_GIT_SHA=<sha> WORKBENCH_GIT_DIRTY=0|1. Back here:
#     python -m workbench suite --import-results <fetched>/suite
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder that collects the results}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[gpu_session] $(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/extra.log"; }

stamp "suite (limit ${SUITE_S:-330} s)"
# shellcheck disable=SC2086
OUT="$OUT/suite" timeout "${SUITE_S:-330}" bash scripts/gpu_suite.sh \
    --total-seconds $(( ${SUITE_S:-330} - 20 )) ${SUITE_ARGS:-}
stamp "suite rc $?"
# gpu_suite.sh installed the wheels and made workbench importable: reuse its PYTHONPATH
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

stamp "tree_build sweep (limit ${SWEEP_S:-60} s)"
# shellcheck disable=SC2086
timeout "${SWEEP_S:-60}" python3 -m workbench.kernels.tree_build --sweep ${SWEEP_ARGS:-} \
    >>"$OUT/extra.log" 2>&1
stamp "sweep rc $?"

stamp "emulation (limit ${EMULATE_S:-150} s)"
# shellcheck disable=SC2086
timeout "${EMULATE_S:-150}" python3 -m workbench.dist.emulate --preset kimi-k2.6 \
    --device cuda --csv "$OUT/emulate.csv" ${EMULATE_ARGS:---layouts ep8} >>"$OUT/extra.log" 2>&1
stamp "emulation rc $?"
