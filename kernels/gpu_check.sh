#!/usr/bin/env bash
# One call on the GPU host: install, correctness checks, benchmark.
#   bash kernels/gpu_check.sh [check|bench|all|tuned|full|tune|pytest|profile|served] [extra bench args]
# served = time to ready of the real Triton server, both models, from an empty kernel cache and with a
# warm one (harness/cold_start.py: results/cold_start.json, also in $OUT/results), then the quick check
# of every kernel the engine can serve and every other candidate (check_quick.json), then each
# experiment of kernels/dev/ (check, then benchmark: dev_<name>.log):
#   bash kernels/gpu_check.sh served      (~3-5 min on the H100)
# all = check + bench; tuned = quick check of every tile (check_pretune.json:
# a faulting or wrong new tile shows up here, not as a crash inside the tune;
# on failure the tune is skipped) + tune (writes this GPU model's kernels/tuned_plans/<model>.json here
# and $OUT/tuned_plans.json, prints what it chose; all batch buckets: extra
# args go to bench only) + check + bench, the H100 run:
#   bash kernels/gpu_check.sh tuned --batches 1,8,32,128,256     (~5 min)
# full = tuned + ncu profile of a few kernels. A failed tune leaves the
# committed table and goes on to check + bench (exit status 1 at the end).
# The convolutions run on the path the engine picks (mixed on an H100/H200:
# each conv on the family its plan names; mma.sync elsewhere);
# FUSEDRESNET_CONV_PATH=mma|wgmma forces one family for the whole script. On
# cc 9.0 `check` also runs the quick check of the forced mma.sync path
# (check_mma.json; NO_MMA_CHECK=1 skips it) and `bench` times the engine forced
# to each family beside the mixed one.
# Logs and results go to $OUT (the device tool brings them back) or ./gpu-out; the set-up and
# $OUT/device.txt come from scripts/gpu_host_prologue.sh.
set -o pipefail
what=${1:-all}; shift || true
OUT=${OUT:-$PWD/gpu-out}; REPO=$PWD
# The offline bundle (cuda.bindings: the programmatic dependent launch of kernels/launch.py), the project,
# the model files; $OUT/device.txt.
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
mkdir -p "$OUT/results"
# the clocks, temperature and power at the start: what the timings below ran at
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
python3 -c "from fusedresnet.backend.engines.config import environment_engine_arguments; from fusedresnet.kernels.launch import library; import time; t=time.time(); lib=library(0, *environment_engine_arguments().values()); print(f'compile+load of the {len(lib.served)} served kernels {time.time()-t:.1f}s, conv path {lib.path} (cc {lib.cc[0]}.{lib.cc[1]}), {len(lib.tuned)} tuned plans for {lib.device_name}, programmatic dependent launch {lib.pdl} ({lib.pdl_reason})')" 2>&1 | tail -12 \
  || { echo "COMPILE/LOAD FAILED"; exit 1; }
path=$(python3 -c "import cupy; from fusedresnet.backend.engines.config import conv_path_override; from fusedresnet.kernels.launch_choices import conv_path; cc=cupy.cuda.Device(0).compute_capability; print(conv_path((int(cc[:-1]), int(cc[-1])), conv_path_override()))" 2>/dev/null)
rc=0
rc_tune=0
if [[ $what == full || $what == tuned ]]; then
  # Every tile (both families, forced) once before the tune times them: a kernel fault inside the
  # tune kills its CUDA context and says little; the check names the tile and keeps the rest.
  python3 -m fusedresnet.harness.check --quick --json "$OUT/check_pretune.json" 2>&1 \
    | tee /tmp/check_pretune.log | grep -v "^ok " ; rc_tune=$?
  echo "pre-tune check ($path path, quick) exit $rc_tune after $(( $(date +%s) - t0 ))s"
  (( rc_tune != 0 )) && echo "PRE-TUNE CHECK FAILED: tune skipped, kernels/tuned_plans/ left as it was"
fi
if [[ ( $what == full || $what == tune || $what == tuned ) && $rc_tune == 0 ]]; then
  # Limit: a tune that runs away must not eat the check and the bench (a failure is loud, no table copied).
  timeout "${TUNE_LIMIT_S:-330}" python3 -m fusedresnet.harness.tune --out "$OUT/tuned_plans.json" 2>&1 \
    | tee "$OUT/tune.log"
  rc_tune=${PIPESTATUS[0]}
  if (( rc_tune != 0 )); then
    echo "TUNE FAILED (exit $rc_tune after $(( $(date +%s) - t0 ))s): kernels/tuned_plans/ left as it was"
    [[ $what == tune ]] && exit 1
  fi
fi
if [[ ( $what == full || $what == tune || $what == tuned ) && $rc_tune == 0 ]]; then
  cp "$OUT/tuned_plans.json" "$(python3 -c "import json, sys; from fusedresnet.kernels.planner import tuned_plans_path
