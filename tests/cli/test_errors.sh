#!/usr/bin/env bash
# kvdrift: bad input on the command line gets one clear line on stderr that
# names the file, field or flag and what was expected, and exit status 2.
set -u
bin="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0

# expect CODE PATTERN -- ARGS...: exit status CODE, a single stderr line matching PATTERN
expect() {
  local code="$1" pat="$2"
  shift 3
  "$bin" "$@" >"$work/out" 2>"$work/err"
  local rc=$? lines
  lines=$(wc -l <"$work/err")
  if [ "$rc" -eq "$code" ] && [ "$lines" -eq 1 ] && grep -qE -- "$pat" "$work/err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: kvdrift $* -> exit $rc (want $code), $lines stderr lines, want /$pat/:"
    sed 's/^/  | /' "$work/err"
  fi
}

# every command and subcommand says how it is used when asked: exit 0, the
# usage on stdout, nothing on stderr, and nothing run
for c in "" run report compare trend audit calibrate export forward plan schema trace "trace gen" \
  "trace stats" "trace import" bench "bench kernels" "bench lockstep" "bench cuda"; do
  # shellcheck disable=SC2086
  "$bin" $c --help >"$work/help.out" 2>"$work/help.err"; rc=$?
  if [ $rc -eq 0 ] && [ ! -s "$work/help.err" ] && grep -qiE "^(usage|kvdrift [0-9]|## Tables)" "$work/help.out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL: kvdrift $c --help: exit $rc: $(head -2 "$work/help.out" "$work/help.err")"
  fi
done

expect 2 "^kvdrift bench: --buffer-mib: expected an integer in 16\.\.1048576, got '8'$" -- bench kernels --buffer-mib 8
# a kernel for the GEMMs of a few rows that is none, or one this CPU lacks
KVD_CPU_GEMM=avx3 expect 2 "^kvdrift: KVD_CPU_GEMM: expected a kernel this CPU runs \(.*blas\), got 'avx3'$" -- version
KVD_CPU_GEMM=avx3 expect 2 "KVD_CPU_GEMM: expected" -- run --model tiny -o "$work/never.h5"
[ ! -e "$work/never.h5" ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: a refused KVD_CPU_GEMM wrote a file"; }
KVD_CUDA_GEMM=fast expect 2 "^kvdrift: KVD_CUDA_GEMM=fast: expected 'tune' or 'first' \(or unset\)$" -- plan --model tiny
KVD_CUDA_DECODE=3 expect 2 "^kvdrift: KVD_CUDA_DECODE=3: expected '2' \(or unset\)$" -- version
KVD_CPU_ATTENTION=avx2 expect 2 "^kvdrift: KVD_CPU_ATTENTION: expected kernels this CPU runs \((amx, )?(avx512, )?portable.*\), got 'avx2'$" -- version
# each kernel set this CPU runs is taken by name; AMX asked of a CPU without it is refused
attn_of() { env "$@" "$bin" version | sed -n 's/^attention: //p'; }
case "$(attn_of)" in
AMX)
  [ "$(attn_of KVD_CPU_ATTENTION=amx)" = AMX ] && [ "$(attn_of KVD_CPU_ATTENTION=avx512)" = AVX-512 ] &&
    pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: KVD_CPU_ATTENTION=amx / avx512 not taken"; } ;;
AVX-512)
  KVD_CPU_ATTENTION=amx expect 2 "^kvdrift: KVD_CPU_ATTENTION: expected kernels this CPU runs \(avx512, portable: it has no AMX-BF16 the process may use\), got 'amx'$" -- version ;;
*)
  KVD_CPU_ATTENTION=amx expect 2 "^kvdrift: KVD_CPU_ATTENTION: expected kernels this CPU runs \(portable: .*\), got 'amx'$" -- version ;;
esac

