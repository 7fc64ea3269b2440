#!/usr/bin/env bash
# Configures and builds kvdrift into a build directory (default build/).
# usage: scripts/build.sh [--sanitize] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=OFF
dir=build
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=ON; dir=build-asan ;;
    *) dir="$a" ;;
  esac
done

type=Release cuda=AUTO
if [ "$sanitize" = ON ]; then
  type=RelWithDebInfo
  # Where no GPU can run them, the sanitized build leaves out the kernels
  # nvcc compiles (the plain build compiles and links them; here they would
  # only be compiled again, a minute and a half on 2 cores): its tests are
  # the host code's, the SIMT simulator's kernels included, and it checks
  # the build without a CUDA back end besides.
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' || cuda=OFF
fi
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DKVD_SANITIZE="$sanitize" -DKVD_CUDA="$cuda" >/dev/null
cmake --build "$dir" -j "$(nproc)"
