#!/usr/bin/env bash
# The CUDA build's compiler launcher: runs the nvcc command it is given
# (built with --resource-usage) and keeps what ptxas said of each kernel in
# DIR/OBJECT.usage, a line a kernel and architecture:
#   ARCH REGISTERS STATIC_SHARED_BYTES STACK_BYTES MANGLED_NAME
# The SIMT simulator reads them (KVD_SIMT_PTXAS=DIR) and refuses a launch a
# GPU would refuse for its registers or shared memory. ptxas's lines are
# kept out of the build's output; every other line of nvcc's goes through.
# usage: scripts/nvcc-usage.sh DIR NVCC ARGS...
set -uo pipefail
dir="$1"
shift
obj=
prev=
for a in "$@"; do
  [ "$prev" = "-o" ] && obj="$a"
  prev="$a"
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>"$log"
rc=$?
grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$log" >&2
if [ "$rc" -eq 0 ] && [ -n "$obj" ]; then
  mkdir -p "$dir"
  out="$dir/$(basename "$obj").usage"
  awk '
    /^ptxas info *: Compiling entry function/ {
      name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name)
      arch = $0; sub(/.* for \047/, "", arch); sub(/\047.*/, "", arch)
      stack = 0; next
    }
    name != "" && / bytes stack frame/ { stack = $1; next }
    name != "" && /^ptxas info *: Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0
      if ($0 ~ /bytes smem/) { smem = $0; sub(/ bytes smem.*/, "", smem); sub(/.* /, "", smem) }
      print arch, regs, smem, stack, name
      name = ""
    }' "$log" >"$out.tmp" && mv "$out.tmp" "$out" || rc=1
fi
exit "$rc"
