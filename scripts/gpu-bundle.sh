#!/usr/bin/env bash
# Builds, here, what the GPU check runs on a device machine that has CUDA
# (driver, cuBLASLt) but none of this host's Debian libraries and no network:
# the parity test, the whole-model test and the device benchmarks, the CUDA
# runtime linked in, generic x86-64 code (the device machine's CPU is not
# this one), and beside them the shared libraries they still need (the large
# ones xz-compressed: OpenBLAS is 36 MB, 4 MB packed). Then, there:
#   bash gpu-bundle/run.sh OUT_DIR
# usage: scripts/gpu-bundle.sh [DIR (default gpu-bundle)]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-gpu-bundle}"
bash scripts/setup.sh >/dev/null
cmake -S . -B build-bundle -DCMAKE_BUILD_TYPE=Release -DKVD_NATIVE=OFF -DKVD_BUNDLE=ON \
  -DKVD_CUDA=ON >/dev/null
cmake --build build-bundle -j"$(nproc)" --target test_cuda_parity test_cuda_model kvd_gpu_bench >/dev/null
rm -rf "$dir"
mkdir -p "$dir/lib"
cp build-bundle/tests/test_cuda_parity build-bundle/tests/test_cuda_model build-bundle/kvd_gpu_bench \
  scripts/gpu-bundle-run.sh "$dir/"
mv "$dir/gpu-bundle-run.sh" "$dir/run.sh"
# shared libraries that are neither the C and C++ runtimes' nor CUDA's (the
# device machine has those, in versions at least as new)
for lib in $(ldd "$dir/test_cuda_parity" "$dir/test_cuda_model" "$dir/kvd_gpu_bench" | awk '/=> \// {print $3}' | sort -u); do
  case "$(basename "$lib")" in
  libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
  libcuda.so* | libcublas*) ;;
  *) cp -L "$lib" "$dir/lib/" ;;
  esac
done
for f in "$dir"/lib/*; do
  [ "$(stat -c %s "$f")" -gt 1000000 ] && xz -9 "$f"
done
# the newest glibc symbol version the binaries ask for
need=$(objdump -T "$dir/test_cuda_parity" "$dir/test_cuda_model" "$dir/kvd_gpu_bench" 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "gpu-bundle: $(du -sh "$dir" | cut -f1) in $dir (needs $need and CUDA 13's driver and cuBLASLt)"
