#!/usr/bin/env bash
# Sets up a fresh machine, builds kvdrift and runs the default sweep: the
# 'small' hybrid model in the FP8 KV cache modes an engine runs without a
# checkpoint (calibrated, unscaled, E5M2, per-token) against BF16, drift
# and throughput, written to out/run.h5 with a summary on stdout, then the
# reviewer's report out/report.html (and out/report.md). The sweep takes
# about 2 minutes on 2 cores. Extra arguments go to `kvdrift run` (a --kv there replaces the
# list below).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh
mkdir -p out
rm -f out/run.h5 # a fresh sweep; rerunning `kvdrift run` by hand resumes instead
build/kvdrift run --model small --context 2048 --concurrency 1,2,4 --decode-tokens 8 \
  --kv bf16,fp8-cal,fp8-unscaled,fp8-e5m2,fp8-token -o out/run.h5 "$@"
build/kvdrift report out/run.h5 -o out/report.html
build/kvdrift report out/run.h5 --format md -o out/report.md
echo "report: out/report.html (open it in a browser), summary: out/report.md"
