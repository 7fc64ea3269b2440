#!/usr/bin/env bash
# Runs the NumPy reference checks: export the tiny model, run the C forward
# with a dump, compare (check.py); run drift sweeps (one with FP8 attention)
# and compare the figures they wrote (check_run.py, check_gen.py, check_kv.py). Skips (77) only when python3-numpy or python3-h5py
# is absent.
set -euo pipefail
bin="$1"
work="$2"
py=/usr/bin/python3
if ! "$py" -c "import numpy, h5py" 2>/dev/null; then
  echo "SKIP: $py has no numpy or h5py (scripts/setup.sh installs python3-numpy and python3-h5py)"
  exit 77
fi
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"
mkdir -p "$work"
"$bin" export --model tiny -o "$work/ckpt"
"$bin" forward --model tiny --tokens 512 --calib-tokens 512 \
  --kv bf16,fp8-cal,fp8-unscaled,nvfp4-cal,nvfp4-unscaled,fp8-token,int8-token,int8-token-rn,int4-token \
  --dump "$work/dump" >"$work/forward.txt"
rc=0
"$py" "$here/check.py" "$work/ckpt" "$work/dump" || rc=1
# DeltaNet widths that are no multiple of the CPU kernels' vectors: key
# heads of 20, value heads of 84 (a 64-column slice of the state, a
# 16-column one and 4 single columns), 416 conv channels (six blocks of 64
# and one of 32)
"$py" - "$work/ckpt/config.json" "$work/odd.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["linear_key_head_dim"], c["linear_value_head_dim"] = 20, 84
json.dump(c, open(sys.argv[2], "w"))
PY
"$bin" export --config "$work/odd.json" -o "$work/odd-ckpt" >/dev/null
"$bin" forward --config "$work/odd.json" --tokens 200 --calib-tokens 200 --kv bf16,fp8-cal \
  --dump "$work/odd-dump" >"$work/odd-forward.txt"
"$py" "$here/check.py" "$work/odd-ckpt" "$work/odd-dump" bf16,fp8-cal || rc=1
# the figures a sweep writes, against the same reference: one 512-token
# trace, generation branches on (they must leave the trace's figures alone)
gen=32
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 512 --traces 1 --seed 7 \
  --gen-tokens $gen --cells drift --attn-per-head -o "$work/run.h5" >/dev/null 2>"$work/run.err" || {
  cat "$work/run.err"
  exit 1
}
"$bin" trace gen --length $((512 + gen + 1)) --seed 7 --vocab 512 -o "$work/trace.h5" >/dev/null
"$py" "$here/check_run.py" "$work/ckpt" "$work/run.h5" "$work/trace.h5" || rc=1
# the same with FP8 attention (FlashAttention 3's rule) in the E4M3 modes
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 512 --traces 1 --seed 7 \
  --gen-tokens $gen --cells drift --attn-per-head --attn-fp8 -o "$work/run-fp8attn.h5" >/dev/null 2>"$work/run.err" || {
  cat "$work/run.err"
  exit 1
}
"$py" "$here/check_run.py" "$work/ckpt" "$work/run-fp8attn.h5" "$work/trace.h5" || rc=1
# greedy generation from the trace's prefixes, short enough for the
# reference to recompute every step (seed 3: continuations that diverge)
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 96 --traces 1 --seed 3 \
  --gen-tokens 12 --cells drift -o "$work/gen.h5" >/dev/null 2>"$work/run.err" || {
  cat "$work/run.err"
  exit 1
}
"$bin" trace gen --length $((96 + 12 + 1)) --seed 3 --vocab 512 -o "$work/gen-trace.h5" >/dev/null
"$py" "$here/check_gen.py" "$work/ckpt" "$work/gen.h5" "$work/gen-trace.h5" || rc=1
# the cache's counters, without generation (every value written is the trace's)
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 256 --traces 1 --seed 7 \
  --gen-tokens 0 --cells drift -o "$work/kv.h5" >/dev/null 2>"$work/run.err" || {
  cat "$work/run.err"
  exit 1
}
"$bin" trace gen --length 257 --seed 7 --vocab 512 -o "$work/kv-trace.h5" >/dev/null
"$py" "$here/check_kv.py" "$work/ckpt" "$work/kv.h5" "$work/kv-trace.h5" || rc=1
exit $rc
