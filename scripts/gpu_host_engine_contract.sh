#!/usr/bin/env bash
# GPU-host run of the engine contract (what the custom model runs, and what it says when it cannot), about 6-8 minutes:
#   1. the GPU tests of the engine contract: the real server's GPU instance with CuPy blocked refuses
#      to load naming CuPy and the install command, `engine: torch` serves the PyTorch graph with a
#      warning; the fused engine's library calls from six threads (tests/test_engine_choice_gpu.py);
#      the engine through the factory and the load log with describe() (tests/test_kernels_gpu.py,
#      tests/test_serving.py's GPU tests);
#   2. the bench, every engine back-to-back and one at a time, torch.compile included
#      (kernels/gpu_check.sh bench: results/kernels_bench.{json,md,png} under $OUT).
# Logs go to $OUT (or build/gpu-host-engine). Usage, from the repository root:
#   OUT=... bash scripts/gpu_host_engine_contract.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
OUT="${OUT:-build/gpu-host-engine}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
rc=0
if [[ $what == tests || $what == all ]]; then
  timeout 300 python3 -m pytest -v -rs tests/test_engine_choice_gpu.py tests/test_engine_config.py \
    "tests/test_serving.py::test_models_run_on_the_gpu_and_match_reference" \
    "tests/test_kernels_gpu.py::test_engine_serves_through_create_custom_engine" 2>&1 | tee "$OUT/pytest-engine.log" | tail -25
  rc=${PIPESTATUS[0]}
  grep -h "engine .* on cuda" build/*.log "$OUT"/*.log 2>/dev/null | head -4
fi
if [[ $what == bench || $what == all ]]; then
  # torch.compile max-autotune at three batch sizes: a few minutes of compiling, timed last.
  OUT="$OUT" timeout 420 bash kernels/gpu_check.sh bench --compile --batches 1,32,128 --layer-batches 128 \
    --features-batches "" --no-compare-mma 2>&1 | tail -20
  rc_bench=${PIPESTATUS[0]}
  (( rc == 0 )) && rc=$rc_bench
fi
exit "$rc"
