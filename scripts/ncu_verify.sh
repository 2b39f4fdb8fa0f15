#!/usr/bin/env bash
# Nsight Compute report of ONE DDTree verify step (issue #12): the `small` preset (4 Kimi-width
# layers, synthetic weights), kernels=${KERNELS:-engine} (optimized kernels + cuBLAS bf16 dense ops), budget ${BUDGET:-8}, C=1, eager (ncu replays
# each kernel; a graph would be profiled as one launch). Only kernels inside the loop's NVTX
# range ddtree/verify are profiled (domain "ddtree", the `nvtx` wheel): the first COUNT of them
# (the kernels are the same every step; compiles launch none). Writes $OUT/ncu_verify.ncu-rep and a per-kernel CSV summary.
#     OUT=traces/ncu BUDGET=8 bash scripts/ncu_verify.sh
#     OUT=traces/ncu KERNELS=optimized KREGEX='^_' COUNT=80 bash scripts/ncu_verify.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
. scripts/ncu_find.sh
"$NCU" --version | tail -1
# The filter comes from workbench.tracing.ncu_filter: '/' inside a range name must be escaped
# (an unescaped "ddtree@ddtree/verify/" matched no kernel on the H200, session 3).
FILTER=$(python3 -c "from workbench.tracing import ncu_filter; print(ncu_filter('ddtree/verify'))")
echo "ncu filter: $FILTER"
# KREGEX narrows to kernel names (e.g. '^_' = our Triton kernels only, whose names all start with
# an underscore; torch's and cuBLAS's do not).
"$NCU" --clock-control none --nvtx --nvtx-include "$FILTER" \
    ${KREGEX:+--kernel-name "regex:$KREGEX"} \
    --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-300}" \
    $(for s in ${SECTIONS:-SpeedOfLight LaunchStats Occupancy MemoryWorkloadAnalysis}; do echo --section "$s"; done) \
    -f -o "$OUT/ncu_verify" \
    python3 -m workbench generate --preset small --device cuda --budget "${BUDGET:-8}" \
        --kernels "${KERNELS:-engine}" --max-new-tokens 12 --prompt-ids 1,2,3,4,5,6,7,8
rc=$?
if [ -f "$OUT/ncu_verify.ncu-rep" ]; then
    "$NCU" --import "$OUT/ncu_verify.ncu-rep" --csv --page details --print-units base \
        >"$OUT/ncu_verify_details.csv"
    gzip -9f "$OUT/ncu_verify.ncu-rep"  # 60 kernels of SpeedOfLight were > 16 MiB raw
fi
exit $rc
