#!/usr/bin/env bash
# Sets up a fresh machine, builds kvdrift and runs the default job: the
# 'small' hybrid model over a synthetic trace in every KV cache mode.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh
exec build/kvdrift forward --model small --tokens 1024 "$@"
