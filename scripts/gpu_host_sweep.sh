#!/usr/bin/env bash
# GPU-host A/B load test: both models under the same traffic, against a Triton server the sweep
# starts itself, and the agreement on 5 photos + 500 generated images. The project's light
# generator (grpc_flood) first, since locust on the same host cannot saturate the server: one
# image per request up to 256 in flight, 32 per request, the same over system and CUDA shared
# memory, and the peak levels again with twice the load-generator processes (more processes, no
# more throughput: the generator is not the limit); then the locust curves. About 9 minutes; the
# steps stop at STEPS_BUDGET_S (default 420 s) whatever happens.
# The report goes to $OUT/results (or build/gpu-host/results): copy
# $OUT/results/{loadtest_ab,ab_agreement}* into results/ and commit them.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
mkdir -p "$OUT/results"
SERIES=(
  "flood:grpc/1/p8@1,16,64,256" "flood:grpc/32/p8@16,64" "flood:grpc/32/cuda/p8@16,64" "flood:grpc/1/cuda/p8@256"
  "flood:grpc/32/system/p8@64" "flood:grpc/1/p16@256" "flood:grpc/32/p16@64"
  "grpc/1@1,16,64" "grpc/32@16" "http/1@1,16"
)
args=(); for s in "${SERIES[@]}"; do args+=(--series "$s"); done
python3 -m fusedresnet.loadtest.sweep --start-server --processes 4 --warmup-s 2 --measure-s 4 \
  --time-budget-s "${STEPS_BUDGET_S:-420}" "${args[@]}" --out "$OUT/results" "$@" 2>&1 \
  | grep -v "^fusedresnet:" | tee "$OUT/sweep.log"
status=${PIPESTATUS[0]}
cp build/loadtest/loadtest_ab/server.log "$OUT/sweep-server.log" 2>/dev/null || true
exit "$status"
