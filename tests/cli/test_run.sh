#!/usr/bin/env bash
# kvdrift run end to end on the tiny preset: the results file reads back
# (h5py, h5dump) and matches docs/results-schema.md; bf16 drifts by exactly
# zero; fp8-unscaled drifts more than fp8-cal; a sweep killed with SIGKILL
# resumes to the same figures as one that ran through.
set -u
bin="$1"
schema_doc="$2"
py=/usr/bin/python3
if ! "$py" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $py has no h5py/numpy (scripts/setup.sh installs python3-h5py)"
  exit 77
fi
. "$(dirname "$0")/lib.sh"

sweep=(run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 512,1024 --concurrency 1,2
       --gen-tokens 8 --decode-tokens 4 --calib-tokens 1024 --attn-per-head)

if "$bin" "${sweep[@]}" -o "$work/a.h5" >"$work/a.out" 2>"$work/a.err"; then ok; else bad "the tiny sweep failed: $(cat "$work/a.err")"; fi
if h5dump -H "$work/a.h5" | grep -q 'DATASET "output"'; then ok; else bad "h5dump cannot read the results"; fi
# the headline, as the report's Markdown gives it
"$bin" report "$work/a.h5" --format md -o "$work/a.md" 2>/dev/null
"$py" - "$work/a.out" "$work/a.md" <<'PY' && ok || bad "run's headline differs from the report's: $(cat "$work/a.out")"
import sys
out, md = open(sys.argv[1]).read().splitlines(), open(sys.argv[2]).read().splitlines()
i = out.index("against fp8-cal at 1024 tokens:")
got = [l[2:] for l in out[i + 1:] if l.startswith("  ")]
want = [l[2:] for l in md if l.startswith("- ")]
assert got == want and len(got) == 1 and got[0].startswith("fp8-unscaled "), (got, want)
PY
# the summary's k_sat% and v_flush% columns: the shares of /drift/kv
"$py" - "$work/a.h5" "$work/a.out" <<'PY' && ok || bad "run summary: k_sat% / v_flush% differ from /drift/kv: $(cat "$work/a.out")"
import sys, h5py
kv = h5py.File(sys.argv[1])["drift/kv"][:]
lines = [l.split() for l in open(sys.argv[2]) if l.split()[:1] in (["fp8-cal"], ["fp8-unscaled"], ["bf16"]) and not l.startswith(" ")]
head = next(l.split() for l in open(sys.argv[2]) if l.startswith("kv_mode"))
ks, vf, rt = head.index("k_sat%"), head.index("v_flush%"), head.index("router%")
summ = h5py.File(sys.argv[1])["drift/summary"][:]
assert len(lines) == 6, lines
for l in lines:
    mode, ctx = l[0], int(l[1])
    s = summ[(summ["mode"] == mode.encode()) & (summ["context"] == ctx) & (summ["metric"] == b"router_flip_rate")]
    assert len(s) == 1 and l[rt] == "%.3f" % (100 * s["value"][0]), (l, rt)
    if mode == "bf16":
        assert l[ks] == l[vf] == "-" and l[rt] == "0.000", l
        continue
    k = kv[(kv["mode"] == mode.encode()) & (kv["context"] == ctx)]
    w = k["n_values"]
    assert l[ks] == "%.3f" % (100 * (k["k_saturated_frac"] * w).sum() / w.sum()), (l, ks)
    assert l[vf] == "%.3f" % (100 * (k["v_flushed_frac"] * w).sum() / w.sum()), (l, vf)
PY
"$bin" schema >"$work/schema.md"
if grep -qF -f <(head -3 "$work/schema.md") "$schema_doc" && "$py" - "$schema_doc" "$work/schema.md" <<'PY'
import sys
doc, gen = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if gen in doc else 1)
PY
then ok; else bad "docs/results-schema.md is not up to date with 'kvdrift schema'"; fi

"$py" - "$work/a.h5" "$schema_doc" <<'PY' && ok || bad "results figures"
import re, sys
import h5py, numpy as np

f = h5py.File(sys.argv[1], "r")
doc = open(sys.argv[2]).read()
# every table the schema names exists with exactly the documented columns
tables = re.findall(r"### `(/[^`]+)`\n\n.*?\n\n\| column \| type \|\n\| --- \| --- \|\n((?:\|.*\|\n)+)", doc)
assert len(tables) == 11, tables
for path, rows in tables:
    cols = [re.match(r"\| `([^`]+)` \|", r).group(1) for r in rows.strip().split("\n")]
    assert list(f[path].dtype.names) == cols, (path, f[path].dtype.names, cols)
assert f.attrs["schema_version"][0] == 4
for a in ("kvdrift_version", "git_revision", "written_utc", "host", "backend", "device",
          "model_config", "trace_spec", "command", "seeds"):
    assert a in f.attrs, a
assert "checkpoint_audit" not in f.attrs  # synthetic weights: no checkpoint to audit

out, lay, att = f["/drift/output"][:], f["/drift/layers"][:], f["/drift/attention"][:]
summ, gen, kv = f["/drift/summary"][:], f["/drift/generation"][:], f["/drift/kv"][:]
cells = f["/cells"][:]
assert len(cells) == 3 * 2 * (1 + 2), len(cells)  # modes x contexts x (drift + 2 throughput)

def sel(t, **kw):
    m = np.ones(len(t), bool)
    for k, v in kw.items():
        m &= t[k] == (v.encode() if isinstance(v, str) else v)
    return t[m]

# bf16 against the reference: exactly zero drift in every figure
b = sel(out, mode="bf16")
assert len(b) and np.all(b["mean"][np.isin(b["metric"], [b"kl", b"delta_p", b"delta_nll"])] == 0)
assert np.all(sel(b, metric="top1_agree")["mean"] == 1)
bl = sel(lay, mode="bf16")
assert np.all(sel(bl, metric="rel_l2")["mean"] == 0) and np.all(sel(bl, metric="cosine")["mean"] == 1)
assert len(sel(bl, metric="router_flip")) and np.all(sel(bl, metric="router_flip")["mean"] == 0)
# router flips per layer: none below the first full-attention layer, some above it in FP8
uf = sel(lay, mode="fp8-unscaled", metric="router_flip", context=1024)
assert set(uf["layer"]) == set(range(8))
assert np.all(uf[uf["layer"] < 3]["mean"] == 0) and uf[uf["layer"] >= 3]["mean"].max() > 0
ba = sel(att, mode="bf16")
assert len(sel(ba, view="isolated")) and len(sel(ba, view="propagated"))
assert np.all(ba["mean"][ba["metric"] != b"argmax_agree"] == 0)
assert np.all(sel(ba, metric="argmax_agree")["mean"] == 1)
bs = sel(summ, mode="bf16")
for m in (b"kl_mean", b"kl_max", b"ln_ppl_ratio", b"delta_p_rms", b"router_flip_rate"):
    assert np.all(bs[bs["metric"] == m]["value"] == 0), m
