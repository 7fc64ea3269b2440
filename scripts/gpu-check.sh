#!/usr/bin/env bash
# The GPU checks in one run: the CUDA parity tests against the CPU twins,
# then the device benchmarks, log into OUT_DIR/gpu-check.log. They run from
# the bundle scripts/gpu-bundle.sh makes (the device machines have CUDA but
# none of the host's Debian libraries): on the host this script builds the
# bundle first; on a device machine it runs the bundle carried there
# (device tool: carry gpu-bundle, command `bash scripts/gpu-check.sh $OUT`).
# Well inside 8 minutes on one H200. Exit 0 only when every parity check passed.
# usage: scripts/gpu-check.sh [OUT_DIR (default out/gpu-check)]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/gpu-check}"
if [ ! -x gpu-bundle/run.sh ] || { command -v dpkg-query >/dev/null &&
  dpkg-query -W libopenblas-dev >/dev/null 2>&1 &&
  [ -n "$(find kernels runners bench tests/gpu CMakeLists.txt -newer gpu-bundle/run.sh -print -quit)" ]; }; then
  bash scripts/gpu-bundle.sh || {
    echo "gpu-check: no bundle, and it cannot be built here (scripts/gpu-bundle.sh needs the host's packages)"
    exit 2
  }
fi
exec bash gpu-bundle/run.sh "$out"
