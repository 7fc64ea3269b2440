#!/usr/bin/env bash
# The GPU check's benchmark program (kvd_gpu_bench) built on the SIMT
# simulator: every part the check runs (the kernels at the small size, the
# whole model with its tuned row, the lock-step drift run) must run to its
# end and print what the log is read for. A fault here would otherwise
# first show on a lent GPU, in minutes that are counted. The simulator's
# figures mean nothing, except where it is built to make them: its cuBLASLt
# algorithms take 100, 60 and 58 s on the events, so the heuristic's
# first choice misses the GEMM target and the tuned one meets it.
set -u
bench="$1"
. "$(dirname "$0")/../cli/lib.sh"

"$bench" smoke >"$work/smoke.log" 2>"$work/smoke.err" && ok || bad "kvd_gpu_bench smoke: exit $? ($(tail -3 "$work/smoke.err"))"
n=$(grep -cE '^  (decode attention v3|BF16 GEMMs).*: (met|NOT met)$' "$work/smoke.log")
[ "$n" = 7 ] && ok || bad "kvd_gpu_bench smoke: $n target lines, expected 7"
grep -qE "^  BF16 GEMMs, the heuristic's first choice .*: NOT met$" "$work/smoke.log" && ok ||
  bad "the heuristic's first choice (the simulator's slowest algorithm) met the GEMM target"
grep -qE '^  BF16 GEMMs, KVD_CUDA_GEMM=tune: .*: met$' "$work/smoke.log" && ok ||
  bad "the tuned GEMMs missed the GEMM target"
for f in nvfp4 e4m3t i8t; do
  n=$(grep -cE "^ +[0-9]+ $f +[123] +[0-9.]+ " "$work/smoke.log")
  [ "$n" = 6 ] && ok || bad "kvd_gpu_bench smoke: $n $f decode rows (v1, v2 and v3 at two contexts), expected 6"
done
n=$(grep -cE "^  \(no target\) decode attention v3, +[0-9]+K: the (nvfp4|e4m3t|i8t) cache [0-9.]+x the E4M3 cache's speed$" "$work/smoke.log")
[ "$n" = 3 ] && ok || bad "kvd_gpu_bench smoke: $n NVFP4 and per-token v3 lines beside the targets, expected 3"
n=$(grep -cE "^ +[0-9]+ i4t +2 +[0-9.]+ " "$work/smoke.log")
[ "$n" = 2 ] && ok || bad "kvd_gpu_bench smoke: $n i4t decode rows (v2 at two contexts), expected 2"
grep -qE "^  \(no target\) decode attention v2, +[0-9]+K: the i4t cache [0-9.]+x the E4M3 cache's speed, both on the FP32 cores$" "$work/smoke.log" && ok ||
  bad "kvd_gpu_bench smoke: no i4t line beside E4M3's v2"
for f in e4m3t nvfp4; do
  n=$(grep -cE "^ +[0-9]+ +[0-9]+ $f +2 +[0-9.]+ " "$work/smoke.log")
  [ "$n" = 4 ] && ok || bad "kvd_gpu_bench smoke: $n $f prefill rows (v2, four chunks), expected 4"
done
grep -q ' failed$' "$work/smoke.log" && bad "a part failed: $(grep ' failed$' "$work/smoke.log" | head -3)" || ok

"$bench" model tiny 16 1 >"$work/model.log" 2>"$work/model.err" && ok || bad "kvd_gpu_bench model: exit $? ($(tail -3 "$work/model.err"))"
for C in 1 8 32; do
  grep -qE "^  bf16 +C +$C: .* tokens/s$" "$work/model.log" && ok || bad "model: no tokens/s at C = $C"
done
grep -q 'tokens/s with KVD_CUDA_GEMM=tune' "$work/model.log" && ok || bad "model: no tuned row at C = 32"

"$bench" lockstep tiny 64 >"$work/lockstep.log" 2>"$work/lockstep.err" && ok || bad "kvd_gpu_bench lockstep: exit $? ($(tail -3 "$work/lockstep.err"))"
grep -q 'lock step with BF16 + figures' "$work/lockstep.log" && ok || bad "lockstep: no lock-step row"

echo "gpu bench on the simulator: $pass passed, $fail failed"
[ "$fail" = 0 ]
