#!/usr/bin/env bash
# Builds the offline bundle for a GPU host that reaches no package index. Run it on a machine
# that does (any Linux with python3 and pip), from anywhere:
#
#   bash scripts/make_offline_bundle.sh [DEST]          # DEST defaults to .gpu-bundle in the checkout
#   bash scripts/make_offline_bundle.sh --print-requirements   # what it would download, and stop
#
# then copy the checkout with DEST to the host and `source scripts/gpu_host_env.sh` there.
#
# The host is expected to have CUDA, python3 with PyTorch, CuPy, NumPy, grpcio, Pillow,
# matplotlib and psutil (docs/GPU_HOST.md); the bundle brings the rest, each at the version
# pyproject.toml pins (nothing is pinned here):
#   triton.tar.xz   Triton Inference Server from the nvidia-pytriton wheel (server binary, Python
#                   backend, the stub for the host's Python), laid out as the wheel installs it
#   frontend.tar.xz the tritonfrontend wheel's files, laid out as it installs (Triton's current gRPC, HTTP and
#                   metrics frontends: the in-process front end, backend/triton_server/front_end.py; its Python package and
#                   dependencies are not used, only its library), xz-compressed: a wheel's zip is 3 MB larger
#   frontend_shim/  the in-process front end's shim built here (backend/triton_server/frontend_shim_build.py)
#   wheels/         tritonclient[grpc,http], locust, prometheus_client, perf-analyzer (Triton's load
#                   tool), cuda-bindings and cuda-pathfinder, with their dependencies that the host
#                   lacks (HOST_HAS), for the host's Python (PYTHON_VERSION) on manylinux x86_64
#   setup.sh        scripts/offline_bundle_setup.sh: installs the bundle on the host (sourced)
#   ab_router_backend/  the A/B router's Triton backend built here (backend/ab_router/build.py; the host has no
#                   compiler packages), used there when its sources are the same
#
# Settings (environment):
#   PYTHON_VERSION  the host's Python, major.minor (default 3.12)
#   CUDA_MAJOR      the host's CUDA major version, as its driver reports it (`nvidia-smi`: "CUDA
#                   Version: 13.0" -> 13); default: the major of the pinned cuda-bindings. A host
#                   of another major needs cuda-bindings of that major: CUDA_BINDINGS_VERSION=12.9.4
#   HOST_HAS        regular expression of wheel names the host already has (left out)
#   EXTRA_WHEELS    more requirements to bundle, e.g. "py-spy==0.4.1"
# The bundle stays well under 64 MiB (it travels with the checkout).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYPROJECT="$ROOT/pyproject.toml"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
# The packages the bundle brings, by name; their versions and extras come from pyproject.toml.
BUNDLED=(tritonclient locust prometheus_client perf-analyzer cuda-bindings cuda-pathfinder)
# The host's PyTorch 2.11 (CUDA 13) brings cuda-bindings and cuda-pathfinder: the engine launched with programmatic
# dependent launch there (it needs cuda.bindings) from a bundle without them; bundled, their 12 MB
# took a fresh clone's bundle (61 MB) with the checkout past the 64 MiB a call carries. HOST_HAS=... brings them back.
HOST_HAS="${HOST_HAS:-^(numpy|grpcio|protobuf|psutil|pytest|pluggy|iniconfig|packaging|attrs|aiohttp|aiosignal|frozenlist|multidict|yarl|propcache|aiohappyeyeballs|jinja2|markupsafe|werkzeug|click|requests|urllib3|idna|certifi|charset_normalizer|typing_extensions|pygments|ml_dtypes|msgpack|h11|cuda_bindings|cuda_pathfinder)-}"

# The requirements pyproject.toml pins for these packages, one a line: "name[extras]==version" as
# written there.
pinned() {
  python3 - "$PYPROJECT" "$@" <<'EOF'
import re, sys
text, names = open(sys.argv[1]).read(), sys.argv[2:]
canonical = lambda s: re.sub(r"[-_.]+", "-", s).lower()
pins = {}
for requirement in re.findall(r'"([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?==[^"]+)"', text):
    pins.setdefault(canonical(re.split(r"[\[=]", requirement)[0]), requirement)
missing = [name for name in names if canonical(name) not in pins]
if missing:
    sys.exit(f"make_offline_bundle: pyproject.toml pins no version of {', '.join(missing)}")
print("\n".join(pins[canonical(name)] for name in names))
EOF
}

pins="$(pinned nvidia-pytriton tritonfrontend "${BUNDLED[@]}")"
mapfile -t requirements <<< "$pins"
pytriton="${requirements[0]}"
frontend="${requirements[1]}"
requirements=("${requirements[@]:2}")

