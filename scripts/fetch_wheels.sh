#!/usr/bin/env bash
# Wheels the H200 lacks (it has no network): the peers' and nvtx's, for its Python 3.12,
# manylinux x86_64, into the git-ignored .whl/ that device runs carry (carry: [".whl"]).
# The recipe is the device README's pip download, verbatim. humming-kernels' own needs
# (torch, triton, numpy, safetensors, jinja2, cuda-bindings, tqdm, tabulate, filelock) and
# its JIT compiler (nvcc, NVRTC) are already on the H200 image (KINDS.md), so --no-deps is
# complete. One version of each package only: two stop the install there.
set -euo pipefail
cd "$(dirname "$0")/.."

# .gitignore lists /.whl/ already; the exclude line keeps older checkouts clean too.
exclude="$(git rev-parse --git-path info/exclude 2>/dev/null || true)"
if [ -n "$exclude" ]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
mkdir -p .whl

PKGS=("humming-kernels==0.1.20" "nvtx==0.2.17")
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${PKGS[@]}"

du -ch .whl/*.whl | tail -1  # counts towards the 64 MiB a device call may carry
