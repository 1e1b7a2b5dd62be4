#!/usr/bin/env bash
# The A/B report measured on a GPU host with Triton's own tools (about 6 minutes on the H100, at most 9.5):
# perf_analyzer against the server as shipped (127.0.0.1, admin token), for resnet18_custom, resnet18_cudnn and
# the zero-answer model (loadtest/zero_model) over gRPC, HTTP, system and CUDA shared memory; grpc_flood on the
# same gRPC steps (the cross-check); the serving story from as shipped to the best configuration (CUDA MPS,
# instances), each step one change and one perf_analyzer command. The load generators run on LOAD_CORES
# (default: the last quarter of the cores), the server on the others; its CPU use is in every step.
#   bash scripts/gpu_host_perf_analyzer.sh            # writes $OUT (default build/gpu-host)
# To show the sweep (scripts/gpu_host_sweep.sh, run first in the same session) beside it, pass
#   --merge build/gpu-host/results/loadtest_ab.json with another OUT for the sweep.
# Commit: $OUT/results/loadtest_ab.{json,csv,md,*.png} and $OUT/results/perf_analyzer_csv/ into results/
# (the A/B report of this code), $OUT/perf_analyzer.log and $OUT/device.txt beside them if wanted.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
mkdir -p "$OUT/results"
pa="$(python3 -c 'from fusedresnet.loadtest.perf_analyzer import binary_path; print(binary_path())')" || exit 1
python3 -c "import importlib.metadata as m; print('perf-analyzer', m.version('perf-analyzer'), '$pa')" | tee -a "$OUT/device.txt"
load_cores=()
[[ -n "${LOAD_CORES:-}" ]] && load_cores=(--load-cores "$LOAD_CORES")
timeout 540 python3 -m fusedresnet.loadtest.perf_analyzer --out "$OUT/results" "${load_cores[@]}" \
  --time-budget-s "${STEPS_BUDGET_S:-420}" "$@" 2>&1 | grep -v "^fusedresnet:" | tee "$OUT/perf_analyzer.log"
status=${PIPESTATUS[0]}
cp build/perf_analyzer_repository/zero_answer/config.pbtxt "$OUT/results/zero_answer_config.pbtxt" 2>/dev/null || true
exit "$status"
