#!/usr/bin/env bash
# Sets up a fresh machine, builds kvdrift and runs every test.
# usage: scripts/test.sh [--sanitize]   (--sanitize: AddressSanitizer + UBSan build)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh "$@"
dir=build
[ "${1:-}" = "--sanitize" ] && dir=build-asan

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# ctest runs two tests at once, each with OMP_NUM_THREADS threads. With
# libgomp's default wait policy a thread that reaches a barrier first spins
# on the core the other test's threads need, and both crawl (the 17 tests
# outside the simulator: 374 s spinning, 63 s passive, on 2 cores).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
if [ "${1:-}" = "--sanitize" ]; then
  # libgomp keeps its thread pool alive at exit; that is not a leak of ours
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
ctest --test-dir "$dir" --output-on-failure -j 2
