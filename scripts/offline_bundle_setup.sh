# shellcheck shell=bash
# The offline bundle's setup (scripts/make_offline_bundle.sh copies it into the bundle as
# setup.sh). Sourced on the GPU host, from anywhere:  source .gpu-bundle/setup.sh
# (scripts/gpu_host_env.sh does it). Installs the bundle into $GPU_SITE (default /tmp/gpu-site;
# again only when the bundle's requirements changed) with the host's python3, no index, and exports:
#   PYTHONPATH       $GPU_SITE first: tritonclient, locust, perf-analyzer, cuda-bindings, ...
#   TRITON_HOME      the server tree: bin/tritonserver, backends/python, caches
#   LD_LIBRARY_PATH  the server's private libraries
#   PATH             tritonserver and perf_analyzer on it
#   FUSEDRESNET_AB_ROUTER_PREBUILT  the A/B router's backend built with the bundle (backend/ab_router/build.py)
#   FUSEDRESNET_FRONTEND_SHIM_PREBUILT  the in-process front end's shim (backend/triton_server/frontend_shim_build.py); the
#                    tritonfrontend wheel's files (frontend.tar.xz) go into $GPU_SITE beside Triton
_bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_site="${GPU_SITE:-/tmp/gpu-site}"
_stamp="$_site/.bundle-requirements"
if [ ! -f "$_stamp" ] || ! cmp -s "$_stamp" "$_bundle/requirements.txt"; then
  rm -rf "$_site" && mkdir -p "$_site" \
    && tar -xJf "$_bundle/triton.tar.xz" -C "$_site" \
    && { [ ! -f "$_bundle/frontend.tar.xz" ] || tar -xJf "$_bundle/frontend.tar.xz" -C "$_site"; } \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
         --target "$_site" "$_bundle"/wheels/*.whl \
    && cp "$_bundle/requirements.txt" "$_stamp" \
    || echo "offline bundle: installing $_bundle into $_site failed" >&2
fi
export PYTHONPATH="$_site${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_HOME="$_site/pytriton/tritonserver"
export LD_LIBRARY_PATH="$_site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$TRITON_HOME/bin:$_site/perf_analyzer/bin:$PATH"
export FUSEDRESNET_AB_ROUTER_PREBUILT="$_bundle/ab_router_backend"
export FUSEDRESNET_FRONTEND_SHIM_PREBUILT="$_bundle/frontend_shim"
unset _bundle _site _stamp
