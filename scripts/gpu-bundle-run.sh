#!/usr/bin/env bash
# On the device machine, from a bundle made by scripts/gpu-bundle.sh: the
# CUDA parity tests against the CPU twins, then the device benchmarks; the
# log into OUT_DIR/gpu-check.log. Exit 0 only when every parity check and
# the whole-model comparison passed.
# usage: bash gpu-bundle/run.sh OUT_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-out/gpu-check}"
mkdir -p "$out"
# cuBLASLt: the system's, else CUDA's own folder, else the Python wheel's
lt=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13/ {print $NF; exit}')
[ -n "$lt" ] || lt=$(ls /usr/local/cuda/lib64/libcublasLt.so.13* 2>/dev/null | head -1)
[ -n "$lt" ] || lt=$(python3 -c 'import nvidia.cublas as c, os; print(os.path.join(list(c.__path__)[0], "lib", "libcublasLt.so.13"))' 2>/dev/null)
# NCCL, for tensor parallelism over several GPUs (opened at run time): the
# system's, else the Python wheel's
nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2/ {print $NF; exit}')
[ -n "$nccl" ] || nccl=$(python3 -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
# the bundle's libraries, the packed ones unpacked (xz, else Python's lzma)
lib="${TMPDIR:-/tmp}/kvdrift-gpu-lib"
mkdir -p "$lib"
for f in "$here"/lib/*; do
  case "$f" in
  *.xz) xz -dc "$f" >"$lib/$(basename "$f" .xz)" 2>/dev/null ||
    python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" \
      >"$lib/$(basename "$f" .xz)" ;;
  *) cp "$f" "$lib/" ;;
  esac
done
export LD_LIBRARY_PATH="$lib:${lt:+$(dirname "$lt"):}${nccl:+$(dirname "$nccl"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# the binaries open cuBLASLt at run time: the one found above, by name
[ -n "$lt" ] && export KVD_CUBLASLT="$lt"
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname) cuBLASLt: ${lt:-not found}, NCCL: ${nccl:-not found}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  # the parity tests' CPU twins take the AVX-512 attention kernels where the
  # host has AVX-512 VBMI, with AMX tiles at 8 and 16 query heads a KV head
  # where it also has AMX-BF16 and AVX512-BF16 (they round the last bits otherwise)
  cpu_attn=portable
  if grep -qw avx512vbmi /proc/cpuinfo; then
    cpu_attn=AVX-512
    grep -qw amx_bf16 /proc/cpuinfo && grep -qw avx512_bf16 /proc/cpuinfo &&
      cpu_attn="AMX (where Linux grants the tiles)"
  fi
  echo "host CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) threads;" \
    "CPU attention kernels: $cpu_attn"
  echo "== parity"
  # limits add up to 470 s when the model test passes (the whole check
  # inside 8 minutes), 550 s when it fails and is run again
  timeout 50 "$here/test_cuda_parity"
  echo "parity exit $?"
  echo "== the whole model on the device against the CPU"
  timeout 110 "$here/test_cuda_model"
  rc=$?
  echo "model exit $rc"
  if [ "$rc" != 0 ]; then
    echo "== the same with decode on v2 and prefill on v1 (do the tensor-core kernels make the difference?)"
    KVD_CUDA_DECODE=2 KVD_CUDA_PREFILL=1 timeout 80 "$here/test_cuda_model"
    echo "model (v2 decode, v1 prefill) exit $?"
  fi
  echo "== device benchmarks"
  timeout 120 "$here/kvd_gpu_bench" 10
  echo "bench exit $?"
  echo "== the whole model: decode tokens/s, qwen3.5-397b-a17b"
  timeout 150 "$here/kvd_gpu_bench" model qwen3.5-397b-a17b 512 8
  echo "model bench exit $?"
  echo "== what the drift measurement costs on the device: lock step against the candidate alone"
  timeout 40 "$here/kvd_gpu_bench" lockstep small 16384
  echo "lockstep bench exit $?"
} 2>&1 | tee "$out/gpu-check.log"
grep -q "^parity exit 0$" "$out/gpu-check.log" && grep -q "^model exit 0$" "$out/gpu-check.log"