bg = sel(gen, mode="bf16")
assert len(bg) and np.all(bg["first_divergence"] == bg["tokens"]) and np.all(bg["agree_rate"] == 1)
assert np.all(sel(kv, mode="bf16")["k_saturated_frac"] == 0)

# the failure the project exists to show: unscaled FP8 drifts more than calibrated
for ctx in (512, 1024):
    def kl(mode):
        s = sel(summ, mode=mode, context=ctx, subset="all", metric="kl_mean")
        return float(s["value"][0])
    def akl(mode, view):
        s = sel(att, mode=mode, context=ctx, subset="all", metric="kl", view=view)
        return float(np.average(s["mean"], weights=s["n"]))
    assert kl("fp8-unscaled") > kl("fp8-cal") > 0, (ctx, kl("fp8-unscaled"), kl("fp8-cal"))
    for view in ("isolated", "propagated"):
        assert akl("fp8-unscaled", view) > akl("fp8-cal", view) > 0, (ctx, view)
    u = sel(kv, mode="fp8-unscaled", context=ctx)
    c = sel(kv, mode="fp8-cal", context=ctx)
    # calibration on a held-out trace can be exceeded by the evaluation trace,
    # rarely: a calibrated cache saturates far less, not never
    assert u["k_saturated_frac"].max() > 10 * c["k_saturated_frac"].max()
    assert u["v_subnormal_frac"].min() > 0.5 > c["v_subnormal_frac"].max()
# the two views: below the first full-attention layer only DeltaNet layers,
# which no KV cache touches, so there the candidate's query is the
# reference's and the propagated view equals the isolated one exactly; above
# it, error carried in from below makes them differ
for mode in ("fp8-cal", "fp8-unscaled"):
    def v(view, al):
        return sel(att, mode=mode, context=1024, subset="all", metric="kl", view=view, attn_layer=al, kv_head=-1)["mean"]
    assert np.array_equal(v("isolated", 0), v("propagated", 0)), mode
    assert not np.array_equal(v("isolated", 1), v("propagated", 1)), mode
    # per KV head: each head's KL is the mean over its query heads
    per = [sel(att, mode=mode, context=1024, metric="kl", view="isolated", attn_layer=1, kv_head=h) for h in (0, 1)]
    whole = sel(att, mode=mode, context=1024, subset="all", metric="kl", view="isolated", attn_layer=1, kv_head=-1)
    assert np.allclose((per[0]["mean"] + per[1]["mean"]) / 2, whole["mean"], rtol=1e-12, atol=0)
# every drift cell's positions: they give the summary's figures again
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
assert len(ts) == 3 * 2 and tk.dtype["kl"] == np.float32 and tk.dtype["copy"] == np.uint8
o = np.sort(ts, order="first")  # the cells' rows, one after another
assert o["first"][0] == 0 and np.array_equal(o["first"][1:], (o["first"] + o["n"])[:-1]) and ts["n"].sum() == len(tk)
for r in ts:
    mode, ctx = r["mode"].decode(), int(r["context"])
    assert r["n"] == ctx - 1 and r["trace"] == 0, r  # a prediction for every token but the first
    t = tk[r["first"]:r["first"] + r["n"]]
    for sub, m in (("all", np.ones(len(t), bool)), ("copy", t["copy"] == 1), ("other", t["copy"] == 0)):
        x = t[m]
        def fig(metric):
            v = sel(summ, mode=mode, context=ctx, subset=sub, metric=metric)
            assert len(v) == 1 and v["n"][0] == len(x), (mode, ctx, sub, metric)
            return float(v["value"][0])
        kl = x["kl"].astype(np.float64)
        assert abs(kl.mean() - fig("kl_mean")) <= 1e-6 * max(fig("kl_mean"), 1e-30), (mode, ctx, sub)
        for name, q in (("kl_max", 1), ("kl_p99_9", .999), ("kl_p99", .99), ("kl_median", .5), ("kl_p01", .01), ("kl_min", 0)):
            want = float(np.percentile(kl, 100 * q))
            assert abs(want - fig(name)) <= 1e-12 * abs(want), (mode, ctx, sub, name, want, fig(name))
        assert x["same_top"].mean() == fig("same_top_p"), (mode, ctx, sub)
        dn = x["delta_nll"].astype(np.float64)
        assert abs(dn.mean() - fig("ln_ppl_ratio")) <= 1e-6 * max(np.abs(dn).mean(), 1e-30), (mode, ctx, sub)
    # the last layer's hidden drift, bucket by bucket (the rows also hold
    # position ctx - 1, which predicts nothing: its bucket is left out)
    hl = sel(lay, mode=mode, context=ctx, subset="all", metric="rel_l2", layer=7)
    pos = np.arange(len(t))
    bk = np.where(pos < 2, 0, np.floor(np.log2(np.maximum(pos, 1))).astype(int))
    for row in hl:
        if row["pos_hi"] >= ctx - 1:
            continue
        x = t["hidden_last"][bk == row["bucket"]].astype(np.float64)
        assert len(x) == row["n"] and abs(x.mean() - row["mean"]) <= 1e-6 * row["mean"] + 1e-30, (mode, ctx, row["bucket"])
    # attention at its sampled positions, the mean over the layers: every
    # layer's rows again (NaN elsewhere)
    for view in ("isolated", "propagated"):
        x = t["attn_" + view].astype(np.float64)
        ok = ~np.isnan(x)
        rows = sel(att, mode=mode, context=ctx, subset="all", metric="kl", view=view, kv_head=-1)
        assert ok.sum() == sel(rows, attn_layer=0)["n"].sum() > ctx // 16 - 2, (mode, ctx, view, ok.sum())
        assert ok[::16].all()  # every 16th position is sampled (and each copy start)
        want = (rows["n"] * rows["mean"]).sum() / rows["n"].sum()
        assert abs(x[ok].mean() - want) <= 1e-6 * want + 1e-30, (mode, ctx, view, x[ok].mean(), want)
    # router flips: each position's count of MoE layers whose top-k set
    # differs, bucket by bucket the layers' rows again (exactly: counts);
    # over the cell, the summary's rate less at most the last position's
    rf = sel(lay, mode=mode, context=ctx, subset="all", metric="router_flip")
    nl = len(set(rf["layer"]))
    assert nl == 8 and t["router_flips"].max() <= nl and tk.dtype["router_flips"] == np.uint16
    for b in set(rf["bucket"]):
        rows = rf[rf["bucket"] == b]
        if rows["pos_hi"][0] >= ctx - 1:
            continue
        x = t["router_flips"][bk == b].astype(np.int64)
        assert len(x) == rows["n"][0] and x.sum() == round((rows["n"] * rows["mean"]).sum()), (mode, ctx, b)
    total = (rf["n"] * rf["mean"]).sum()
    rate = float(sel(summ, mode=mode, context=ctx, subset="all", metric="router_flip_rate")["value"][0])
    assert abs(total - rate * nl * ctx) < 1e-6 and 0 <= total - t["router_flips"].sum() <= nl, (mode, ctx)
    if mode != "bf16" and ctx == 1024:
        assert t["router_flips"].sum() > 0, mode
    if mode == "bf16":
        assert np.all(t["kl"] == 0) and np.all(t["same_top"] == 1) and np.all(t["delta_nll"] == 0)
        assert np.all(t["hidden_last"] == 0) and np.nanmax(t["attn_propagated"]) == 0
        assert np.all(t["router_flips"] == 0)
