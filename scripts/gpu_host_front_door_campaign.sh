#!/usr/bin/env bash
# Issue 37's measurements in one job, on a host of 2 GPUs or more and 64 cores (nvidia-h100-x4; about 17 minutes,
# so started with scripts/gpu_host_background.sh, which outlasts one call):
#   1. the abandonment soak (campaigns/abuse_soak.py, SOAK_SECONDS, default 600): the launcher with 2 processes on
#      GPU $SOAK_GPU (default 1), its server on cores 32-47; valid clients (custom and cuDNN, 1 and 32 images per
#      request, retrying as the project's clients do) and the abandonment storm (16 connections x 16 single-image
#      calls closed together every 2 s, alternating the models) on cores 48-63;
#   2. meanwhile, the layouts (campaigns/front_door.py: N = 1, 2, 4, CUDA MPS off then on) on GPU 0, the server
#      on cores 0-15 and the load generators on 16-31 (a stand-in for remote clients);
#   3. then perf_analyzer's windows on the final layout (campaigns/perf_analyzer_windows.py), same GPU and cores;
#   4. the soak's summary added to front_door.json (its `abandonment`).
#   bash scripts/gpu_host_background.sh start 590 "bash scripts/gpu_host_front_door_campaign.sh"
#   bash scripts/gpu_host_background.sh wait 590
# Carry .gpu-bundle and .h2load (scripts/gpu_host_front_door.sh says how h2load is packed).
# Writes $OUT: device.txt, front_door.{json,md}, front_door_soak.{json,md}, perf_analyzer_windows.{json,md},
# the consoles (*.log) and the launchers' logs (logs.tgz).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
status=0
soak_repository=$(python3 -c "
import tempfile; from pathlib import Path
from fusedresnet.loadtest.perf_analyzer import build_repository
print(build_repository(Path(tempfile.mkdtemp(prefix='soak_models_')) / 'models',
                       entries=('resnet18_custom', 'resnet18_cudnn'), zero=False))")
taskset -c 32-63 python3 -m fusedresnet.campaigns.abuse_soak --seconds "${SOAK_SECONDS:-600}" \
    --model resnet18_custom,resnet18_cudnn --images-per-request 1,32 --valid-processes 8 --valid-in-flight 8 \
    --abuse abandon-storm --pause 0 --sample-every-s 1 --load-cores 48-63 --out "$OUT/front_door_soak" \
    -- --processes-per-gpu 2 --gpus "${SOAK_GPU:-1}" --model-repository "$soak_repository" > "$OUT/soak.log" 2>&1 &
soak=$!
python3 -m fusedresnet.campaigns.front_door --out "$OUT/front_door.json" --mps "${MPS:-off,on}" \
    --server-cores 0-15 --generator-cores 16-31 --processes "${PROCESSES:-1,2,4}" > "$OUT/front_door.log" 2>&1 \
    || status=1
tail -n 60 "$OUT/front_door.md" 2>/dev/null || tail -n 30 "$OUT/front_door.log"
python3 -m fusedresnet.campaigns.perf_analyzer_windows --out "$OUT/perf_analyzer_windows.json" \
    --server-cores 0-15 --generator-cores 16-31 --processes 2 > "$OUT/perf_analyzer_windows.log" 2>&1 || status=1
cat "$OUT/perf_analyzer_windows.md" 2>/dev/null || tail -n 30 "$OUT/perf_analyzer_windows.log"
wait "$soak" || status=1
tail -n 40 "$OUT/front_door_soak.md" 2>/dev/null || tail -n 30 "$OUT/soak.log"
python3 -m fusedresnet.campaigns.front_door --out "$OUT/front_door.json" --processes "" \
    --abandonment "$OUT/front_door_soak.json" --server-cores 0 --generator-cores 0 || status=1
tar czf "$OUT/logs.tgz" /tmp/front_door_*/launcher-* /tmp/perf_analyzer_windows_*/launcher.* 2>/dev/null || true
exit "$status"
