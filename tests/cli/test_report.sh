#!/usr/bin/env bash
# kvdrift report and compare on a real tiny result file: HTML and every SVG
# well-formed (xmllint), plotted points equal to the file's numbers, Markdown
# and CSV outputs, compare's exit codes, and a headless-Chromium screenshot
# that is not blank where Debian's chromium is installed.
set -u
bin="$1"
thresholds="$2"
py=/usr/bin/python3
if ! "$py" -c "import h5py, numpy" 2>/dev/null || ! command -v xmllint >/dev/null; then
  echo "SKIP: needs /usr/bin/python3 with h5py and numpy, and xmllint (scripts/setup.sh installs them)"
  exit 77
fi
. "$(dirname "$0")/lib.sh"
nightly="$(cd "$(dirname "$0")/../.." && pwd)/baselines/nightly.h5"

"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 512 --concurrency 1,2 \
  --gen-tokens 4 --decode-tokens 3 --calib-tokens 512 -o "$work/r.h5" >/dev/null 2>&1 || bad "sweep failed"
"$bin" report "$work/r.h5" -o "$work/r.html" 2>/dev/null && ok || bad "report html failed"
xmllint --noout "$work/r.html" 2>"$work/x.err" && ok || bad "HTML is not well-formed: $(head -3 "$work/x.err")"
grep -q '^ &quot;calib-tokens&quot;: 512,$' "$work/r.html" && ok || bad "the provenance does not show the run settings"

"$py" - "$work/r.h5" "$work/r.html" "$work" <<'PY' && ok || bad "plotted values differ from the file"
import sys, re
import xml.etree.ElementTree as ET
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
html = open(sys.argv[2]).read()
svgs = re.findall(r"<svg .*?</svg>", html, re.S)
assert len(svgs) >= 8, len(svgs)
for i, s in enumerate(svgs):  # each chart on its own is well-formed XML
    open(f"{sys.argv[3]}/chart{i}.svg", "w").write(s)
ns = "{http://www.w3.org/2000/svg}"
out = f["/drift/output"][:]
# the KL-against-position chart: every point is a bucket mean of the file
kl_chart = ET.fromstring(svgs[0])
pts = [c for c in kl_chart.iter(ns + "circle") if c.get("class") == "pt"]
assert pts
for c in pts:
    mode = c.get("data-series").encode()
    x, y = float(c.get("data-x")), float(c.get("data-y"))
    rows = out[(out["mode"] == mode) & (out["subset"] == b"all") & (out["metric"] == b"kl")]
    b = int(round(np.log2(x * x) / 2)) if x > 1.5 else 0
    lo = 1 if b == 0 else 2 ** b
    row = rows[rows["bucket"] == b]
    assert len(row) == 1 and abs(np.sqrt(lo * (2 ** (b + 1) - 1)) - x) < 1e-9 * x, (mode, x)
    assert row["mean"][0] == y, (mode, b, row["mean"][0], y)
# every non-zero bucket of every mode is drawn (zeros cannot sit on a log axis)
for mode in (b"fp8-cal", b"fp8-unscaled"):
    rows = out[(out["mode"] == mode) & (out["subset"] == b"all") & (out["metric"] == b"kl") & (out["mean"] > 0)]
    assert len([c for c in pts if c.get("data-series").encode() == mode]) == len(rows), mode
# the heatmap cells are the layer table's means
lay = f["/drift/layers"][:]
heat = [ET.fromstring(s) for s in svgs if 'class="chart heatmap"' in s]
assert len(heat) == 2  # one per non-reference mode
cells = [r for r in heat[0].iter(ns + "rect") if r.get("class") == "cell"]
L = 8
for r in cells:
    layer = L - 1 - int(r.get("data-row"))
    b = int(r.get("data-col"))
    v = float(r.get("data-v"))
    row = lay[(lay["mode"] == b"fp8-cal") & (lay["layer"] == layer) & (lay["bucket"] == b) & (lay["subset"] == b"all") & (lay["metric"] == b"rel_l2")]
    if len(row):
        assert row["mean"][0] == v, (layer, b)
    else:
        assert np.isnan(v)
# one colour scale for both maps: the smallest non-zero and the largest cell of either
both = lay[((lay["mode"] == b"fp8-cal") | (lay["mode"] == b"fp8-unscaled")) & (lay["subset"] == b"all") & (lay["metric"] == b"rel_l2")]["mean"]
for h in heat:
    assert float(h.get("data-lo")) == both[both > 0].min() and float(h.get("data-hi")) == both.max(), (h.get("data-lo"), h.get("data-hi"))
# the copy/other bars are the summary table's kl_mean per subset
summ = f["/drift/summary"][:]
bars = [ET.fromstring(s) for s in svgs if "copy positions" in s][0]
rects = [r for r in bars.iter(ns + "rect") if r.get("class") == "bar"]
assert len(rects) == 4
for r in rects:
    sub = b"copy" if "copy" in r.get("data-series") else b"other"
    mode = r.get("data-group").encode()
    want = summ[(summ["mode"] == mode) & (summ["subset"] == sub) & (summ["metric"] == b"kl_mean")]["value"][0]
    assert float(r.get("data-y")) == want
# decode throughput points are the throughput table's
tp = f["/throughput"][:]
dec = [ET.fromstring(s) for s in svgs if "decode throughput" in s][0]
for c in dec.iter(ns + "circle"):
    mode = c.get("data-series").encode()
    conc = int(float(c.get("data-x")))
    want = tp[(tp["mode"] == mode) & (tp["concurrency"] == conc)]["decode_tok_s"][0]
    assert float(c.get("data-y")) == want
PY
for s in "$work"/chart*.svg; do
  xmllint --noout "$s" 2>/dev/null || { bad "$(basename "$s") is not well-formed"; break; }
done
ok

"$bin" report "$work/r.h5" --format md >"$work/r.md" && grep -q '^| r | fp8-unscaled |' "$work/r.md" && ok || bad "markdown"
# the verdict table's "K saturated / V flushed to 0": each FP8 mode's shares
# of the values its cache writes lost that way, over every layer and head
"$py" - "$work/r.h5" "$work/r.md" <<'PY' && ok || bad "markdown: the K saturated / V flushed column differs from /drift/kv"
import sys, h5py, numpy as np
kv = h5py.File(sys.argv[1])["drift/kv"][:]
rows = {l.split("|")[2].strip(): [c.strip() for c in l.split("|")[1:-1]]
        for l in open(sys.argv[2]) if l.startswith("| r |")}
head = [c.strip() for c in open(sys.argv[2]).read().split("\n")[2].split("|")[1:-1]]
col = head.index("K saturated / V flushed to 0")
assert rows["bf16"][col] == "-", rows["bf16"]
for mode in ("fp8-cal", "fp8-unscaled"):
    k = kv[(kv["mode"] == mode.encode()) & (kv["context"] == 512)]
    w = k["n_values"]
    want = "%.3f%% / %.3f%%" % (100 * (k["k_saturated_frac"] * w).sum() / w.sum(),
                                  100 * (k["v_flushed_frac"] * w).sum() / w.sum())
    assert rows[mode][col] == want, (mode, rows[mode][col], want)
# unscaled flushes V (the tiny model's V is far below 1), calibrated does not
vf = {m: float(rows[m][col].split("/")[1].rstrip("% ")) for m in ("fp8-cal", "fp8-unscaled")}
assert vf["fp8-unscaled"] > 1 > 100 * vf["fp8-cal"], vf
PY
# runs are told apart: file names that clash take more of their path, one
# file given twice is numbered; more files than a report takes are refused
mkdir -p "$work/a" "$work/b"
cp "$work/r.h5" "$work/a/r.h5"
cp "$work/r.h5" "$work/b/r.h5"
"$bin" report "$work/a/r.h5" "$work/b/r.h5" "$work/a/r.h5" --format md >"$work/ab.md" &&
  [ "$(grep -c '^| a/r | fp8-cal |' "$work/ab.md")" -eq 1 ] && [ "$(grep -c '^| b/r | fp8-cal |' "$work/ab.md")" -eq 1 ] &&
  [ "$(grep -c '^| a/r #2 | fp8-cal |' "$work/ab.md")" -eq 1 ] && ok || bad "clashing run labels: $(cat "$work/ab.md")"
# a chart that cannot hold every run's modes says which it shows
"$bin" report $(for i in $(seq 9); do echo "$work/r.h5"; done) -o "$work/nine.html" 2>/dev/null &&
  [ "$(grep -c "This chart shows the first 24 of 27 series" "$work/nine.html")" -eq 3 ] &&
  ! grep -q "This chart shows" "$work/r.html" && ok || bad "charts with more series than they hold"
"$bin" report $(for i in $(seq 65); do echo "$work/r.h5"; done) --format md >/dev/null 2>"$work/e65"; rc=$?
[ $rc -eq 2 ] && grep -q "expected at most 64 result files" "$work/e65" && ok || bad "65 files: exit $rc $(cat "$work/e65")"
"$bin" report "$work/r.h5" "$work/r.h5" -o "$work/two.html" 2>/dev/null && xmllint --noout "$work/two.html" && grep -q "r: fp8-cal" "$work/two.html" && ok || bad "two files side by side"
"$bin" report "$work/r.h5" --format csv -o "$work/r.csv" 2>/dev/null
"$py" - "$work/r.h5" "$work/r.csv" <<'PY' && ok || bad "csv"
import csv, sys
import h5py
rows = list(csv.DictReader(open(sys.argv[2])))
assert list(rows[0].keys()) == ["run", "mode", "context", "subset", "metric", "value"]
s = h5py.File(sys.argv[1], "r")["/drift/summary"][:]
want = s[(s["mode"] == b"fp8-cal") & (s["subset"] == b"all") & (s["metric"] == b"kl_mean")]["value"][0]
got = [r for r in rows if r["mode"] == "fp8-cal" and r["subset"] == "all" and r["metric"] == "kl_mean"]
assert len(got) == 1 and abs(float(got[0]["value"]) - want) <= 1e-8 * abs(want)
PY

# the headline: each other FP8 mode against fp8-cal, recomputed from the
# file (pooled over its traces): the mean KL paired by position, the 99th
# percentile with its paired order-statistic error where there is one,
# top-1 agreement, the routing paired by position, the cache's losses; a
# CPU run's speeds said to be the CPU's; neither where it does not apply
"$bin" report "$work/r.h5" --format md -o "$work/r.md" 2>/dev/null
"$bin" report "$nightly" --format md -o "$work/nightly.md" 2>/dev/null
cat >"$work/headline.py" <<'PY'
import sys, math, html as H
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s, kv, lay = f["/drift/summary"][:], f["/drift/kv"][:], f["/drift/layers"][:]
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
def rows(mode, metric):
    r = s[(s["mode"] == mode.encode()) & (s["subset"] == b"all") & (s["metric"] == metric.encode())]
    assert len(r) == len(set(ts["trace"])), (mode, metric)
    return r
def fig(mode, metric):  # the traces' n-weighted mean
    r = rows(mode, metric)
    return float((r["n"] * r["value"]).sum() / r["n"].sum())
def pos(mode, col):  # every trace's positions, in trace order
    return np.concatenate([tk[col][r["first"]:r["first"] + r["n"]] for r in np.sort(ts[ts["mode"] == mode.encode()], order="trace")]).astype(np.float64)
def shares(mode):
    r = kv[kv["mode"] == mode.encode()]
    w = r["n_values"]
    return 100 * (w * r["k_saturated_frac"]).sum() / w.sum(), 100 * (w * r["v_flushed_frac"]).sum() / w.sum()
def pct(v, q):
    v = np.sort(v); x = q * (len(v) - 1); i = int(x)
    return v[i] + (x - i) * (v[i + 1] - v[i])
def ose(v, q):  # NaN where the interval runs past the ends
    v = np.sort(v); n = len(v); h = 1.959963984540054 * math.sqrt(n * q * (1 - q))
    lo, hi = math.floor(n * q - h), math.ceil(n * q + h)
    return (v[hi] - v[lo]) / (2 * 1.959963984540054) if lo >= 0 and hi <= n - 1 else math.nan
