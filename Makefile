# fusedresnet: the two commands a new user needs are `make demo` and `make test`.
#
#   make demo    set everything up, start Triton with both models, classify the
#                sample photos through both over gRPC (labels + timings), stop
#   make test    set everything up and run the test suite against the real server
#   make serve   run the server in the foreground (Ctrl-C stops it)
#   make loadtest  A/B load-test sweep of both models against a server it starts
#   make setup   virtual environment + dependencies + model repository files
#   make lint    ruff (pinned in pyproject.toml) over the whole tree; `make test` runs it first
#
# VENV=.venv by default; `make VENV= ...` uses the python3 on PATH as it is
# (a GPU host without a package index: nothing is downloaded then).

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
PYTEST_ARGS ?=

.PHONY: setup prepare serve demo lint test loadtest clean

setup: $(INSTALLED) $(STAMP)

$(INSTALLED): pyproject.toml
ifeq ($(strip $(VENV)),)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	mkdir -p build && touch $@
else
	$(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[server,client,loadtest,dev]'
	touch $@
endif

$(STAMP): $(INSTALLED) backend/resnet.py backend/folding.py backend/prepare.py backend/prepared_stamp.py
	$(PY) -m fusedresnet.backend.prepare

prepare: $(INSTALLED)
	$(PY) -m fusedresnet.backend.prepare $(if $(WEIGHTS),--weights $(WEIGHTS))

serve: setup
	$(PY) -m fusedresnet.backend.serve

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
