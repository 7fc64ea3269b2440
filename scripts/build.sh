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

type=Release
[ "$sanitize" = ON ] && type=RelWithDebInfo
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DKVD_SANITIZE="$sanitize" -DKVD_CUDA=AUTO >/dev/null
cmake --build "$dir" -j "$(nproc)"
