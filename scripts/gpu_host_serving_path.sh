#!/usr/bin/env bash
# GPU-host measurements of the serving path (docs/SERVING.md). One or more parts:
#   bash scripts/gpu_host_serving_path.sh tests instances sequence
#   tests      GPU serving, shared-memory, nn.Module and diff tests (pytest -m gpu)
#   instances  the current code at 1, 2, 4 and 8 instances per model (INSTANCES to change)
#   delays     the current code at dynamic-batching queue delays 0, 100, 500 us (DELAYS to change)
#   robustness overload and fault tests (tests/test_overload.py, tests/test_faults.py)
#   soak       10-minute soak (SOAK_SECONDS) with mixed valid/invalid traffic and SOAK_LOAD
#              (CONCURRENCY[/IMAGES], default 64: half the peak) in flight to resnet18_custom
#   diff       the layer-by-layer diff of the fused kernels against the float32 reference
#   multigpu   GPU tests on every GPU (tests/test_multi_gpu.py) and the aggregate img/s on all GPUs against
#              GPU 0 alone (campaigns/multi_gpu.py -> $OUT/multi_gpu.json/.md); a host with 2+ GPUs
#   sequence   as shipped -> + threads -> + instances -> + copies -> + system shm -> + CUDA shm
#              (needs build/shipped: `git archive de30da4 | tar -x -C build/shipped`)
# MPS=1: the parts run under CUDA MPS (the control daemon started here, stopped at the end), so the
# models' stub processes share each GPU instead of time-slicing it; the multigpu part's files get the
# suffix _mps (the other parts write their usual names: keep them apart with another OUT).
# Logs and JSON go to $OUT (or build/gpu-host).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
suffix=""
if [[ "${MPS:-0}" == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fusedresnet-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fusedresnet-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "could not start the MPS control daemon" >&2; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  suffix=_mps
fi
for part in "$@"; do
  case "$part" in
    tests)
      timeout 420 python3 -m pytest -q -rs -m gpu tests/test_serving.py tests/test_shared_memory.py \
        tests/test_fused_module_gpu.py tests/test_diff.py 2>&1 | tee "$OUT/pytest-gpu.log" | tail -30 ;;
    robustness)
      FUSEDRESNET_RESULTS_DIR="$OUT" timeout 420 python3 -m pytest -v -rs tests/test_overload.py tests/test_faults.py \
        2>&1 | tee "$OUT/pytest-robustness.log" | tail -15 ;;
    soak)
      FUSEDRESNET_SOAK_SECONDS="${SOAK_SECONDS:-600}" FUSEDRESNET_SOAK_LOAD="${SOAK_LOAD:-64}" \
        FUSEDRESNET_RESULTS_DIR="$OUT" python3 -m pytest -v -rs tests/test_soak.py 2>&1 \
        | tee "$OUT/pytest-soak.log" | tail -15 ;;
    multigpu)
      [[ -z $suffix ]] && timeout 300 python3 -m pytest -q -rs -m gpu tests/test_multi_gpu.py 2>&1 \
        | tee "$OUT/pytest-multi-gpu.log" | tail -15
      python3 -m fusedresnet.campaigns.multi_gpu --seconds "${SECONDS_PER_STEP:-4}" --out "$OUT/multi_gpu$suffix.json" \
        --log-dir "build/gpu-logs/multi_gpu$suffix" 2>&1 | grep -v "^fusedresnet:" | tee "$OUT/multi_gpu$suffix.log" | tail -40 ;;
    diff)
      python3 -m fusedresnet.harness.diff --device cuda 2>&1 | tee "$OUT/diff_gpu.txt" ;;
    instances)
      python3 -m fusedresnet.campaigns.serving_sequence --instances "${INSTANCES:-1,2,4,8}" \
        --models "${MODELS:-resnet18_custom}" --seconds "${SECONDS_PER_STEP:-4}" \
        --out "$OUT/serving_instances.json" --log-dir build/gpu-logs/instances 2>&1 | grep -v "^fusedresnet:" | tee "$OUT/instances.log" ;;
    delays)
      python3 -m fusedresnet.campaigns.serving_sequence --queue-delays "${DELAYS:-0,100,500}" \
        --models "${MODELS:-resnet18_custom}" --seconds "${SECONDS_PER_STEP:-4}" --processes "${PROCESSES:-4}" \
        --out "$OUT/serving_delays.json" --log-dir build/gpu-logs/delays 2>&1 | grep -v "^fusedresnet:" | tee "$OUT/delays.log" ;;
    sequence)
      python3 -m fusedresnet.campaigns.serving_sequence --shipped-tree build/shipped --count "${COUNT:-4}" \
        --seconds "${SECONDS_PER_STEP:-4}" --processes "${PROCESSES:-4}" ${ONLY:+--only "$ONLY"} \
        --out "$OUT/serving_sequence.json" --log-dir build/gpu-logs/sequence 2>&1 | grep -v "^fusedresnet:" | tee "$OUT/sequence.log" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
tar -czf "$OUT/server-logs.tgz" -C build gpu-logs 2>/dev/null || true
