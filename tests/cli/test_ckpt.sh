#!/usr/bin/env bash
# Real checkpoints and kvdrift audit, on checkpoints the test builds itself:
# the exported tiny model loads back with bit-identical logits (also with the
# experts fused); FP8 KV scales come from the checkpoint; audit sees FP8 KV
# without scales, with scales and without quantization; Qwen3.5's layout
# (text_config, model.language_model., split Gated DeltaNet projections, many
# shards) and tied embeddings load; malformed JSON, offsets past the end,
# FP8 and packed 4-bit (NVFP4, MXFP4) weights with their scales load as their
# dequantized values; overlapping or duplicated tensors, truncated files,
# quantized weights without usable scales and config fields the model does
# not compute are refused with a clear message.
set -u
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "SKIP: $py has no numpy (scripts/setup.sh installs python3-numpy)"
  exit 77
fi
st() { "$py" "$here/st_tool.py" "$@"; }
. "$(dirname "$0")/lib.sh"
# expect CODE PATTERN -- ARGS: exit status and a one-line message
expect() {
  local code="$1" pat="$2"
  shift 3
  "$bin" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ $rc -eq "$code" ] && grep -qE -- "$pat" "$work/err" "$work/out"; then ok; else
    bad "kvdrift $* -> exit $rc (want $code), want /$pat/: $(head -c 400 "$work/err")"; fi
}

"$bin" export --model tiny -o "$work/ck" >/dev/null
"$bin" forward --model tiny --tokens 200 --kv bf16,fp8-unscaled --dump "$work/syn" >/dev/null
"$bin" forward --model-dir "$work/ck" --tokens 200 --kv bf16,fp8-unscaled --dump "$work/real" >"$work/real.out"
grep -q "^weights: checkpoint $work/ck (305 tensors" "$work/real.out" && ok || bad "forward --model-dir does not say whose weights: $(sed -n 2p "$work/real.out")"
cmp -s "$work/syn/bf16/logits.f32" "$work/real/bf16/logits.f32" &&
  cmp -s "$work/syn/fp8-unscaled/logits.f32" "$work/real/fp8-unscaled/logits.f32" && ok ||
  bad "exported then loaded: logits differ from the synthetic model's"

# experts stored fused (gate_up_proj [E, 2I, H], down_proj [E, H, I]), as recent transformers writes them
cp -r "$work/ck" "$work/fused"
st fuse-experts "$work/fused"
"$bin" forward --model-dir "$work/fused" --tokens 200 --kv bf16 --dump "$work/fz" >/dev/null 2>"$work/err" &&
  cmp -s "$work/syn/bf16/logits.f32" "$work/fz/bf16/logits.f32" && ok || bad "fused experts: $(cat "$work/err")"

# the same weights stored as F32 (exact) and as F16 (rounded once more)
for dt in F32 F16; do
  cp -r "$work/ck" "$work/$dt"
  st retype "$work/$dt/model.safetensors" "$dt"
  "$bin" forward --model-dir "$work/$dt" --tokens 200 --kv bf16 --dump "$work/d$dt" >/dev/null 2>"$work/err" || bad "$dt weights: $(cat "$work/err")"
done
cmp -s "$work/syn/bf16/logits.f32" "$work/dF32/bf16/logits.f32" && ok || bad "F32 weights: logits differ"
"$py" - "$work/syn/bf16/logits.f32" "$work/dF16/bf16/logits.f32" <<'PY' && ok || bad "F16 weights: logits too far"
import sys, numpy as np
a, b = (np.fromfile(p, dtype="<f4") for p in sys.argv[1:3])
# BF16 values re-rounded to F16 (10-bit mantissa, narrower range): close, not equal
assert not np.array_equal(a, b) and np.linalg.norm(a - b) / np.linalg.norm(a) < 0.05
PY

# no quantization config: nothing switched on
expect 0 "KV cache none" -- audit "$work/ck"
"$bin" audit "$work/ck" --strict >/dev/null && ok || bad "audit --strict on an unquantized checkpoint"

# FP8 KV requested, no scales: the silent failure
cp -r "$work/ck" "$work/noscale"
printf '{"producer": {"name": "modelopt", "version": "0.31.0"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}\n' >"$work/noscale/hf_quant_config.json"
expect 1 "0 of 2 full-attention layers have k_scale and v_scale; missing in layers 3, 7" -- audit "$work/noscale" --strict
"$bin" audit "$work/noscale" --format json >"$work/a.json"
"$py" -c "
import json,sys; a=json.load(open('$work/a.json'))
assert a['fp8_kv_without_scales'] is True and a['layers_missing_kv_scales'] == [3, 7]
assert a['kv_cache_quantization'] == 'FP8' and a['kv_bytes_per_token']['fp8'] * 2 == a['kv_bytes_per_token']['bf16']
t, b = a['tokens_in_budget'], a['kv_bytes_per_token']  # whole tokens that fit
assert t['bf16'] == int(t['budget_bytes']) // b['bf16'] and t['fp8'] == int(t['budget_bytes']) // b['fp8'], (t, b)
assert 'with q_scale 1.0 (the checkpoint carries none)' in a['fp8_attention'] and '--attn-fp8' in a['fp8_attention']
assert a['layers_with_q_scales'] == 0
" && ok || bad "audit --format json"
# an FP8 cache on FlashAttention 3 computes attention in FP8 too: said for
# FP8 KV, not for a BF16 cache or a format kvdrift does not model
"$bin" audit "$work/noscale" | grep -q "^FP8 attention: on FlashAttention 3 .* kvdrift run --model-dir DIR --kv fp8-ckpt --attn-fp8 measures that too$" &&
  ! "$bin" audit "$work/ck" | grep -q "^FP8 attention" && ok || bad "audit's FP8 attention line"
expect 0 "no k_scale/v_scale; fp8-ckpt uses 1.0" -- forward --model-dir "$work/noscale" --tokens 32 --kv fp8-ckpt

# ... and fixed: calibrate writes the scales into the checkpoint as engines
# read them; audit --strict then passes, and fp8-ckpt (the checkpoint's
# scales) equals fp8-cal (the same calibration) bit for bit
cp -r "$work/noscale" "$work/fixed"
"$bin" calibrate --model-dir "$work/fixed" --into-checkpoint >"$work/out" 2>"$work/err" &&
  grep -q "wrote the scales into .*fixed (kv_scales.safetensors)" "$work/out" && ok ||
  bad "calibrate --into-checkpoint: $(cat "$work/err")"
expect 0 "2 of 2 full-attention layers have k_scale and v_scale" -- audit "$work/fixed" --strict
"$bin" forward --model-dir "$work/fixed" --tokens 64 --kv fp8-cal,fp8-ckpt --dump "$work/fx" >/dev/null 2>"$work/err" &&
  cmp -s "$work/fx/fp8-cal/logits.f32" "$work/fx/fp8-ckpt/logits.f32" && ok ||
  bad "after --into-checkpoint, fp8-ckpt differs from fp8-cal: $(cat "$work/err")"