# one trace per context: every mode hashes the same tokens, the contexts others
for ctx in (512, 1024):
    assert len(set(sel(ts, context=ctx)["trace_hash"])) == 1
assert sel(ts, context=512)["trace_hash"][0] != sel(ts, context=1024)["trace_hash"][0]
# the dense matrix and its dimension scales
m = f["/matrices/drift_fp8-unscaled_c1_ctx1024_t0/hidden_rel_l2"]
assert m.shape[0] == 8 and m.dims[0][0].name.endswith("layer") and m.dims[1][0].name.endswith("bucket_lo")
assert np.all(f["/matrices/drift_bf16_c1_ctx1024_t0/hidden_rel_l2"][:] == 0)
tp = f["/throughput"][:]
assert len(tp) == 3 * 2 * 2 and np.all(tp["decode_tok_s"] > 0) and np.all(tp["budget_tokens"] > 0)
# fp8 caches hold twice the tokens of bf16 in the same budget
assert sel(tp, mode="fp8-cal")["budget_tokens"][0] == 2 * sel(tp, mode="bf16")["budget_tokens"][0]
PY

# SIGKILL mid-sweep, then the same command again: the same figures as a run
# that was never interrupted (throughput is timing and is left out)
kill_sweep=(run --model tiny --kv bf16,fp8-unscaled,fp8-e5m2 --context 256,512,768 --concurrency 1
            --gen-tokens 4 --decode-tokens 3)
"$bin" "${kill_sweep[@]}" -o "$work/full.h5" >/dev/null 2>&1
"$bin" "${kill_sweep[@]}" -o "$work/k.h5" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  if [ -e "$work/k.h5" ] && "$py" -c "import h5py,sys; sys.exit(0 if len(h5py.File('$work/k.h5','r')['/cells']) >= 2 else 1)" 2>/dev/null; then
    break
  fi
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
n_before=$("$py" -c "import h5py; print(len(h5py.File('$work/k.h5','r')['/cells']))" 2>/dev/null || echo unreadable)
if [ "$n_before" != unreadable ] && [ "$n_before" -lt 18 ]; then ok; else bad "after SIGKILL the file is '$n_before' cells (want readable and unfinished)"; fi
"$bin" "${kill_sweep[@]}" -o "$work/k.h5" >"$work/resume.out" 2>"$work/resume.err"
if grep -q "resuming" "$work/resume.err"; then ok; else bad "the rerun did not resume: $(cat "$work/resume.err")"; fi
"$py" - "$work/full.h5" "$work/k.h5" <<'PY' && ok || bad "the resumed sweep's figures differ from the uninterrupted one's"
import sys
import h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert len(a["/cells"]) == len(b["/cells"]) == 18
for p in ("/drift/output", "/drift/layers", "/drift/attention", "/drift/summary", "/drift/kv", "/drift/generation", "/drift/token_sets"):
    x, y = a[p][:], b[p][:]
    keys = [n for n in x.dtype.names if x.dtype[n].kind in "SU" or n in ("concurrency", "context", "trace", "layer", "attn_layer", "kv_head", "bucket", "prefix")]
    x, y = np.sort(x, order=keys), np.sort(y, order=keys)
    assert x.shape == y.shape, p
    for n in x.dtype.names:
        assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), (p, n)
# each cell's positions, wherever the file put them
ta, tb = a["/drift/tokens"][:], b["/drift/tokens"][:]
assert len(ta) == len(tb) > 0
for r in a["/drift/token_sets"][:]:
    s = b["/drift/token_sets"][:]
    s = s[(s["mode"] == r["mode"]) & (s["context"] == r["context"]) & (s["trace"] == r["trace"])]
    assert len(s) == 1 and s["n"][0] == r["n"] and s["trace_hash"][0] == r["trace_hash"]
    x, y = ta[r["first"]:r["first"] + r["n"]], tb[s["first"][0]:s["first"][0] + r["n"]]
    for n in x.dtype.names:  # attention is NaN where not sampled
        assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), (r, n)
PY

# a context's figures do not depend on the sweep's other contexts: each has
# traces of its own length (cut from the longest trace, 256 tokens of a
# 773-token trace were mostly its system prompt)
"$bin" run --model tiny --kv fp8-unscaled --context 256 --concurrency 1 --gen-tokens 4 --decode-tokens 3 --cells drift -o "$work/one.h5" >/dev/null 2>&1
"$py" - "$work/full.h5" "$work/one.h5" <<'PY' && ok || bad "the 256-token cell of a 256,512,768 sweep differs from a 256-token sweep's"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for p in ("/drift/output", "/drift/layers", "/drift/attention", "/drift/summary", "/drift/kv", "/drift/generation"):
    x, y = a[p][:], b[p][:]
    x = x[(x["mode"] == b"fp8-unscaled") & (x["context"] == 256)]
    assert len(x) == len(y) > 0, p
    keys = [n for n in x.dtype.names if x.dtype[n].kind in "SU" or n in ("concurrency", "context", "trace", "layer", "attn_layer", "kv_head", "bucket", "prefix")]
    x, y = np.sort(x, order=keys), np.sort(y, order=keys)
    for n in x.dtype.names:
        assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), (p, n)
