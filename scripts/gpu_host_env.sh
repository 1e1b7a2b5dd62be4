# shellcheck shell=bash
# Source on the GPU host (no package index) from the repository root:
#   source scripts/gpu_host_env.sh
# Installs the offline bundle (Triton, tritonclient, locust, perf-analyzer, cuda-bindings; built
# by scripts/make_offline_bundle.sh, docs/GPU_HOST.md), installs the fusedresnet packages for the
# host's python3 (scripts/install_offline.sh) and writes the model repository files.
# shellcheck source=scripts/offline_bundle_setup.sh
source .gpu-bundle/setup.sh
export CUPY_CACHE_DIR=/tmp/cupy-cache PYTHONUNBUFFERED=1
bash scripts/install_offline.sh || return 1
python3 -m fusedresnet.backend.repository.prepare
python3 -m fusedresnet.backend.ab_router.build || return 1   # the bundle's prebuilt A/B router backend
