#!/usr/bin/env bash
# GPU-host run of the A/B router's own cost (docs/AB_LIVE.md): one call of at most 5 minutes on an H100, set-up
# included (about 2 minutes of measuring):
# python -m fusedresnet.campaigns.ab_live starts Triton on a copy of the shipped repository per mode, and in shadow
# and split mode measures direct calls to the primary and calls through resnet18_ab back to back (1 image/request
# at one in flight, 32 images/request at 16 in flight), with the agreement over the shadow steps.
#   bash scripts/gpu_host_ab_live.sh            # writes $OUT (default build/gpu-host)
# Commit: $OUT/results/ab_live.json and ab_live.md into results/ (and index them in results/README.md).
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
BUDGET_S="${BUDGET_S:-285}"    # the whole call, set-up included
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
mkdir -p "$OUT/results"
left=$((BUDGET_S - SECONDS))
echo "set-up took ${SECONDS} s; ab_live gets ${left} s" | tee "$OUT/ab_live.log"
if (( left < 150 )); then
    echo "less than 150 s left for ab_live (it needs about 120): not started" | tee -a "$OUT/ab_live.log"
    exit 2
fi
timeout "$left" python3 -m fusedresnet.campaigns.ab_live --out "$OUT/results" "$@" 2>&1 | tee -a "$OUT/ab_live.log"
exit "${PIPESTATUS[0]}"
