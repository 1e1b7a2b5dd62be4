# Source on the GPU host (no package index) from the repository root:
#   source scripts/gpu_host_env.sh
# Installs the offline bundle (Triton, tritonclient, locust; see
# ../shared/gpu-host/README.md), makes the fusedresnet packages importable with
# the host's python3 and writes the model repository files.
source .gpu-bundle/setup.sh
export CUPY_CACHE_DIR=/tmp/cupy-cache PYTHONUNBUFFERED=1
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/fusedresnet-install.log 2>&1; then
  # no setuptools there: lay the namespace out by hand
  mkdir -p /tmp/fusedresnet-ns/fusedresnet
  cp fusedresnet/__init__.py /tmp/fusedresnet-ns/fusedresnet/
  for d in backend kernels client loadtest; do ln -sfn "$PWD/$d" "/tmp/fusedresnet-ns/fusedresnet/$d"; done
  export PYTHONPATH="/tmp/fusedresnet-ns:$PYTHONPATH"
fi
python3 -m fusedresnet.backend.prepare