sa, sb = a["/drift/token_sets"][:], b["/drift/token_sets"][:]
sa = sa[(sa["mode"] == b"fp8-unscaled") & (sa["context"] == 256)]
assert len(sa) == len(sb) == 1 and sa["trace_hash"][0] == sb["trace_hash"][0] and sa["n"][0] == sb["n"][0] == 255
x, y = a["/drift/tokens"][sa["first"][0]:sa["first"][0] + 255], b["/drift/tokens"][sb["first"][0]:sb["first"][0] + 255]
for n in x.dtype.names:
    assert np.array_equal(x[n], y[n], equal_nan=x.dtype[n].kind == "f"), n
PY

# generation's branches fit the drift cell's cache at every context: at 300
# tokens and 4 generated, the trace's 3 blocks of 128 and a branch's 3 once
# took 6 blocks of a cache sized at 634 tokens (5 blocks)
for ctx in 272 300; do
  "$bin" run --model tiny --kv fp8-cal --context $ctx --concurrency 1 --gen-tokens 4 --calib-tokens 128 --cells drift -o "$work/g$ctx.h5" >/dev/null 2>"$work/g.err"
  "$py" -c "import sys, h5py; g = h5py.File(sys.argv[1], 'r')['/drift/generation'][:]; assert sorted(g['prefix']) == [$ctx // 4, $ctx // 2, $ctx] and (g['tokens'] == 4).all(), g" "$work/g$ctx.h5" 2>/dev/null && ok ||
    bad "--context $ctx --gen-tokens 4: $(cat "$work/g.err")"
done

# no temporary is left behind: the rerun swept what SIGKILL left, and Ctrl-C
# (SIGINT) removes the one being written
if ls "$work"/k.h5.tmp.* >/dev/null 2>&1; then bad "a killed run's temporary file was not swept"; else ok; fi
"$bin" "${kill_sweep[@]}" -o "$work/int.h5" >/dev/null 2>&1 &
pid=$!
sleep 1.5
kill -INT "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if ls "$work"/int.h5.tmp.* >/dev/null 2>&1; then
  bad "Ctrl-C left a temporary file"
elif [ -e "$work/int.h5" ] && ! "$py" -c "import h5py; h5py.File('$work/int.h5','r')['/cells']" 2>/dev/null; then
  bad "Ctrl-C left an unreadable results file"
else
  ok
fi

# kvdrift calibrate writes exactly the scales a run calibrates: a run given
# them through --scales gives the same figures
"$bin" calibrate --model tiny --seed 3 --calib-tokens 700 -o "$work/cal.json" >/dev/null
"$bin" run --model tiny --kv fp8-cal --context 256 --concurrency 1 --seed 3 --calib-tokens 700 --gen-tokens 0 --decode-tokens 2 -o "$work/c1.h5" >/dev/null 2>&1
"$bin" run --model tiny --kv fp8-cal --context 256 --concurrency 1 --seed 3 --scales "$work/cal.json" --gen-tokens 0 --decode-tokens 2 -o "$work/c2.h5" >/dev/null 2>&1
"$py" - "$work/c1.h5" "$work/c2.h5" <<'PY' && ok || bad "run --scales (from kvdrift calibrate) differs from run's own calibration"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert np.array_equal(a["/calibration/k_scale"][:], b["/calibration/k_scale"][:])
for p in ("/drift/summary", "/drift/layers", "/drift/attention"):
    assert np.array_equal(a[p][:]["mean" if p != "/drift/summary" else "value"], b[p][:]["mean" if p != "/drift/summary" else "value"], equal_nan=True), p
PY

# FP8 attention (--attn-fp8): the E4M3 modes' figures move, bf16's and
# fp8-e5m2's stay bit for bit; fp8-cal's query scales are those kvdrift
# calibrate writes; the settings say so (a spec's "attn_fp8" too), the run's
# output and the report say so, and a run without the flag records neither
fa=(run --model tiny --kv bf16,fp8-cal,fp8-unscaled,fp8-e5m2 --context 256 --seed 3 --calib-tokens 700 --gen-tokens 0 --cells drift)
"$bin" "${fa[@]}" -o "$work/fa0.h5" >/dev/null 2>&1
"$bin" "${fa[@]}" --attn-fp8 -o "$work/fa1.h5" >"$work/fa1.out" 2>&1
printf '{"model": "tiny", "kv": ["bf16", "fp8-cal", "fp8-unscaled", "fp8-e5m2"], "context": [256], "seed": 3, "calib_tokens": 700, "gen_tokens": 0, "cells": ["drift"], "attn_fp8": true, "output": "%s"}' "$work/fa2.h5" >"$work/fa.json"
"$bin" run --spec "$work/fa.json" >/dev/null 2>&1
"$bin" report "$work/fa0.h5" --format md -o "$work/fa0.md" 2>/dev/null
"$bin" report "$work/fa1.h5" --format md -o "$work/fa1.md" 2>/dev/null
"$bin" report "$work/fa1.h5" -o "$work/fa1.html" 2>/dev/null
"$bin" compare "$work/fa0.h5" "$work/fa1.h5" >"$work/fa.cmp" 2>&1
grep -q "^note: the runs differ in attn-fp8 (false against true)$" "$work/fa.cmp" &&
  ok || bad "compare does not say one run computed attention in FP8: $(cat "$work/fa.cmp")"
"$py" - "$work/fa0.h5" "$work/fa1.h5" "$work/fa2.h5" "$work/cal.json" "$work/fa1.out" "$work/fa0.md" "$work/fa1.md" "$work/fa1.html" <<'PY' && ok || bad "run --attn-fp8: $(cat "$work/fa1.out")"
import json, sys, h5py, numpy as np
a, b, c = (h5py.File(p, "r") for p in sys.argv[1:4])
sa, sb = json.loads(a.attrs["run_settings"]), json.loads(b.attrs["run_settings"])
assert "attn-fp8" not in sa and sb.pop("attn-fp8") is True and sa == sb
assert c.attrs["run_settings"] == b.attrs["run_settings"]  # the spec's field
assert "q_scale" not in a["calibration"]
cal = json.load(open(sys.argv[4]))
q = np.array([l["q_scale"] for l in cal["layers"]], dtype=np.float32)
assert q.shape == (2, 4) and np.array_equal(b["/calibration/q_scale"][:], q), (b["/calibration/q_scale"][:], q)
assert np.array_equal(a["/calibration/k_scale"][:], b["/calibration/k_scale"][:])
def toks(f, mode):
    ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
    r = ts[ts["mode"] == mode.encode()][0]
    return tk[r["first"]:r["first"] + r["n"]]
