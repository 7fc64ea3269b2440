#!/usr/bin/env bash
# The GPU checks in one run (for a machine with an NVIDIA GPU): build, the
# CUDA parity tests against the CPU twins, the kernel benchmarks; log and
# figures into the folder given (default out/gpu-check). Meant to finish well
# inside 8 minutes on one H200.
# usage: scripts/gpu-check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/gpu-check}"
mkdir -p "$out"
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  bash scripts/build.sh build-gpu 2>&1 | tail -3
  echo "== parity"
  ctest --test-dir build-gpu -R 'gpu_|oracle_' --output-on-failure 2>&1
  echo "== device benchmarks"
  timeout 240 build-gpu/kvdrift bench cuda 2>&1
  echo "== kernels (CPU side, for the ratios)"
  timeout 120 build-gpu/kvdrift bench kernels --reps 5 2>&1
} | tee "$out/gpu-check.log"
grep -q "tests passed, 0 tests failed\|100% tests passed" "$out/gpu-check.log"