# ... and so does a sweep's, with every calibration setting left at its
# default: calibrate and run calibrate alike
"$bin" run --model-dir "$work/fixed" --kv fp8-cal,fp8-ckpt --context 128 --concurrency 1 --cells drift \
  --gen-tokens 0 -o "$work/fixed.h5" >/dev/null 2>"$work/err" &&
  "$py" - "$work/fixed.h5" <<'PY' && ok || bad "after --into-checkpoint, run's fp8-ckpt differs from its fp8-cal: $(cat "$work/err")"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
for p, col in (("/drift/summary", "value"), ("/drift/output", "mean"), ("/drift/attention", "mean"), ("/drift/kv", None)):
    t = f[p][:]
    a, b = t[t["mode"] == b"fp8-cal"], t[t["mode"] == b"fp8-ckpt"]
    assert len(a) == len(b) > 0, p
    for name in t.dtype.names:
        if name != "mode":
            assert np.array_equal(a[name], b[name], equal_nan=t.dtype[name].kind == "f"), (p, name)
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
a, b = ts[ts["mode"] == b"fp8-cal"][0], ts[ts["mode"] == b"fp8-ckpt"][0]
assert a["n"] == b["n"] == 127 and a["trace_hash"] == b["trace_hash"]
x, y = tk[a["first"]:a["first"] + a["n"]], tk[b["first"]:b["first"] + b["n"]]
for n in x.dtype.names:  # attention is NaN where not sampled
    assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), n
PY
# the headline says so, position by position
"$bin" report "$work/fixed.h5" --format md -o "$work/fixed.md" 2>/dev/null &&
  grep -qE "^- fp8-ckpt drifts exactly as fp8-cal does: the same KL at every position \(mean output KL [0-9.e+-]*\); 99th-percentile KL ([0-9.e+-]*) against \1; top-1 agreement ([0-9.]*) against \2; experts rerouted at ([0-9.]*%) of \(position, MoE layer\) pairs against \3;" "$work/fixed.md" &&
  ok || bad "the headline of a checkpoint whose scales are fp8-cal's: $(cat "$work/fixed.md")"
expect 2 "--into-checkpoint: .*fixed: layer 3 already carries k_scale/v_scale" -- calibrate --model-dir "$work/fixed" --into-checkpoint
expect 2 "--into-checkpoint: expected --model-dir CKPT" -- calibrate --model tiny --into-checkpoint

