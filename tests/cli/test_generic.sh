#!/usr/bin/env bash
# kvdrift built for this machine against kvdrift with its kernels built for
# generic x86-64 (as the GPU bundle builds them): the kernels are chosen by
# what the CPU has, not by what the build was compiled for, so the two give
# the same bytes, cache and logits, in every cache format: with the CPU's
# own kernels (on a CPU with AVX-512 VBMI, the AVX-512 attention kernels in
# their target-attribute build, and with AMX-BF16 the AMX ones at 32 query
# heads) and under KVD_CPU_ATTENTION=portable (the
# portable ones, as a CPU without AVX-512 VBMI runs them). Where the CPU has
# the AVX-512 kernels they give other last bits than the portable ones.
set -u
bin="$1" generic="$2" models="${3:-tiny small}"
. "$(dirname "$0")/lib.sh"

kv=bf16,fp8-cal,fp8-e5m2,nvfp4-cal,fp8-token,int8-token,int4-token
for model in $models; do
  n=64
  [ $model = small ] && n=24
  for mode in cpu portable; do
    env=()
    [ $mode = portable ] && env=(KVD_CPU_ATTENTION=portable)
    env "${env[@]}" "$generic" forward --model $model --tokens $n --kv $kv --dump "$work/g-$mode-$model" \
      >/dev/null 2>"$work/err" || bad "$model ($mode): the generic build: $(cat "$work/err")"
    env "${env[@]}" "$bin" forward --model $model --tokens $n --kv $kv --dump "$work/n-$mode-$model" \
      >/dev/null 2>"$work/err" || bad "$model ($mode): this build: $(cat "$work/err")"
    if diff -r "$work/g-$mode-$model" "$work/n-$mode-$model" >"$work/diff"; then ok; else
      bad "$model: the generic build differs from this one ($mode kernels): $(head -3 "$work/diff")"
    fi
  done
done
# the AMX kernels too, where the CPU takes them (8 and 16 query heads a KV
# head): tiny with 32 query heads over its 2 KV heads, the same bytes
"$bin" export --model tiny -o "$work/wide" >/dev/null 2>"$work/err" &&
  /usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_attention_heads"] = 32; json.dump(c, open(sys.argv[1], "w"))' "$work/wide/config.json" ||
  bad "a 32-head config: $(cat "$work/err")"
for b in "$generic" "$bin"; do
  "$b" forward --config "$work/wide/config.json" --tokens 64 --kv bf16,fp8-cal,int8-token \
    --dump "$work/wide-$([ "$b" = "$generic" ] && echo g || echo n)" >/dev/null 2>"$work/err" ||
    bad "32 heads: $b: $(cat "$work/err")"
done
diff -r "$work/wide-g" "$work/wide-n" >"$work/diff" && ok ||
  bad "32 heads: the generic build differs from this one: $(head -3 "$work/diff")"
attn() { env "$@" | sed -n 's/^attention: //p'; }
[ "$(attn "$generic" version)" = "$(attn "$bin" version)" ] && ok ||
  bad "the two builds name other attention kernels: $(attn "$generic" version), $(attn "$bin" version)"
[ "$(attn KVD_CPU_ATTENTION=portable "$generic" version)" = portable ] && ok ||
  bad "the generic build under KVD_CPU_ATTENTION=portable: $(attn KVD_CPU_ATTENTION=portable "$generic" version)"
[ "$("$generic" version | sed -n 's/^blas: //p')" = "$("$bin" version | sed -n 's/^blas: //p')" ] && ok ||
  bad "the two builds' BLAS lines differ"
if [ "$(attn "$bin" version)" != portable ]; then
  ! cmp -s "$work/g-cpu-tiny/bf16/logits.f32" "$work/g-portable-tiny/bf16/logits.f32" && ok ||
    bad "the $(attn "$bin" version) attention kernels gave the portable ones' logits bit for bit"
else
  echo "(this CPU has no AVX-512 VBMI: the AVX-512 attention kernels are not run here)"
fi
echo "generic: $pass passed, $fail failed"
[ $fail = 0 ]
