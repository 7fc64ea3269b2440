#!/usr/bin/env bash
# Runs the NumPy reference check: export the tiny model, run the C forward
# with a dump, compare. Skips (77) only when Debian's python3-numpy is absent.
set -euo pipefail
bin="$1"
work="$2"
py=/usr/bin/python3
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "SKIP: $py has no numpy (scripts/setup.sh installs python3-numpy)"
  exit 77
fi
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"
mkdir -p "$work"
"$bin" export --model tiny -o "$work/ckpt"
"$bin" forward --model tiny --tokens 512 --calib-tokens 512 --kv bf16,fp8-cal,fp8-unscaled \
  --dump "$work/dump" >"$work/forward.txt"
"$py" "$here/check.py" "$work/ckpt" "$work/dump"
