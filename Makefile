# fusedresnet: the two commands a new user needs are `make demo` and `make test`.
#
#   make demo    set everything up, start Triton with both models, classify the
#                sample photos through both over gRPC (labels + timings), stop
#   make test    set everything up and run the test suite against the real server
#   make serve   run the server in the foreground (Ctrl-C stops it; launcher options in SERVE_ARGS)
#   make loadtest  A/B load-test sweep of both models against a server it starts
#   make setup   virtual environment + dependencies + model repository files
#   make lint    ruff (pinned in pyproject.toml) over the whole tree; `make test` runs it first
#
# VENV=.venv by default; `make VENV= ...` uses the python3 on PATH as it is
# (a GPU host without a package index: nothing is downloaded then).
#
# On a machine with an NVIDIA GPU (nvidia-smi, /dev/nvidia0 or /proc/driver/nvidia), `setup`
# also installs the `gpu` extra, what the fused engine needs: CuPy, NVRTC and cuda-bindings of the
# CUDA major of the torch wheel (pyproject.toml). NVIDIA_GPU=yes or NVIDIA_GPU= overrides the check.

VENV ?= .venv
PYTHON3 ?= python3
ifeq ($(strip $(VENV)),)
PY := $(PYTHON3)
INSTALLED := build/.installed-system
else
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
endif
STAMP := model_repository/.prepared.json
NVIDIA_GPU ?= $(shell { command -v nvidia-smi || test -e /dev/nvidia0 || test -e /proc/driver/nvidia; } >/dev/null 2>&1 && echo yes)
# Where the tritonfrontend wheel installs (CPython 3.12, glibc 2.38+), `setup` adds it: the launcher then serves through
# Triton's current frontends in-process (backend/triton_server/front_end.py). FRONTEND=yes or FRONTEND= overrides the check.
FRONTEND ?= $(shell $(PYTHON3) -c 'import os, sys; g = os.confstr("CS_GNU_LIBC_VERSION").split()[-1].split("."); \
	sys.exit(sys.version_info[:2] != (3, 12) or (int(g[0]), int(g[1])) < (2, 38))' 2>/dev/null && echo yes)
PYTEST_ARGS ?=
SERVE_ARGS ?=

.PHONY: setup prepare serve demo lint test loadtest clean

# The A/B router is a Triton C++ backend: built once per source into build/ab_router_backend/ with the C++ compiler
# alone (its JSON parser and hash are vendored; backend/ab_router/build.py says what is missing).
setup: $(INSTALLED) $(STAMP)
	$(PY) -m fusedresnet.backend.ab_router.build

$(INSTALLED): pyproject.toml
ifeq ($(strip $(VENV)),)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	mkdir -p build && touch $@
else
	$(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[server,client,loadtest,dev]'
ifneq ($(strip $(FRONTEND)),)
	@echo "CPython 3.12 and glibc 2.38+: installing Triton's current frontends (extra frontend, its library alone)"
	$(PY) -m pip install -q --no-deps "tritonfrontend==$$($(PY) -c 'from fusedresnet.backend.triton_server.front_end import \
	TRITONFRONTEND_VERSION; print(TRITONFRONTEND_VERSION)')"
endif
ifneq ($(strip $(NVIDIA_GPU)),)
	@echo "NVIDIA GPU found: installing the fused engine's CUDA packages (extra gpu). CuPy 14 needs NumPy 2;"
	@echo "pip may report that nvidia-pytriton 0.7.0 asks for NumPy < 2: the server runs on NumPy 2, as on the GPU host."
	$(PY) -m pip install -q -e '.[gpu]'
endif
	touch $@
endif

$(STAMP): $(INSTALLED) backend/resnet/architecture.py backend/resnet/folding.py backend/repository/prepare.py backend/repository/prepared_stamp.py
	$(PY) -m fusedresnet.backend.repository.prepare

prepare: $(INSTALLED)
	$(PY) -m fusedresnet.backend.repository.prepare $(if $(WEIGHTS),--weights $(WEIGHTS))

serve: setup
	$(PY) -m fusedresnet.backend.serve $(SERVE_ARGS)

demo: setup
	$(PY) -m fusedresnet.client.demo

lint: $(INSTALLED)
	$(PY) -m ruff check .

test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

loadtest: setup
	$(PY) -m fusedresnet.loadtest.sweep --start-server --out build/loadtest

clean:
	rm -rf build $(STAMP) model_repository/*/1/*.pt model_repository/*/labels.txt
