#!/usr/bin/env bash
# Several server processes behind one port, measured on a GPU host (docs/SERVING.md, "Several processes
# behind one port"): campaigns/front_door.py starts the launcher on GPU 0 with N = 1, 2, 4 processes,
# pinned to SERVER_CORES (default 0-15), and drives custom, cuDNN and the zero-answer model from
# GENERATOR_CORES (default 16-31: on a 32-core host with 2 GPUs, a stand-in for remote clients) at
# gRPC 1 and 32 images/request and CUDA shared memory at 32.
#   bash scripts/gpu_host_front_door.sh off        # the layouts without CUDA MPS (about 6 min)
#   bash scripts/gpu_host_front_door.sh on         # the same under CUDA MPS
# h2load (Debian's nghttp2-client) drives plain gRPC: the host has none, so carry its binary and libraries
# unpacked under .h2load/root (apt-get download nghttp2-client libnghttp2-14 libev4 libjansson4 libjemalloc2;
# dpkg -x each into .h2load/root; or packed as .h2load/h2load.tar.xz of that root/, which is unpacked here).
# Writes $OUT (default build/gpu-host): device.txt, front_door_<mps>.json/.md, the launchers' logs (.tgz).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
MPS="${1:-off}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
python3 -m fusedresnet.campaigns.front_door --out "$OUT/front_door_$MPS.json" --mps "$MPS" \
    --server-cores "${SERVER_CORES:-0-15}" --generator-cores "${GENERATOR_CORES:-16-31}" \
    --processes "${PROCESSES:-1,2,4}" ${MODELS:+--models "$MODELS"} 2>&1 | tee "$OUT/front_door_$MPS.log"
status=${PIPESTATUS[0]}
tar czf "$OUT/front_door_logs_$MPS.tgz" /tmp/front_door_*/launcher-* 2>/dev/null || true
exit "$status"