for mode in ("bf16", "fp8-e5m2"):
    x, y = toks(a, mode), toks(b, mode)
    assert all(np.array_equal(x[n], y[n], equal_nan=True) for n in x.dtype.names), mode
for mode in ("fp8-cal", "fp8-unscaled"):
    x, y = toks(a, mode), toks(b, mode)
    moved = np.abs(x["kl"] - y["kl"])
    assert (moved > 0).mean() > 0.5, (mode, (moved > 0).mean())
    # the isolated view holds the query and weights in E4M3 too
    assert not np.array_equal(x["attn_isolated"], y["attn_isolated"], equal_nan=True), mode
    assert np.array_equal(toks(c, mode)["kl"], y["kl"])
out = open(sys.argv[5]).read()
note = "the E4M3 modes computed attention in FP8, as FlashAttention 3 does over an FP8 cache (--attn-fp8)"
assert "In this run, " + note in out
assert note in open(sys.argv[7]).read() and note not in open(sys.argv[6]).read()
assert note in open(sys.argv[8]).read()
PY

# --fp8-overflow nan (a plain cast, no saturation): fp8-unscaled, whose
# values overflow E4M3 (fa0 saturated them), stores NaN, fails in a step and
# is named; it drops out of its group (and fails again alone), and every
# mode kept has fa0's figures
# (only a mode that saturated in fa0 can fail: past 464 a value is NaN, from
# 448 to 464 it rounds to 448 either way)
"$bin" "${fa[@]}" --fp8-overflow nan -o "$work/ov.h5" >"$work/ov.out" 2>"$work/ov.err"; rc=$?
[ $rc -eq 1 ] && grep -q "^kvdrift run: cell drift_fp8-unscaled_c1_ctx256_t0 failed among 4 modes at once; trying it alone$" "$work/ov.err" &&
  grep -q "^kvdrift run: cell drift_fp8-unscaled_c1_ctx256_t0: non-finite activation .* at sequence 0, position [0-9]*, hidden dim [0-9]* (under --fp8-overflow nan, an FP8 write past the format's range stores NaN or infinity)$" "$work/ov.err" &&
  grep -q "^fp8-unscaled *256 *failed " "$work/ov.out" &&
  grep -qE "^(1 cell|2 cells) did not finish \(.*ov.h5 keeps why in /failures\):$" "$work/ov.out" &&
  grep -q "^  fp8-unscaled: drift at 256 tokens (trace 0): non-finite activation" "$work/ov.out" &&
  grep -q "^In this run, the FP8 caches were written as a cast without a clamp writes them (--fp8-overflow nan)" "$work/ov.out" &&
  ok || bad "run --fp8-overflow nan: exit $rc, $(cat "$work/ov.err" "$work/ov.out")"
"$py" - "$work/fa0.h5" "$work/ov.h5" <<'PY' && ok || bad "run --fp8-overflow nan: the cells kept differ from a saturating run's"
import json, sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
sa, sb = json.loads(a.attrs["run_settings"]), json.loads(b.attrs["run_settings"])
assert sa.pop("fp8-saturate") is True and sb.pop("fp8-saturate") is False and sa == sb
kv = a["/drift/kv"][:]
kept = set(m.decode() for m in b["/cells"][:]["mode"])
failed = []
for mode in ("bf16", "fp8-cal", "fp8-unscaled", "fp8-e5m2"):
    if mode not in kept:
        k = kv[kv["mode"] == mode.encode()]
        assert ((k["k_saturated_frac"] > 0) | (k["v_saturated_frac"] > 0)).any(), mode
        failed.append(mode)
        continue
    for t in ("output", "layers", "attention", "summary", "kv"):
        x, y = a["/drift/" + t][:], b["/drift/" + t][:]
        x, y = x[x["mode"] == mode.encode()], y[y["mode"] == mode.encode()]
        assert len(x) and len(x) == len(y), (mode, t)
        for n in x.dtype.names:
            f = x[n].dtype.kind == "f"
            assert np.array_equal(x[n], y[n], equal_nan=f), (mode, t, n)
assert "fp8-unscaled" in failed and {"bf16", "fp8-e5m2"} <= kept, (failed, kept)
PY
# /failures keeps why (the message run printed), once per cell however often
# a rerun fails it again; report, compare and trend show it where figures
# are missing
"$bin" "${fa[@]}" --fp8-overflow nan -o "$work/ov.h5" >/dev/null 2>"$work/ov2.err"; rc=$?
"$bin" report "$work/ov.h5" --format md -o "$work/ov.md" 2>/dev/null
"$bin" compare "$work/fa0.h5" "$work/ov.h5" -o "$work/ov.cmp.md" >"$work/ov.cmp" 2>&1; crc=$?
"$bin" trend "$work/fa0.h5" "$work/ov.h5" --format md -o "$work/ov.trend.md" 2>/dev/null
"$py" - "$work/ov.h5" "$work/ov.err" "$work/ov.md" "$work/ov.cmp.md" "$work/ov.cmp" "$work/ov.trend.md" <<'PY' && [ $rc -eq 1 ] && [ $crc -eq 1 ] && ok || bad "run --fp8-overflow nan: /failures, or report and compare on it (exit $rc, compare $crc)"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
fl, cells = f["/failures"][:], f["/cells"][:]
names = [c.decode() for c in fl["cell"]]
assert len(names) == len(set(names)) and "drift_fp8-unscaled_c1_ctx256_t0" in names, names
assert not set(names) & set(c.decode() for c in cells["cell"])
err = open(sys.argv[2]).read()
for x in fl:
    assert x["kind"] == b"drift" and x["context"] == 256 and x["trace"] == 0
    msg = x["message"].decode()
    assert "non-finite activation" in msg and ("cell %s: %s" % (x["cell"].decode(), msg)) in err, msg
    line = "- %s: drift at 256 tokens (trace 0): %s" % (x["mode"].decode(), msg)
    assert line in open(sys.argv[3]).read().splitlines(), line
    assert line in open(sys.argv[4]).read().splitlines(), line
    assert "note: cells the candidate did not finish: " + line[2:] in open(sys.argv[5]).read()
    note = "ov: the FP8 caches were written as a cast without a clamp writes them (--fp8-overflow nan)"
    assert note in open(sys.argv[3]).read()
    trend = open(sys.argv[6]).read()
    assert "\nrun 2 (ov): cells that did not finish:\n\n" + line + "\n" in trend, trend
