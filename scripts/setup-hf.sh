#!/usr/bin/env bash
# Optional: a Python virtual environment, .venv-hf, with torch and
# transformers from PyPI, for the check against Hugging Face transformers'
# own Qwen3-Next (tests/reference/run_hf.sh, ctest -R reference_transformers).
# Several GB (PyPI's torch brings CUDA's libraries); nothing else needs it, and
# the test skips with a message without it.
# usage: bash scripts/setup-hf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1 || ! /usr/bin/python3 -c "import ensurepip" 2>/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y --no-install-recommends python3-venv
fi
[ -x .venv-hf/bin/python ] || /usr/bin/python3 -m venv .venv-hf
.venv-hf/bin/pip install --quiet torch transformers safetensors numpy compressed-tensors
.venv-hf/bin/python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
