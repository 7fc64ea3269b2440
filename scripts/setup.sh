#!/usr/bin/env bash
# Installs every Debian package kvdrift needs to build, test and report.
# Idempotent and non-interactive: packages already present are skipped.
set -euo pipefail

packages=(
  build-essential g++ cmake pkg-config
  libopenblas-dev libjansson-dev libcsv-dev libhdf5-dev hdf5-tools
  libcmocka-dev
  python3 python3-numpy python3-h5py
  libxml2-utils
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