def apart(z):
    return "" if not math.isfinite(z) else (f" ({math.floor(10 * z) / 10:.1f} standard errors apart: within the error)" if z < 2 else f" ({z:.0f} standard errors apart)")
nl = len(set(lay[lay["metric"] == b"router_flip"]["layer"]))
c, c99, kc_ = fig("fp8-cal", "kl_mean"), pct(pos("fp8-cal", "kl"), .99), pos("fp8-cal", "kl")
want, zs = [], {}
def words(z):  # how many standard errors apart, in the report's words
    return f"{math.floor(10 * z) / 10:.1f} standard errors apart: within the error" if z < 2 else f"{z:.0f} standard errors apart"
for o in ("fp8-unscaled", "fp8-ckpt", "fp8-e5m2", "nvfp4-cal", "nvfp4-unscaled", "fp8-token"):
    if not (ts["mode"] == o.encode()).any():
        continue
    u, ku = fig(o, "kl_mean"), pos(o, "kl")
    d = ku - kc_
    z = abs(u - c) / (d.std(ddof=1) / math.sqrt(len(d)))
    how = (f"drifts as far as fp8-cal within the error (mean output KL {u:.3e} against {c:.3e}, {math.floor(10 * z) / 10:.1f} standard errors apart)"
           if z < 2 else f"drifts {u / c:.2g}x as far as fp8-cal (mean output KL {u:.3e} against {c:.3e}, {z:.0f} standard errors apart)")
    u99 = pct(ku, .99)
    assert abs(u99 - fig(o, "kl_p99")) <= 1e-6 * u99 or len(set(ts["trace"])) > 1
    sa, sb = ose(kc_, .99), ose(ku, .99)
    rho = np.corrcoef(kc_ <= c99, ku <= u99)[0, 1]
    z99 = abs(u99 - c99) / math.sqrt(sa * sa + sb * sb - 2 * rho * sa * sb)
    ru, rc = fig(o, "router_flip_rate"), fig("fp8-cal", "router_flip_rate")
    dr = (pos(o, "router_flips") - pos("fp8-cal", "router_flips")) / nl
    zr = abs(ru - rc) / (dr.std(ddof=1) / math.sqrt(len(dr)))
    (ku_, vu), (kc2, vc) = shares(o), shares("fp8-cal")
    # an NVFP4 cache without scales against NVFP4's calibrated one, paired
    nvc = ""
    if o == "nvfp4-unscaled" and (ts["mode"] == b"nvfp4-cal").any():
        n, dn = fig("nvfp4-cal", "kl_mean"), ku - pos("nvfp4-cal", "kl")
        zn = abs(u - n) / (dn.std(ddof=1) / math.sqrt(len(dn)))
        nvc = f"; against nvfp4-cal {u / n:.2g}x (mean output KL {n:.3e}, {words(zn)})"
        print(f"nvfp4-unscaled against nvfp4-cal: z {zn:.2f}", file=sys.stderr)
    want.append(f"{o} {how}; 99th-percentile KL {u99:.3e} against {c99:.3e}{apart(z99)}; "
                f"top-1 agreement {fig(o, 'same_top_p'):.4f} against {fig('fp8-cal', 'same_top_p'):.4f}{nvc}; "
                f"experts rerouted at {100 * ru:.2f}% of (position, MoE layer) pairs against {100 * rc:.2f}%{apart(zr)}; "
                f"K saturated {ku_:.3f}% against {kc2:.3f}%, V flushed to zero {vu:.3f}% against {vc:.3f}%.")
    zs[o] = (z, z99, zr)
print(f"{sys.argv[1]}: headline z (mean, p99, routing) {zs}", file=sys.stderr)
md = open(sys.argv[2]).read()
assert "\nAgainst the calibrated FP8 cache, same weights and trace:\n\n" + "".join("- " + w + "\n" for w in want) in md, want
assert md.count("\n- ") == len(want)
# the 99th percentile's error exists only where its order statistics do
assert all(math.isfinite(z[1]) == (sys.argv[4] == "p99-error") for z in zs.values()), zs
if len(sys.argv) > 3 and sys.argv[3] != "-":
    page = open(sys.argv[3]).read()
    for w in want:
        assert "<li>" + H.escape(w, quote=True).replace("&#x27;", "'") + "</li>" in page
    assert '<ul class="headline">\n<li>' in page
    assert "Speeds are the CPU back end's" in md and "Speeds are the CPU back end" in page
    (ku_, vu), (kc2, vc) = shares("fp8-unscaled"), shares("fp8-cal")
    assert vu > 100 * vc  # the story it tells: unscaled V lands in the flush-to-zero range
PY
# r.h5: 511 positions, too few for the 99th percentile's order statistics;
# the nightly baseline: two traces of 2047, three FP8 modes
"$py" "$work/headline.py" "$work/r.h5" "$work/r.md" "$work/r.html" no-p99-error 2>"$work/hl.err" &&
  ok || bad "the headline against fp8-cal: $(tail -3 "$work/hl.err") $(cat "$work/r.md")"
"$py" "$work/headline.py" "$nightly" "$work/nightly.md" - p99-error 2>"$work/hl.err" &&
  ok || bad "the nightly baseline's headline against fp8-cal: $(tail -3 "$work/hl.err") $(cat "$work/nightly.md")"
# what NVFP4's flushed share means, under the verdict where a run has an
# nvfp4 mode (the nightly baseline) and nowhere else
grep -q "^The nvfp4 modes are NVFP4 caches: .* the share is the format's, not the sign of a missing scale.$" "$work/nightly.md" &&
  ! grep -q "nvfp4 modes are NVFP4" "$work/r.md" && ok || bad "the NVFP4 note under the verdict"
# and what the per-token modes' scales are, where a run has one (the
# nightly baseline's fp8-token)
grep -q "^The -token modes give each row (a token's K or V of one KV head) its own scale .* int8-token-rn rounds.$" "$work/nightly.md" &&
  ! grep -q "token modes give" "$work/r.md" && ok || bad "the per-token note under the verdict"
# the KL tail: each point the share of the file's positions above its x;
# no series for bf16 (no drift)
"$py" - "$work/r.h5" "$work/r.html" "$work/r.md" <<'PY' && ok || bad "the KL tail chart differs from /drift/tokens"
import sys, re
import xml.etree.ElementTree as ET
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
html = open(sys.argv[2]).read()
svg = next(x for x in re.findall(r"<svg .*?</svg>", html, re.S) if "whose next-token KL exceeds x" in x)
ns = "{http://www.w3.org/2000/svg}"
pts = [c for c in ET.fromstring(svg).iter(ns + "circle") if c.get("class") == "pt"]
assert {c.get("data-series") for c in pts} == {"fp8-cal", "fp8-unscaled"}
for mode in ("fp8-cal", "fp8-unscaled"):
    r = ts[ts["mode"] == mode.encode()][0]
    kl = tk["kl"][r["first"]:r["first"] + r["n"]].astype(np.float64)
    mine = [c for c in pts if c.get("data-series") == mode]
    xs = [float(c.get("data-x")) for c in mine]
    assert len(mine) >= 8 and xs == sorted(xs) and float(mine[0].get("data-y")) == 1.0, xs
    for c in mine:
        x, y = float(c.get("data-x")), float(c.get("data-y"))
        assert y == (kl > x).mean() > 0, (mode, x, y, (kl > x).mean())
    assert (kl > xs[-1] * 10 ** 0.25).mean() == 0  # the series ends where nothing is above
# each mode in the colour it has in the KL-against-position chart
first = next(x for x in re.findall(r"<svg .*?</svg>", html, re.S) if "KL against position" in x)
def colours(svg):
    return {c.get("data-series"): c.get("fill") for c in ET.fromstring(svg).iter(ns + "circle") if c.get("class") == "pt"}
above, tail = colours(first), colours(svg)
assert all(tail[m] == above[m] for m in tail) and len(set(tail.values())) == 2, (above, tail)
# the tail in one sentence, on the page under the chart and in the Markdown
def share(mode, x):
    r = ts[ts["mode"] == mode.encode()][0]
    return 100 * (tk["kl"][r["first"]:r["first"] + r["n"]].astype(np.float64) > x).mean()
want = ("Share of positions whose next-token KL exceeds 0.001 / 0.01 nats: "
        + ", ".join(f"{m} {share(m, 1e-3):.1f}% / {share(m, 1e-2):.1f}%" for m in ("fp8-cal", "fp8-unscaled")) + ".")
assert f'<p class="tail">{want}</p>' in html, want
assert "\n" + want + "\n" in open(sys.argv[3]).read(), want
PY
# without positions (a schema version 1 file) the headline weighs the
# difference by the two means' combined errors
cp "$work/r.h5" "$work/v1.h5"
"$py" - "$work/v1.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r+")
del f["/drift/token_sets"], f["/drift/tokens"]
f.attrs["schema_version"] = np.array([1], dtype=np.int32)
PY
"$bin" report "$work/v1.h5" --format md -o "$work/v1.md" 2>/dev/null &&
  "$py" - "$work/v1.h5" "$work/v1.md" <<'PY' && ok || bad "a version 1 file's headline: $(cat "$work/v1.md")"
import sys, re, math, h5py
s = h5py.File(sys.argv[1], "r")["/drift/summary"][:]
def fig(mode, metric):
    return float(s[(s["mode"] == mode.encode()) & (s["subset"] == b"all") & (s["metric"] == metric.encode())]["value"][0])
z = abs(fig("fp8-unscaled", "kl_mean") - fig("fp8-cal", "kl_mean")) / math.hypot(fig("fp8-unscaled", "kl_mean_err"), fig("fp8-cal", "kl_mean_err"))
m = re.search(r"^- fp8-unscaled .*?, ([0-9.]+) standard errors apart\)", open(sys.argv[2]).read(), re.M)
assert m and m.group(1) == (f"{math.floor(10 * z) / 10:.1f}" if z < 2 else f"{z:.0f}"), (m and m.group(1), z)
PY
"$bin" report "$work/v1.h5" -o "$work/v1.html" 2>/dev/null && xmllint --noout "$work/v1.html" &&
  ! grep -q "How the drift is spread" "$work/v1.html" && ok || bad "a version 1 file has a KL tail chart"
# the greedy continuations, each cell from the file; no section without them
"$py" - "$work/r.h5" "$work/r.html" <<'PY' && ok || bad "the greedy continuation table differs from the file"
import sys, re
import h5py
g = h5py.File(sys.argv[1], "r")["/drift/generation"][:]
page = open(sys.argv[2]).read()
table = re.search(r'<table class="gen">(.*?)</table>', page, re.S).group(1)
prefixes = [int(p) for p in re.findall(r"<th>from (\d+) of 512 tokens</th>", table)]
assert prefixes == sorted(set(int(p) for p in g["prefix"])), prefixes
for mode in ("fp8-cal", "fp8-unscaled"):
    cells = re.search(rf'<tr><td class="l">{mode}</td>(.*?)</tr>', table).group(1)
    got = re.findall(r"<td>([^<]*)</td>", cells)
    want = []
    for p in prefixes:
        x = g[(g["mode"] == mode.encode()) & (g["prefix"] == p)]
        assert len(x) == 1 and x["tokens"][0] == 4
        fd = int(x["first_divergence"][0])
        want.append(f"{'all 4' if fd >= 4 else f'{fd} of 4'}, {100 * x['agree_rate'][0]:.0f}% agree")
    assert got == want, (mode, got, want)
assert "bf16</td>" not in table and "(the median over traces)" not in page
PY
cp "$work/r.h5" "$work/nogen.h5"
"$py" -c "
import sys, h5py
f = h5py.File(sys.argv[1], 'r+'); a = f['/drift/generation'][:]; del f['/drift/generation']; f['/drift/generation'] = a[:0]" "$work/nogen.h5"
"$bin" report "$work/nogen.h5" -o "$work/nogen.html" 2>/dev/null && xmllint --noout "$work/nogen.html" &&
  ! grep -q "Greedy continuation" "$work/nogen.html" && ok || bad "a run without greedy continuations has their section"