print(tuned_plans_path(json.load(open(sys.argv[1]))['device']))" "$OUT/tuned_plans.json")"
  python3 - "$OUT/tuned_plans.json" <<'PY'
import collections, json, sys
table = json.load(open(sys.argv[1]))
count = collections.Counter((k.split("_")[0], e["family"]) for k, e in table["plans"].items())
batches = sorted({k.split("_")[0] for k in table["plans"]}, key=lambda b: int(b[1:]))
print(f"tuned plans for {table['device']} ({'+'.join(table['families'])}): " + ", ".join(
    f"{b}: wgmma {count[b, 'wgmma']}/{count[b, 'wgmma'] + count[b, 'mma']}" for b in batches))
PY
  echo "tune done after $(( $(date +%s) - t0 ))s"
fi
if [[ $what == check || $what == all || $what == full || $what == tuned ]]; then
  python3 -m fusedresnet.harness.check --json "$OUT/check.json" 2>&1 | tee /tmp/check.log | grep -v "^ok " ; rc=$?
  echo "check ($path path) exit $rc after $(( $(date +%s) - t0 ))s"
  if [[ $path != mma && -z $NO_MMA_CHECK ]]; then
    python3 -m fusedresnet.harness.check --quick --conv-path mma --json "$OUT/check_mma.json" 2>&1 \
      | tee /tmp/check_mma.log | grep -v "^ok " ; rc_mma=$?
    echo "check (mma path, quick) exit $rc_mma after $(( $(date +%s) - t0 ))s"
    (( rc == 0 )) && rc=$rc_mma
  fi
fi
if [[ $what == served ]]; then
  # the server on its own empty kernel cache first (nothing else compiling beside it), then the checks
  python3 -m fusedresnet.harness.cold_start --out "$REPO/results/cold_start.json" 2>&1 | tee "$OUT/cold_start.log"
  rc=${PIPESTATUS[0]}
  cp -r "$REPO/results/cold_start.json" "$REPO/results/cold_start_logs" "$OUT/results/" 2>/dev/null
  echo "cold start exit $rc after $(( $(date +%s) - t0 ))s"
  python3 -m fusedresnet.harness.check --quick --json "$OUT/check_quick.json" 2>&1 | tee /tmp/check_quick.log \
    | grep -v "^ok " ; rc_check=${PIPESTATUS[0]}
  echo "check ($path path, quick: every kernel) exit $rc_check after $(( $(date +%s) - t0 ))s"
  (( rc == 0 )) && rc=$rc_check
  # the experiments of kernels/dev/: each checks itself against float32, then times itself beside the served plans
  for runner in "$REPO"/kernels/dev/[a-z]*.py; do
    name=$(basename "$runner" .py)
    python3 -m "fusedresnet.kernels.dev.$name" 2>&1 | tee "$OUT/dev_$name.log" | tail -40; rc_dev=${PIPESTATUS[0]}
    echo "dev $name exit $rc_dev after $(( $(date +%s) - t0 ))s"
    (( rc == 0 )) && rc=$rc_dev
  done
fi
if [[ $what == pytest ]]; then
  # --noconftest: the suite's conftest needs the Triton client libraries, which this host lacks
  python3 -m pytest -q --noconftest -m gpu "$REPO/tests/test_kernels_gpu.py" 2>&1 | tee "$OUT/pytest.log" | tail -15; rc=$?
fi
if [[ $what == bench || $what == all || $what == full || $what == tuned ]]; then
  export FUSEDRESNET_BENCH_COMMAND="bash kernels/gpu_check.sh $what $* (runs: python -m fusedresnet.harness.bench --accuracy <check.json> --out <dir> $*)"
  python3 -m fusedresnet.harness.bench --accuracy "$OUT/check.json" --out "$OUT/results" "$@" 2>&1 | tee "$OUT/bench.log" | tail -30
  rc_bench=$?
  echo "bench exit $rc_bench after $(( $(date +%s) - t0 ))s"
  (( rc == 0 )) && rc=$rc_bench
fi
if [[ ( $what == full && -z $NO_NCU ) || $what == profile ]]; then
  # the second round of profile_layers' launches (the first is the warm-up); clocks left alone
  per_round=$(python3 -c "from fusedresnet.harness.profile_layers import LAUNCHES_PER_ROUND as n; print(n)")
  ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters -k regex:"stem|conv" --launch-skip "$per_round" --launch-count "$per_round" \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor_op_.*cycles_active.avg.pct_of_peak_sustained_active,regex:l1tex__data_bank_conflicts_pipe_lsu_mem_shared.*sum" \
      python3 -m fusedresnet.harness.profile_layers > "$OUT/ncu.txt" 2>&1
  echo "ncu exit $? after $(( $(date +%s) - t0 ))s"
fi
(( rc == 0 )) && rc=$rc_tune
exit "$rc"
