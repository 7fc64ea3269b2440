#!/usr/bin/env bash
# kvdrift built for this machine against kvdrift with its kernels built for
# generic x86-64 (no AVX-512 attention kernels, as on a CPU without AVX-512
# VBMI): under KVD_CPU_ATTENTION=portable the first gives the second's
# bytes, cache and logits, in every cache format; without it the AVX-512
# kernels give other last bits. The GEMMs of a few rows take the same
# kernel in both (chosen by the CPU, not the build).
set -u
bin="$1" generic="$2" models="${3:-tiny small}"
. "$(dirname "$0")/lib.sh"

kv=bf16,fp8-cal,fp8-e5m2,nvfp4-cal,fp8-token,int8-token
for model in $models; do
  n=64
  [ $model = small ] && n=24
  "$generic" forward --model $model --tokens $n --kv $kv --dump "$work/g-$model" >/dev/null 2>"$work/err" ||
    bad "$model: the generic build: $(cat "$work/err")"
  KVD_CPU_ATTENTION=portable "$bin" forward --model $model --tokens $n --kv $kv --dump "$work/p-$model" \
    >/dev/null 2>"$work/err" || bad "$model: KVD_CPU_ATTENTION=portable: $(cat "$work/err")"
  if diff -r "$work/g-$model" "$work/p-$model" >"$work/diff"; then ok; else
    bad "$model: KVD_CPU_ATTENTION=portable differs from the generic build: $(head -3 "$work/diff")"
  fi
done
[ "$("$generic" version | sed -n 's/^attention: //p')" = portable ] && ok ||
  bad "the generic build's attention kernels: $("$generic" version | grep attention)"
[ "$("$generic" version | sed -n 's/^blas: //p')" = "$("$bin" version | sed -n 's/^blas: //p')" ] && ok ||
  bad "the two builds' BLAS lines differ"
if [ "$("$bin" version | sed -n 's/^attention: //p')" = AVX-512 ]; then
  "$bin" forward --model tiny --tokens 64 --kv $kv --dump "$work/v-tiny" >/dev/null &&
    ! cmp -s "$work/v-tiny/bf16/logits.f32" "$work/g-tiny/bf16/logits.f32" && ok ||
    bad "the AVX-512 attention kernels gave the portable ones' logits bit for bit"
fi
echo "generic: $pass passed, $fail failed"
[ $fail = 0 ]