# several traces: every view pools them, each weighted by its n, as one
# sample (the mean's standard error from the traces' errors, not their
# average): the verdict and run's summary, the CSV, the KL chart with its
# band, the heatmap, the KV table
"$bin" run --model tiny --kv bf16,fp8-cal --context 256 --traces 3 --cells drift --gen-tokens 6 \
  -o "$work/t3.h5" >"$work/t3.out" 2>&1 || bad "a sweep over 3 traces failed: $(cat "$work/t3.out")"
"$bin" report "$work/t3.h5" --format md -o "$work/t3.md" 2>/dev/null &&
  "$bin" report "$work/t3.h5" --format csv -o "$work/t3.csv" 2>/dev/null &&
  "$bin" report "$work/t3.h5" -o "$work/t3.html" 2>/dev/null && xmllint --noout "$work/t3.html" &&
  "$py" - "$work/t3.h5" "$work/t3.md" "$work/t3.csv" "$work/t3.html" "$work/t3.out" 2>"$work/t3.err" <<'PY' && ok || bad "figures over several traces are not pooled as one sample: $(tail -3 "$work/t3.err")"
import csv, re, sys
import xml.etree.ElementTree as ET
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s = f["/drift/summary"][:]
s = s[(s["mode"] == b"fp8-cal") & (s["subset"] == b"all")]
assert sorted(set(s["trace"])) == [0, 1, 2]
def pooled(metric):
    r = s[s["metric"] == metric.encode()]
    n, v = r["n"], r["value"]
    assert len(r) == 3
    if metric.endswith("_err"): return np.sqrt(((n * v) ** 2).sum()) / n.sum()
    if metric == "kl_max": return v.max()
    if metric == "kl_min": return v.min()
    if metric == "delta_p_rms": return np.sqrt((n * v * v).sum() / n.sum())
    if metric in pct:  # every trace's positions together
        return float(np.percentile(kl, 100 * pct[metric]))
    return (n * v).sum() / n.sum()
pct = {"kl_p99_9": .999, "kl_p99": .99, "kl_p95": .95, "kl_p90": .9, "kl_median": .5,
       "kl_p10": .1, "kl_p05": .05, "kl_p01": .01, "kl_p00_1": .001}
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
ts = ts[ts["mode"] == b"fp8-cal"]
assert sorted(ts["trace"]) == [0, 1, 2] and len(set(ts["trace_hash"])) == 3
kl = np.concatenate([tk["kl"][r["first"]:r["first"] + r["n"]] for r in ts]).astype(np.float64)
# the traces differ, so pooling them one way or another shows
assert len(set(s[s["metric"] == b"kl_mean"]["value"])) == 3
r = s[s["metric"] == b"kl_p99"]
assert abs(pooled("kl_p99") - (r["n"] * r["value"]).sum() / r["n"].sum()) > 1e-6 * pooled("kl_p99")
md = open(sys.argv[2]).read()
row = next(l for l in md.splitlines() if l.startswith("| t3 | fp8-cal |"))
assert f"| {pooled('kl_mean'):.3e} ± {pooled('kl_mean_err'):.1e} | {pooled('same_top_p'):.4f} |" in row, row
assert "Against the calibrated" not in md and "Speeds are" not in md  # no other FP8 mode, no speeds
out = open(sys.argv[5]).read()
line = next(l for l in out.splitlines() if l.startswith("fp8-cal "))
assert line.split()[2:6] == [f"{pooled('kl_mean'):.3e}", f"{pooled('kl_p99'):.3e}", f"{pooled('same_top_p'):.4f}", f"{pooled('ln_ppl_ratio'):.3e}"], line
rows = [r for r in csv.DictReader(open(sys.argv[3])) if r["mode"] == "fp8-cal" and r["subset"] == "all"]
assert len(rows) == len(set(s["metric"])), (len(rows), len(set(s["metric"])))
for r in rows:
    want = pooled(r["metric"])
    assert abs(float(r["value"]) - want) <= 1e-8 * abs(want), (r, want)
html = open(sys.argv[4]).read()
svgs = re.findall(r"<svg .*?</svg>", html, re.S)
ns = "{http://www.w3.org/2000/svg}"
o = f["/drift/output"][:]
o = o[(o["mode"] == b"fp8-cal") & (o["subset"] == b"all") & (o["metric"] == b"kl")]
pts = [c for c in ET.fromstring(svgs[0]).iter(ns + "circle") if c.get("class") == "pt" and c.get("data-series") == "fp8-cal"]
assert pts
for c in pts:
    x = float(c.get("data-x"))
    b = int(round(np.log2(x * x) / 2)) if x > 1.5 else 0
    r = o[o["bucket"] == b]
    assert len(r) == 3
    want = (r["n"] * r["mean"]).sum() / r["n"].sum()
    assert abs(float(c.get("data-y")) - want) <= 1e-12 * want, (b, c.get("data-y"), want)
    # the band: the pooled ci95, narrower than the traces' own
    ci = np.sqrt(((r["n"] * r["ci95"]) ** 2).sum()) / r["n"].sum()
    assert abs(float(c.get("data-hi")) - want - ci) <= 1e-12 * want, (b, c.get("data-hi"), want, ci)
    assert abs(want - float(c.get("data-lo")) - ci) <= 1e-12 * want, (b, c.get("data-lo"), want, ci)
lay = f["/drift/layers"][:]
lay = lay[(lay["mode"] == b"fp8-cal") & (lay["subset"] == b"all") & (lay["metric"] == b"rel_l2")]
heat = [ET.fromstring(x) for x in svgs if 'class="chart heatmap"' in x][0]
cells = [r for r in heat.iter(ns + "rect") if r.get("class") == "cell" and not np.isnan(float(r.get("data-v")))]
assert cells
for r in cells:
    layer, b = 7 - int(r.get("data-row")), int(r.get("data-col"))
    x = lay[(lay["layer"] == layer) & (lay["bucket"] == b)]
    assert len(x) == 3
    want = (x["n"] * x["mean"]).sum() / x["n"].sum()
    assert abs(float(r.get("data-v")) - want) <= 1e-12 * want, (layer, b)
kv = f["/drift/kv"][:]
kv = kv[kv["mode"] == b"fp8-cal"]
trs = re.findall(r'<tr><td class="l">fp8-cal</td><td>(\d+)</td><td>(-?\d+)</td>((?:<td>[^<]*</td>){8})</tr>', html)
assert len(trs) == len(kv) // 3 > 0, (len(trs), len(kv))
for layer, head, rest in trs:
    cells = re.findall(r"<td>([^<]*)</td>", rest)
    x = kv[(kv["layer"] == int(layer)) & (kv["kv_head"] == int(head))]
    assert len(x) == 3
    w = x["n_values"]
    assert cells[6] == f"{100 * (w * x['v_flushed_frac']).sum() / w.sum():.3f}%", (layer, head, cells)
g = f["/drift/generation"][:]
g = g[g["mode"] == b"fp8-cal"]
for p in sorted(set(g["prefix"])):  # the greedy continuation: the median over traces, the mean share
    x = g[g["prefix"] == p]
    assert len(x) == 3 and (x["tokens"] == 6).all()
    med = float(np.median(x["first_divergence"]))
    first = "all 6" if med >= 6 else f"{med:g} of 6"
    cell = f"<th>from {p} of 256 tokens</th>"
    assert cell in html, cell
    assert f"<td>{first}, {100 * x['agree_rate'].mean():.0f}% agree</td>" in html, (p, first)
assert "(the median over traces)" in html
PY
# several contexts: the report's "Drift against context length" holds each
# mode's figures at each context (every trace pooled), against the shortest
# with the two means' independent errors; its chart plots them; the rest of
# the report stays at the largest context; a run of one context has no such
# section
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 128,256 --traces 2 --concurrency 1 \
  --gen-tokens 4 --decode-tokens 3 --calib-tokens 256 --attn-per-head -o "$work/ctx.h5" >"$work/ctx.out" 2>&1 ||
  bad "a sweep over 2 contexts failed: $(cat "$work/ctx.out")"
"$bin" report "$work/ctx.h5" -o "$work/ctx.html" 2>/dev/null && xmllint --noout "$work/ctx.html" &&
  "$bin" report "$work/ctx.h5" --format md -o "$work/ctx.md" 2>/dev/null &&
  "$py" - "$work/ctx.h5" "$work/ctx.html" "$work/ctx.md" "$work/r.html" "$work/r.md" 2>"$work/ctx.err" <<'PY' && ok || bad "the report's figures against context length differ from the file: $(tail -3 "$work/ctx.err")"
import re, sys
import xml.etree.ElementTree as ET
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
html, md = open(sys.argv[2]).read(), open(sys.argv[3]).read()
s = f["/drift/summary"][:]
s = s[s["subset"] == b"all"]
def pooled(mode, ctx, metric):
    r = s[(s["mode"] == mode.encode()) & (s["context"] == ctx) & (s["metric"] == metric.encode())]
    assert len(r) == 2, (mode, ctx, metric, len(r))
    n, v = r["n"], r["value"]
    if metric.endswith("_err"): return np.sqrt(((n * v) ** 2).sum()) / n.sum()
    return (n * v).sum() / n.sum()
ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
def p99(mode, ctx):  # every trace's positions together
    rows = ts[(ts["mode"] == mode.encode()) & (ts["context"] == ctx)]
    assert len(rows) == 2
    return np.percentile(np.concatenate([tk["kl"][r["first"]:r["first"] + r["n"]] for r in rows]).astype(np.float64), 99)
a = f["/drift/attention"][:]
def attn(mode, ctx):
    r = a[(a["mode"] == mode.encode()) & (a["context"] == ctx) & (a["view"] == b"propagated") & (a["subset"] == b"all") & (a["metric"] == b"kl") & (a["kv_head"] == -1)]
    return (r["n"] * r["mean"]).sum() / r["n"].sum()
t = f["/throughput"][:]
def dec(mode, ctx):
    x, b = (t[(t["mode"] == m.encode()) & (t["context"] == ctx) & (t["concurrency"] == 1)] for m in (mode, "bf16"))
    return x["decode_tok_s"][0] / b["decode_tok_s"][0]
assert "ctx: contexts 128 and 256 tokens (figures at 256 unless a table names the context)" in html
sec = html[html.index(">Drift against context length</h2>"):html.index(">Output drift against context position</h2>")]
# the contents: a link to every section, each to its own heading
toc = re.search(r'<p class="toc">Contents:(.*?)</p>', html).group(1)
links = re.findall(r'<a href="#(s\d+)">([^<]*)</a>', toc)
heads = re.findall(r'<h2 id="(s\d+)">([^<]*)</h2>', html)
assert links == heads and len(heads) == html.count("<h2") >= 12, (links, heads)
assert ("s2", "Drift against context length") in heads
mds = md[md.index("### Drift against context length"):]
svg = ET.fromstring(re.search(r"<svg .*?</svg>", sec, re.S).group(0))
pts = [c for c in svg.iter("{http://www.w3.org/2000/svg}circle") if c.get("class") == "pt"]
assert sorted({c.get("data-series") for c in pts}) == ["fp8-cal", "fp8-unscaled"], pts
words = []
for mode in ("fp8-cal", "fp8-unscaled"):
    kl = {c: pooled(mode, c, "kl_mean") for c in (128, 256)}
    err = {c: pooled(mode, c, "kl_mean_err") for c in (128, 256)}
    assert kl[128] != kl[256]
    z = abs(kl[256] - kl[128]) / np.hypot(err[128], err[256])
    for c in (128, 256):
        rel = "-" if c == 128 else f"{kl[256] / kl[128]:.2f}x ({np.floor(10 * z) / 10:.1f} se)"
        verdict = "negligible" if kl[c] < 1e-3 else "noticeable" if kl[c] < 1e-2 else "degraded"
        cells = [f"{kl[c]:.3e} ± {err[c]:.1e}", rel, f"{p99(mode, c):.3e}", f"{pooled(mode, c, 'same_top_p'):.4f}",
                 f"{pooled(mode, c, 'ln_ppl_ratio'):.2e}", f"{attn(mode, c):.2e}"]
        row = f"| ctx | {mode} | {c} | " + " | ".join(cells) + " | "
        assert row in mds, (row, mds)
        assert f"| {dec(mode, c):.2f}x (C=1) | {verdict} |" in mds.split(row)[1].splitlines()[0], mds
        want = f'<tr><td class="l">ctx</td><td class="l">{mode}</td><td>{c}</td><td>' + "</td><td>".join(cells).replace("±", "&#177;") + "</td>"
        assert want in sec, (want, sec)
        pt = [p for p in pts if p.get("data-series") == mode and float(p.get("data-x")) == c]
        assert len(pt) == 1 and abs(float(pt[0].get("data-y")) - kl[c]) <= 1e-12 * kl[c], pt
        assert abs(float(pt[0].get("data-hi")) - kl[c] - 1.959963984540054 * err[c]) <= 1e-12 * kl[c]
    apart = f"{np.floor(10 * z) / 10:.1f} standard errors apart: within the error" if z < 2 else f"{z:.0f} standard errors apart"
    words.append(f"{kl[128]:.3e} to {kl[256]:.3e} for {mode} ({kl[256] / kl[128]:.2f}x, {apart})")
