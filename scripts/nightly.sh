#!/usr/bin/env bash
# Nightly regression gate: build, run the fixed sweep (scripts/nightly.json),
# write the HTML and Markdown reports, keep the run in OUT_DIR/history and
# render the trend of the last 30, compare against the baseline and exit
# with the verdict: 0 pass, 1 regression, 2 bad input or no baseline.
# usage: scripts/nightly.sh [BASELINE.h5 (default baselines/nightly.h5)] [OUT_DIR (default out/nightly)]
set -uo pipefail
cd "$(dirname "$0")/.."
baseline="${1:-baselines/nightly.h5}"
out="${2:-out/nightly}"

bash scripts/setup.sh >/dev/null && bash scripts/build.sh >/dev/null || exit 2
mkdir -p "$out"
rm -f "$out/nightly.h5" # a nightly run starts fresh
build/kvdrift run --spec scripts/nightly.json -o "$out/nightly.h5" || exit 2
build/kvdrift report "$out/nightly.h5" -o "$out/nightly.html" || exit 2
build/kvdrift report "$out/nightly.h5" --format md -o "$out/nightly.md" || exit 2
# the run joins the history, and the trend over the last 30 runs shows a creep
# no single comparison flags (the gate below stays the comparison)
mkdir -p "$out/history"
cp "$out/nightly.h5" "$out/history/nightly-$(date -u +%Y%m%dT%H%M%SZ).h5" || exit 2
mapfile -t past < <(ls "$out"/history/nightly-*.h5 | tail -n 30)
if [ "${#past[@]}" -ge 2 ]; then
  build/kvdrift trend "${past[@]}" -o "$out/trend.html" &&
    build/kvdrift trend "${past[@]}" --format md -o "$out/trend.md" ||
    echo "nightly: no trend this time (the history's files above); the comparison still decides" >&2
fi
if [ ! -f "$baseline" ]; then
  echo "nightly: no baseline at $baseline; to make this run the baseline:"
  echo "  mkdir -p $(dirname "$baseline") && cp $out/nightly.h5 $baseline"
  exit 2
fi
# the comparison as Markdown for the log or a ticket, then the gate itself
build/kvdrift compare "$baseline" "$out/nightly.h5" --thresholds reports/thresholds.csv \
  -o "$out/diff.md" >/dev/null
build/kvdrift compare "$baseline" "$out/nightly.h5" --thresholds reports/thresholds.csv \
  -o "$out/diff.html" | tee "$out/verdict.txt"
exit "${PIPESTATUS[0]}"
