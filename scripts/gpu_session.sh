#!/usr/bin/env bash
# One device call that gathers a session's GPU evidence (the device tool returns <= 8 files):
#   1. `pytest -m gpu` file by file, each with its own time limit   -> $OUT/pytest_gpu.log
#   2. the GPU suite's benchmarks (scripts/gpu_suite.sh --skip-tests): every mission op at
#      REAL shapes with its peers                                    -> $OUT/suite/ (4 files)
#   3. optionally the tree_build sweep (bs x budget grid)            -> $OUT/extra.log
#   4. optionally the single-rank full-size emulation (workbench.dist.emulate)
#                                                                    -> $OUT/emulate.csv
#   0. first, optionally, the steps of a plan file STEPS (one "limit_s<TAB>command" a line,
#      '#' comments; scripts/gpu_plans/ keeps the plans that made committed results)
#                                                                    -> $OUT/steps.log
# Time limits (seconds, env): TEST_FILES ("file:limit ..."), SUITE_S, SWEEP_S, EMULATE_S (0
# skips a stage). Stages write as they go, so one cut short still returns what it finished.
# Extra arguments: SUITE_ARGS, SWEEP_ARGS, EMULATE_ARGS. Pass the dev box's commit:
# WORKBENCH_GIT_SHA=<sha> WORKBENCH_GIT_DIRTY=0|1. Back here:
#     python -m workbench suite --import-results <fetched>/suite
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder that collects the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[gpu_session] $(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/extra.log"; }

if compgen -G ".whl/*.whl" >/dev/null; then  # the device README's recipe (nvtx, humming)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/extra.log"

# A process's descendants, parents before children, from /proc (no procps needed; gVisor has
# /proc/N/stat too).
descendants() {
  local f stat rest c ppid
  for f in /proc/[0-9]*/stat; do
    stat=$(<"$f") 2>/dev/null || continue
    rest=${stat##*) }
    read -r _ ppid _ <<<"$rest"
    if [ "$ppid" = "$1" ]; then c=${f#/proc/}; c=${c%/stat}; echo "$c"; descendants "$c"; fi
  done
}
# A plan step under its limit (status 124 past it, as timeout's). At the limit the step's
# processes stop in two rounds: first all but the filters a plan pipes its output through
# (grep, tail, tee, head, sed, awk, gzip, cat), which then see the end of their input and write
# what they hold; 10 s later whatever is left. `timeout` signals the whole process group at
# once, so a step's `| tail | tee` wrote nothing when it was cut (session 39 lost a 560 s step).
run_step() {
  local lim=$1 cmd=$2 pid p end
  bash -c "$cmd" >>"$OUT/steps.log" 2>&1 &
  pid=$!
  end=$((SECONDS + lim))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; return; fi
  for p in "$pid" $(descendants "$pid"); do  # bash -c execs a lone command: then $pid is it
    case "$(cat "/proc/$p/comm" 2>/dev/null)" in
      bash|sh|grep|tail|tee|head|sed|awk|gzip|cat) ;;  # a shell ends with its pipeline
      *) kill -TERM "$p" 2>/dev/null ;;
    esac
  done
  end=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  for p in $(descendants "$pid") "$pid"; do kill -KILL "$p" 2>/dev/null; done
  wait "$pid" 2>/dev/null
  return 124
}

if [ -n "${STEPS:-}" ]; then
  while IFS=$'\t' read -r lim cmd; do
    case "$lim" in ''|'#'*) continue;; esac
    stamp "step (limit $lim s): $cmd"
    run_step "$lim" "$cmd" </dev/null
    rc=$?; stamp "step rc $rc"; echo "[gpu_session] rc $rc: $cmd" >>"$OUT/steps.log"
  done <"$STEPS"
fi

for spec in ${TEST_FILES:-}; do
  f=${spec%%:*}; lim=${spec##*:}
  stamp "pytest -m gpu $f (limit $lim s)"
  timeout "$lim" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=8 "$f" \
      >>"$OUT/pytest_gpu.log" 2>&1
  rc=$?; stamp "pytest $f rc $rc"; echo "[gpu_session] rc $rc: $f" >>"$OUT/pytest_gpu.log"
done

if [ "${SUITE_S:-300}" -gt 0 ]; then
  stamp "suite benchmarks (limit ${SUITE_S:-300} s)"
  # shellcheck disable=SC2086
  OUT="$OUT/suite" timeout "${SUITE_S:-300}" bash scripts/gpu_suite.sh --skip-tests \
      --total-seconds $(( ${SUITE_S:-300} - 15 )) ${SUITE_ARGS:-}
  stamp "suite rc $?"
fi

if [ "${SWEEP_S:-0}" -gt 0 ]; then
  stamp "tree_build sweep (limit $SWEEP_S s)"
  # shellcheck disable=SC2086
  timeout "$SWEEP_S" python3 -m workbench.kernels.tree_build --sweep ${SWEEP_ARGS:-} \
      >>"$OUT/extra.log" 2>&1
  stamp "sweep rc $?"
fi

if [ "${EMULATE_S:-0}" -gt 0 ]; then
  stamp "emulation (limit $EMULATE_S s)"
  # shellcheck disable=SC2086
  timeout "$EMULATE_S" python3 -m workbench.dist.emulate --preset kimi-k2.6 --device cuda \
      --csv "$OUT/emulate.csv" ${EMULATE_ARGS:---layouts ep8} >>"$OUT/extra.log" 2>&1
  stamp "emulation rc $?"
fi
stamp "done"
