#!/usr/bin/env bash
# Train the shipped target + DFlash drafter pair on one GPU (H200: ~8 min in all), then write
# the acceptance report. Run from anywhere; works from the repository root:
#
#     OUT=/some/folder bash scripts/train_gpu.sh
#
# Writes into the working tree: workbench/assets/trained/{tokenizer.json,corpus.json,target/,
# drafter/} and traces/{train_target,train_drafter,acceptance_trained}.csv + acceptance_trained.md.
# Copies into $OUT (7 files): trained.tar.part00/01 (`cat trained.tar.part* | tar -x -C
# workbench/assets` restores the pair folder), the four traces, and train_gpu.log.
# If workbench/assets/trained/corpus.json exists, the run trains on exactly that file list (a
# different Python's extra files are ignored, missing ones reported), so a rerun reproduces the
# shipped pair up to GPU nondeterminism. Extra per-stage arguments: TARGET_ARGS, DRAFTER_ARGS,
# REPORT_ARGS (e.g. TARGET_ARGS="--steps 200" for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder that collects the results}
mkdir -p "$OUT"
exec > >(tee "$OUT/train_gpu.log") 2>&1
T0=$(date +%s)
stamp() { echo "[train_gpu] $(( $(date +%s) - T0 )) s: $*"; }

# The workbench is one import root with reference/ and kernels/ mapped under it (pyproject
# package-dir). Without an installed copy, build that mapping from symlinks; PYTHONSAFEPATH
# stops `python -m` from putting the repository root (whose workbench/ lacks them) first.
if ! python -c "import workbench.reference" 2>/dev/null; then
    SHIM=$(mktemp -d)
    mkdir "$SHIM/workbench"
    for f in workbench/*; do ln -s "$PWD/$f" "$SHIM/workbench/"; done
    ln -s "$PWD/reference" "$SHIM/workbench/reference"
    ln -s "$PWD/kernels" "$SHIM/workbench/kernels"
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
    python -c "import workbench.reference, workbench.train" || { echo "import shim failed"; exit 1; }
    stamp "workbench not installed: using the symlink import shim $SHIM"
fi
python - <<'EOF'
import platform, sysconfig, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU'}, "
      f"stdlib {sysconfig.get_paths()['stdlib']}")
EOF

PAIR=workbench/assets/trained
MANIFEST=()
if [ -f "$PAIR/corpus.json" ] && python -c "import sys; from workbench.train import data; \
        data.load_manifest(sys.argv[1])" "$PAIR/corpus.json" 2>/dev/null; then
    cp "$PAIR/corpus.json" "$OUT/.corpus.json"
    MANIFEST=(--manifest "$OUT/.corpus.json")
    stamp "training on the shipped corpus list $PAIR/corpus.json"
elif [ -f "$PAIR/corpus.json" ]; then
    stamp "ignoring $PAIR/corpus.json (another corpus rule version): writing a new one"
fi
mkdir -p "$PAIR" traces
rm -rf "$PAIR/target" "$PAIR/drafter" "$PAIR/tokenizer.json" "$PAIR/README.md"

# Pack the pair folder (two parts of <= 15 MB) and the traces into $OUT. Called right after
# the drafter and again at the end, so a run cut short still returns the pair.
pack() {
    rm -f "$OUT"/trained.tar.part*
    tar -cf - -C workbench/assets trained | split -b 15m -d - "$OUT/trained.tar.part"
    for f in traces/train_target.csv traces/train_drafter.csv traces/acceptance_trained.csv \
             traces/acceptance_trained.md; do
        if [ -f "$f" ]; then cp "$f" "$OUT/"; fi
    done
}

stamp "target"
S=$(date +%s)
# shellcheck disable=SC2086
python -m workbench.train target --device cuda ${MANIFEST[@]+"${MANIFEST[@]}"} ${TARGET_ARGS:-}
W_TARGET=$(( $(date +%s) - S )); S=$(date +%s)
stamp "drafter"
# shellcheck disable=SC2086
python -m workbench.train drafter --device cuda ${MANIFEST[@]+"${MANIFEST[@]}"} ${DRAFTER_ARGS:-}
W_DRAFTER=$(( $(date +%s) - S )); S=$(date +%s)
rm -f traces/acceptance_trained.csv traces/acceptance_trained.md
pack
stamp "pair packed; acceptance report"
RC=0
# shellcheck disable=SC2086
python -m workbench.train report --device cuda ${REPORT_ARGS:-} || RC=$?
W_REPORT=$(( $(date +%s) - S ))
python -m workbench.train readme --wall target=$W_TARGET --wall drafter=$W_DRAFTER \
    --wall report=$W_REPORT || RC=$?
rm -f "$OUT/.corpus.json"
pack
BYTES=$(du -sb "$PAIR" | cut -f1)
du -ab "$PAIR" | sort -k2
ls -l "$OUT"
stamp "total (pair $BYTES bytes)"
if [ "$BYTES" -gt 25000000 ]; then echo "ERROR: pair is $BYTES bytes (> 25 MB)"; exit 1; fi
exit $RC
