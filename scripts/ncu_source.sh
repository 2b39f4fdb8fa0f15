#!/usr/bin/env bash
# Per-SASS-instruction Nsight Compute counters (warp stall samples, executed instructions) of
# one launch of one kernel, exported as CSV: where a kernel's time goes, line by line.
#     OUT=traces/ncu NAME=tree_mla_v4_src KREGEX=_attn_kernel \
#         bash scripts/ncu_source.sh python3 scripts/run_case.py tree_mla triton_v4 "N=9 H=8 P=1024" --calls 1
# Writes $OUT/$NAME.csv (details page), $OUT/$NAME_sass.csv (source page, SASS) and the
# gzipped report.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}; NAME=${NAME:?set NAME}
SECTIONS="SpeedOfLight WarpStateStats SourceCounters" COUNT=1 bash scripts/ncu_kernel.sh "$@"
rc=$?
. scripts/ncu_find.sh
if [ -f "$OUT/$NAME.ncu-rep.gz" ]; then
    gunzip -kf "$OUT/$NAME.ncu-rep.gz"
    "$NCU" --import "$OUT/$NAME.ncu-rep" --page source --csv --print-source sass \
        >"$OUT/${NAME}_sass.csv" 2>&1 || echo "source page export failed"
    rm -f "$OUT/$NAME.ncu-rep"
fi
exit $rc