PY
# a throughput cell that fails is kept in /failures too, with its concurrency
"$bin" run --model tiny --kv bf16,fp8-unscaled --context 256 --concurrency 1,2 --cells throughput --decode-tokens 3 --repeats 1 --fp8-overflow nan -o "$work/ovt.h5" >"$work/ovt.out" 2>"$work/ovt.err"; rc=$?
"$py" - "$work/ovt.h5" <<'PY' && [ $rc -eq 1 ] && grep -q "^fp8-unscaled *256 *failed *failed$" "$work/ovt.out" && ok || bad "run --fp8-overflow nan, throughput: exit $rc, $(cat "$work/ovt.err" "$work/ovt.out")"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
fl, cells = f["/failures"][:], f["/cells"][:]
assert sorted((x["cell"].decode(), x["kind"].decode(), int(x["concurrency"]), int(x["trace"])) for x in fl) == [
    ("tput_fp8-unscaled_c1_ctx256", "throughput", 1, -1), ("tput_fp8-unscaled_c2_ctx256", "throughput", 2, -1)], fl
assert all(b"non-finite activation" in x["message"] for x in fl)
assert sorted(c.decode() for c in cells["cell"]) == ["tput_bf16_c1_ctx256", "tput_bf16_c2_ctx256"], cells
PY
cp "$work/ov.h5" "$work/ov.before"
resume_refused "$work/ov.h5" "$work/ov.before" "ov.h5 holds cells run with --fp8-overflow nan, this run has --fp8-overflow sat" "$bin" "${fa[@]}"

