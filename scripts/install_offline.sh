#!/usr/bin/env bash
# Makes the fusedresnet packages importable with the python3 on PATH, from any directory, on a
# host with no package index (the GPU host): the project alone, in editable mode, without its
# dependencies (the host has them, or the offline bundle brings them). Needs setuptools >= 68
# in that environment (PyTorch on Python 3.12 requires it). Run from anywhere:
#   bash scripts/install_offline.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
mkdir -p build
if ! python3 -m pip install --no-deps --no-build-isolation -e . > build/install.log 2>&1; then
  echo "installing fusedresnet failed (build/install.log):" >&2
  tail -20 build/install.log >&2
  exit 1
fi
