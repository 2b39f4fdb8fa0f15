#!/usr/bin/env bash
# The GPU suite in one command (DESIGN.md §10), for the H200 test machine:
#   1. installs the carried wheels from .whl/ (nvtx, humming-kernels; scripts/fetch_wheels.sh
#      downloads them here) into /tmp/site, the device README's recipe;
#   2. makes `workbench` importable (editable install: pyproject maps reference/ and kernels/
#      under the package, so the bare checkout alone does not import);
#   3. runs `python -m workbench.suite`: pytest -m gpu, benchmarks of every op with peers at
#      REAL shapes, optionally compute-sanitizer. Extra arguments go to the suite, e.g.
#      `--sanitizer memcheck`, `--ops int4_moe,tree_mla`, `--per-op-seconds 20`.
# Results: $OUT if set (the device tool fetches it), else traces/gpu/<UTC time>. Pass the dev
# box's commit along, since the machine gets the tree without .git:
#   WORKBENCH_GIT_SHA=<sha> WORKBENCH_GIT_DIRTY=0|1 bash scripts/gpu_suite.sh
# and back here: python -m workbench suite --import-results <fetched folder>
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || { echo "wheel install failed" >&2; exit 1; }
else
  echo "no .whl/ wheels: peers and nvtx that the image lacks will report 'not installed'"
fi

if ! python3 -c "import workbench.reference, workbench.kernels" 2>/dev/null; then
  # --no-build-isolation --no-index: the machine is offline; its setuptools builds the
  # editable wheel.
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    || { echo "editable install of workbench failed" >&2; exit 1; }
fi

exec python3 -m workbench.suite "$@"