sentence = "From 128 to 256 tokens the mean output KL goes from " + "; from ".join(words) + "."
assert sentence in sec and sentence in mds, (sentence, mds)
assert "| ctx | bf16 | 128 |" not in mds  # the reference, zero at every context
# the verdict table stays at the largest context
row = next(l for l in md.splitlines() if l.startswith("| ctx | fp8-cal |"))
assert row.startswith(f"| ctx | fp8-cal | {pooled('fp8-cal', 256, 'kl_mean'):.3e} ±"), row
assert "Context 256 tokens (a run's largest; every context in the table below)" in md
for one in sys.argv[4:]:
    assert "Drift against context length" not in open(one).read(), one
# decode tokens/s per context, against bf16's at the same context
tab = re.search(r'<table class="tput-contexts">(.*?)</table>', html, re.S).group(1)
for mode in ("bf16", "fp8-cal", "fp8-unscaled"):
    for c in (128, 256):
        x = t[(t["mode"] == mode.encode()) & (t["context"] == c) & (t["concurrency"] == 1)]["decode_tok_s"][0]
        cell = f"{x:.1f}" + ("" if mode == "bf16" else f" ({dec(mode, c):.2f}x)")
        assert f'<tr><td class="l">{mode}</td><td>{c}</td><td>{cell}</td></tr>' in tab, (mode, c, cell, tab)
assert "tput-contexts" not in open(sys.argv[4]).read()
# --attn-per-head: a map per FP8 mode of the isolated attention KL per layer
# (deepest on top) and KV head at the largest context, every trace and
# bucket pooled by n; the sentence names each mode's largest against its
# median head; a run without heads has neither
heat = [ET.fromstring(x) for x in re.findall(r"<svg .*?</svg>", html, re.S) if "per layer and KV head" in x]
assert len(heat) == 2, len(heat)
att = a[(a["context"] == 256) & (a["view"] == b"isolated") & (a["subset"] == b"all") & (a["metric"] == b"kl") & (a["kv_head"] >= 0)]
layers = sorted(set(att["attn_layer"]))
words = []
for mode, svg in zip(("fp8-cal", "fp8-unscaled"), heat):
    assert mode + ": isolated attention KL per layer and KV head" in ET.tostring(svg, encoding="unicode")
    cells = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "cell"]
    grid = {}
    for al in layers:
        for h in (0, 1):
            x = att[(att["mode"] == mode.encode()) & (att["attn_layer"] == al) & (att["kv_head"] == h)]
            assert len(set(x["trace"])) == 2
            grid[(al, h)] = (x["n"] * x["mean"]).sum() / x["n"].sum()
    assert len(cells) == len(grid), (len(cells), len(grid))
    for r in cells:
        al, h = layers[-1 - int(r.get("data-row"))], int(r.get("data-col"))
        assert abs(float(r.get("data-v")) - grid[(al, h)]) <= 1e-12 * grid[(al, h)], (mode, al, h)
    (al, h), top = max(grid.items(), key=lambda kv: kv[1])
    lay = int(att[att["attn_layer"] == al]["layer"][0])
    words.append(f"{mode}, layer {lay} KV head {h} ({top:.3e} nats, {top / np.median(list(grid.values())):.1f}x the median head's)")
want = "The KV head whose own cache error moves attention most (isolated attention KL), per mode: " + "; ".join(words) + "."
assert f'<p class="heads">{want}</p>' in html, (want, re.findall(r'<p class="heads">.*?</p>', html))
assert f"\n{want}\n" in md, md
assert "per layer and KV head" not in open(sys.argv[4]).read()
PY
# compare checks every context the baseline has: a regression at the
# shorter one shows; a candidate without a context misses its figures; a
# baseline of one of the candidate's contexts compares that one; runs with
# no context in common are refused
cp "$work/ctx.h5" "$work/ctx-worse.h5"
"$py" - "$work/ctx-worse.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
s = f["/drift/summary"][:]
k = (s["mode"] == b"fp8-cal") & (s["context"] == 128) & (s["metric"] == b"kl_mean")
s["value"][k] *= 3
f["/drift/summary"][...] = s
PY
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nkl_mean,*,*,0,0.1\n' >"$work/tctx.csv"
"$bin" compare "$work/ctx.h5" "$work/ctx-worse.h5" --thresholds "$work/tctx.csv" -o "$work/ctx-c.html" >"$work/ctx-c.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^REGRESSION kl_mean fp8-cal context 128: " "$work/ctx-c.out" &&
  [ "$(grep -c "^REGRESSION" "$work/ctx-c.out")" = 1 ] && grep -q "^compare: 4 checks, 1 regressions: REGRESSION$" "$work/ctx-c.out" &&
  grep -q '<td class="l">kl_mean</td><td class="l">fp8-unscaled</td><td>256</td>' "$work/ctx-c.html" &&
  grep -q "<h2>Output drift, baseline and candidate, at 256 tokens</h2>" "$work/ctx-c.html" && ok ||
  bad "compare of two contexts: exit $rc: $(cat "$work/ctx-c.out")"
"$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 128 --traces 2 --concurrency 1 \
  --gen-tokens 4 --decode-tokens 3 --calib-tokens 256 -o "$work/ctx128.h5" >/dev/null 2>&1 || bad "the 128-token sweep failed"
"$bin" compare "$work/ctx.h5" "$work/ctx128.h5" --thresholds "$work/tctx.csv" >"$work/ctx-m.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^REGRESSION kl_mean fp8-cal context 256: baseline .*, candidate none (absent, or NaN)$" "$work/ctx-m.out" &&
  grep -q "^compare: 4 checks, 2 regressions (2 missing in the candidate): REGRESSION$" "$work/ctx-m.out" && ok ||
  bad "a candidate without the baseline's longer context: exit $rc: $(cat "$work/ctx-m.out")"
"$bin" compare "$work/ctx128.h5" "$work/ctx.h5" --thresholds "$work/tctx.csv" -o "$work/ctx-p.html" >"$work/ctx-p.out"; rc=$?
[ $rc -eq 0 ] && grep -q "^note: the runs ran the same traces" "$work/ctx-p.out" &&
  grep -q "^compare: 2 checks, 0 regressions: pass$" "$work/ctx-p.out" &&
  grep -q "<h2>Output drift, baseline and candidate, at 128 tokens</h2>" "$work/ctx-p.html" && ok ||
  bad "a baseline of one of the candidate's contexts: exit $rc: $(cat "$work/ctx-p.out")"
"$bin" compare "$work/r.h5" "$work/ctx.h5" >/dev/null 2>"$work/ctx-e.err"; rc=$?
[ $rc -eq 2 ] && grep -q "r.h5 and .*ctx.h5: expected a context in common (the baseline's 512 tokens, the candidate's 128 and 256)" "$work/ctx-e.err" && ok ||
  bad "compare of runs with no context in common: exit $rc: $(cat "$work/ctx-e.err")"
# expert routing: each bar a layer's router-flip share from /drift/layers
# (every trace pooled), each mode in its colour of the KL chart; the
# sentence from the summary's router_flip_rate, on the page and in the
# Markdown; no section for a file without router rows (a dense model)
"$py" - "$work/r.h5" "$work/r.html" "$work/r.md" "$work/t3.h5" "$work/t3.html" "$work/t3.md" <<'PY' && ok || bad "the expert routing chart or sentence differs from the file"
import sys, re
import xml.etree.ElementTree as ET
import h5py, numpy as np
ns = "{http://www.w3.org/2000/svg}"
for h5, page, md, modes in ((sys.argv[1], sys.argv[2], sys.argv[3], ("fp8-cal", "fp8-unscaled")),
                            (sys.argv[4], sys.argv[5], sys.argv[6], ("fp8-cal",))):
    f = h5py.File(h5, "r")
    html = open(page).read()
    lay = f["/drift/layers"][:]
    lay = lay[(lay["metric"] == b"router_flip") & (lay["subset"] == b"all")]
    layers = sorted(set(lay["layer"]))
    assert len(layers) >= 2 and len(set(lay["trace"])) == (3 if "t3" in h5 else 1)
    def share(mode, layer):
        x = lay[(lay["mode"] == mode.encode()) & (lay["layer"] == layer)]
        return (x["n"] * x["mean"]).sum() / x["n"].sum()
    svg = next(x for x in re.findall(r"<svg .*?</svg>", html, re.S) if "routed to another expert set" in x)
    bars = [r for r in ET.fromstring(svg).iter(ns + "rect") if r.get("class") == "bar"]
    assert sorted({b.get("data-series") for b in bars}) == sorted(modes), bars
    for b in bars:
        want = share(b.get("data-series"), int(b.get("data-group").split()[-1]))
        assert abs(float(b.get("data-y")) - want) <= 1e-12 * max(want, 1e-30), (b.attrib, want)
    assert {int(b.get("data-group").split()[-1]) for b in bars} == set(layers)
    assert max(float(b.get("data-y")) for b in bars) > 0
    first = next(x for x in re.findall(r"<svg .*?</svg>", html, re.S) if "KL against position" in x)
    kl_fill = {c.get("data-series"): c.get("fill") for c in ET.fromstring(first).iter(ns + "circle") if c.get("class") == "pt"}
    for b in bars:
        assert b.get("fill") == kl_fill[b.get("data-series")], (b.attrib, kl_fill)
    s = f["/drift/summary"][:]
    s = s[s["metric"] == b"router_flip_rate"]
    def rate(mode):
        x = s[s["mode"] == mode.encode()]
        return (x["n"] * x["value"]).sum() / x["n"].sum()
    want = ("Share of (position, MoE layer) pairs whose top-k expert set differs from BF16's: "
            + ", ".join(f"{m} {100 * rate(m):.2f}% ({100 * share(m, layers[-1]):.2f}% at layer {layers[-1]})" for m in modes) + ".")
    assert f'<p class="routing">{want.replace(chr(39), "&apos;")}</p>' in html or f'<p class="routing">{want}</p>' in html, want
    assert "\n" + want + "\n" in open(md).read(), want
    print(want, file=sys.stderr)
    # the output KL at the positions routed to another expert set at some
    # layer, against the rest, from /drift/tokens over every trace
    ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
    parts = []
    for m in modes:
        t = np.concatenate([tk[r["first"]:r["first"] + r["n"]] for r in ts[ts["mode"] == m.encode()]])
        kl, routed = t["kl"].astype(np.float64), t["router_flips"] > 0
        assert 0 < routed.sum() < len(t) and len(t) == (511 if "t3" not in h5 else 3 * 255)
        parts.append(f"{m} {100 * routed.mean():.1f}% of positions with {100 * kl[routed].sum() / kl.sum():.0f}% of the output KL"
                     f" (their mean KL {kl[routed].mean() / kl[~routed].mean():.1f}x the rest's)")
    want = "Positions routed to another expert set at some MoE layer: " + "; ".join(parts) + "."
    assert f'<p class="routed">{want.replace(chr(39), "&apos;")}</p>' in html or f'<p class="routed">{want}</p>' in html, want
    assert "\n" + want + "\n" in open(md).read(), want
    print(want, file=sys.stderr)