# the same request in config.json's quantization_config (llm-compressor's form)
cp -r "$work/ck" "$work/ct"
"$py" - "$work/ct/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"] = {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
json.dump(c, open(sys.argv[1], "w"))
PY
expect 1 "config.json:quantization_config \(compressed-tensors\).*KV cache FP8" -- audit "$work/ct" --strict

# a KV cache format kvdrift does not model (ModelOpt's INT8, compressed-tensors'
# int8 or 4-bit float schemes): said so, never "no KV quantization"; --strict
# fails it (not checked), fp8-ckpt warns that it is not the engine's cache,
# and a sweep's report says it under the verdict
cp -r "$work/ck" "$work/i8"
printf '{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "INT8"}}\n' >"$work/i8/hf_quant_config.json"
expect 0 "an engine that honours this checkpoint quantizes the KV cache as INT8, a format kvdrift does not model" -- audit "$work/i8"
expect 1 "VERDICT: INT8 KV cache, which kvdrift does not model \(not checked\)" -- audit "$work/i8" --strict
"$bin" audit "$work/i8" >"$work/out" && ! grep -q "asks for no KV" "$work/out" && ok || bad "an INT8 KV cache read as none: $(cat "$work/out")"
"$bin" audit "$work/i8" --format json >"$work/a.json" && "$py" -c "
import json; a = json.load(open('$work/a.json'))
assert a['kv_cache_not_modelled'] is True and a['kv_cache_quantization'] == 'INT8' and a['fp8_kv_without_scales'] is False
assert a['fp8_attention'] is None and a['nvfp4_kv_without_scales'] is False
" && ok || bad "audit --format json on an INT8 KV cache: $(cat "$work/a.json")"
"$bin" audit "$work/fixed" --format json >"$work/a.json" && "$py" -c "
import json; a = json.load(open('$work/a.json')); assert a['kv_cache_not_modelled'] is False" && ok || bad "kv_cache_not_modelled on an FP8 checkpoint"
expect 0 "i8: the checkpoint asks for the KV cache format INT8, which kvdrift does not model: fp8-ckpt is an FP8 cache" -- forward --model-dir "$work/i8" --tokens 8 --kv fp8-ckpt

# an NVFP4 KV cache (ModelOpt's kv_cache_quant_algo "NVFP4") without scales:
# the engines' global scale 1.0, the same silent failure; nvfp4-ckpt runs
# that cache, which is nvfp4-unscaled's at every position, and fp8-ckpt
# says it is another format. With scales, nvfp4-ckpt takes them as they are.
cp -r "$work/ck" "$work/nv4"
printf '{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}}\n' >"$work/nv4/hf_quant_config.json"
expect 0 "an engine that honours this checkpoint switches the KV cache to NVFP4 because kv_cache_quant_algo is NVFP4, finds no k_scale/v_scale" -- audit "$work/nv4"
expect 1 "VERDICT: NVFP4 KV cache without scales \(silent scale 1.0\)" -- audit "$work/nv4" --strict
"$bin" audit "$work/nv4" --format json >"$work/a.json" && "$py" -c "
import json; a = json.load(open('$work/a.json'))
assert a['kv_cache_not_modelled'] is False and a['kv_cache_quantization'] == 'NVFP4'
assert a['nvfp4_kv_without_scales'] is True and a['fp8_kv_without_scales'] is False
assert a['fp8_attention'] is None and a['layers_missing_kv_scales'] == [3, 7]
b = a['kv_bytes_per_token']  # tiny: 2 layers x 2 KV heads x (64 / 2 + 64 / 16) bytes, K and V
assert b['nvfp4'] == 2 * 2 * 2 * (64 // 2 + 64 // 16) and b['fp8'] == 2 * 2 * 2 * 64, b
" && ok || bad "audit --format json on an NVFP4 KV cache without scales: $(cat "$work/a.json")"
expect 0 "nv4: the checkpoint asks for an NVFP4 KV cache: nvfp4-ckpt is the cache an engine would run, fp8-ckpt another format" -- forward --model-dir "$work/nv4" --tokens 8 --kv fp8-ckpt
"$bin" run --model-dir "$work/nv4" --kv bf16,nvfp4-ckpt,nvfp4-unscaled --context 64 --cells drift --gen-tokens 0 -o "$work/nv4.h5" >/dev/null 2>"$work/err" &&
  "$py" - "$work/nv4.h5" <<'PY' && ok || bad "nvfp4-ckpt without scales is not nvfp4-unscaled: $(cat "$work/err")"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
ts, t = f["drift/token_sets"][:], f["drift/tokens"][:]
def kl(m):
    r = ts[ts["mode"] == m][0]
    return t["kl"][r["first"]:r["first"] + r["n"]]
a, b = kl(b"nvfp4-ckpt"), kl(b"nvfp4-unscaled")
assert len(a) > 0 and np.array_equal(a, b) and a.max() > 0
PY
"$bin" report "$work/nv4.h5" --format md 2>/dev/null | grep -q "nv4: the checkpoint asks for an NVFP4 KV cache (hf_quant_config.json) without k_scale/v_scale in layers 3, 7: an engine uses 1.0 there, as nvfp4-ckpt does" && ok ||
  bad "the report over an NVFP4-KV checkpoint without scales: $("$bin" report "$work/nv4.h5" --format md 2>&1 | head -20)"
# ... and fixed: calibrate writes NVFP4 global scales (the FP8 ones over 6),
# audit --strict passes, and nvfp4-ckpt is nvfp4-cal bit for bit
cp -r "$work/nv4" "$work/nv4fix"
"$bin" calibrate --model-dir "$work/nv4fix" --into-checkpoint >"$work/out" 2>"$work/err" &&
  grep -q "the checkpoint asks for an NVFP4 KV cache: it got them as NVFP4 global scales, over 6" "$work/out" && ok ||
  bad "calibrate --into-checkpoint on an NVFP4 checkpoint: $(cat "$work/err" "$work/out")"
expect 0 "2 of 2 full-attention layers have k_scale and v_scale" -- audit "$work/nv4fix" --strict
"$bin" run --model-dir "$work/nv4fix" --kv nvfp4-cal,nvfp4-ckpt --context 128 --concurrency 1 --cells drift \
  --gen-tokens 0 -o "$work/nv4fix.h5" >/dev/null 2>"$work/err" &&
  "$py" - "$work/nv4fix.h5" <<'PY' && ok || bad "after --into-checkpoint, nvfp4-ckpt differs from nvfp4-cal: $(cat "$work/err")"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
k = f["/drift/kv"][:]
a, b = k[k["mode"] == b"nvfp4-cal"], k[k["mode"] == b"nvfp4-ckpt"]
assert len(a) == len(b) > 0
for n in ("k_scale", "v_scale", "k_flushed_frac", "v_flushed_frac", "v_subnormal_frac"):
    assert np.array_equal(a[n], b[n]), n
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
a, b = ts[ts["mode"] == b"nvfp4-cal"][0], ts[ts["mode"] == b"nvfp4-ckpt"][0]
x, y = tk[a["first"]:a["first"] + a["n"]], tk[b["first"]:b["first"] + b["n"]]
assert a["n"] == b["n"] == 127 and x["kl"].max() > 0
for n in x.dtype.names:  # attention is NaN where not sampled
    assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), n
PY

for scheme in 'int:8:INT8' 'float:4:FP4'; do
  IFS=: read -r ty bits name <<<"$scheme"
  cp -r "$work/ct" "$work/ct-$name"
  "$py" - "$work/ct-$name/config.json" "$ty" "$bits" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"]["kv_cache_scheme"].update(type=sys.argv[2], num_bits=int(sys.argv[3]))
json.dump(c, open(sys.argv[1], "w"))
PY
  expect 1 "VERDICT: $name KV cache, which kvdrift does not model" -- audit "$work/ct-$name" --strict
done
"$bin" run --model-dir "$work/i8" --kv bf16,fp8-ckpt --context 64 --cells drift --gen-tokens 0 -o "$work/i8.h5" >/dev/null 2>&1 &&
  "$bin" report "$work/i8.h5" --format md 2>/dev/null | grep -q "i8: the checkpoint asks for an INT8 KV cache (hf_quant_config.json), a format kvdrift does not model: fp8-ckpt is an FP8 cache" && ok ||
  bad "the report over an INT8-KV checkpoint does not say it is not modelled"

# with scales: a second shard and an index; fp8-ckpt uses exactly them
cp -r "$work/noscale" "$work/scaled"
st add-scales "$work/scaled" 3:0.75:0.0002 7:1.5:0.0001
# the same scales under an NVFP4 KV config: nvfp4-ckpt's global scales, as they are
cp -r "$work/scaled" "$work/nv4s"
cp "$work/nv4/hf_quant_config.json" "$work/nv4s/"
expect 0 "switches the KV cache to NVFP4 and takes the checkpoint's k_scale/v_scale as each full-attention layer's global scales" -- audit "$work/nv4s" --strict
"$bin" run --model-dir "$work/nv4s" --kv bf16,nvfp4-ckpt --context 64 --cells drift --gen-tokens 0 -o "$work/nv4s.h5" >/dev/null 2>"$work/err" &&
  "$py" - "$work/nv4s.h5" <<'PY' && ok || bad "nvfp4-ckpt with the checkpoint's scales: $(cat "$work/err")"
import sys, h5py, numpy as np
k = h5py.File(sys.argv[1], "r")["drift/kv"][:]
k = k[k["mode"] == b"nvfp4-ckpt"]
for layer, ks, vs in ((3, 0.75, 0.0002), (7, 1.5, 0.0001)):
    r = k[k["layer"] == layer]
    assert len(r) and np.all(r["k_scale"] == np.float32(ks)) and np.all(r["v_scale"] == np.float32(vs)), r
PY
expect 0 "2 of 2 full-attention layers have k_scale and v_scale" -- audit "$work/scaled" --strict
expect 2 "--into-checkpoint: .*scaled: layer 3 already carries k_scale/v_scale" -- calibrate --model-dir "$work/scaled" --into-checkpoint
printf '{"format": "kvdrift-kv-scales", "version": 1, "granularity": "per-layer", "layers": [{"k_scale": [0.75, 0.75], "v_scale": [0.0002, 0.0002]}, {"k_scale": [1.5, 1.5], "v_scale": [0.0001, 0.0001]}]}' >"$work/same.json"
"$bin" forward --model-dir "$work/scaled" --tokens 200 --kv fp8-cal,fp8-ckpt --scales "$work/same.json" --dump "$work/sc" >/dev/null 2>"$work/err" &&
  cmp -s "$work/sc/fp8-cal/logits.f32" "$work/sc/fp8-ckpt/logits.f32" &&
  ! cmp -s "$work/sc/fp8-ckpt/logits.f32" "$work/real/fp8-unscaled/logits.f32" && ok ||
  bad "fp8-ckpt with the checkpoint's scales differs from fp8-cal with the same scales: $(cat "$work/err")"

# the other names engines read KV scales under: Quark's k_proj.output_scale,
# the engines' own attn.k_scale, and the deprecated kv_scale that serves K
# and V alike; fp8-ckpt uses exactly them
for style in quark attn legacy; do
  cp -r "$work/noscale" "$work/sc-$style"
  st add-scales-as $style "$work/sc-$style" 3:0.75:0.0002 7:1.5:0.0001
  expect 0 "2 of 2 full-attention layers have k_scale and v_scale" -- audit "$work/sc-$style" --strict
  v3=0.0002 v7=0.0001
  [ $style = legacy ] && v3=0.75 v7=1.5
  printf '{"format": "kvdrift-kv-scales", "version": 1, "granularity": "per-layer", "layers": [{"k_scale": [0.75, 0.75], "v_scale": [%s, %s]}, {"k_scale": [1.5, 1.5], "v_scale": [%s, %s]}]}' $v3 $v3 $v7 $v7 >"$work/same-$style.json"
  "$bin" forward --model-dir "$work/sc-$style" --tokens 64 --kv fp8-cal,fp8-ckpt --scales "$work/same-$style.json" --dump "$work/scs" >/dev/null 2>"$work/err" &&
    cmp -s "$work/scs/fp8-cal/logits.f32" "$work/scs/fp8-ckpt/logits.f32" && ok ||
    bad "KV scales named as $style: fp8-ckpt differs from fp8-cal with the same scales: $(cat "$work/err")"
done

# FP8 attention's query scales from the checkpoint, under each name engines
# load them as (llm-compressor's self_attn.q_scale, Quark's
# q_proj.output_scale, attn.q_scale): fp8-ckpt --attn-fp8 computes exactly
# what fp8-cal does with the same K, V and query scales in a scales file,
# and they change the logits (per layer here, per query head in layer 7)
printf '{"format": "kvdrift-kv-scales", "version": 1, "granularity": "per-head", "layers": [{"k_scale": [0.75, 0.75], "v_scale": [0.0002, 0.0002], "q_scale": [0.02, 0.02, 0.02, 0.02]}, {"k_scale": [1.5, 1.5], "v_scale": [0.0001, 0.0001], "q_scale": [0.01, 0.02, 0.03, 0.04]}]}' >"$work/same-q.json"
for style in modelopt quark attn; do
  cp -r "$work/noscale" "$work/q-$style"
  st add-scales-as $style "$work/q-$style" 3:0.75:0.0002:0.02 7:1.5:0.0001:0.01,0.02,0.03,0.04
  "$bin" forward --model-dir "$work/q-$style" --tokens 64 --kv fp8-cal,fp8-ckpt --scales "$work/same-q.json" --attn-fp8 --dump "$work/qs-$style" >/dev/null 2>"$work/err" &&
    cmp -s "$work/qs-$style/fp8-cal/logits.f32" "$work/qs-$style/fp8-ckpt/logits.f32" && ok ||
    bad "query scales named as $style: fp8-ckpt --attn-fp8 differs from fp8-cal with the same scales: $(cat "$work/err")"
done
"$bin" forward --model-dir "$work/sc-quark" --tokens 64 --kv fp8-ckpt --attn-fp8 --dump "$work/qs-none" >/dev/null 2>&1 &&
  ! cmp -s "$work/qs-none/fp8-ckpt/logits.f32" "$work/qs-quark/fp8-ckpt/logits.f32" && ok ||
  bad "the checkpoint's query scales do not change fp8-ckpt's FP8 attention"
"$bin" audit "$work/q-quark" --format json >"$work/aq.json"
"$bin" audit "$work/sc-quark" --format json >"$work/an.json"
cp -r "$work/noscale" "$work/q-half"
st add-scales-as quark "$work/q-half" 3:0.75:0.0002:0.02 7:1.5:0.0001
"$bin" audit "$work/q-half" --format json >"$work/ah.json"
"$py" - "$work/aq.json" "$work/an.json" "$work/ah.json" <<'PY' && ok || bad "audit's query scales"
import json, sys
q, n, h = (json.load(open(p)) for p in sys.argv[1:4])
assert (q['layers_with_q_scales'], n['layers_with_q_scales'], h['layers_with_q_scales']) == (2, 0, 1)
assert "with the checkpoint's q_scale (every full-attention layer has one)" in q['fp8_attention']
assert 'with q_scale 1.0 (the checkpoint carries none)' in n['fp8_attention']
assert "with the checkpoint's q_scale in 1 of 2 full-attention layers and 1.0 in the others" in h['fp8_attention']
assert '--kv fp8-ckpt --attn-fp8' in q['fp8_attention']
PY
# the checkpoint's digest covers its query scales: a sweep run over them is
# not resumed over others, even where they sit in a large shard whose
# values the digest only samples (one byte of layer 3's q scale changed)
cp -r "$work/q-quark" "$work/q-merged"
st merge-into-model "$work/q-merged" kv_scales.safetensors
"$bin" run --model-dir "$work/q-merged" --kv fp8-ckpt --attn-fp8 --context 64 --cells drift --gen-tokens 0 -o "$work/q-run.h5" >/dev/null 2>&1 || bad "run --model-dir with query scales failed"
st poke "$work/q-merged/model.safetensors" model.layers.3.self_attn.q_proj.output_scale 2 0xb3
expect 2 "q-run.h5 holds cells of other weights" -- run --model-dir "$work/q-merged" --kv fp8-ckpt --attn-fp8 --context 64 --cells drift --gen-tokens 0 -o "$work/q-run.h5"
# query scales that cannot be: the file, the tensor and what was expected
cp -r "$work/noscale" "$work/q-bad"
st add-scales-as quark "$work/q-bad" 3:0.75:0.0002:0.02,0.02,0.02 7:1.5:0.0001:0.02
expect 2 "kv_scales.safetensors: model.layers.3.self_attn.q_proj.output_scale: 3 values, expected 1 or 4 \(per query head\)" -- forward --model-dir "$work/q-bad" --tokens 16 --kv fp8-ckpt --attn-fp8
st add-scales-as quark "$work/q-bad" 3:0.75:0.0002:0.02 7:1.5:0.0001:-1
expect 2 "model.layers.7.self_attn.q_proj.output_scale: expected positive finite scales, got -1" -- forward --model-dir "$work/q-bad" --tokens 16 --kv fp8-ckpt

# a sweep over a checkpoint resumes only over the same contents: scales
# re-calibrated in place (same files, same headers) are another sweep
"$bin" run --model-dir "$work/scaled" --kv bf16,fp8-ckpt --context 64 --concurrency 1 --gen-tokens 0 \
  --decode-tokens 2 -o "$work/ck-run.h5" >/dev/null 2>&1 || bad "run --model-dir failed"
expect 0 "resuming .*ck-run.h5: 4 cells already finished" -- run --model-dir "$work/scaled" --kv bf16,fp8-ckpt --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/ck-run.h5"
cp "$work/ck-run.h5" "$work/ck-run.before"
st add-scales "$work/scaled" 3:0.5:0.0002 7:1.5:0.0001
expect 2 "ck-run.h5 holds cells of other weights \(their contents fnv1a64:[0-9a-f]{16}, this run's fnv1a64:[0-9a-f]{16}\)" -- run --model-dir "$work/scaled" --kv bf16,fp8-ckpt --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/ck-run.h5"
cmp -s "$work/ck-run.h5" "$work/ck-run.before" && ok || bad "a refused resume changed the results file"
st add-scales "$work/scaled" 3:0.75:0.0002 7:1.5:0.0001
# ... and so are weights rewritten in place with the same layout (a fine-tune
# saved over its base: the same headers, other values)
expect 0 "resuming .*ck-run.h5: 4 cells already finished" -- run --model-dir "$work/scaled" --kv bf16,fp8-ckpt --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/ck-run.h5"
cp "$work/scaled/model.safetensors" "$work/base.safetensors"
st nudge "$work/scaled/model.safetensors"
expect 2 "ck-run.h5 holds cells of other weights \(their contents fnv1a64:[0-9a-f]{16}, this run's fnv1a64:[0-9a-f]{16}\)" -- run --model-dir "$work/scaled" --kv bf16,fp8-ckpt --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/ck-run.h5"
cp "$work/base.safetensors" "$work/scaled/model.safetensors"

# malformed JSON
cp -r "$work/ck" "$work/badjson"
printf '{"quantization": {"kv_cache_quant_algo": "FP8",}}\n' >"$work/badjson/hf_quant_config.json"
expect 2 "hf_quant_config.json: line 1, column" -- audit "$work/badjson"

# hostile and damaged safetensors
cp -r "$work/ck" "$work/past"
# Qwen3.5's layout (multimodal config with text_config and rope_parameters,
# the language model under model.language_model., split Gated DeltaNet
# projections, vision and MTP tensors, 70 shards): the same logits, bit for bit
st qwen35 "$work/ck" "$work/q35" 70
"$bin" forward --model-dir "$work/q35" --tokens 200 --kv bf16,fp8-unscaled --dump "$work/q35d" >/dev/null 2>"$work/err" &&
  cmp -s "$work/syn/bf16/logits.f32" "$work/q35d/bf16/logits.f32" &&
  cmp -s "$work/syn/fp8-unscaled/logits.f32" "$work/q35d/fp8-unscaled/logits.f32" && ok ||
  bad "Qwen3.5 layout: logits differ from the synthetic model's: $(cat "$work/err")"
expect 0 "weights: BF16/F16/F32, loadable with --model-dir" -- audit "$work/q35"
# scales written into a sharded Qwen3.5 checkpoint: under its prefix, one
# per KV head, listed in its index
cp -r "$work/q35" "$work/q35-fixed"
"$bin" calibrate --model-dir "$work/q35-fixed" --per-head --into-checkpoint >/dev/null 2>"$work/err" || bad "calibrate --into-checkpoint (Qwen3.5): $(cat "$work/err")"
grep -q '"model.language_model.layers.3.self_attn.k_proj.k_scale": "kv_scales.safetensors"' "$work/q35-fixed/model.safetensors.index.json" && ok || bad "the index does not list the new scales"
expect 0 "2 of 2 full-attention layers have k_scale and v_scale \(per KV head\)" -- audit "$work/q35-fixed"
"$bin" forward --model-dir "$work/q35-fixed" --tokens 64 --kv fp8-cal,fp8-ckpt --per-head --dump "$work/fx" >/dev/null 2>"$work/err" &&
  cmp -s "$work/fx/fp8-cal/logits.f32" "$work/fx/fp8-ckpt/logits.f32" && ok ||
  bad "Qwen3.5, after --into-checkpoint --per-head, fp8-ckpt differs from fp8-cal: $(cat "$work/err")"
cp -r "$work/q35" "$work/q35-stray"
: >"$work/q35-stray/kv_scales.safetensors" # not in the index: never read, but would be replaced
expect 2 "--into-checkpoint: .*q35-stray/kv_scales.safetensors: already there" -- calibrate --model-dir "$work/q35-stray" --into-checkpoint
cp -r "$work/q35" "$work/q35-noz"
st drop "$work/q35-noz" model.language_model.layers.0.linear_attn.in_proj_z.weight
expect 2 "q35-noz: tensor model.layers.0.linear_attn.in_proj_z.weight is missing \(the split form of model.layers.0.linear_attn.in_proj_qkvz.weight has in_proj_qkv, not in_proj_z\)" -- forward --model-dir "$work/q35-noz" --tokens 8
expect 0 "weights: not loadable with --model-dir: tensor model.layers.0.linear_attn.in_proj_z.weight is missing" -- audit "$work/q35-noz"
cp -r "$work/q35" "$work/q35-nonorm"
st drop "$work/q35-nonorm" model.language_model.norm.weight
expect 2 "tensor model.norm.weight is missing \(the config asks for it\)" -- forward --model-dir "$work/q35-nonorm" --tokens 8
cp -r "$work/q35" "$work/q35-dup"
st dup "$work/q35-dup" model.language_model.layers.3.self_attn.k_proj.weight
expect 2 "q35-dup: tensor model.language_model.layers.3.self_attn.k_proj.weight is in both .*/(extra|model-00015-of-00070).safetensors and .*/(extra|model-00015-of-00070).safetensors" -- forward --model-dir "$work/q35-dup" --tokens 8
# tied embeddings: without lm_head.weight the embedding is the output
# projection, so the logits equal an untied checkpoint whose lm_head is a copy
cp -r "$work/ck" "$work/copied"
st lm-head-is-embed "$work/copied"
cp -r "$work/copied" "$work/tied"
st tie "$work/tied"
"$bin" forward --model-dir "$work/copied" --tokens 64 --kv bf16 --dump "$work/copiedd" >/dev/null 2>&1
"$bin" forward --model-dir "$work/tied" --tokens 64 --kv bf16 --dump "$work/tiedd" >"$work/out" 2>"$work/err" &&
  grep -q "(304 tensors" "$work/out" && cmp -s "$work/copiedd/bf16/logits.f32" "$work/tiedd/bf16/logits.f32" &&
  ! cmp -s "$work/real/bf16/logits.f32" "$work/tiedd/bf16/logits.f32" && ok ||
  bad "tied embeddings: $(cat "$work/err") $(sed -n 2p "$work/out")"
# config.json fields the model does not compute are refused by name
cfgcase() { # NAME KEY JSON_VALUE PATTERN
  cp -r "$work/ck" "$work/$1"
  st config "$work/$1" "$2" "$3"
  expect 2 "$4" -- forward --model-dir "$work/$1" --tokens 8
}
cfgcase llama model_type '"llama"' "config.json: field 'model_type': expected qwen3_next, qwen3_5_moe or qwen3_5 .*got \"llama\""
cfgcase bias attention_bias true "field 'attention_bias': true is not supported"
cfgcase yarn rope_scaling '{"rope_type": "yarn", "factor": 4.0}' "rope_type': \"yarn\" is not supported"
cfgcase gelu hidden_act '"gelu"' "field 'hidden_act': expected \"silu\", got \"gelu\""
cfgcase mixed mlp_only_layers '[0, 1]' "dense layers among MoE ones are not supported"

st past-end "$work/past/model.safetensors"
expect 2 "model.safetensors: tensor .*: data_offsets .* outside the .* data bytes" -- forward --model-dir "$work/past" --tokens 8
expect 2 "data_offsets" -- audit "$work/past"
cp -r "$work/ck" "$work/overlap"
st overlap "$work/overlap/model.safetensors"
expect 2 "model.safetensors: tensors .* and .* overlap|bytes for" -- forward --model-dir "$work/overlap" --tokens 8
cp -r "$work/ck" "$work/cut"
head -c 4 "$work/ck/model.safetensors" >"$work/cut/model.safetensors"
expect 2 "model.safetensors: truncated" -- forward --model-dir "$work/cut" --tokens 8
head -c 100000 "$work/ck/model.safetensors" >"$work/cut/model.safetensors"
expect 2 "model.safetensors: tensor .*: data_offsets|header length" -- forward --model-dir "$work/cut" --tokens 8
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2, 3]}' >"$work/cut/model.safetensors"
expect 2 "model.safetensors: tensor a: expected a shape|unknown dtype" -- forward --model-dir "$work/cut" --tokens 8
cp -r "$work/ck" "$work/fp8w"
st fp8-weight "$work/fp8w/model.safetensors" model.layers.0.linear_attn.out_proj.weight
expect 2 "model.layers.0.linear_attn.out_proj.weight is F8_E4M3 without its scale: FP8 weights are read as 2-D matrices with a .*out_proj.weight_scale_inv or .*out_proj.weight_scale beside them" -- forward --model-dir "$work/fp8w" --tokens 8
expect 0 "weights: not loadable with --model-dir: .*out_proj.weight is F8_E4M3 without its scale" -- audit "$work/fp8w"
cp -r "$work/ck" "$work/u8w"
st fp8-weight "$work/u8w/model.safetensors" model.layers.0.linear_attn.out_proj.weight U8
expect 2 "model.layers.0.linear_attn.out_proj.weight is U8: integer or packed 4-bit values are not loaded as weights without their scales" -- forward --model-dir "$work/u8w" --tokens 8
expect 0 "weights: not loadable with --model-dir: .*out_proj.weight is U8: integer" -- audit "$work/u8w"
# FP8 weights with their scales (per 64 x 64 block as quantization_config
# says, per row, per tensor) are dequantized on load: the logits equal, bit
# for bit, those of the same checkpoint holding the dequantized values in F32
"$bin" forward --model-dir "$work/ck" --tokens 64 --kv bf16 --dump "$work/real64" >/dev/null
# dequant_same WHAT CKPT REF KV_MODES: forward over a quantized checkpoint
# gives, mode by mode, the logits of forward over REF (its dequantized
# values in F32), bit for bit, and the quantization did change them
dequant_same() {
  local what="$1" a="$2" b="$3" kv="$4" m same=1
  rm -rf "$work/dqa" "$work/dqb"
  "$bin" forward --model-dir "$a" --tokens 64 --kv "$kv" --dump "$work/dqa" >/dev/null 2>"$work/err" &&
    "$bin" forward --model-dir "$b" --tokens 64 --kv "$kv" --dump "$work/dqb" >/dev/null 2>>"$work/err" || same=0
  for m in ${kv//,/ }; do cmp -s "$work/dqa/$m/logits.f32" "$work/dqb/$m/logits.f32" || same=0; done
  [ $same = 1 ] && ! cmp -s "$work/dqa/bf16/logits.f32" "$work/real64/bf16/logits.f32" && ok ||
    bad "$what: logits differ from the dequantized checkpoint's, or equal the unquantized one's: $(cat "$work/err")"
}
for mode in block64 channel tensor; do
  cp -r "$work/ck" "$work/fp8-$mode"
  st fp8-quantize "$work/fp8-$mode" $mode "$work/fp8-$mode-ref"
  dequant_same "FP8 weights ($mode)" "$work/fp8-$mode" "$work/fp8-$mode-ref" bf16,fp8-unscaled
  expect 0 "weights: [0-9]+ FP8 tensors with their scales \(dequantized to FP32 on load\)" -- audit "$work/fp8-$mode"
done
# the same in Qwen3.5's layout: the split Gated DeltaNet projections are
# dequantized part by part, row ranges across block boundaries
cp -r "$work/q35" "$work/fp8-q35"
st fp8-quantize "$work/fp8-q35" block64 "$work/fp8-q35-ref"
dequant_same "FP8 weights in Qwen3.5's layout" "$work/fp8-q35" "$work/fp8-q35-ref" bf16
# The whole story on an FP8 checkpoint (FP8 weights with block scales, ModelOpt
# asks for an FP8 KV cache, no KV scales): audit --strict fails it, and a
# sweep over it shows the cache an engine would use (fp8-ckpt: scale 1.0)
# drifting further from BF16 than a calibrated one
cp -r "$work/fp8-block64" "$work/story"
cp "$work/noscale/hf_quant_config.json" "$work/story/"
expect 1 "VERDICT: FP8 KV cache without scales" -- audit "$work/story" --strict
expect 0 "FP8 tensors with their scales" -- audit "$work/story"
"$bin" run --model-dir "$work/story" --kv bf16,fp8-ckpt,fp8-cal --context 512 --cells drift \
  -o "$work/story.h5" >/dev/null 2>"$work/err" &&
  "$py" -c "
import h5py, sys
s = h5py.File('$work/story.h5')['drift/summary'][:]
kl = {m: float(s[(s['mode'] == m.encode()) & (s['subset'] == b'all') & (s['metric'] == b'kl_mean')]['value'][0])
      for m in ('bf16', 'fp8-ckpt', 'fp8-cal')}
print('story kl_mean', kl)
sys.exit(0 if kl['bf16'] == 0 and kl['fp8-ckpt'] > 1.5 * kl['fp8-cal'] > 0 else 1)" >"$work/out" && ok ||
  bad "FP8 checkpoint without KV scales: fp8-ckpt should drift more than fp8-cal: $(cat "$work/out" "$work/err")"

# the same with power-of-two block scales stored as F8_E8M0 (UE8M0)
cp -r "$work/ck" "$work/fp8-e8"
st fp8-quantize "$work/fp8-e8" block64-ue8m0 "$work/fp8-e8-ref"
dequant_same "FP8 weights with F8_E8M0 block scales" "$work/fp8-e8" "$work/fp8-e8-ref" bf16

# Packed 4-bit weights (E2M1 codes two to a byte) with their scales:
# ModelOpt's NVFP4 (NAME_scale per 16 values times NAME_scale_2),
# compressed-tensors' NVFP4 (NAME_packed, NAME_scale / NAME_global_scale) and
# MXFP4 (a U8 E8M0 scale per 32 values) are dequantized on load: the logits
# equal, bit for bit, those of the checkpoint holding the values in F32
for mode in modelopt compressed mxfp4; do
  cp -r "$work/ck" "$work/fp4-$mode"
  st fp4-quantize "$work/fp4-$mode" $mode "$work/fp4-$mode-ref"
  dequant_same "packed 4-bit weights ($mode)" "$work/fp4-$mode" "$work/fp4-$mode-ref" bf16,fp8-unscaled
  # and the weights themselves, as export --dtype f32 writes what was loaded
  "$bin" export --model-dir "$work/fp4-$mode" --dtype f32 -o "$work/fp4x" >/dev/null 2>"$work/err" &&
    st same-values "$work/fp4x/model.safetensors" "$work/fp4-$mode-ref/model.safetensors" >"$work/out" 2>&1 && ok ||
    bad "packed 4-bit weights ($mode): export --dtype f32 differs from the dequantized values: $(cat "$work/err" "$work/out")"
  expect 0 "weights: [0-9]+ packed 4-bit \(NVFP4/MXFP4\) tensors with their scales" -- audit "$work/fp4-$mode"
done
# compressed-tensors' names in Qwen3.5's layout: the split projections'
# NAME_packed parts, in many shards
cp -r "$work/q35" "$work/fp4-q35"
st fp4-quantize "$work/fp4-q35" compressed "$work/fp4-q35-ref"
dequant_same "NVFP4 weights in Qwen3.5's layout" "$work/fp4-q35" "$work/fp4-q35-ref" bf16
# ModelOpt's NVFP4 export asks for an FP8 KV cache: without KV scales,
# audit --strict fails it
expect 1 "VERDICT: FP8 KV cache without scales" -- audit "$work/fp4-modelopt" --strict
expect 0 "weights NVFP4, KV cache FP8" -- audit "$work/fp4-modelopt"
# what is refused, and how it is named
p=model.layers.0.linear_attn.out_proj
cp -r "$work/fp4-modelopt" "$work/fp4-bad"
st rm "$work/fp4-bad/model.safetensors" $p.weight_scale_2
expect 2 "$p.weight is NVFP4 without its second-level scale: expected $p.weight_scale_2 \(ModelOpt\) or $p.weight_global_scale \(compressed-tensors\)" -- forward --model-dir "$work/fp4-bad" --tokens 8
st rm "$work/fp4-bad/model.safetensors" $p.weight_scale
expect 2 "$p.weight is U8 \[128, 64\] \(packed 4-bit\) without its scale: NVFP4 and MXFP4 weights are read as 2-D matrices with $p.weight_scale beside them" -- forward --model-dir "$work/fp4-bad" --tokens 8
expect 0 "weights: not loadable with --model-dir: .*$p.weight is U8 \[128, 64\] \(packed 4-bit\) without its scale" -- audit "$work/fp4-bad"
cp -r "$work/fp4-modelopt" "$work/fp4-bad2"
st retag "$work/fp4-bad2/model.safetensors" $p.weight_scale F8_E4M3 '[128, 4]'
expect 2 "tensor $p.weight_scale: F8_E4M3 \[128, 4\], expected F8_E4M3 \[128, 8\] \(NVFP4, one scale per 16 values\) or U8 / F8_E8M0 \[128, 4\] \(MXFP4, one per 32\) for the packed 4-bit $p.weight" -- forward --model-dir "$work/fp4-bad2" --tokens 8
cp -r "$work/fp4-modelopt" "$work/fp4-nan"
st poke "$work/fp4-nan/model.safetensors" $p.weight_scale 5 0x7f
expect 2 "tensor $p.weight_scale: value 5 is nan, expected a finite scale" -- forward --model-dir "$work/fp4-nan" --tokens 8
# an F4 tensor that is no 2-D matrix (a norm's weight) is no packed weight
cp -r "$work/ck" "$work/f4norm"
st retag "$work/f4norm/model.safetensors" model.norm.weight F4 '[128]'
expect 2 "tensor model.norm.weight is F4: integer or packed 4-bit values are not loaded as weights without their scales" -- forward --model-dir "$work/f4norm" --tokens 8
cp -r "$work/fused" "$work/fp4-fused"
st retag "$work/fp4-fused/model.safetensors" model.layers.0.mlp.experts.gate_up_proj U8 '[8, 64, 64]'
expect 2 "tensor model.layers.0.mlp.experts.gate_up_proj is U8: packed 4-bit experts are read one expert at a time" -- forward --model-dir "$work/fp4-fused" --tokens 8

# Scales that are there but 1.0: ModelOpt's export clamps FP8 KV scales to
# at least 1.0, so on this model (K outliers up to ~1000, V under 0.1) every
# V scale it writes is 1.0 and V lands in E4M3's subnormals as without
# scales. calibrate --calibration modelopt writes such a checkpoint; audit
# --strict fails it, naming the side; a sweep shows the cost (its K scales
# are fp8-cal's, absmax / 448 > 1, so only V differs between the two)
cp -r "$work/noscale" "$work/mo"
"$bin" calibrate --model-dir "$work/mo" --calibration modelopt --into-checkpoint >/dev/null 2>"$work/err" || bad "calibrate --calibration modelopt --into-checkpoint: $(cat "$work/err")"
expect 1 "VERDICT: FP8 KV cache with every V scale 1.0 \(the same as without scales\)" -- audit "$work/mo" --strict
expect 0 "KV scale values: K [0-9.]+ to [0-9.]+, V 1 to 1; 0 of 2 K and 2 of 2 V scales are exactly 1.0" -- audit "$work/mo"
expect 0 "mo: every V scale the checkpoint carries is 1.0 \(ModelOpt clamps KV scales to at least 1.0\): fp8-ckpt writes V as without scales" -- forward --model-dir "$work/mo" --tokens 16 --kv fp8-ckpt
"$bin" audit "$work/mo" --format json >"$work/a.json" && "$py" -c "
import json; a = json.load(open('$work/a.json'))
assert a['fp8_kv_scales_all_one'] == 'v' and a['kv_scales_exactly_one'] == {'k': 0, 'v': 2}
assert a['kv_scale_range']['v'] == [1.0, 1.0] and a['kv_scale_range']['k'][0] > 1 and a['bad_kv_scale'] == ''
" && ok || bad "audit --format json on scales of 1.0: $(cat "$work/a.json")"
"$bin" run --model-dir "$work/mo" --kv bf16,fp8-ckpt,fp8-cal --context 512 --cells drift \
  -o "$work/mo.h5" >/dev/null 2>"$work/err" &&
  "$py" -c "
import h5py, sys
f = h5py.File('$work/mo.h5')
s, kv = f['drift/summary'][:], f['drift/kv'][:]
kl = {m: float(s[(s['mode'] == m.encode()) & (s['subset'] == b'all') & (s['metric'] == b'kl_mean')]['value'][0])
      for m in ('fp8-ckpt', 'fp8-cal')}
vf = {m: float(kv[kv['mode'] == m.encode()]['v_flushed_frac'].mean()) for m in ('fp8-ckpt', 'fp8-cal')}
print('modelopt scales: kl_mean', kl, 'v_flushed_frac', vf)
ks = {m: kv[kv['mode'] == m.encode()]['k_scale'] for m in ('fp8-ckpt', 'fp8-cal')}
assert (ks['fp8-ckpt'] == ks['fp8-cal']).all() and (ks['fp8-cal'] > 1).all(), ks
sys.exit(0 if kl['fp8-ckpt'] > 1.1 * kl['fp8-cal'] > 0 and vf['fp8-ckpt'] > 0.05 > 100 * vf['fp8-cal'] else 1)" >"$work/out" && ok ||
  bad "ModelOpt-clamped scales: fp8-ckpt should flush V and drift more than fp8-cal: $(cat "$work/out" "$work/err")"
# the results file keeps what audit said of the checkpoint, and the report
# says it beside the verdict
"$py" -c "
import h5py, json; a = json.loads(h5py.File('$work/mo.h5').attrs['checkpoint_audit'])
assert a['fp8_kv_scales_all_one'] == 'v' and a['kv_cache_quantization'] == 'FP8', a
" && "$bin" report "$work/mo.h5" --format md | grep -q "^mo: the checkpoint asks for an FP8 KV cache (hf_quant_config.json); every V scale it carries is 1.0 (ModelOpt clamps KV scales to at least 1.0): fp8-ckpt, what an engine runs, writes V as without scales.$" &&
  "$bin" report "$work/story.h5" --format md | grep -q "^story: the checkpoint asks for an FP8 KV cache (hf_quant_config.json) without k_scale/v_scale in layers 3, 7: an engine uses 1.0 there, as fp8-ckpt does" &&
  "$bin" report "$work/mo.h5" -o "$work/mo.html" 2>/dev/null && grep -q "checkpoint audit:" "$work/mo.html" && ok ||
  bad "checkpoint_audit: not in the results file, or not in its report"
# ... and replaced: calibrate --into-checkpoint --replace removes the
# placeholders and writes calibrated scales; audit --strict then passes and
# fp8-ckpt equals fp8-cal (the same calibration) bit for bit
expect 2 "layer 3 already carries k_scale/v_scale; .*--replace removes those" -- calibrate --model-dir "$work/mo" --into-checkpoint
expect 2 "--replace: expected --into-checkpoint" -- calibrate --model-dir "$work/mo" --replace -o "$work/x.json"
"$bin" calibrate --model-dir "$work/mo" --into-checkpoint --replace >"$work/out" 2>"$work/err" &&
  grep -q "removed the 4 KV scale tensors .*mo had" "$work/out" && ok || bad "calibrate --replace: $(cat "$work/err" "$work/out")"
expect 0 "KV scale values: K [0-9.]+ to [0-9.]+, V [0-9.e-]+ to [0-9.e-]+; 0 of 2 K and 0 of 2 V scales are exactly 1.0" -- audit "$work/mo" --strict
"$bin" forward --model-dir "$work/mo" --tokens 64 --kv fp8-cal,fp8-ckpt --dump "$work/mor" >/dev/null 2>"$work/err" &&
  cmp -s "$work/mor/fp8-cal/logits.f32" "$work/mor/fp8-ckpt/logits.f32" && ok ||
  bad "after --replace, fp8-ckpt differs from fp8-cal: $(cat "$work/err")"
# compare names what audit found differently in the two checkpoints
"$bin" run --model-dir "$work/mo" --kv bf16,fp8-ckpt,fp8-cal --context 512 --cells drift \
  -o "$work/mo-fixed.h5" >/dev/null 2>"$work/err" || bad "sweep after --replace: $(cat "$work/err")"
"$bin" compare "$work/mo.h5" "$work/mo-fixed.h5" >"$work/out" 2>"$work/err"
[ $? -ne 2 ] && grep -q "^note: the runs differ in .*the checkpoint audit's fp8_kv_scales_all_one ('v' against '')" "$work/out" && ok ||
  bad "compare does not name the checkpoint audit's difference: $(cat "$work/out" "$work/err")"
# scales inside the weights' own file (as exporters write them, Quark's
# names): that file is rewritten without them, every other tensor and its
# header metadata as they were, and the index follows
cp -r "$work/noscale" "$work/inl"
st add-scales-as quark "$work/inl" 3:1:1 7:1:1
st inline-scales "$work/inl"
cp "$work/inl/model.safetensors" "$work/inl-before.safetensors"
"$bin" calibrate --model-dir "$work/inl" --into-checkpoint --replace >/dev/null 2>"$work/err" &&
  st same-but-scales "$work/inl-before.safetensors" "$work/inl/model.safetensors" >"$work/out" 2>&1 &&
  "$py" -c "
import json; w = json.load(open('$work/inl/model.safetensors.index.json'))['weight_map']
s = {n: f for n, f in w.items() if 'scale' in n}
assert s == {f'model.layers.{l}.self_attn.{p}': 'kv_scales.safetensors' for l in (3, 7) for p in ('k_proj.k_scale', 'v_proj.v_scale')}, s
" && ok || bad "--replace with the scales inside model.safetensors: $(cat "$work/err" "$work/out")"
expect 0 "2 of 2 full-attention layers have k_scale and v_scale" -- audit "$work/inl" --strict
"$bin" forward --model-dir "$work/inl" --tokens 64 --kv fp8-cal,fp8-ckpt --dump "$work/inr" >/dev/null 2>"$work/err" &&
  cmp -s "$work/inr/fp8-cal/logits.f32" "$work/inr/fp8-ckpt/logits.f32" && ok ||
  bad "after --replace of inline scales, fp8-ckpt differs from fp8-cal: $(cat "$work/err")"
# the whole story on a ModelOpt-style NVFP4 export: 4-bit weights, FP8 KV
# asked for, placeholder scales of 1.0 inside the weights' file; --replace
# keeps every 4-bit tensor and its scales byte for byte
cp -r "$work/fp4-modelopt" "$work/nv"
st add-scales-as modelopt "$work/nv" 3:1:1 7:1:1
st inline-scales "$work/nv"
expect 1 "VERDICT: FP8 KV cache with every K and V scale 1.0" -- audit "$work/nv" --strict
cp "$work/nv/model.safetensors" "$work/nv-before.safetensors"
"$bin" calibrate --model-dir "$work/nv" --into-checkpoint --replace >/dev/null 2>"$work/err" &&
  st same-but-scales "$work/nv-before.safetensors" "$work/nv/model.safetensors" >"$work/out" 2>&1 &&
  "$bin" audit "$work/nv" --strict >/dev/null 2>>"$work/err" && ok ||
  bad "NVFP4 export with placeholder scales, --replace: $(cat "$work/err" "$work/out")"
# a scale that is no number is named
cp -r "$work/noscale" "$work/nanscale"
st add-scales "$work/nanscale" 3:0.75:nan 7:1.5:0.0001
expect 1 "VERDICT: FP8 KV cache with an unusable scale \(model.layers.3.self_attn.v_proj.v_scale = nan\)" -- audit "$work/nanscale" --strict

# a block scale of the wrong shape is refused, naming what was expected
cp -r "$work/fp8-block64" "$work/fp8-badblock"
st config "$work/fp8-badblock" quantization_config '{"quant_method": "fp8", "weight_block_size": [32, 32]}'
expect 2 "tensor model.layers.0.linear_attn.in_proj_qkvz.weight_scale_inv: shape \[6, 2\], expected 1 value, 384 \(one per row\) or \[12, 4\] \(one per 32 x 32 block\) for the FP8 model.layers.0.linear_attn.in_proj_qkvz.weight" -- forward --model-dir "$work/fp8-badblock" --tokens 8
expect 2 "kv fp8-ckpt: expected --model-dir" -- forward --model tiny --tokens 8 --kv fp8-ckpt
expect 2 "export: --dtype: expected bf16 or f32, got 'f16'" -- export --model tiny --dtype f16 -o "$work/f16x"
expect 2 "nowhere/config.json: cannot open" -- forward --model-dir "$work/nowhere" --tokens 8

echo "checkpoints: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
