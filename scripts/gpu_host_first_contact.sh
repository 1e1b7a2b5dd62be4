#!/usr/bin/env bash
# GPU-host check of issue 29 (first contact on a GPU), from the repository root on the GPU host:
#   OUT=build/first-contact bash scripts/gpu_host_first_contact.sh
# 1. the offline path of the README's demo, `make demo VENV=` (the host's python3 with its cupy-cuda13x):
#    resnet18_custom must answer with a fused-cuda-fp16-... engine;
# 2. the GPU tests of the README's flow (tests/test_serving.py, test_folding.py, test_preprocess.py) and the
#    evaluate command's tests, against the real server on the GPU: $OUT/gpu_tests.log.
# About 3-5 minutes (three server starts; the first one compiles the kernels). Exit status 0 when both hold.
set -uo pipefail
OUT="${OUT:-build/first-contact}"; mkdir -p "$OUT"
source scripts/gpu_host_env.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
{ date -u; python3 -m fusedresnet.backend.provenance; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| cupy', cupy.__version__, 'cuda', cupy.cuda.runtime.runtimeGetVersion(), '| numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/device.txt"
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
