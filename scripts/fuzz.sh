#!/usr/bin/env bash
# Fuzz every parser with libFuzzer for a while each (default 60 s): the
# safetensors reader, config.json, the CSV readers. Seeds come from files the
# project writes itself. Crashes land in out/fuzz/.
# usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
bash scripts/setup.sh >/dev/null
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DKVD_FUZZ=ON -DKVD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target kvdrift fuzz_safetensors fuzz_config fuzz_csv >/dev/null
out=out/fuzz
mkdir -p "$out"/{seeds_st,seeds_cfg,seeds_csv}
build-fuzz/kvdrift export --model tiny -o "$out/ckpt" >/dev/null
head -c 65536 "$out/ckpt/model.safetensors" >"$out/seeds_st/head"
cp "$out/ckpt/config.json" "$out/seeds_cfg/"
cp reports/thresholds.csv "$out/seeds_csv/"
printf 'id,segment\n1,user\n2,file\n' >"$out/seeds_csv/trace.csv"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1
for t in safetensors:seeds_st config:seeds_cfg csv:seeds_csv; do
  name=${t%%:*}
  seeds=${t##*:}
  echo "fuzz_$name: $secs s"
  (cd "$out" && ../../build-fuzz/tests/fuzz/fuzz_$name -max_total_time="$secs" -max_len=70000 "$seeds" 2>&1 | tail -3)
done