PY
cp "$work/r.h5" "$work/dense.h5"
"$py" - "$work/dense.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
for path, col in (("/drift/layers", "metric"), ("/drift/summary", "metric")):
    t = f[path][:]
    t = t[~((t[col] == b"router_flip") | (t[col] == b"router_flip_rate"))]
    del f[path]
    f[path] = t
PY
"$bin" report "$work/dense.h5" -o "$work/dense.html" 2>/dev/null && "$bin" report "$work/dense.h5" --format md -o "$work/dense.md" 2>/dev/null &&
  xmllint --noout "$work/dense.html" && ! grep -q "Expert routing\|expert set" "$work/dense.html" "$work/dense.md" &&
  grep -q "Attention drift per full-attention layer" "$work/dense.html" && ok || bad "a file without router rows has an expert routing section"
# a version 2 file keeps no router flips per position: the layers' chart and
# sentence, not the routed positions' share of the KL
cp "$work/r.h5" "$work/rv2.h5"
"$py" - "$work/rv2.h5" <<'PY'
import sys, h5py, numpy.lib.recfunctions as rf
f = h5py.File(sys.argv[1], "r+")
a = f["/drift/tokens"][:]
del f["/drift/tokens"]
f["/drift/tokens"] = rf.drop_fields(a, "router_flips", usemask=False)
f.attrs["schema_version"] = [2]
PY
"$bin" report "$work/rv2.h5" -o "$work/rv2.html" 2>/dev/null && "$bin" report "$work/rv2.h5" --format md -o "$work/rv2.md" 2>/dev/null &&
  grep -q '<p class="routing">' "$work/rv2.html" && grep -q "^Share of (position, MoE layer)" "$work/rv2.md" &&
  ! grep -q "routed to another expert set at some" "$work/rv2.html" "$work/rv2.md" && ok || bad "a version 2 file: the routed positions' share of the KL from zeros"
# trend: runs of one sweep oldest first (by when each was written, not the
# order given), each mode's mean KL and its step from the run before in
# standard errors (paired over the positions of the same traces, else the
# two means' errors), a step of 2 or more marked, where settings change;
# the HTML's chart holds the file's figures; CSV; the refusals
for s in 1 2; do
  "$bin" run --model tiny --kv bf16,fp8-cal,fp8-unscaled --context 128 --cells drift --gen-tokens 4 \
    --calib-tokens 256 --seed $s -o "$work/tr$s.h5" >/dev/null 2>&1 || bad "trend: the seed $s sweep failed"
