#!/usr/bin/env bash
# GPU-host scaling run (issue 32) on a host with 2 or more GPUs (kind nvidia-h200-x2, or x4):
# one server per GPU behind gRPC's client-side round robin against one server over every GPU,
# gRPC at 1 and 32 images/request and CUDA shared memory (each generator on its own GPU's server),
# the load generator pinned with taskset to GENERATOR_CORES (default: the second half of the cores),
# the servers to SERVER_CORES (the first half). About 6 minutes on 2 GPUs.
#   OUT=build/gpu-host bash scripts/gpu_host_multi_gpu.sh
# Writes $OUT/multi_gpu.json and .md (copy both to results/), $OUT/multi_gpu.log, $OUT/device.txt,
# $OUT/server-logs.tgz.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"; mkdir -p "$OUT"
source scripts/gpu_host_env.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; \
  nvidia-smi topo -m 2>/dev/null | head -8; } | tee "$OUT/device.txt"
cores=()
[[ -n ${GENERATOR_CORES:-} ]] && cores+=(--generator-cores "$GENERATOR_CORES")
[[ -n ${SERVER_CORES:-} ]] && cores+=(--server-cores "$SERVER_CORES")
timeout 500 python3 -m fusedresnet.loadtest.multi_gpu --seconds "${SECONDS_PER_STEP:-4}" \
  --processes "${PROCESSES:-8}" "${cores[@]}" --out "$OUT/multi_gpu.json" --log-dir build/gpu-logs/multi_gpu 2>&1 \
  | grep -v "^fusedresnet:" | tee "$OUT/multi_gpu.log" | tail -30
tar -czf "$OUT/server-logs.tgz" -C build gpu-logs 2>/dev/null || true
