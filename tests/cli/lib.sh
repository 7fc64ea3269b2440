# kvdrift: what the command-line checks share (sourced): a scratch folder
# removed on exit, and pass/fail counters with ok and bad (which says why).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
