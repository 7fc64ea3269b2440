#!/usr/bin/env bash
# The optional check against Hugging Face transformers' own Qwen3-Next and
# Qwen3.5 (hf_check.py): kvdrift's tiny and small exports, and Qwen3.5
# checkpoints transformers writes itself (hf_make_qwen35.py); and of the
# FP8 and 4-bit weights kvdrift dequantizes against compressed-tensors
# (ct_check.py). It needs a Python with torch
# and transformers: $KVD_HF_PYTHON, else the .venv-hf that
# scripts/setup-hf.sh makes, else the python3 first on PATH. Skips (77) with
# a message when none has them; the project's own set-up does not install
# them (several GB from PyPI).
# usage: run_hf.sh KVDRIFT WORK_DIR
set -euo pipefail
bin="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py=""
for cand in "${KVD_HF_PYTHON:-}" "$root/.venv-hf/bin/python" "$(command -v python3 || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  if "$cand" -c "import torch, transformers.models.qwen3_next" 2>/dev/null; then
    py="$cand"
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIP: no Python with torch and transformers (Qwen3-Next): bash scripts/setup-hf.sh makes .venv-hf (several GB from PyPI), or set KVD_HF_PYTHON"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
rc=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
# check NAME CKPT_DIR FORWARD_FLAGS...: forward's dump against transformers
check() {
  local name="$1" ckpt="$2"
  shift 2
  echo "== $name"
  "$bin" forward --tokens 512 --calib-tokens 512 "$@" --dump "$work/$name-dump" \
    >"$work/$name-forward.txt"
  "$py" "$here/hf_check.py" "$ckpt" "$work/$name-dump" "$work/$name-forward.txt" || rc=1
}
# kvdrift's own export (Qwen3-Next names), the forward on the same synthetic weights
for preset in tiny small; do
  "$bin" export --model "$preset" -o "$work/$preset-ckpt" >/dev/null
done
check tiny "$work/tiny-ckpt" --model tiny --kv bf16,fp8-cal,fp8-unscaled,fp8-e5m2
check small "$work/small-ckpt" --model small --kv bf16,fp8-cal,fp8-unscaled,fp8-e5m2
check tiny-per-head "$work/tiny-ckpt" --model tiny --kv bf16,fp8-cal --per-head --calibration modelopt
# Qwen3.5 checkpoints as transformers writes them, read by --model-dir
"$py" "$here/hf_make_qwen35.py" "$work/qwen35"
for kind in moe moe-text dense; do
  check "qwen3.5-$kind" "$work/qwen35/$kind" --model-dir "$work/qwen35/$kind" \
    --kv bf16,fp8-cal,fp8-unscaled,fp8-e5m2
done
# FP8 (per tensor, per row, per block) and packed 4-bit weights (NVFP4 in
# ModelOpt's and compressed-tensors' names, MXFP4) as kvdrift dequantizes
# them, against compressed-tensors' own dequantization, where the library is
# installed
if "$py" -c "import compressed_tensors" 2>/dev/null; then
  for q in fp8:tensor fp8:channel fp8:block64 fp4:modelopt fp4:compressed fp4:mxfp4; do
    kind=${q%%:*} mode=${q#*:}
    echo "== quantized weights: $kind $mode"
    d="$work/q-$kind-$mode"
    "$bin" export --model tiny -o "$d" >/dev/null
    /usr/bin/python3 "$here/../cli/st_tool.py" $kind-quantize "$d" $mode "$d-ref"
    "$bin" export --model-dir "$d" --dtype f32 -o "$d-f32" >/dev/null
    (cd "$here" && "$py" ct_check.py "$d" "$d-f32/model.safetensors") || rc=1
  done
else
  echo "== quantized weights: skipped (no compressed-tensors in $py: bash scripts/setup-hf.sh installs it)"
fi
exit $rc
