#!/usr/bin/env bash
# The README's GPU flow on a GPU host, from the repository root (about 3-5 minutes: three server starts,
# the first one compiles the kernels):
#   bash scripts/gpu_host_serving.sh            # writes $OUT (default build/gpu-host)
# 1. `make demo VENV=` (the host's python3 as it is): resnet18_custom must answer with a fused-cuda-fp16-...
#    engine; $OUT/demo.log and the server's log, $OUT/demo-server.log;
# 2. the serving, folding, preprocessing and evaluate tests against the real server with both models on
#    the GPU: $OUT/gpu_tests.log.
# Exit status 0 when both hold.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
status=0
make demo VENV= 2>&1 | tee "$OUT/demo.log"
cp build/demo-server.log "$OUT/" 2>/dev/null || true
if grep -Eq '^== resnet18_custom \(engine fused-cuda-fp16-' "$OUT/demo.log"; then
  echo "demo: resnet18_custom serves the fused engine" | tee -a "$OUT/demo.log"
else
  echo "demo: resnet18_custom does NOT serve the fused engine" | tee -a "$OUT/demo.log"; status=1
fi
python3 -m pytest -v -rs tests/test_serving.py tests/test_folding.py tests/test_preprocess.py tests/test_evaluate.py \
  2>&1 | tee "$OUT/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