done
cp "$work/tr1.h5" "$work/tr1b.h5"
"$py" - "$work/tr1.h5" "$work/tr1b.h5" "$work/tr2.h5" <<'PY'
import sys, h5py, numpy as np
for path, when in zip(sys.argv[1:], ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z")):
    with h5py.File(path, "r+") as f:
        f.attrs["written_utc"] = np.bytes_(when)
# the second night: fp8-cal drifts 1.5x as far at every position
with h5py.File(sys.argv[2], "r+") as f:
    ts = f["/drift/token_sets"][:]
    r = ts[ts["mode"] == b"fp8-cal"][0]
    tk = f["/drift/tokens"][:]
    tk["kl"][r["first"]:r["first"] + r["n"]] *= 1.5
    f["/drift/tokens"][...] = tk
    s = f["/drift/summary"][:]
    k = (s["mode"] == b"fp8-cal") & np.isin(s["metric"], [b"kl_mean", b"kl_mean_err"])
    s["value"][k] *= 1.5
    f["/drift/summary"][...] = s
PY
"$bin" trend "$work/tr2.h5" "$work/tr1.h5" "$work/tr1b.h5" --format md -o "$work/tr.md" 2>/dev/null &&
  "$bin" trend "$work/tr2.h5" "$work/tr1b.h5" "$work/tr1.h5" -o "$work/tr.html" 2>/dev/null && xmllint --noout "$work/tr.html" &&
  "$bin" trend "$work/tr1.h5" "$work/tr1b.h5" "$work/tr2.h5" --format csv -o "$work/tr.csv" 2>/dev/null &&
  "$py" - "$work/tr1.h5" "$work/tr1b.h5" "$work/tr2.h5" "$work/tr.md" "$work/tr.html" "$work/tr.csv" 2>"$work/tr.err" <<'PY' && ok || bad "trend: the figures differ from the files: $(tail -3 "$work/tr.err")"
import csv, math, re, sys
import xml.etree.ElementTree as ET
import h5py, numpy as np
files = [h5py.File(p, "r") for p in sys.argv[1:4]]
md, html = open(sys.argv[4]).read(), open(sys.argv[5]).read()
def fig(f, mode, metric):
    s = f["/drift/summary"][:]
    r = s[(s["mode"] == mode.encode()) & (s["subset"] == b"all") & (s["metric"] == metric.encode())]
    assert len(r) == 1
    return float(r["value"][0])
def kl(f, mode):
    ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
    r = ts[ts["mode"] == mode.encode()][0]
    return tk["kl"][r["first"]:r["first"] + r["n"]].astype(np.float64)
cut = lambda z: math.trunc(10 * z) / 10
def step(i, mode):
    if i == 0: return None, "-"
    a, b = files[i - 1], files[i]
    if i == 1:  # the same traces: paired
        d = kl(b, mode) - kl(a, mode)
        se = d.std(ddof=1) / math.sqrt(len(d))
        z = 0.0 if se == 0 and d.mean() == 0 else d.mean() / se
        return z, f"{cut(z):+.1f} se paired"
    z = (fig(b, mode, "kl_mean") - fig(a, mode, "kl_mean")) / math.hypot(fig(a, mode, "kl_mean_err"), fig(b, mode, "kl_mean_err"))
    return z, f"{cut(z):+.1f} se"
names = ["tr1", "tr1b", "tr2"]
for i, f in enumerate(files):
    row = f"| {i + 1} | {names[i]} | 2026-01-0{i + 1}T00:00:00Z | "
    line = next(l for l in md.splitlines() if l.startswith(row))
    cells = [c.strip() for c in line.split("|")[5:-1]]
    for m, mode in enumerate(("fp8-cal", "fp8-unscaled")):
        z, text = step(i, mode)
        assert cells[2 * m] == f"{fig(f, mode, 'kl_mean'):.3e} ± {fig(f, mode, 'kl_mean_err'):.1e}", (line, mode)
        assert cells[2 * m + 1] == (f"**{text}**" if z is not None and abs(z) >= 2 else text), (line, mode, z, text)
z_cal, _ = step(1, "fp8-cal")
assert z_cal >= 2, z_cal  # the crafted night moved
assert step(1, "fp8-unscaled")[1] == "+0.0 se paired"
assert "- run 3 (tr2) differs from the run before in: seed (1 against 2), the trace spec" in md, md
k0, k2 = fig(files[0], "fp8-cal", "kl_mean"), fig(files[2], "fp8-cal", "kl_mean")
zl = (k2 - k0) / math.hypot(fig(files[0], "fp8-cal", "kl_mean_err"), fig(files[2], "fp8-cal", "kl_mean_err"))
want = (f"- fp8-cal: mean output KL {k0:.3e} in the first run and {k2:.3e} in the last ({k2 / k0:.2f}x, "
        f"{abs(cut(zl)):.1f} standard errors apart{': within the error' if abs(zl) < 2 else ''})")
assert want in md, (want, md)
big = max((step(i, "fp8-cal")[0] for i in (1, 2)), key=abs)
at = 2 if big == step(1, "fp8-cal")[0] else 3
assert f"the largest step between consecutive runs is {cut(big):+.1f} standard errors{' (paired)' if at == 2 else ''}, into run {at} ({names[at - 1]})." in md, md
# the page: the same order whatever the arguments' order, the step marked,
# the first chart's points the mean KL run by run with its band
assert '<td class="moved">' + step(1, "fp8-cal")[1] + "</td>" in html, html
svg = ET.fromstring(re.findall(r"<svg .*?</svg>", html, re.S)[0])
pts = [c for c in svg.iter("{http://www.w3.org/2000/svg}circle") if c.get("data-series") == "fp8-cal"]
assert [float(p.get("data-x")) for p in pts] == [1, 2, 3], pts
for p, f in zip(pts, files):
    v, e = fig(f, "fp8-cal", "kl_mean"), fig(f, "fp8-cal", "kl_mean_err")
    assert abs(float(p.get("data-y")) - v) <= 1e-12 * v and abs(float(p.get("data-hi")) - v - 1.959963984540054 * e) <= 1e-12 * v
assert "<li class=\"change\">run 3 (tr2) against the run before: seed (1 against 2), the trace spec</li>" in html
rows = list(csv.DictReader(open(sys.argv[6])))
got = {(r["run"], r["mode"], r["metric"]): float(r["value"]) for r in rows}
assert got[("2", "fp8-cal", "kl_step_z_paired")] == float(f"{z_cal:.9g}"), got[("2", "fp8-cal", "kl_step_z_paired")]
assert ("3", "fp8-cal", "kl_step_z") in got and ("1", "fp8-cal", "kl_step_z") not in got
for i, f in enumerate(files):
    for metric in ("kl_mean", "kl_p99", "same_top_p"):
        assert abs(got[(str(i + 1), "fp8-unscaled", metric)] - fig(f, "fp8-unscaled", metric)) <= 1e-8 * abs(fig(f, "fp8-unscaled", metric)), metric
PY
# runs of throughput cells alone: the CSV still carries their speeds
for s in 1 2; do
  "$bin" run --model tiny --kv bf16,fp8-cal --context 128 --cells throughput --concurrency 1 \
    --decode-tokens 3 --calib-tokens 256 -o "$work/tp$s.h5" >/dev/null 2>&1 || bad "trend: throughput sweep $s failed"
done
"$bin" trend "$work/tp1.h5" "$work/tp2.h5" --format csv -o "$work/tp.csv" 2>/dev/null &&
  "$py" - "$work/tp1.h5" "$work/tp2.h5" "$work/tp.csv" <<'PY' && ok || bad "trend of throughput runs: $(cat "$work/tp.csv")"
import csv, sys, h5py
rows = list(csv.DictReader(open(sys.argv[3])))
assert [r["metric"] for r in rows] == ["decode_vs_bf16"] * 2, rows
for r, path in zip(rows, sys.argv[1:3]):
    t = h5py.File(path)["/throughput"][:]
    d = {m: t[t["mode"] == m.encode()]["decode_tok_s"][0] for m in ("bf16", "fp8-cal")}
    assert abs(float(r["value"]) - d["fp8-cal"] / d["bf16"]) <= 1e-8, (r, d)
PY
"$bin" trend "$work/tr1.h5" --format md >/dev/null 2>"$work/tr.e1"; rc1=$?
"$bin" trend "$work/tr1.h5" "$work/r.h5" --format md >/dev/null 2>"$work/tr.e2"; rc2=$?
[ $rc1 -eq 2 ] && grep -q "trend: expected two or more result files, got 1" "$work/tr.e1" &&
  [ $rc2 -eq 2 ] && grep -q "trend: expected a context every run has (a trend follows one sweep): .*tr1.h5 has 128; .*r.h5 has 512$" "$work/tr.e2" && ok ||
  bad "trend's refusals: $(cat "$work/tr.e1" "$work/tr.e2")"
# compare: 0 against itself, 1 for a crafted regression, 2 for bad thresholds
"$bin" compare "$work/r.h5" "$work/r.h5" --thresholds "$thresholds" >"$work/c0.out"; rc=$?
[ $rc -eq 0 ] && grep -q "0 regressions" "$work/c0.out" && ok || bad "compare against itself: exit $rc"
cp "$work/r.h5" "$work/worse.h5"
"$py" - "$work/worse.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
s = f["/drift/summary"][:]
m = (s["mode"] == b"fp8-cal") & (s["subset"] == b"all") & (s["metric"] == b"kl_mean")
s["value"][m] *= 3
f["/drift/summary"][...] = s
# a file without positions (schema version 1): the runs cannot pair
del f["/drift/token_sets"], f["/drift/tokens"]
f.attrs["schema_version"] = [1]
PY
"$bin" compare "$work/r.h5" "$work/worse.h5" --thresholds "$thresholds" -o "$work/diff.html" >"$work/c1.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^REGRESSION kl_mean fp8-cal context 512: baseline" "$work/c1.out" &&
  [ "$(grep -c '^REGRESSION' "$work/c1.out")" -eq 1 ] && xmllint --noout "$work/diff.html" && ok ||
  bad "crafted regression: exit $rc: $(cat "$work/c1.out")"
# its difference in combined standard errors: 2 x kl_mean over sqrt(2) x its error
"$py" - "$work/r.h5" "$work/c1.out" <<'PY' && ok || bad "compare: the standard errors of the crafted regression: $(cat "$work/c1.out")"
import re, sys, h5py, math
s = h5py.File(sys.argv[1])["drift/summary"][:]
v = {m: float(s[(s["mode"] == b"fp8-cal") & (s["subset"] == b"all") & (s["metric"] == m) & (s["trace"] == 0)]["value"][0])
     for m in (b"kl_mean", b"kl_mean_err")}
line = next(l for l in open(sys.argv[2]) if l.startswith("REGRESSION kl_mean"))
z = float(re.search(r", ([0-9.]+) standard errors;", line).group(1))
want = 2 * v[b"kl_mean"] / math.sqrt(2 * v[b"kl_mean_err"] ** 2)
assert abs(z - want) <= 0.05 + 1e-9, (z, want, line)
PY
# the Markdown page (-o FILE.md, or --format md): the verdict, the main
# figures passing or not, the regression with the text line's figures; a
# run against itself has every check within its thresholds
"$bin" compare "$work/r.h5" "$work/worse.h5" --thresholds "$thresholds" -o "$work/diff.md" >/dev/null; rc1=$?
"$bin" compare "$work/r.h5" "$work/worse.h5" --thresholds "$thresholds" --format md -o "$work/diff-md.txt" >/dev/null; rc2=$?
"$bin" compare "$work/r.h5" "$work/r.h5" --thresholds "$thresholds" -o "$work/same.md" >/dev/null; rc3=$?
"$bin" compare "$work/r.h5" "$work/r.h5" --format md >/dev/null 2>"$work/cmd.err"; rc4=$?
[ $rc1 -eq 1 ] && [ $rc2 -eq 1 ] && [ $rc3 -eq 0 ] && [ $rc4 -eq 2 ] && cmp -s "$work/diff.md" "$work/diff-md.txt" &&
  grep -q "compare: --format md: expected -o FILE" "$work/cmd.err" &&
  grep -q "^Every check is within its thresholds.$" "$work/same.md" &&
  "$py" - "$work/r.h5" "$work/worse.h5" "$work/diff.md" "$work/c1.out" <<'PY' && ok || bad "compare's Markdown page: exit $rc1 $rc2 $rc3 $rc4: $(head -5 "$work/diff.md")"
import re, sys, h5py
md, out = open(sys.argv[3]).read(), open(sys.argv[4]).read()
assert md.startswith("## kvdrift compare: r (baseline) against worse (candidate): REGRESSION\n"), md[:200]
n = re.search(r"^compare: (\d+) checks, 1 regressions: REGRESSION$", out, re.M).group(1)
assert f"\n{n} checks, 1 regressions.\n" in md
line = next(l for l in out.splitlines() if l.startswith("REGRESSION kl_mean fp8-cal"))
base, cand, z = re.search(r"baseline ([^,]+), candidate ([^ ]+) .*, ([0-9.]+) standard errors;", line).groups()
row = next(l for l in md.splitlines() if l.startswith("| kl_mean | fp8-cal | 512 | * |"))
cells = [c.strip() for c in row.split("|")[1:-1]]
assert float(cells[4]) == float(f"{float(base):.4g}") and float(cells[5]) == float(f"{float(cand):.4g}"), (cells, line)
assert cells[8] == z and cells[10] == "**regressed**", (cells, z)
s = {}
for p in sys.argv[1:3]:
    t = h5py.File(p)["drift/summary"][:]
    s[p] = {m: float(t[(t["mode"] == b"fp8-unscaled") & (t["subset"] == b"all") & (t["metric"] == m.encode())]["value"][0]) for m in ("kl_mean", "kl_p99", "same_top_p")}
for m in ("kl_mean", "kl_p99", "same_top_p"):  # passing, and shown
    row = next(l for l in md.splitlines() if l.startswith(f"| {m} | fp8-unscaled | 512 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3] == f"{s[sys.argv[1]][m]:.4g}" and cells[4] == f"{s[sys.argv[2]][m]:.4g}", (m, cells)
PY
# --min-sigma: a breach by fewer combined standard errors is noise (listed,
# passed); by more, still a regression
z=$(sed -n 's/^REGRESSION kl_mean .*, \([0-9.]*\) standard errors;.*/\1/p' "$work/c1.out")
above=$("$py" -c "print(float('$z') + 0.5)")
below=$("$py" -c "print(max(float('$z') - 0.5, 0.1))")
"$bin" compare "$work/r.h5" "$work/worse.h5" --thresholds "$thresholds" --min-sigma "$above" -o "$work/noise.html" >"$work/cz.out"; rc=$?
[ $rc -eq 0 ] && grep -q "^NOISE kl_mean fp8-cal context 512: baseline .*, $z standard errors, under --min-sigma $above; allowed" "$work/cz.out" &&
  grep -q "^compare: [0-9]* checks, 0 regressions, 1 within noise: pass$" "$work/cz.out" &&
  grep -q "within noise" "$work/noise.html" && xmllint --noout "$work/noise.html" && ok ||
  bad "compare --min-sigma above the breach's standard errors: exit $rc: $(cat "$work/cz.out")"
"$bin" compare "$work/r.h5" "$work/worse.h5" --thresholds "$thresholds" --min-sigma "$below" >"$work/cz.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^REGRESSION kl_mean fp8-cal context 512: " "$work/cz.out" && ! grep -q "^NOISE" "$work/cz.out" && ok ||
  bad "compare --min-sigma below the breach's standard errors: exit $rc: $(cat "$work/cz.out")"
"$bin" compare "$work/r.h5" "$work/worse.h5" --min-sigma -1 >/dev/null 2>"$work/cz.err"; rc=$?
[ $rc -eq 2 ] && grep -q "compare: --min-sigma: expected a number in \[0, 1e+06\], got '-1'" "$work/cz.err" && ok ||
  bad "compare --min-sigma -1: exit $rc: $(cat "$work/cz.err")"
# the output figures per position bucket carry standard errors too (each
# trace's ci95 / 1.96): one bucket's KL made 1.5x, its z against numpy's
cp "$work/r.h5" "$work/worse-b.h5"
"$py" - "$work/worse-b.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
o = f["/drift/output"][:]
m = (o["mode"] == b"fp8-unscaled") & (o["subset"] == b"all") & (o["metric"] == b"kl") & (o["bucket"] == 8)
assert m.sum() >= 1
o["mean"][m] *= 1.5
f["/drift/output"][...] = o
del f["/drift/token_sets"], f["/drift/tokens"]
f.attrs["schema_version"] = [1]
PY
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nkl,fp8-unscaled,8,0,0\n' >"$work/tb.csv"
"$bin" compare "$work/r.h5" "$work/worse-b.h5" --thresholds "$work/tb.csv" >"$work/cb.out"; rc=$?
[ $rc -eq 1 ] && "$py" - "$work/r.h5" "$work/worse-b.h5" "$work/cb.out" <<'PY' && ok || bad "compare: the standard errors of a bucket's KL: exit $rc: $(cat "$work/cb.out")"
import re, sys, math, h5py, numpy as np
def fig(path):
    o = h5py.File(path)["/drift/output"][:]
    o = o[(o["mode"] == b"fp8-unscaled") & (o["subset"] == b"all") & (o["metric"] == b"kl") & (o["bucket"] == 8)]
    n = o["n"].sum()
    return (o["n"] * o["mean"]).sum() / n, math.sqrt(((o["n"] * o["ci95"] / 1.96) ** 2).sum()) / n
(b, sb), (c, sc) = fig(sys.argv[1]), fig(sys.argv[2])
line = open(sys.argv[3]).read()
m = re.search(r"^REGRESSION kl fp8-unscaled context 512 bucket 8: .*, ([0-9.]+) standard errors;", line, re.M)
want = (c - b) / math.sqrt(sb * sb + sc * sc)
assert m and abs(float(m.group(1)) - want) <= 0.05 + 1e-9, (m and m.group(1), want, line)
PY
# ln(PPL ratio), the mean of delta_nll over every position, takes its
# standard error from delta_nll's position buckets
cp "$work/r.h5" "$work/worse-p.h5"
"$py" - "$work/worse-p.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
s = f["/drift/summary"][:]
s["value"][(s["mode"] == b"fp8-unscaled") & (s["subset"] == b"all") & (s["metric"] == b"ln_ppl_ratio")] += 0.01
f["/drift/summary"][...] = s
del f["/drift/token_sets"], f["/drift/tokens"]
f.attrs["schema_version"] = [1]
PY
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nln_ppl_ratio,fp8-unscaled,*,0,0\n' >"$work/tp.csv"
"$bin" compare "$work/r.h5" "$work/worse-p.h5" --thresholds "$work/tp.csv" >"$work/cp.out"; rc=$?
[ $rc -eq 1 ] && "$py" - "$work/r.h5" "$work/cp.out" <<'PY' && ok || bad "compare: the standard errors of ln_ppl_ratio: exit $rc: $(cat "$work/cp.out")"
import re, sys, math, h5py
o = h5py.File(sys.argv[1])["/drift/output"][:]
o = o[(o["mode"] == b"fp8-unscaled") & (o["subset"] == b"all") & (o["metric"] == b"delta_nll")]
se = math.sqrt(((o["n"] * o["ci95"]) ** 2).sum()) / o["n"].sum() / 1.96
m = re.search(r"^REGRESSION ln_ppl_ratio fp8-unscaled context 512: .*, ([0-9.]+) standard errors;", open(sys.argv[2]).read(), re.M)
want = 0.01 / math.sqrt(2 * se * se)
assert m and abs(float(m.group(1)) - want) <= 0.05 + 1e-9, (m and m.group(1), want)
PY
# two runs over the same traces pair position by position: the same sweep
# calibrated on 256 tokens, not 512. compare's z for fp8-cal's kl_mean,
# same_top_p and one bucket's KL, against numpy's paired errors; a run over
# other traces (another seed) does not pair
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nkl_mean,fp8-cal,*,0,0\nsame_top_p,fp8-cal,*,0,0\nkl,fp8-cal,8,0,0\ndelta_p_rms,fp8-cal,*,0,0\nattn_kl,fp8-cal,*,0,0\nkl_p90,fp8-cal,*,0,0\nkl_median,fp8-cal,*,0,0\nrouter_flip_rate,fp8-cal,*,0,0\n' >"$work/tpair.csv"
for v in c256:"--calib-tokens 256" seed2:"--calib-tokens 512 --seed 2"; do
  IFS=: read -r name flags <<<"$v"
  # shellcheck disable=SC2086
  "$bin" run --model tiny --kv fp8-cal --context 512 --cells drift --gen-tokens 4 $flags \
    -o "$work/$name.h5" >/dev/null 2>&1 || bad "the $name sweep failed"
  "$bin" compare "$work/r.h5" "$work/$name.h5" --thresholds "$work/tpair.csv" -o "$work/$name.html" >"$work/$name.out"
done
"$py" - "$work/r.h5" "$work/c256.h5" "$work/c256.html" "$work/seed2.html" "$work/c256.out" <<'PY' && ok || bad "compare: paired standard errors over the same traces"
import re, sys, math, h5py, numpy as np
def tokens(path):
    f = h5py.File(path, "r")
    ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
    r = ts[ts["mode"] == b"fp8-cal"]
    assert len(r) == 1
    return r["trace_hash"][0], tk[r["first"][0]:r["first"][0] + r["n"][0]]
(ha, a), (hb, b) = tokens(sys.argv[1]), tokens(sys.argv[2])
assert ha == hb and len(a) == len(b) == 511
def z_of(page, metric, bucket):
    m = re.search(rf'<tr><td class="l">{metric}</td><td class="l">fp8-cal</td><td>512</td><td>{re.escape(bucket)}</td>'
                  r"<td>([^<]*)</td><td>([^<]*)</td><td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td>", page)
    assert m, (metric, bucket)
    return m.group(3)
page = open(sys.argv[3]).read()
pos = np.arange(511)
for metric, bucket, col, sign, sel in (("kl_mean", "*", "kl", 1, pos >= 0), ("same_top_p", "*", "same_top", -1, pos >= 0),
                                      ("kl", "8", "kl", 1, (pos >= 256) & (pos < 512))):
    d = (b[col].astype(np.float64) - a[col].astype(np.float64))[sel]
    z = sign * d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    got = z_of(page, metric, bucket)
    assert got.endswith(" paired") and abs(float(got.split()[0]) - z) <= 0.05 + 1e-9, (metric, got, z)
    if z > 0:  # worse: a breach of the zero allowances, its line marked paired too
        line = rf"^REGRESSION {metric} fp8-cal context 512{' bucket ' + bucket if bucket != '*' else ''}: .*, {got.split()[0]} standard errors \(paired\);"
        assert re.search(line, open(sys.argv[5]).read(), re.M), (line, open(sys.argv[5]).read())
    print(f"{metric} bucket {bucket}: paired z {z:.2f}", file=sys.stderr)
# delta_p_rms paired: the mean squares' difference over its error
d = b["delta_p"].astype(np.float64) ** 2 - a["delta_p"].astype(np.float64) ** 2
z = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
got = z_of(page, "delta_p_rms", "*")
assert got.endswith(" paired") and abs(float(got.split()[0]) - z) <= 0.05 + 1e-9, ("delta_p_rms", got, z)
# attention KL paired: each sampled position's mean over the layers
def attn_rows(path):
    t = h5py.File(path)["/drift/attention"][:]
    t = t[(t["mode"] == b"fp8-cal") & (t["view"] == b"propagated") & (t["subset"] == b"all") & (t["metric"] == b"kl") & (t["kv_head"] == -1)]
    return (t["n"] * t["mean"]).sum() / t["n"].sum()
d = b["attn_propagated"].astype(np.float64) - a["attn_propagated"].astype(np.float64)
d = d[~np.isnan(d)]
assert 30 <= len(d) < 100
z = (attn_rows(sys.argv[2]) - attn_rows(sys.argv[1])) / (d.std(ddof=1) / math.sqrt(len(d)))
got = z_of(page, "attn_kl", "*")
assert got.endswith(" paired") and abs(float(got.split()[0]) - z) <= 0.05 + 1e-9, ("attn_kl", got, z)
assert a["kl"].mean() != b["kl"].mean()  # the calibrations differ
# router_flip_rate paired: each position's count of flipped MoE layers, the
# share's error that count's over the MoE layers
def rate(path):
    s = h5py.File(path)["/drift/summary"][:]
    return float(s[(s["mode"] == b"fp8-cal") & (s["metric"] == b"router_flip_rate")]["value"][0])
d = b["router_flips"].astype(np.float64) - a["router_flips"].astype(np.float64)
assert d.any()
z = (rate(sys.argv[2]) - rate(sys.argv[1])) / (d.std(ddof=1) / math.sqrt(len(d)) / 8)
got = z_of(page, "router_flip_rate", "*")
assert got.endswith(" paired") and abs(float(got.split()[0]) - z) <= 0.05 + 1e-9, ("router_flip_rate", got, z)
print(f"router_flip_rate: paired z {z:.2f}", file=sys.stderr)
# a KL percentile paired: each run's order-statistic error, less the
# covariance of the shares of positions at or below each run's quantile
def pct(v, q):
    v = np.sort(v); x = q * (len(v) - 1); i = int(x)
    return v[i] + (x - i) * (v[i + 1] - v[i])
def ose(v, q):
    v = np.sort(v); n = len(v); h = 1.959963984540054 * math.sqrt(n * q * (1 - q))
    return (v[math.ceil(n * q + h)] - v[math.floor(n * q - h)]) / (2 * 1.959963984540054)
ka, kb = a["kl"].astype(np.float64), b["kl"].astype(np.float64)
boot = np.random.default_rng(7).integers(0, len(ka), (2000, len(ka)))
for metric, q in (("kl_p90", .9), ("kl_median", .5)):
    ia, ib = ka <= pct(ka, q), kb <= pct(kb, q)
    rho = np.corrcoef(ia, ib)[0, 1]
    sa, sb = ose(ka, q), ose(kb, q)
    se = math.sqrt(sa * sa + sb * sb - 2 * rho * sa * sb)
    z = (pct(kb, q) - pct(ka, q)) / se
    got = z_of(page, metric, "*")
    assert got.endswith(" paired") and abs(float(got.split()[0]) - z) <= 0.05 + 1e-9, (metric, got, z)
    # the method itself: within a fifth of a paired bootstrap's error, and
    # under the unpaired error (the runs' KLs correlate)
    bs = np.std([np.quantile(kb[i], q) - np.quantile(ka[i], q) for i in boot], ddof=1)
    assert 0.8 < se / bs < 1.25 and rho > 0.2 and se < math.hypot(sa, sb), (metric, se, bs, rho)
    print(f"{metric}: paired z {z:.2f}, error {se / math.hypot(sa, sb):.2f}x the unpaired, {se / bs:.2f}x the bootstrap's", file=sys.stderr)
other = open(sys.argv[4]).read()
assert not re.search(r"[0-9] paired</td>", other) and re.search(r"[0-9]\.[0-9]</td><td>[^<]*</td><td", other)
# the page's chart of the paired difference per position bucket
import xml.etree.ElementTree as ET
svg = next(x for x in re.findall(r"<svg .*?</svg>", page, re.S) if "paired by position" in x)
pts = [c for c in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}circle") if c.get("class") == "pt"]
assert {c.get("data-series") for c in pts} == {"fp8-cal"} and len(pts) >= 8
d = b["kl"].astype(np.float64) - a["kl"].astype(np.float64)
bucket = np.where(pos < 2, 0, np.floor(np.log2(np.maximum(pos, 1))).astype(int))
for c in pts:
    x = float(c.get("data-x"))
    bk = int(round(np.log2(x * x) / 2)) if x > 1.5 else 0
    v = d[bucket == bk]
    mean, ci = v.mean(), 1.959963984540054 * v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0
    assert abs(float(c.get("data-y")) - mean) <= 1e-9 * abs(v).max(), (bk, c.get("data-y"), mean)
    assert abs(float(c.get("data-hi")) - mean - ci) <= 1e-9 * abs(v).max() + 1e-6 * ci, (bk, c.get("data-hi"), ci)
assert "paired by position" not in other
# fp8-cal in the colour of the baseline's fp8-cal in the chart above
above = next(x for x in re.findall(r"<svg .*?</svg>", page, re.S) if "KL against position" in x)
fill = {c.get("data-series"): c.get("fill") for c in ET.fromstring(above).iter("{http://www.w3.org/2000/svg}circle") if c.get("class") == "pt"}
assert {c.get("fill") for c in pts} == {fill[next(k for k in fill if k.endswith("fp8-cal") and "c256" not in k)]}, fill
PY
"$bin" compare "$work/r.h5" "$work/r.h5" -o "$work/same.html" >/dev/null && xmllint --noout "$work/same.html" &&
  grep -q "every mode's KL is the same at every position" "$work/same.html" && ! grep -q "paired by position" "$work/same.html" &&
  ok || bad "compare against itself: no note that every position is the same"
# figures with an error of their own, between runs that do not pair (seed 1
# against 2): a KL percentile's order statistics, delta_p_rms, the last
# layer's hidden drift and attention KL (its mean over layers) from the
# positions. From version 1 files: the buckets, attention taking the layers
# as independent (an upper bound of z, shown as such), no percentile, no rms
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nkl_p90,fp8-cal,*,0,0\ndelta_p_rms,fp8-cal,*,0,0\nhidden_rel_l2_last,fp8-cal,*,0,0\nattn_kl,fp8-cal,*,0,0\nattn_kl_isolated,fp8-cal,*,0,0\nrouter_flip_rate,fp8-cal,*,0,0\n' >"$work/tse.csv"
"$bin" compare "$work/r.h5" "$work/seed2.h5" --thresholds "$work/tse.csv" -o "$work/se.html" >"$work/se.out"
cp "$work/seed2.h5" "$work/seed2-v1.h5"
"$py" - "$work/seed2-v1.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
del f["/drift/token_sets"], f["/drift/tokens"]
f.attrs["schema_version"] = [1]
PY
"$bin" compare "$work/v1.h5" "$work/seed2-v1.h5" --thresholds "$work/tse.csv" -o "$work/se1.html" >"$work/se1.out"
"$py" - "$work/r.h5" "$work/seed2.h5" "$work/se.html" "$work/se1.html" "$work/se1.out" <<'PY' && ok || bad "compare: the standard errors of percentiles, rms, hidden and attention drift: $(cat "$work/se.out" "$work/se1.out")"
import re, sys, math, h5py, numpy as np
import html as H
def summ(f, metric):
    s = f["/drift/summary"][:]
    return float(s[(s["mode"] == b"fp8-cal") & (s["subset"] == b"all") & (s["metric"] == metric.encode())]["value"][0])
def pos(f, col):
    ts, tk = f["/drift/token_sets"][:], f["/drift/tokens"][:]
    r = ts[ts["mode"] == b"fp8-cal"][0]
    x = tk[col][r["first"]:r["first"] + r["n"]].astype(np.float64)
    return x[~np.isnan(x)]
def se(x):
    return x.std(ddof=1) / math.sqrt(len(x))
def pct_se(f, q):
    v = np.sort(pos(f, "kl")); n = len(v)
    h = 1.959963984540054 * math.sqrt(n * q * (1 - q))
    lo, hi = math.floor(n * q - h), math.ceil(n * q + h)
    assert 0 <= lo and hi <= n - 1
    return (v[hi] - v[lo]) / (2 * 1.959963984540054)
def rms_se(f):
    return se(pos(f, "delta_p") ** 2) / (2 * summ(f, "delta_p_rms"))
def rows_se(t):
    c = np.nan_to_num(t["ci95"])
    return (t["n"] * t["mean"]).sum() / t["n"].sum(), math.sqrt(((t["n"] * c / 1.959963984540054) ** 2).sum()) / t["n"].sum()
def hid(f):
    l = f["/drift/layers"][:]
    return rows_se(l[(l["mode"] == b"fp8-cal") & (l["layer"] == l["layer"].max()) & (l["subset"] == b"all") & (l["metric"] == b"rel_l2")])
def attn(f, view):
    a = f["/drift/attention"][:]
    return rows_se(a[(a["mode"] == b"fp8-cal") & (a["view"] == view.encode()) & (a["subset"] == b"all") & (a["metric"] == b"kl") & (a["kv_head"] == -1)])
def z(b, a, sa, sb):
    return (b - a) / math.hypot(sa, sb)
A, B = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
views = {"attn_kl": "propagated", "attn_kl_isolated": "isolated"}
with_pos = {
    "kl_p90": (z(summ(B, "kl_p90"), summ(A, "kl_p90"), pct_se(A, .9), pct_se(B, .9)), ""),
    "delta_p_rms": (z(summ(B, "delta_p_rms"), summ(A, "delta_p_rms"), rms_se(A), rms_se(B)), ""),
    "hidden_rel_l2_last": (z(hid(B)[0], hid(A)[0], se(pos(A, "hidden_last")), se(pos(B, "hidden_last"))), ""),
}
for m, v in views.items():
    with_pos[m] = (z(attn(B, v)[0], attn(A, v)[0], se(pos(A, "attn_" + v)), se(pos(B, "attn_" + v))), "")
# router_flip_rate: from the positions' counts over the 8 MoE layers; from
# version 1 files the layers' rows as independent, an upper bound
def router_rows(f):
    l = f["/drift/layers"][:]
    l = l[(l["mode"] == b"fp8-cal") & (l["metric"] == b"router_flip") & (l["subset"] == b"all")]
    assert len(set(l["layer"])) == 8
    per = [rows_se(l[l["layer"] == k])[1] for k in range(8)]
    return math.sqrt(sum(e * e for e in per)) / 8
with_pos["router_flip_rate"] = (z(summ(B, "router_flip_rate"), summ(A, "router_flip_rate"), se(pos(A, "router_flips")) / 8, se(pos(B, "router_flips")) / 8), "")
without = {"kl_p90": None, "delta_p_rms": None,
           "hidden_rel_l2_last": (z(hid(B)[0], hid(A)[0], hid(A)[1], hid(B)[1]), ""),
           "router_flip_rate": (z(summ(B, "router_flip_rate"), summ(A, "router_flip_rate"), router_rows(A), router_rows(B)), "\u2264")}
for m, v in views.items():
    without[m] = (z(attn(B, v)[0], attn(A, v)[0], attn(A, v)[1], attn(B, v)[1]), "\u2264")
for page, want in ((open(sys.argv[3]).read(), with_pos), (open(sys.argv[4]).read(), without)):
    for metric, w in want.items():
        m = re.search(rf'<tr><td class="l">{metric}</td><td class="l">fp8-cal</td><td>512</td><td>\*</td>(?:<td>[^<]*</td>){{4}}<td>([^<]*)</td>', page)
        got = H.unescape(m.group(1))
        if w is None:
            assert got == "-", (metric, got)
            continue
        zz, mark = w
        assert got.startswith(mark) and not got[len(mark):].startswith("\u2264") and abs(float(got[len(mark):]) - zz) <= 0.05 + 1e-9, (metric, got, zz)
        print(f"{metric}: z {mark}{zz:.2f}", file=sys.stderr)
# by positions, attention's error is larger than the layers-as-independent one
for m, v in views.items():
    assert se(pos(A, "attn_" + v)) > attn(A, v)[1], m
out = open(sys.argv[5]).read()
assert re.search(r"^REGRESSION attn_kl fp8-cal context 512: .*, at most [0-9.]+ standard errors;", out, re.M) or without["attn_kl"][0] <= 0, out
PY
# decode_vs_bf16: a mode's decode speed over BF16's in the same run. FP8
# made slower regresses it; BF16 made slower does not (the machine, not the
# cache format), though BF16's own tok/s does
for who in fp8-unscaled:0.5 bf16:0.4; do
  IFS=: read -r mode f <<<"$who"
  cp "$work/r.h5" "$work/slow-$mode.h5"
  "$py" - "$work/slow-$mode.h5" "$mode" "$f" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
t = f["/throughput"][:]
t["decode_tok_s"][(t["mode"] == sys.argv[2].encode()) & (t["concurrency"] == 2)] *= float(sys.argv[3])
f["/throughput"][...] = t
PY
done
"$bin" compare "$work/r.h5" "$work/slow-fp8-unscaled.h5" --thresholds "$thresholds" >"$work/cs1.out"; rc1=$?
"$bin" compare "$work/r.h5" "$work/slow-bf16.h5" --thresholds "$thresholds" >"$work/cs2.out"; rc2=$?
[ $rc1 -eq 1 ] && [ $rc2 -eq 1 ] && "$py" - "$work/r.h5" "$work/cs1.out" "$work/cs2.out" <<'PY' && ok || bad "compare decode_vs_bf16: $(cat "$work/cs1.out" "$work/cs2.out")"
import re, sys, h5py
t = h5py.File(sys.argv[1])["/throughput"][:]
d = {(r["mode"].decode(), int(r["concurrency"])): r["decode_tok_s"] for r in t}
ratio = d[("fp8-unscaled", 2)] / d[("bf16", 2)]
a = [l for l in open(sys.argv[2]) if l.startswith("REGRESSION")]
assert len(a) == 1, a
m = re.match(r"REGRESSION decode_vs_bf16@c2 fp8-unscaled context 512: baseline ([0-9.e+-]+), candidate ([0-9.e+-]+) ", a[0])
assert m and abs(float(m.group(1)) - ratio) <= 1e-5 * ratio and abs(float(m.group(2)) - ratio / 2) <= 1e-5 * ratio, a
b = [l for l in open(sys.argv[3]) if l.startswith("REGRESSION")]
assert len(b) == 1 and b[0].startswith("REGRESSION decode_tok_s@c2 bf16 context 512:"), b
PY
# runs that differ in more than their figures say so (here: the trace seed)
cp "$work/r.h5" "$work/seed5.h5"
"$py" - "$work/seed5.h5" <<'PY'
import sys, json, h5py
f = h5py.File(sys.argv[1], "r+")
s = json.loads(f.attrs["run_settings"])
assert s["seed"] == 1 and s["backend"] == "cpu", s
s["seed"] = 5
f.attrs["run_settings"] = json.dumps(s)
PY
"$bin" compare "$work/r.h5" "$work/seed5.h5" -o "$work/seed5.html" >"$work/c5.out"; rc=$?
[ $rc -eq 0 ] && grep -q "^note: the runs differ in seed (1 against 5)$" "$work/c5.out" &&
  grep -q "The runs differ in: seed (1 against 5)" "$work/seed5.html" &&
  ! grep -q "^note: the runs differ" "$work/c0.out" && ok || bad "runs with other settings: exit $rc: $(cat "$work/c5.out")"
# whether the standard errors pair, said once: against itself and across
# calibrations the same traces; across seeds other ones; a version 1 file none
grep -q "^note: the runs ran the same traces, so their figures' standard errors are those of the per-position differences (paired)$" "$work/c0.out" &&
  grep -q "^note: the runs ran the same traces" "$work/c256.out" &&
  grep -q "^note: the runs ran other traces (their tokens differ), so their figures' standard errors are unpaired$" "$work/seed2.out" &&
  grep -q "^note: a run keeps no per-position figures (a schema version 1 file, or no drift cells), so the figures' standard errors are unpaired$" "$work/c1.out" &&
  grep -q "Standard errors: the runs ran other traces" "$work/seed2.html" && ok ||
  bad "compare's note on pairing: $(head -3 "$work/c0.out" "$work/seed2.out" "$work/c1.out")"
# a candidate without a figure the baseline has (a sweep that died, a NaN)
# regresses: a gate that passed what it could not see would pass them
cp "$work/r.h5" "$work/part.h5"
"$py" - "$work/part.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r+")
for p in ("/drift/output", "/drift/layers", "/drift/attention", "/drift/summary", "/drift/kv", "/drift/generation", "/throughput", "/cells"):
    a = f[p][:]
    del f[p]
    f[p] = a[a["mode"] != b"fp8-unscaled"]
s = f["/drift/summary"][:]
s["value"][(s["mode"] == b"fp8-cal") & (s["subset"] == b"all") & (s["metric"] == b"kl_p99")] = np.nan
f["/drift/summary"][...] = s
PY
printf 'metric,mode,bucket,max_abs_increase,max_rel_increase\nkl_mean,*,*,1,1\nkl_p99,fp8-cal,*,1,1\ndecode_tok_s,fp8-unscaled,*,0,1\n' >"$work/tm.csv"
"$bin" compare "$work/r.h5" "$work/part.h5" --thresholds "$work/tm.csv" -o "$work/miss.html" >"$work/cm.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^REGRESSION kl_mean fp8-unscaled context 512: baseline .*, candidate none (absent, or NaN)$" "$work/cm.out" &&
  grep -q "^REGRESSION kl_p99 fp8-cal context 512: baseline .*, candidate none" "$work/cm.out" &&
  grep -q "^REGRESSION decode_tok_s@c2 fp8-unscaled context 512: baseline .*, candidate none" "$work/cm.out" &&
  grep -q "^compare: 5 checks, 4 regressions (4 missing in the candidate): REGRESSION$" "$work/cm.out" &&
  grep -q "missing in the candidate" "$work/miss.html" && ok || bad "a candidate missing figures: exit $rc: $(cat "$work/cm.out")"
# ... whatever --min-sigma says: a figure that is not there is no noise
"$bin" compare "$work/r.h5" "$work/part.h5" --thresholds "$work/tm.csv" --min-sigma 1000 >"$work/cm.out"; rc=$?
[ $rc -eq 1 ] && grep -q "^compare: 5 checks, 4 regressions (4 missing in the candidate): REGRESSION$" "$work/cm.out" && ok ||
  bad "a candidate missing figures, --min-sigma 1000: exit $rc: $(cat "$work/cm.out")"
# the other way round, figures the baseline lacks are new, not compared
"$bin" compare "$work/part.h5" "$work/r.h5" --thresholds "$work/tm.csv" >"$work/cn.out"; rc=$?
[ $rc -eq 0 ] && grep -q "^compare: 1 checks, 0 regressions: pass$" "$work/cn.out" && ok || bad "a candidate with more figures: exit $rc: $(cat "$work/cn.out")"
# bad thresholds, exit 2 with the line or the reason: a missing column, a
# non-numeric allowance, an unknown metric or mode, a stray field, and rows
# that compare nothing (bf16 drifts by zero: it is never checked)
h='metric,mode,bucket,max_abs_increase,max_rel_increase'
k=0
while IFS='|' read -r csv pat; do
  k=$((k + 1))
  printf '%b' "$csv" >"$work/t$k.csv"
  "$bin" compare "$work/r.h5" "$work/r.h5" --thresholds "$work/t$k.csv" 2>"$work/e$k" >/dev/null; rc=$?
  [ $rc -eq 2 ] && grep -q -- "$pat" "$work/e$k" && ok || bad "thresholds $(printf '%b' "$csv" | tail -1): exit $rc $(cat "$work/e$k")"
done <<EOF
metric,mode,max_abs_increase,max_rel_increase\nkl_mean,*,0.1,0.1\n|t1.csv:1: missing column 'bucket'
$h\nkl_mean,*,*,0.1,0.1\nkl_p99,*,*,lots,0.1\n|t2.csv:3: column 'max_abs_increase': expected a non-negative number, got 'lots'
$h\nkl_meen,*,*,0.1,0.1\n|thresholds line 2: unknown metric 'kl_meen'
$h\nkl_mean,fp9,*,0.1,0.1\n|thresholds line 2: unknown mode 'fp9'
$h\nkl_mean,*,*,0.1,0.1,9\n|t5.csv:2: expected 5 fields as in the header, got 6
$h\nkl_mean,bf16,*,0.1,0.1\n|r.h5: none of the figures the thresholds name is in it: nothing was compared
EOF
"$bin" trace gen --length 64 -o "$work/trace.h5" >/dev/null
"$bin" report "$work/trace.h5" --format md 2>"$work/e8"; rc=$?
[ $rc -eq 2 ] && grep -q "trace.h5: attribute 'format': expected \"kvdrift-results\", got \"kvdrift-trace\"" "$work/e8" && ok || bad "a trace file as results: exit $rc $(cat "$work/e8")"
"$bin" compare "$work/r.h5" "$work/missing.h5" 2>"$work/e9"; rc=$?
[ $rc -eq 2 ] && grep -q "missing.h5" "$work/e9" && ok || bad "missing file: exit $rc"

# look at it: a headless-Chromium screenshot must not be blank
chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$chrome" ]; then
  timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1600 \
    --screenshot="$work/shot.png" "file://$work/r.html" >/dev/null 2>&1
  "$py" - "$work/shot.png" <<'PY' && ok || bad "the screenshot is blank or missing"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, t = struct.unpack(">I4s", data[pos:pos + 8])
    if t == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", data[pos + 8:pos + 18])
    if t == b"IDAT":
        idat += data[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
# distinct byte values across the image: a blank page has one or two
assert len(set(raw[::97])) > 40, len(set(raw[::97]))
PY
else
  echo "SKIP: chromium is not installed: no screenshot check (apt-get install chromium to run it)"
fi

echo "report: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
