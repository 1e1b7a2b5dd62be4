#!/usr/bin/env bash
# GPU-host run of the client-abuse checks (the service survives its clients), against the shipped models on the GPU:
#   1. tests/test_client_abuse.py (abandoned calls, expiring deadlines, RST_STREAM storms, idle
#      connections, slow/cut HTTP bodies, keep-alive abuse; the h2load storms skip: no h2load there)
#      and the SIGABRT tests of tests/test_faults.py                                      (about 3 min)
#   2. a 10-minute soak (campaigns/abuse_soak.py): valid traffic at >= half the measured peak
#      (38.7k img/s at 32 images/request on an H100) mixed with
#      abandonment, deadline and RST_STREAM cycles; nothing valid lost (the valid clients retry
#      UNAVAILABLE up to 60 s, as the project's clients do), memory flat per server process after
#      its warm-up, every crash recovered by the launcher; the server on cores 0-9, the 8 valid
#      processes and the abuse loop on SOAK_LOAD_CORES (default 10-15); a 5-s timeline (valid
#      img/s, Triton's queue/compute times, CPU of server, clients and abuse loop, memory) in the
#      report                                                                     (about 11-12 min)
#   3. the abandonment crash rate on the zero-answer model, as shipped                    (about 3 min)
# Results under $OUT (default build/gpu-host-robustness): device.txt, pytest-robustness.log,
# robustness_client_abuse.{json,md}, robustness_faults.{json,md}, robustness_abuse_soak.{json,md},
# robustness_abandonment_gpu.{json,md} and the logs. Exit status 0 when all three passed.
#
# It takes about 17 minutes, longer than one device call (10 minutes at most), so it runs detached
# (scripts/gpu_host_background.sh) in a first call and is collected by a second one:
#   call 1:  bash scripts/gpu_host_background.sh start 570 "bash scripts/gpu_host_robustness.sh"
#   call 2:  bash scripts/gpu_host_background.sh wait 570        (again while it says "still running")
# Each call leaves $OUT/out.tgz (out/ = this script's $OUT, console.log, rc): commit out/ as
# results/robustness_gpu_client_abuse/ (the earlier one under results/history/).
set -uo pipefail
OUT="${OUT:-build/gpu-host-robustness}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
status=0
echo "== 1. client abuse and SIGABRT tests ($(date -u +%H:%M:%S))"
FUSEDRESNET_RESULTS_DIR="$OUT" python3 -m pytest -v -rs --durations=10 tests/test_client_abuse.py \
    tests/test_faults.py::test_aborted_tritonserver_is_restarted_by_the_launcher_on_the_same_ports_with_its_cause_logged \
    tests/test_faults.py::test_launcher_with_no_restart_exits_with_status_4_when_tritonserver_is_aborted \
    > "$OUT/pytest-robustness.log" 2>&1 || status=1
tail -n 15 "$OUT/pytest-robustness.log"
echo "== 2. 10-minute soak ($(date -u +%H:%M:%S))"
python3 -m fusedresnet.campaigns.abuse_soak --seconds 600 --valid-processes 8 --valid-in-flight 8 \
    --images-per-request 32 --min-images-per-s 19350 --load-cores "${SOAK_LOAD_CORES:-10-15}" \
    --out "$OUT/robustness_abuse_soak" \
    > "$OUT/abuse_soak.log" 2>&1 || status=1
cat "$OUT/robustness_abuse_soak.md" 2>/dev/null || tail -n 30 "$OUT/abuse_soak.log"
echo "== 3. abandonment crash rate, zero-answer model ($(date -u +%H:%M:%S))"
python3 -m fusedresnet.campaigns.abandonment_trials --rounds "${ABANDONMENT_ROUNDS:-60}" --candidates "as shipped" \
    --out "$OUT/robustness_abandonment_gpu" > "$OUT/abandonment_trials.log" 2>&1 || status=1
cat "$OUT/robustness_abandonment_gpu.md" 2>/dev/null
echo "== done ($(date -u +%H:%M:%S)), status $status"
exit $status
