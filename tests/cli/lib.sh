# kvdrift: what the command-line checks share (sourced): a scratch folder
# removed on exit, and pass/fail counters with ok and bad (which says why).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# resume_refused FILE KEPT PATTERN CMD...: CMD -o FILE exits 2 with PATTERN
# (an extended regex) on stderr, and FILE is still byte for byte KEPT
resume_refused() {
  local file="$1" kept="$2" pat="$3"
  shift 3
  "$@" -o "$file" >/dev/null 2>"$work/refused.err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -qE -- "$pat" "$work/refused.err" && cmp -s "$file" "$kept"; then ok; else
    bad "resume not refused (/$pat/): exit $rc, $(cat "$work/refused.err")"; fi
}
