#!/usr/bin/env bash
# GPU-host run of the A/B router's own cost (docs/AB_LIVE.md), about 2 minutes on the H100, at most 4:
# python -m fusedresnet.campaigns.ab_live starts Triton (model control mode explicit, the shipped repository), and
# in shadow and split mode measures direct calls to the primary and calls through resnet18_ab back to back
# (1 image/request at one in flight, 32 images/request at 16 in flight), with the agreement over the shadow steps.
#   bash scripts/gpu_host_ab_live.sh            # writes $OUT (default build/gpu-host)
# Commit: $OUT/results/ab_live.json and ab_live.md into results/ (and index them in results/README.md).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
mkdir -p "$OUT/results"
timeout 240 python3 -m fusedresnet.campaigns.ab_live --out "$OUT/results" "$@" 2>&1 | tee "$OUT/ab_live.log"
exit "${PIPESTATUS[0]}"