# cuda-bindings must match the host's CUDA major (its driver); cuda-pathfinder serves every major.
for i in "${!requirements[@]}"; do
  if [[ ${requirements[$i]} == cuda-bindings==* ]]; then
    pinned_major="${requirements[$i]#cuda-bindings==}"; pinned_major="${pinned_major%%.*}"
    CUDA_MAJOR="${CUDA_MAJOR:-$pinned_major}"
    if [[ -n ${CUDA_BINDINGS_VERSION:-} ]]; then
      requirements[i]="cuda-bindings==$CUDA_BINDINGS_VERSION"
    elif [[ $CUDA_MAJOR != "$pinned_major" ]]; then
      echo "make_offline_bundle: the host's CUDA is $CUDA_MAJOR, the pinned ${requirements[$i]} is for CUDA" \
           "$pinned_major: set CUDA_BINDINGS_VERSION to a cuda-bindings $CUDA_MAJOR.x release" >&2
      exit 2
    fi
    if [[ ${requirements[$i]#cuda-bindings==} != "$CUDA_MAJOR".* ]]; then
      echo "make_offline_bundle: ${requirements[$i]} does not match CUDA_MAJOR=$CUDA_MAJOR" >&2
      exit 2
    fi
  fi
done
# shellcheck disable=SC2206  # EXTRA_WHEELS is a space-separated list on purpose
requirements+=(${EXTRA_WHEELS:-})

if [[ ${1:-} == --print-requirements ]]; then
  printf '%s\n' "$pytriton" "$frontend" "${requirements[@]}"
  exit 0
fi

DEST="${1:-$ROOT/.gpu-bundle}"
mkdir -p "$DEST/wheels"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_38 manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 \
           manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 \
           manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
BINARY=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp)

# Triton: the server tree of the nvidia-pytriton wheel, unpacked once (the wheel is large; the tree
# without the wheel's Python 3.13 libpython is what the host runs).
if [[ ! -s $DEST/triton.tar.xz || ! -f $DEST/triton.version || $(cat "$DEST/triton.version") != "$pytriton" ]]; then
  echo "downloading $pytriton"
  python3 -m pip download -q --no-deps "${BINARY[@]}" "${PLATFORMS[@]}" -d "$TMP" "$pytriton"
  mkdir -p "$TMP/site"
  (cd "$TMP/site" && python3 -m zipfile -e "$TMP"/nvidia_pytriton-*.whl .)
  rm -f "$TMP"/site/nvidia_pytriton.libs/libpython3-*.so*
  # the host runs the stub of its own Python alone (backend/triton_server/installation.py)
  find "$TMP"/site/pytriton/tritonserver/python_backend_stubs -mindepth 1 -maxdepth 1 ! -name "$PYTHON_VERSION" \
       -exec rm -rf {} +
  chmod +x "$TMP"/site/pytriton/tritonserver/bin/tritonserver \
           "$TMP"/site/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
  XZ_OPT="${XZ_OPT:--9e -T0}" tar -C "$TMP/site" -cJf "$DEST/triton.tar.xz" .   # -9e: 1.9 MB less than the default
  echo "$pytriton" > "$DEST/triton.version"
fi

if [[ ! -s $DEST/frontend.tar.xz || ! -f $DEST/frontend.version || $(cat "$DEST/frontend.version") != "$frontend" ]]; then
  echo "downloading $frontend"
  python3 -m pip download -q --no-deps "${BINARY[@]}" "${PLATFORMS[@]}" -d "$TMP/frontend" "$frontend"
  mkdir -p "$TMP/frontend/site"
  (cd "$TMP/frontend/site" && python3 -m zipfile -e "$TMP"/frontend/tritonfrontend-*.whl .)
  XZ_OPT="${XZ_OPT:--9e -T0}" tar -C "$TMP/frontend/site" -cJf "$DEST/frontend.tar.xz" .
  echo "$frontend" > "$DEST/frontend.version"
fi

echo "downloading ${requirements[*]}"
python3 -m pip download -q "${BINARY[@]}" "${PLATFORMS[@]}" -d "$TMP/all" "${requirements[@]}"
rm -f "$DEST"/wheels/*.whl
for wheel in "$TMP"/all/*.whl; do
  if ! basename "$wheel" | grep -qiE "$HOST_HAS"; then cp "$wheel" "$DEST/wheels/"; fi
done
# The A/B router's backend, built with this checkout's environment (make setup) or python3 (the build needs the
# standard library alone), for the host's checkout. Installed or not: backend/ is linked as fusedresnet/backend
# (pyproject.toml's package-dir; fusedresnet is a namespace package) on PYTHONPATH.
router_python="$ROOT/.venv/bin/python"; [ -x "$router_python" ] || router_python=python3
mkdir -p "$TMP/router/fusedresnet" && ln -s "$ROOT/backend" "$TMP/router/fusedresnet/backend"
router="$(PYTHONPATH="$TMP/router${PYTHONPATH:+:$PYTHONPATH}" "$router_python" -m fusedresnet.backend.ab_router.build)"
rm -rf "$DEST/ab_router_backend" && mkdir -p "$DEST/ab_router_backend"
cp -r "$(dirname "$router")" "$DEST/ab_router_backend/"
shim="$(PYTHONPATH="$TMP/router${PYTHONPATH:+:$PYTHONPATH}" "$router_python" -m fusedresnet.backend.triton_server.frontend_shim_build)"
rm -rf "$DEST/frontend_shim" && mkdir -p "$DEST/frontend_shim"
cp -r "$(dirname "$shim")" "$DEST/frontend_shim/"
cp "$ROOT/scripts/offline_bundle_setup.sh" "$DEST/setup.sh"
printf '%s\n' "$pytriton" "$frontend" "${requirements[@]}" > "$DEST/requirements.txt"
ls "$DEST/wheels"
du -sh "$DEST"
