#!/usr/bin/env bash
# GPU-host A/B load test (issue 4): the full default sweep (30 steps, both models, gRPC and
# HTTP) and the agreement on 5 photos + 500 generated images, against a Triton server the
# sweep starts itself. About 6 minutes; the steps stop at 330 s whatever happens.
# The report goes to $OUT/results (or build/gpu-host/results): copy
# $OUT/results/{loadtest_ab,ab_agreement}* into results/ and commit them.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"; mkdir -p "$OUT/results"
source scripts/gpu_host_env.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
python3 -m fusedresnet.loadtest.sweep --start-server --processes 4 --time-budget-s 330 \
  --out "$OUT/results" "$@" 2>&1 | tee "$OUT/sweep.log"
status=${PIPESTATUS[0]}
cp build/loadtest/loadtest_ab/server.log "$OUT/sweep-server.log" 2>/dev/null || true
exit "$status"