# resuming: a file's cells ran under its settings, model and traces; a run
# that differs in any of them is refused and leaves the file as it was, one
# that only adds cells resumes
c1=(run --model tiny --kv fp8-cal --context 256 --concurrency 1 --seed 3 --calib-tokens 700 --gen-tokens 0 --decode-tokens 2)
cp "$work/c1.h5" "$work/c1.before"
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells run with --seed 3, this run has --seed 4" "$bin" "${c1[@]}" --seed 4
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells of other weights \(their seed 1234, this run's 9\)" "$bin" "${c1[@]}" --weight-seed 9
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells run with --calibration absmax, this run has --calibration modelopt" "$bin" "${c1[@]}" --calibration modelopt
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells run with --repeats 3, this run has --repeats 2" "$bin" "${c1[@]}" --repeats 2
# the CPU's BLAS: the settings name it as kvdrift version does, and a resume
# whose OpenBLAS dispatches to another core type (other kernels, other last
# bits) is refused
blas=$("$bin" version | sed -n 's/^blas: //p')
other=Sandybridge
case "$blas" in *Sandybridge) other=Haswell ;; esac
"$py" -c "import sys, json, h5py; s = json.loads(h5py.File(sys.argv[1])['/'].attrs['run_settings']); assert s['blas'] == sys.argv[2] and sys.argv[2].startswith('OpenBLAS '), (s.get('blas'), sys.argv[2])" "$work/c1.h5" "$blas" &&
  ok || bad "run_settings do not name the BLAS ($blas)"
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells run with $blas, this run has OpenBLAS [0-9.]+ $other[^(]* \(another CPU's BLAS kernels round the sums otherwise\)" env OPENBLAS_CORETYPE=$other "$bin" "${c1[@]}"
# its attention kernels likewise (AMX, AVX-512 VBMI or portable: other last bits)
att=$("$bin" version | sed -n 's/^attention: //p')
"$py" -c "import sys, json, h5py; s = json.loads(h5py.File(sys.argv[1])['/'].attrs['run_settings']); assert s['cpu-attention'] == sys.argv[2] and sys.argv[2] in ('AMX', 'AVX-512', 'portable'), (s.get('cpu-attention'), sys.argv[2])" "$work/c1.h5" "$att" &&
  ok || bad "run_settings do not name the attention kernels ($att)"
if [ "$att" != portable ]; then
  resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells run with the $att attention kernels, this run has the portable ones \(they round the sums otherwise\)" env KVD_CPU_ATTENTION=portable "$bin" "${c1[@]}"
fi
resume_refused "$work/c1.h5" "$work/c1.before" "c1.h5 holds cells of another model" "$bin" run --model small --kv fp8-cal --context 256 --concurrency 1 --seed 3 --calib-tokens 700 --gen-tokens 0 --decode-tokens 2
if "$bin" "${c1[@]}" --kv fp8-cal,bf16 --context 128,256,384 -o "$work/c1.h5" >/dev/null 2>"$work/e5" &&
  grep -q "resuming .*c1.h5: 2 cells already finished" "$work/e5"; then ok; else bad "adding modes and contexts did not resume: $(cat "$work/e5")"; fi
"$py" - "$work/c1.before" "$work/c1.h5" <<'PY' && ok || bad "the resumed file lost or changed its first cells"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert len(a["/cells"]) == 2 and len(b["/cells"]) == 2 * 3 * 2, (len(a["/cells"]), len(b["/cells"]))
assert a.attrs["run_settings"] == b.attrs["run_settings"] and a.attrs["trace_spec"] == b.attrs["trace_spec"]
assert np.array_equal(a["/calibration/k_scale"][:], b["/calibration/k_scale"][:])
s = b["/drift/summary"][:]
old = a["/drift/summary"][:]
new = s[(s["mode"] == b"fp8-cal") & (s["context"] == 256)]
assert np.array_equal(np.sort(old, order=["metric", "subset"]), np.sort(new, order=["metric", "subset"]))
PY
# the same --scales file with other scales in it
cp "$work/c2.h5" "$work/c2.before"
"$bin" calibrate --model tiny --seed 3 --calib-tokens 300 -o "$work/cal300.json" >/dev/null
cp "$work/cal300.json" "$work/cal.json"
"$bin" run --model tiny --kv fp8-cal --context 256 --concurrency 1 --seed 3 --scales "$work/cal.json" --gen-tokens 0 --decode-tokens 2 -o "$work/c2.h5" >/dev/null 2>"$work/e5"; rc=$?
if [ $rc -eq 2 ] && grep -q "c2.h5 holds calibrated cells (fp8-cal, nvfp4-cal) run with other scales (its /calibration) than this run's from .*cal.json" "$work/e5" &&
  ! grep -q "resuming" "$work/e5" && cmp -s "$work/c2.h5" "$work/c2.before"; then ok; else bad "a changed scales file resumed: exit $rc, $(cat "$work/e5")"; fi
# a file another build wrote (its figures may differ in the last bits)
cp "$work/c1.h5" "$work/other.h5"
"$py" -c "import h5py, sys; h5py.File(sys.argv[1], 'r+').attrs['git_revision'] = '0000000'" "$work/other.h5"
"$bin" "${c1[@]}" -o "$work/other.h5" >/dev/null 2>"$work/e5"; rc=$?
if [ $rc -eq 2 ] && grep -q "other.h5 holds cells of kvdrift 0000000, this is " "$work/e5"; then ok; else bad "a file of another build resumed: exit $rc, $(cat "$work/e5")"; fi
# a file from before run_settings was recorded: its settings are unknown
cp "$work/c2.h5" "$work/old.h5"
"$py" -c "import h5py, sys; del h5py.File(sys.argv[1], 'r+').attrs['run_settings']" "$work/old.h5"
"$bin" run --model tiny --kv fp8-cal --context 256 --concurrency 1 --seed 3 --scales "$work/cal.json" --gen-tokens 0 --decode-tokens 2 -o "$work/old.h5" >/dev/null 2>"$work/e5"; rc=$?
if [ $rc -eq 2 ] && grep -q "old.h5: its cells cannot be resumed: it records no run settings" "$work/e5"; then ok; else bad "a file without run settings resumed: exit $rc, $(cat "$work/e5")"; fi

# bad input
"$bin" run --model tiny --context 8 -o "$work/x.h5" 2>"$work/e1"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--context: expected" "$work/e1"; then ok; else bad "--context 8 not refused"; fi
"$bin" run --model tiny --kv fp16 -o "$work/x.h5" 2>"$work/e2"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--kv: expected" "$work/e2"; then ok; else bad "--kv fp16 not refused"; fi
head -c 2000 "$work/a.h5" >"$work/cut.h5"
"$bin" "${sweep[@]}" -o "$work/cut.h5" 2>"$work/e3"; rc=$?
if [ $rc -eq 2 ] && grep -q "cut.h5: not a readable HDF5 file" "$work/e3"; then ok; else bad "a truncated results file not refused: $(cat "$work/e3")"; fi
printf '{"kv": ["bf16"], "context": [256], "concurrency": [1], "gen_tokens": 0, "decode_tokens": 2, "model": "tiny", "output": "%s"}' "$work/s.h5" >"$work/spec.json"
if "$bin" run --spec "$work/spec.json" >/dev/null 2>&1 && [ -e "$work/s.h5" ]; then ok; else bad "a JSON spec run failed"; fi
printf '{"kv": ["bf16"], "context": 256,,}' >"$work/badspec.json"
"$bin" run --spec "$work/badspec.json" 2>"$work/e4"; rc=$?
if [ $rc -eq 2 ] && grep -q "badspec.json: line 1" "$work/e4"; then ok; else bad "a malformed spec not refused: $(cat "$work/e4")"; fi

# --cells: throughput cells alone, a bad list, and --backend cuda where no
# device is visible (drift cells and throughput cells alike)
if "$bin" run --model tiny --kv bf16,fp8-cal --context 256 --concurrency 1,2 --cells throughput \
  --calib-tokens 128 --decode-tokens 3 -o "$work/tp.h5" >"$work/tp.out" 2>&1 &&
  grep -q "4 cells (0 drift rows, 4 throughput rows)" "$work/tp.out"; then ok; else bad "--cells throughput: $(tail -2 "$work/tp.out")"; fi
# a throughput-only file reports and compares at its own context (decode_tok_s
# for both modes, decode_vs_bf16 for fp8-cal, at C = 1 and 2: 6 checks)
"$bin" report "$work/tp.h5" --format md 2>/dev/null | grep -q "^Context 256 tokens;" && ok || bad "report of a throughput-only file: $("$bin" report "$work/tp.h5" --format md 2>&1 | tail -1)"
"$bin" compare "$work/tp.h5" "$work/tp.h5" >"$work/tpc.out" 2>&1 && grep -q "^compare: 6 checks, 0 regressions: pass$" "$work/tpc.out" && ok || bad "compare of throughput-only files: $(cat "$work/tpc.out")"
# --repeats: one warm-up pass and N timed decode passes from the prefilled
# state. With one timed pass its steps are the whole pass: decode tokens/s is
# C steps' tokens over their summed ITL (within what the loop around the
# steps costs); the settings name the count, and --repeats 0 is refused
if "$bin" run --model tiny --kv bf16 --context 256 --concurrency 1,3 --cells throughput \
  --decode-tokens 6 --repeats 1 -o "$work/rp.h5" >"$work/rp.out" 2>&1 &&
  "$py" - "$work/rp.h5" "$blas" <<'PY'
import json, sys
import h5py
f = h5py.File(sys.argv[1], "r")
# with the kernel of a few rows (AVX-512 or AVX2) a decode of up to 32
# sequences sums every row as it would
# alone: the batched first step is the same bits as each sequence's own
import re
few = re.search(r"up to (\d+) rows: ", sys.argv[2])
few_rows = int(few.group(1)) if few else 0
assert json.loads(f.attrs["run_settings"])["repeats"] == 1
for r in f["/throughput"][:]:
    c, steps = int(r["concurrency"]), int(r["output_tokens"]) - 1
    from_itl = c * steps / (r["itl_ms_mean"] * steps / 1e3)
    assert abs(r["decode_tok_s"] / from_itl - 1) < 0.05, (c, r["decode_tok_s"], from_itl)
    assert r["itl_ms_p50"] <= r["itl_ms_p90"] <= r["itl_ms_p99"], r
    if c <= few_rows:
        assert r["batch_drift_max_rel"] == 0, r
    else:
        assert r["batch_drift_max_rel"] < 1e-3 and (c == 1) == (r["batch_drift_max_rel"] == 0), r
PY
then ok; else bad "--repeats 1: $(tail -3 "$work/rp.out")"; fi
# the kernel of a few rows, taken by what the CPU has: its AVX2 twin gives
# the AVX-512 one's bits (a forward pass of 24 tokens: every GEMM has at
# most 24 rows; fp8-cal's calibration has more, which the AMX kernels take
# where the CPU has them, so the AVX-512 ones without AMX are the base);
# KVD_CPU_GEMM=blas leaves them to OpenBLAS and says so
few=$("$bin" version | sed -n 's/^blas: .*up to [0-9]* rows: //p')
base=$(case "$few" in *AMX*) echo avx512 ;; esac)
if [ -n "$few" ]; then
  KVD_CPU_GEMM=$base "$bin" forward --model tiny --tokens 24 --kv bf16,fp8-cal --dump "$work/kd" >/dev/null &&
    KVD_CPU_GEMM=avx2 "$bin" forward --model tiny --tokens 24 --kv bf16,fp8-cal --dump "$work/k2" >/dev/null &&
    diff -r "$work/kd" "$work/k2" >/dev/null && ok || bad "KVD_CPU_GEMM=avx2: other bytes than $few"
fi
KVD_CPU_GEMM=blas "$bin" version | grep -qE "^blas: OpenBLAS [^;]*$" && ok || bad "KVD_CPU_GEMM=blas: $(KVD_CPU_GEMM=blas "$bin" version | grep blas)"
# the GEMMs of more than 32 rows on the AMX tiles, where the CPU has them:
# the products are sgemm's, the sums in another order, so the logits move in
# their last bits (tiny over 64 tokens: prefill's GEMMs have 64 rows); with
# the FP8 cache a little more: a value at a rounding midpoint takes the
# other code, and the calibrated scales move in their last bits
if [ "$base" = avx512 ]; then
  "$bin" forward --model tiny --tokens 64 --kv bf16,fp8-cal --dump "$work/ga" >/dev/null &&
    KVD_CPU_GEMM=avx512 "$bin" forward --model tiny --tokens 64 --kv bf16,fp8-cal --dump "$work/gb" >/dev/null &&
    "$py" - "$work/ga" "$work/gb" <<'PY' && ok || bad "KVD_CPU_GEMM=amx against avx512: logits (above)"
import sys, numpy as np
for m, tol in (("bf16", 1e-4), ("fp8-cal", 1e-3)):
    a, b = (np.fromfile(f"{d}/{m}/logits.f32", np.float32) for d in sys.argv[1:])
    rel = float(np.abs(a - b).max() / np.abs(a).max())
    assert (a != b).any() and rel < tol, (m, rel)
PY
fi
# KVD_CPU_ATTENTION=portable: the portable attention kernels where the
# AVX-512 ones would run; the logits move in the last bits only (the BF16
# cache's: a K/V value at a rounding midpoint takes the other code)
if [ "$("$bin" version | sed -n 's/^attention: //p')" = AVX-512 ]; then
  "$bin" forward --model tiny --tokens 64 --kv bf16,fp8-cal --dump "$work/av" >/dev/null &&
    KVD_CPU_ATTENTION=portable "$bin" forward --model tiny --tokens 64 --kv bf16,fp8-cal --dump "$work/ap" >/dev/null &&
    "$py" - "$work/av" "$work/ap" <<'PY' && ok || bad "KVD_CPU_ATTENTION=portable: logits (above)"
import sys, numpy as np
for m in ("bf16", "fp8-cal"):
    a, b = (np.fromfile(f"{d}/{m}/logits.f32", np.float32) for d in sys.argv[1:])
    rel = float(np.abs(a - b).max() / np.abs(a).max())
    assert (a != b).any() and rel < 1e-4, (m, rel)
PY
fi
"$bin" run --model tiny --repeats 0 -o "$work/r0.h5" 2>"$work/e8"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--repeats: expected an integer in 1..1000, got '0'" "$work/e8" && [ ! -e "$work/r0.h5" ]; then ok; else bad "--repeats 0 not refused: $(cat "$work/e8")"; fi
"$bin" run --model tiny --cells drifts -o "$work/c.h5" 2>"$work/e6"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--cells: expected a list of drift and throughput" "$work/e6"; then ok; else bad "--cells drifts not refused"; fi
if "$bin" version | grep -q "^cuda: no CUDA device visible"; then
  for cells in drift throughput; do
    "$bin" run --model tiny --backend cuda --cells $cells -o "$work/c.h5" 2>"$work/e7"; rc=$?
    if [ $rc -eq 1 ] && grep -q -- "--backend cuda: no CUDA device visible" "$work/e7" && [ ! -e "$work/c.h5" ]; then ok; else bad "--backend cuda --cells $cells without a device: $(cat "$work/e7")"; fi
  done
fi

# a dense model (num_experts 0): no router, so no router% in the summary,
# no flips per position, no router rows and no routing section in the report
"$bin" export --model tiny -o "$work/tinyck" >/dev/null 2>&1
"$py" -c "
import json, sys
c = json.load(open(sys.argv[1])); c['num_experts'] = 0; c.setdefault('intermediate_size', 256)
json.dump(c, open(sys.argv[2], 'w'))" "$work/tinyck/config.json" "$work/dense.json"
if "$bin" run --config "$work/dense.json" --kv bf16,fp8-cal --context 256 --cells drift -o "$work/dense.h5" >"$work/dense.out" 2>&1 &&
  "$bin" report "$work/dense.h5" -o "$work/dense.html" 2>/dev/null &&
  awk '$1 == "kv_mode" {for (i = 1; i <= NF; i++) if ($i == "router%") c = i} $1 == "fp8-cal" && c {v = $c} END {exit v != "-"}' "$work/dense.out" &&
  ! grep -q "Expert routing" "$work/dense.html" && "$py" - "$work/dense.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert f["/drift/tokens"].shape[0] == 2 * 255 and np.all(f["/drift/tokens"]["router_flips"] == 0)
assert not np.any(f["/drift/layers"]["metric"] == b"router_flip")
assert not np.any(f["/drift/summary"]["metric"] == b"router_flip_rate")
PY
then ok; else bad "a dense model's router figures: $(tail -4 "$work/dense.out")"; fi

# bench lockstep: the drift run (twice) and the candidate alone (twice),
# their times and ratios (a benchmark: only that it runs and reports sane figures)
if "$bin" bench lockstep --model tiny --context 256 --reps 1 >"$work/ls.out" 2>"$work/ls.err" &&
  awk '/every row.s logits:/ {a = $6} /last row.s logits:/ {b = $6} /lock step with BF16/ {c = $7}
       /copy starts only:/ {d = $9} /^  ratio: / {r = $2 + 0}
       END {exit !(a > 0 && b > 0 && c > 0 && d > 0 && r > 0 && r < 100 &&
       (r - c / a) ^ 2 < 0.0625 * r * r)}' "$work/ls.out"; then ok; else bad "bench lockstep: $(cat "$work/ls.out" "$work/ls.err")"; fi

echo "run: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