cat >"$work/heads.json" <<'J'
{"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 4,
 "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 300}
J
cat >"$work/layer.json" <<'J'
{"hidden_size": 256, "num_hidden_layers": 2, "layer_types": ["linear_attention", "mamba"],
 "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 300}
J
cat >"$work/zero.json" <<'J'
{"hidden_size": 0, "num_hidden_layers": 4}
J
printf '{"hidden_size": 256,\n  "num_hidden_layers": 4,,\n}\n' >"$work/broken.json"
printf '{"format": "kvdrift-kv-scales", "layers": [{"k_scale": [1, 1], "v_scale": [1]}]}' >"$work/scales.json"

expect 2 "unknown model preset 'huge'" -- forward --model huge
expect 2 "heads.json: field 'num_key_value_heads': expected a divisor of num_attention_heads \(6\), got 4" -- forward --config "$work/heads.json"
expect 2 "layer.json: field 'layer_types\[1\]': expected \"linear_attention\" or \"full_attention\", got \"mamba\"" -- forward --config "$work/layer.json"
expect 2 "zero.json: field 'hidden_size': expected a positive integer, got 0" -- forward --config "$work/zero.json"
expect 2 "broken.json: line 2, column" -- forward --config "$work/broken.json"
# NVFP4 needs head_dim in whole groups of 16: refused before any cell runs
cat >"$work/hd40.json" <<'J'
{"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 40, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 300}
J
expect 2 "--kv nvfp4-cal: the model's head_dim 40 is not a multiple of NVFP4's 16-value groups" -- run --config "$work/hd40.json" --kv bf16,nvfp4-cal --context 64 -o "$work/hd40.h5"
if [ ! -e "$work/hd40.h5" ]; then pass=$((pass + 1)); else
  fail=$((fail + 1))
  echo "FAIL: a refused NVFP4 sweep left $work/hd40.h5"
fi
expect 2 "--kv nvfp4-unscaled: the model's head_dim 40 is not a multiple of NVFP4's 16-value groups" -- forward --config "$work/hd40.json" --kv bf16,nvfp4-unscaled --tokens 16
# int4-token's rotation takes powers of two
expect 2 "--kv int4-token: the model's head_dim 40 is not a power of two from 32 to 4096 \\(the Hadamard rotation's\\)" -- run --config "$work/hd40.json" --kv bf16,int4-token --context 64 -o "$work/hd40.h5"
expect 2 "--tokens: expected an integer in 1\.\." -- forward --model tiny --tokens 0
expect 2 "--tokens: expected an integer in 1\.\..*got '-5'" -- forward --model tiny --tokens -5
expect 2 "--kv: unknown mode 'fp4'" -- forward --model tiny --kv bf16,fp4
expect 2 "--fp8-overflow: expected sat or nan" -- forward --model tiny --fp8-overflow wrap
expect 2 "--fp8-overflow: expected sat or nan" -- run --model tiny --fp8-overflow NaN -o "$work/x.h5"
expect 2 "scales.json: field 'layers': expected 2 entries" -- forward --model tiny --tokens 8 --scales "$work/scales.json"
expect 2 "nope.json: cannot open" -- forward --model tiny --tokens 8 --scales "$work/nope.json"
expect 2 "expected -o DIR" -- export --model tiny
expect 2 "unknown flag '--bogus'" -- calibrate --bogus
expect 2 "unknown command 'frobnicate'" -- frobnicate

# traces: bad lengths, truncated files, bad CSV rows
expect 2 "--length: expected an integer in 1\.\." -- trace gen --length 0 -o "$work/t.h5"
expect 2 "--length: expected an integer in 1\.\..*got '-3'" -- trace gen --length -3 -o "$work/t.h5"
expect 2 "--kind: expected agentic-coding" -- trace gen --length 100 --kind chat -o "$work/t.h5"
"$bin" trace gen --length 5000 --seed 4 -o "$work/good.h5" >/dev/null
head -c 3000 "$work/good.h5" >"$work/cut.h5"
expect 2 "cut.h5: not a readable HDF5 file" -- trace stats "$work/cut.h5"
printf 'id,segment\n1,user\n2.5,user\n' >"$work/bad.csv"
expect 2 "bad.csv:3: column 'id': expected a non-negative integer token id, got '2.5'" -- trace import --csv "$work/bad.csv" -o "$work/i.h5"
printf '1\n70000\n' >"$work/big.csv"
expect 2 "big.csv:2: token id 70000: expected < vocab size 65536" -- trace import --csv "$work/big.csv" --vocab 65536 -o "$work/i.h5"

# a written trace file reads back through h5py (Debian's python3-h5py) and h5dump
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  if /usr/bin/python3 - "$work/good.h5" <<'PY'
import h5py, json, sys
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] in (b"kvdrift-trace", "kvdrift-trace")
(name,) = list(f["traces"])
g = f["traces"][name]
tok = g["tokens"][:]
assert len(tok) == 5000 and tok.dtype == "uint32"
spec = json.loads(g.attrs["spec"])
assert spec["length"] == 5000 and spec["seed"] == 4
seg = g["segments"][:]
assert seg["length"].sum() == 5000
ref = g["references"][:]
assert (tok[ref["pos"]] == tok[ref["src"]]).all() and (ref["src"] < ref["pos"]).all()
PY
  then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: h5py could not read the trace file back"; fi
else
  echo "SKIP: /usr/bin/python3 has no h5py"
fi
if command -v h5dump >/dev/null && h5dump -H "$work/good.h5" | grep -q 'DATASET "tokens"'; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: h5dump does not show the tokens dataset"
fi
"$bin" trace stats --format csv "$work/good.h5" >"$work/stats.csv"
if head -1 "$work/stats.csv" | grep -qx '"trace","table","key","count","tokens","share"' &&
   grep -q '"reuse_distance","16-31",' "$work/stats.csv"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: trace stats --format csv"
fi

# plan: Qwen3.5-397B-A17B's KV bytes per token (MODEL_FACTS: 30,720 BF16, 15,360 FP8;
# NVFP4: 15 layers x 2 KV heads x (256 / 2 + 256 / 16) bytes, K and V: 8,640;
# int4-token: 15 x 2 x (256 / 2 + 4) x 2: 7,920); a head_dim NVFP4 cannot
# group, or int4-token rotate, says so in their rows
"$bin" plan --model qwen3.5-397b-a17b --kv-budget 39GB >"$work/plan.txt"
"$bin" plan --config "$work/hd40.json" >>"$work/plan.txt"
if grep -qE '^bf16 +30720 +1269531 ' "$work/plan.txt" && grep -qE '^fp8-cal +15360 +2539062 ' "$work/plan.txt" &&
   grep -qE '^nvfp4-unscaled +8640 +4513888 ' "$work/plan.txt" &&
   grep -qE '^int4-token +7920 +4924242 ' "$work/plan.txt" &&
   grep -qE "^nvfp4-cal +- +\(head_dim 40 is not a multiple of NVFP4's 16-value groups\)" "$work/plan.txt" &&
   grep -qE '^int4-token +- +\(head_dim 40 is not a power of two from 32 to 4096' "$work/plan.txt"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: kvdrift plan figures"; cat "$work/plan.txt"
fi
# tensor parallelism: the budget is each GPU's; a GPU caches its share of
# the KV heads (one each, replicated, past 2 GPUs here) and of the DeltaNet
# state; a count the model does not split over is refused as run refuses it
"$bin" plan --model qwen3.5-397b-a17b --kv-budget 39GB --gpus 2 >"$work/plan.txt" &&
  "$bin" plan --model qwen3.5-397b-a17b --kv-budget 39GB --gpus 8 >"$work/plan2.txt"
if grep -qE '^bf16 +15360 +2539062 +18\.5 ' "$work/plan.txt" && grep -qE '^fp8-cal +7680 +5078125 +35\.3 ' "$work/plan.txt" &&
   grep -q "on each of 2 GPUs; each caches 1 of 2 KV heads and 93.2 MiB of Gated DeltaNet state" "$work/plan.txt" &&
   grep -qE '^bf16 +15360 +2539062 +19\.1 ' "$work/plan2.txt" &&
   grep -q "on each of 8 GPUs; each caches 1 of 2 KV heads (each head on 4 GPUs) and 23.3 MiB" "$work/plan2.txt"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: kvdrift plan --gpus 2, 8"; cat "$work/plan.txt" "$work/plan2.txt"
fi
expect 2 "--gpus 3: num_attention_heads 32 does not split into 3 equal parts \(this model splits over 1, 2, 4, 8, 16\)" -- plan --model qwen3.5-397b-a17b --gpus 3
# the budget's units: binary up to TiB, decimal, bytes
"$bin" plan --model qwen3.5-397b-a17b --kv-budget 1.5TiB >"$work/plan.txt" &&
  "$bin" plan --model qwen3.5-397b-a17b --kv-budget 61440B >"$work/plan2.txt" &&
  "$bin" plan --model qwen3.5-397b-a17b --kv-budget 2TB >"$work/plan3.txt"
if grep -qE '^bf16 +30720 +53687091 ' "$work/plan.txt" && grep -qE '^fp8-cal +15360 +107374182 ' "$work/plan.txt" &&
   grep -qE '^bf16 +30720 +2 ' "$work/plan2.txt" && grep -qE '^fp8-cal +15360 +4 ' "$work/plan2.txt" &&
   grep -qE "^bf16 +30720 +65104166 " "$work/plan3.txt"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: kvdrift plan --kv-budget 1.5TiB, 61440B, 2TB"; cat "$work/plan.txt" "$work/plan2.txt" "$work/plan3.txt"
fi
expect 2 "--kv-budget: expected a size like 40GiB, 512MiB or 1.5TiB \\(B, KiB, MiB, GiB, TiB, kB, MB, GB, TB\\), got '40 apples'" -- plan --kv-budget "40 apples"
expect 2 "--kv-budget: expected a size like 40GiB, 512MiB or 1.5TiB \\(B, KiB, MiB, GiB, TiB, kB, MB, GB, TB\\), got 'infGiB'" -- run --kv-budget infGiB -o "$work/never.h5"
expect 2 "--kv-budget: expected a size like 40GiB, 512MiB or 1.5TiB \\(B, KiB, MiB, GiB, TiB, kB, MB, GB, TB\\), got '0GiB'" -- audit "$work" --kv-budget 0GiB

# activation profile: per-layer magnitudes reach the cache (and bad rows are named)
printf 'layer,k_outlier_scale,v_rms\n3,,0.05\n7,900,\n' >"$work/prof.csv"
"$bin" calibrate --model tiny --calib-tokens 256 -o "$work/p0.json" >/dev/null
"$bin" calibrate --model tiny --calib-tokens 256 --activation-profile "$work/prof.csv" -o "$work/p1.json" >/dev/null
if /usr/bin/python3 - "$work/p0.json" "$work/p1.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["layers"] for p in sys.argv[1:3])
assert b[0]["v_absmax"][0] > 3 * a[0]["v_absmax"][0]          # layer 3: v_rms 0.05
assert b[0]["k_absmax"][0] == a[0]["k_absmax"][0]              # layer 3: K untouched
assert b[1]["k_absmax"][0] > 1.5 * a[1]["k_absmax"][0]         # layer 7: outlier scale 900
PY
then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: the activation profile did not shape K/V"; fi
printf 'layer,v_rms\n12,0.05\n' >"$work/prof2.csv"
expect 2 "prof2.csv:2: column 'layer': expected 0..7, got '12'" -- calibrate --model tiny --activation-profile "$work/prof2.csv" -o "$work/p2.json"
printf 'layer,v_rms\n3,lots\n' >"$work/prof3.csv"
expect 2 "prof3.csv:2: column 'v_rms': expected a positive number, got 'lots'" -- calibrate --model tiny --activation-profile "$work/prof3.csv" -o "$work/p3.json"

# no output file is left behind by a refused command
"$bin" calibrate --model huge -o "$work/s.json" 2>/dev/null
if [ -e "$work/s.json" ] || ls "$work"/s.json.tmp* >/dev/null 2>&1; then
  fail=$((fail + 1)); echo "FAIL: a refused calibrate left a file behind"
else
  pass=$((pass + 1))
fi

# --backend: a bad value; where no GPU is visible, why (forward, calibrate)
expect 2 "--backend: expected cpu or cuda, got 'tpu'" -- forward --model tiny --backend tpu
expect 2 "--backend: expected cpu or cuda, got 'tpu'" -- calibrate --model tiny --backend tpu -o "$work/s.json"
# --gpus: a count the CPU cannot take, one out of range
expect 2 "--gpus 2: needs --backend cuda" -- forward --model tiny --gpus 2 --tokens 16
expect 2 "--gpus 2: needs --backend cuda" -- run --model tiny --gpus 2 -o "$work/g.h5"
expect 2 "--gpus: expected 1 to 16, got '0'" -- run --model tiny --gpus 0 -o "$work/g.h5"
# -o names what run would resume: a directory, a file that is not a results file
mkdir -p "$work/outdir"
expect 2 "-o .*outdir: a directory; expected a results file" -- run --model tiny -o "$work/outdir"
"$bin" trace gen --length 64 -o "$work/trace.h5" >/dev/null
expect 2 "trace.h5: attribute 'format': expected \"kvdrift-results\", got \"kvdrift-trace\"; a run resumes the file it writes, and cannot resume this one" -- run --model tiny -o "$work/trace.h5"
# an output never replaces a file of another kind: a results file named as a
# report's, a calibration's or a trace set's output is left as it was
"$bin" run --model tiny --kv bf16 --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/res.h5" >/dev/null 2>&1
cp "$work/res.h5" "$work/res.before"
expect 2 "res.h5: an HDF5 file \(results or traces\?\) is there, and this output is not one: choose another name" -- report "$work/res.h5" -o "$work/res.h5"
expect 2 "calibrate: -o: .*res.h5: an HDF5 file \(results or traces\?\) is there" -- calibrate --model tiny --calib-tokens 64 -o "$work/res.h5"
# compare checks its -o before the verdict: a gate that printed "pass" and
# then exited 2 would give two answers
expect 2 "compare: -o: .*res.h5: an HDF5 file \(results or traces\?\) is there" -- compare "$work/res.h5" "$work/res.h5" -o "$work/res.h5"
if [ -s "$work/out" ]; then
  fail=$((fail + 1)); echo "FAIL: compare printed a verdict before refusing its -o:"; sed 's/^/  | /' "$work/out"
else
  pass=$((pass + 1))
fi
expect 2 "compare: -o: .*nodir/diff.html: cannot create: No such file or directory \(directory .*nodir\)" -- compare "$work/res.h5" "$work/res.h5" -o "$work/nodir/diff.html"
expect 2 "report: -o: .*outdir: a directory: expected a file name" -- report "$work/res.h5" -o "$work/outdir"
expect 1 "res.h5: an HDF5 file of another kind \(format \"kvdrift-results\"\) is there, not a kvdrift-trace file" -- trace gen --length 64 -o "$work/res.h5"
if cmp -s "$work/res.h5" "$work/res.before" && ! ls "$work"/res.h5.tmp.* >/dev/null 2>&1; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: a refused output changed the results file or left a temporary"
fi
# a results table without one of its columns is named, not read as zeros
cp "$work/res.h5" "$work/nocol.h5"
/usr/bin/python3 -c "
import sys, h5py, numpy.lib.recfunctions as rf
f = h5py.File(sys.argv[1], 'r+'); a = f['/drift/summary'][:]; del f['/drift/summary']
f['/drift/summary'] = rf.drop_fields(a, 'n', usemask=False)" "$work/nocol.h5"
expect 2 "nocol.h5: dataset /drift/summary: no column 'n' \(expected in schema version 4\)" -- report "$work/nocol.h5" -o "$work/nocol.html"
# ... and so is version 3's router_flips; a version 2 file, which predates
# it, reads, and a run does not resume it (its cells would keep zeros)
cp "$work/res.h5" "$work/v2.h5"
/usr/bin/python3 -c "
import sys, h5py, numpy.lib.recfunctions as rf
f = h5py.File(sys.argv[1], 'r+'); a = f['/drift/tokens'][:]; assert len(a); del f['/drift/tokens']
f['/drift/tokens'] = rf.drop_fields(a, 'router_flips', usemask=False)" "$work/v2.h5"
expect 2 "v2.h5: dataset /drift/tokens: no column 'router_flips' \(expected in schema version 4\)" -- report "$work/v2.h5" -o "$work/v2.html"
/usr/bin/python3 -c "import sys, h5py; h5py.File(sys.argv[1], 'r+').attrs['schema_version'] = [2]" "$work/v2.h5"
cp "$work/v2.h5" "$work/v2.before"
expect 0 "wrote .*v2.html" -- report "$work/v2.h5" -o "$work/v2.html"
expect 2 "v2.h5: results schema version 2, and this kvdrift writes version 4: a run cannot resume it; write to another file \(-o\), or remove it to start over" -- run --model tiny --kv bf16 --context 64 --concurrency 1 --gen-tokens 0 --decode-tokens 2 -o "$work/v2.h5"
if cmp -s "$work/v2.h5" "$work/v2.before"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: a refused resume changed the version 2 file"
fi
# --scales gives fp8-cal's scales; the calibration flags make them: not both.
# A --scales file is read even when no fp8-cal mode runs (a typo shows)
expect 2 "--scales gives fp8-cal's scales, and --calibration, --per-head and --calib-tokens make them" -- run --model tiny --per-head --scales "$work/scales.json" -o "$work/g.h5"
expect 2 "--scales gives fp8-cal's scales" -- forward --model tiny --scales "$work/scales.json" --calibration modelopt
expect 2 "nope.json: cannot open" -- run --model tiny --kv bf16 --context 64 --scales "$work/nope.json" -o "$work/g.h5"
# FP8 attention: over an E4M3 mode, with fp8-cal's query scales; a scales
# file's q_scale in every layer or in none; a file run without it is not
# resumed with it
expect 2 "--attn-fp8: expected an E4M3 mode in --kv \(fp8-cal, fp8-unscaled, fp8-ckpt\)" -- run --model tiny --kv bf16,fp8-e5m2 --attn-fp8 -o "$work/g.h5"
"$bin" calibrate --model tiny --calib-tokens 64 -o "$work/q.json" >/dev/null
/usr/bin/python3 - "$work/q.json" "$work/noq.json" "$work/halfq.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert all("q_scale" in l for l in s["layers"])
for l in s["layers"]: l.pop("q_scale"); l.pop("q_absmax")
json.dump(s, open(sys.argv[2], "w"))
s = json.load(open(sys.argv[1]))
s["layers"][1].pop("q_scale")
json.dump(s, open(sys.argv[3], "w"))
PY
expect 2 "--attn-fp8: .*noq\.json has no q_scale: fp8-cal's FP8 attention needs the query's scales" -- run --model tiny --kv fp8-cal --context 64 --scales "$work/noq.json" --attn-fp8 -o "$work/g.h5"
expect 2 "halfq\.json: field 'q_scale': expected it in every layer or in none" -- run --model tiny --kv fp8-cal --context 64 --scales "$work/halfq.json" -o "$work/g.h5"
"$bin" run --model tiny --kv fp8-unscaled --context 64 --cells drift --gen-tokens 0 -o "$work/fa.h5" >/dev/null 2>&1
expect 2 "fa\.h5 holds cells run with --attn-fp8 false, this run has --attn-fp8 true" -- run --model tiny --kv fp8-unscaled --context 64 --cells drift --gen-tokens 0 --attn-fp8 -o "$work/fa.h5"
# sequences longer than the model's positions are refused before any work
expect 2 "--tokens: 70000 tokens is beyond the model's max_position_embeddings 65536" -- forward --model tiny --tokens 70000
expect 2 "--calib-tokens: 70000 tokens is beyond the model's max_position_embeddings 65536" -- calibrate --model tiny --calib-tokens 70000 -o "$work/s.json"
expect 2 "--context: 65530 and the 32 tokens generated after it \(--gen-tokens, --decode-tokens\) run past the model's max_position_embeddings 65536" -- run --model tiny --context 65530 -o "$work/g.h5"
expect 2 "--calib-tokens: 65537 tokens is beyond" -- run --model tiny --calib-tokens 65537 -o "$work/g.h5"
# run's lists: an empty item, an item listed twice (it would run, or skip, a cell twice)
expect 2 "--concurrency: expected a list of up to 16 levels in 1\.\.1024, got '1,,2'" -- run --model tiny --concurrency 1,,2 -o "$work/g.h5"
expect 2 "--context: expected a list of up to 16 token counts >= 16, got '256,'" -- run --model tiny --context 256, -o "$work/g.h5"
expect 2 "--context: 512 is listed twice in '512,256,0512'" -- run --model tiny --context 512,256,0512 -o "$work/g.h5"
expect 2 "--kv: bf16 is listed twice in 'bf16,fp8-cal,bf16'" -- run --model tiny --kv bf16,fp8-cal,bf16 -o "$work/g.h5"
expect 2 "--concurrency: 4 is listed twice" -- run --model tiny --concurrency 4,4 -o "$work/g.h5"
expect 2 "--cells: expected a list of drift and throughput, got 'drift,,'" -- run --model tiny --cells drift,, -o "$work/g.h5"
# a spec's fields are checked as the flags are, and a message names the file
printf '{"model": "tiny", "seed": "abc", "output": "%s"}' "$work/g.h5" >"$work/seed.json"
expect 2 "run: .*seed\.json: --seed: expected an integer in 0\.\.2147483647, got 'abc'" -- run --spec "$work/seed.json"
printf '{"model": "tiny", "traces": 0}' >"$work/traces.json"
expect 2 "traces\.json: --traces: expected an integer in 1\.\.10000, got '0'" -- run --spec "$work/traces.json"
printf '{"model": "tiny", "contexts": [256]}' >"$work/field.json"
expect 2 "field\.json: unknown field 'contexts'" -- run --spec "$work/field.json"
printf '{"model": "tiny", "per_head": "yes"}' >"$work/switch.json"
expect 2 "switch\.json: field 'per_head': expected true or false, got 'yes'" -- run --spec "$work/switch.json"
printf '{"model": "tiny", "kv": ["bf16", "bf16"]}' >"$work/twice.json"
expect 2 "twice\.json: --kv: bf16 is listed twice" -- run --spec "$work/twice.json"
if [ -e "$work/g.h5" ]; then
  fail=$((fail + 1)); echo "FAIL: a refused run left a results file"
else
  pass=$((pass + 1))
fi
expect 2 "bench: --backend: expected cpu or cuda, got 'tpu'" -- bench lockstep --model tiny --backend tpu
expect 2 "bench: --gpus 2: needs --backend cuda" -- bench lockstep --model tiny --gpus 2
expect 2 "bench: expected 'kernels', 'lockstep' or 'cuda'" -- bench kernel
expect 2 "bench: cuda: unexpected argument '--reps'" -- bench cuda --reps 3
if "$bin" version 2>/dev/null | grep -q "^cuda: no CUDA device visible"; then
  expect 1 "--backend cuda: no CUDA device visible" -- forward --model tiny --backend cuda --dump "$work/d"
  expect 1 "--backend cuda: no CUDA device visible" -- forward --model tiny --backend cuda --tokens 16
  expect 1 "--backend cuda: no CUDA device visible" -- calibrate --model tiny --backend cuda -o "$work/s.json"
  expect 1 "--backend cuda: no CUDA device visible" -- bench lockstep --model tiny --backend cuda
  expect 1 "bench: cuda: no CUDA device visible" -- bench cuda
fi

echo "cli errors: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
