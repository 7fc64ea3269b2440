#!/usr/bin/env bash
# Every C, C++ and CUDA source tracked by git is as clang-format (.clang-format)
# would write it; exit 1 naming the files that are not, 77 without clang-format.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "SKIP: clang-format not installed"; exit 77; }
command -v git >/dev/null && [ -d .git ] || { echo "SKIP: not a git checkout"; exit 77; }
bad=0
for f in $(git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.cpp'); do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not clang-formatted: $f"
    bad=1
  fi
done
exit $bad
