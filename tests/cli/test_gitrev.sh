#!/usr/bin/env bash
# scripts/gitrev.cmake, which names the revision in results files and in
# `kvdrift version`: the short commit, "-dirty" with uncommitted changes to
# tracked files, "unknown" outside git; the header rewritten only when the
# revision changes (so a build does not recompile for nothing).
set -u
script="$1"
bin="$2"
. "$(dirname "$0")/lib.sh"
command -v git >/dev/null || { echo "SKIP: no git"; exit 77; }
rev() { cmake -DSRC="$work/repo" -DOUT="$work/gitrev.h" -P "$script" && sed -n 's/^#define KVD_GIT_REV "\(.*\)"$/\1/p' "$work/gitrev.h"; }

mkdir -p "$work/repo"
[ "$(rev)" = unknown ] && ok || bad "outside git: '$(rev)'"
g() { git -C "$work/repo" -c user.name=t -c user.email=t@example.org "$@" >/dev/null 2>&1; }
g init -q && echo a >"$work/repo/f" && g add f && g commit -q -m one
c1=$(git -C "$work/repo" rev-parse --short HEAD)
[ "$(rev)" = "$c1" ] && ok || bad "a clean checkout: '$(rev)', want '$c1'"
touch -d '2001-01-01' "$work/gitrev.h"
rev >/dev/null
[ "$(stat -c %Y "$work/gitrev.h")" = "$(date -d '2001-01-01' +%s)" ] && ok || bad "the header was rewritten with the same revision"
echo b >"$work/repo/f"
[ "$(rev)" = "$c1-dirty" ] && ok || bad "an uncommitted change: '$(rev)', want '$c1-dirty'"
g commit -q -am two
c2=$(git -C "$work/repo" rev-parse --short HEAD)
[ "$(rev)" = "$c2" ] && [ "$c2" != "$c1" ] && ok || bad "after a commit: '$(rev)', want '$c2'"
# the build's own: what `kvdrift version` says is a revision, not empty
"$bin" version | head -1 | grep -Eq '^kvdrift [0-9.]+ \(([0-9a-f]{7,}(-dirty)?|unknown)\)$' && ok || bad "kvdrift version: $("$bin" version | head -1)"

echo "gitrev: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
