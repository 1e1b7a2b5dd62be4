#!/usr/bin/env bash
# GPU-host scaling run on a host with 2 or more GPUs (kind nvidia-h100-x4 / nvidia-h200-x4, or x2):
# one server per GPU behind gRPC's client-side round robin against one server over the GPUs, on 1, 2, 4, ...
# GPUs in one run (the 2- and 4-GPU scaling from the same run), gRPC at 1 and 32 images/request and CUDA
# shared memory (each generator on its own GPU's server); at each GPU count the limit's measurements at
# 32 images/request: twice the generator processes, and the zero-answer model in the same servers.
# The load generator is pinned with taskset to GENERATOR_CORES (default: the second half of the cores,
# PROCESSES processes, default half of them), the servers to SERVER_CORES (the first half).
# It prints its own estimate; about 5.5 minutes of measurement on 4 GPUs plus the set-up (~1-1.5 minutes);
# no step or server start begins after BUDGET_S (default 390) seconds of measurement.
#   OUT=build/gpu-host bash scripts/gpu_host_multi_gpu.sh
# Writes $OUT/multi_gpu.json and .md (copy both to results/), $OUT/multi_gpu.log, $OUT/device.txt,
# $OUT/server-logs.tgz (results/multi_gpu_logs/).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
started=$(date +%s)
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
echo "set-up: $(( $(date +%s) - started )) s"
nvidia-smi topo -m 2>/dev/null | head -12 | tee -a "$OUT/device.txt"    # how the GPUs are linked
rm -f "$OUT/multi_gpu.json" "$OUT/multi_gpu.md"    # a run cut short must not show an earlier run's report
options=()
[[ -n ${GENERATOR_CORES:-} ]] && options+=(--generator-cores "$GENERATOR_CORES")
[[ -n ${SERVER_CORES:-} ]] && options+=(--server-cores "$SERVER_CORES")
[[ -n ${PROCESSES:-} ]] && options+=(--processes "$PROCESSES")
timeout 480 python3 -m fusedresnet.campaigns.multi_gpu --seconds "${SECONDS_PER_STEP:-3.5}" --warmup-s 1.5 \
  --budget-s "${BUDGET_S:-390}" "${options[@]}" --out "$OUT/multi_gpu.json" --log-dir build/gpu-logs/multi_gpu 2>&1 \
  | grep -v "^fusedresnet:" > "$OUT/multi_gpu.log"
status=${PIPESTATUS[0]}
[[ -f $OUT/multi_gpu.json && ! -f $OUT/multi_gpu.md ]] && \
  python3 -m fusedresnet.campaigns.multi_gpu --out "$OUT/multi_gpu.json" --markdown-only    # cut short: its steps so far
tail -5 "$OUT/multi_gpu.log"; sed -n '1,/^Every step/p' "$OUT/multi_gpu.md"    # the scaling and the limits
tar -czf "$OUT/server-logs.tgz" -C build gpu-logs 2>/dev/null || true
echo "whole run: $(( $(date +%s) - started )) s (multi_gpu exit status $status)"
exit "$status"
