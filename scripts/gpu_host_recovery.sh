#!/usr/bin/env bash
# Issue 37's recovery target measured on a GPU host (about 4 minutes on the H100, 16 cores): the shipped server
# (the launcher's default layout, the shipped model repository) with one process killed 3 times per variant,
# CUDA MPS off/on x the early CUDA context off/on (campaigns/recovery.py), then the best variant with
# `--instances gpu`; and the GPU checks of the early context and of MPS (tests/test_cuda_context.py,
# tests/test_cuda_mps.py).
#   bash scripts/gpu_host_recovery.sh          # writes $OUT (default build/gpu-host)
# Commit: $OUT/recovery.{json,md} and $OUT/recovery_instances_gpu.{json,md} into results/.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
status=0
python3 -m pytest -q -m gpu tests/test_cuda_context.py tests/test_cuda_mps.py 2>&1 | tail -n 15 \
    | tee "$OUT/recovery_gpu_tests.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
cores="0-$(( $(nproc) - 1 ))"
python3 -m fusedresnet.campaigns.recovery --out "$OUT/recovery.json" --server-cores "$cores" \
    --mps off,on --early-context off,on --kills "${KILLS:-3}" > "$OUT/recovery.log" 2>&1 || status=1
python3 -m fusedresnet.campaigns.recovery --out "$OUT/recovery_instances_gpu.json" --server-cores "$cores" \
    --mps on --early-context on --kills "${KILLS:-3}" --launcher-args "--instances gpu" \
    >> "$OUT/recovery.log" 2>&1 || status=1
cat "$OUT/recovery.md" "$OUT/recovery_instances_gpu.md" 2>/dev/null || tail -n 40 "$OUT/recovery.log"
tar czf "$OUT/recovery_logs.tgz" /tmp/recovery_*/ 2>/dev/null || true
exit "$status"
