#!/usr/bin/env bash
# GPU-host check of the serving spine (issue 2): the end-to-end tests and the demo
# with the models on the GPU. Logs go to $OUT (or build/gpu-host).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"; mkdir -p "$OUT"
source scripts/gpu_host_env.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } | tee "$OUT/device.txt"
python3 -m pytest -v -rs tests/test_serving.py tests/test_folding.py tests/test_preprocess.py 2>&1 | tee "$OUT/pytest-serving.log"
python3 -m fusedresnet.client.demo 2>&1 | tee "$OUT/demo.log"
cp build/demo-server.log "$OUT/" 2>/dev/null || true
