#!/usr/bin/env bash
# Nsight Compute on a few launches of one kernel family, with the sections that say what limits
# it (speed of light, memory chart, warp stalls, issue slots, occupancy), exported to CSV:
#     OUT=traces/ncu NAME=int4_v8_T17 KREGEX=_gemm_kernel COUNT=2 \
#         bash scripts/ncu_kernel.sh python3 -m workbench.kernels.int4_moe.triton_v8 --T 17 --cfgs base --seconds 0.05
# Writes $OUT/$NAME.ncu-rep (gzipped: reports of full sections are tens of MB) and
# $OUT/$NAME.csv (the details page, base units).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}; NAME=${NAME:?set NAME}; KREGEX=${KREGEX:?set KREGEX}
mkdir -p "$OUT"
. scripts/ncu_find.sh
SECTIONS=${SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats ComputeWorkloadAnalysis}
"$NCU" --clock-control none --kernel-name "regex:$KREGEX" \
    --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-2}" \
    $(for s in $SECTIONS; do echo --section "$s"; done) \
    -f -o "$OUT/$NAME" "$@"
rc=$?
if [ -f "$OUT/$NAME.ncu-rep" ]; then
    "$NCU" --import "$OUT/$NAME.ncu-rep" --csv --page details --print-units base >"$OUT/$NAME.csv"
    gzip -9f "$OUT/$NAME.ncu-rep"
fi
exit $rc
