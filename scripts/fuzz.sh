#!/usr/bin/env bash
# Fuzz every parser with libFuzzer for a while each (default 60 s): the
# safetensors reader, config.json, the CSV readers, and a checkpoint
# directory as the loaders and audit read it. Seeds come from files the
# project writes itself. Crashes land in out/fuzz/.
# usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
bash scripts/setup.sh >/dev/null
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DKVD_FUZZ=ON -DKVD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target kvdrift fuzz_safetensors fuzz_config fuzz_csv \
  fuzz_checkpoint >/dev/null
out=out/fuzz
rm -rf "$out"/{seeds_ck,micro*}
mkdir -p "$out"/{seeds_st,seeds_cfg,seeds_csv,seeds_ck}
build-fuzz/kvdrift export --model tiny -o "$out/ckpt" >/dev/null
head -c 65536 "$out/ckpt/model.safetensors" >"$out/seeds_st/head"
cp "$out/ckpt/config.json" "$out/seeds_cfg/"
cp reports/thresholds.csv "$out/seeds_csv/"
printf 'id,segment\n1,user\n2,file\n' >"$out/seeds_csv/trace.csv"
# the checkpoint loader's seeds: a micro model, and its FP8 and 4-bit forms
build-fuzz/kvdrift export --config tests/fuzz/micro.json -o "$out/micro" >/dev/null
cp "$out/micro/model.safetensors" "$out/seeds_ck/bf16"
for q in fp8:block64 fp8:channel fp4:modelopt fp4:compressed fp4:mxfp4; do
  cp -r "$out/micro" "$out/micro-${q#*:}"
  /usr/bin/python3 tests/cli/st_tool.py ${q%%:*}-quantize "$out/micro-${q#*:}" ${q#*:} "$out/micro-ref" >/dev/null
  cp "$out/micro-${q#*:}/model.safetensors" "$out/seeds_ck/${q#*:}"
done
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 KVD_FUZZ_CONFIG="$PWD/tests/fuzz/micro.json"
for t in safetensors:seeds_st:70000 config:seeds_cfg:70000 csv:seeds_csv:70000 checkpoint:seeds_ck:200000; do
  IFS=: read -r name seeds len <<<"$t"
  echo "fuzz_$name: $secs s"
  (cd "$out" && ../../build-fuzz/tests/fuzz/fuzz_$name -max_total_time="$secs" -max_len="$len" "$seeds" 2>&1 | tail -3)
done
