#!/usr/bin/env bash
# The two front ends on a GPU host (results/front_end.md, docs/ROBUSTNESS.md): the in-process one (Triton 2.73's
# frontends on the 2.51 core, backend/front_end.py) against the tritonserver 2.51 binary.
#   bash scripts/gpu_host_front_end.sh check        # the tests against the in-process front end (about 5 min)
#   bash scripts/gpu_host_front_end.sh levers       # its settings: processes per GPU, gRPC infer threads (custom)
#   bash scripts/gpu_host_front_end.sh throughput   # both: custom, cuDNN, zero at 1 and 32 images/request over
#                                                   # gRPC, and CUDA shared memory at 32 (about 7 min)
#   bash scripts/gpu_host_front_end.sh soak SECONDS [LAUNCHER ARGS]  # both at once, each beside abusive clients of
#                                                   # every kind, each launcher as the README starts it (plus ARGS)
# The servers run on SERVER_CORES (default 0-11), the load generators on GENERATOR_CORES (12-15). h2load comes
# carried as .h2load/h2load.tar.xz (scripts/gpu_host_front_door.sh says how to make it).
# Writes $OUT (default build/gpu-host): device.txt, <task>.log, front_end_*.json/.md, logs.tgz.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
task="${1:?check, levers, throughput or soak}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
SERVER_CORES="${SERVER_CORES:-0-11}" GENERATOR_CORES="${GENERATOR_CORES:-12-15}"
front_door() {   # name, then campaigns/front_door.py's arguments
    local name=$1; shift
    python3 -m fusedresnet.campaigns.front_door --out "$OUT/front_end_$name.json" --server-cores "$SERVER_CORES" \
        --generator-cores "$GENERATOR_CORES" "$@" 2>&1 | tee -a "$OUT/$task.log"
}
status=0
case $task in
check)
    # the launcher as the README starts it, then the photos through both models over gRPC, HTTP and CUDA shared memory
    python3 -m fusedresnet.backend.serve --front-end inprocess --client-shared-memory --log-file "$OUT/smoke_server.log" \
        > "$OUT/smoke_launcher.log" 2>&1 &
    launcher=$!
    for _ in $(seq 240); do grep -q "Triton ready on" "$OUT/smoke_launcher.log" && break; sleep 0.5; done
    cat "$OUT/smoke_launcher.log"
    for protocol in "--protocol grpc" "--protocol http" "--shared-memory cuda"; do
        # shellcheck disable=SC2086  # two words on purpose
        python3 -m fusedresnet.client.classify client/samples/*.png client/samples/*.jpg $protocol --model resnet18_custom --top-k 1 2>&1 \
            | tee -a "$OUT/smoke_classify.log" | tail -n 3
    done
    kill -INT "$launcher"; wait "$launcher"; echo "launcher exit status $?"; tail -n 5 "$OUT/smoke_launcher.log"
    FUSEDRESNET_FRONT_END=inprocess timeout "${CHECK_TIMEOUT_S:-420}" python3 -m pytest -q -p no:cacheprovider --durations=10 \
        tests/test_front_end.py tests/test_security.py tests/test_serving.py tests/test_client_abuse.py \
        tests/test_front_door.py 2>&1 | tee "$OUT/check.log"
    status=${PIPESTATUS[0]}
    ;;
levers)
    # processes per GPU under MPS with the frontends' defaults, then more gRPC infer threads for each
    front_door inprocess_levers --processes "${PROCESSES:-1,2}" --mps on --models resnet18_custom \
        --series h2load:1:none:512,h2load:32:none:64 --launcher-args "--front-end inprocess"
    status=$?
    front_door inprocess_threads4 --processes "${PROCESSES:-1,2}" --mps on --models resnet18_custom \
        --series h2load:1:none:512,h2load:32:none:64 \
        --launcher-args "--front-end inprocess -- --grpc-infer-thread-count=4 --grpc-infer-allocation-pool-size=64"
    status=$((status | $?))
    ;;
throughput)
    # as each front end is shipped, then the in-process one with client shared memory chosen (one process)
    front_door binary --processes 2 --mps on --launcher-args "--front-end binary"
    status=$?
    front_door inprocess --processes "${INPROCESS_PROCESSES:-2}" --mps on --launcher-args "--front-end inprocess" \
        --series h2load:1:none:512,h2load:32:none:64
    status=$((status | $?))
    front_door inprocess_shm --processes 1 --mps on --series grpc_flood:32:cuda:64 \
        --launcher-args "--front-end inprocess --client-shared-memory"
    status=$((status | $?))
    ;;
soak)
    seconds="${2:-600}"
    python3 -m fusedresnet.campaigns.front_end_soak --seconds "$seconds" --out "$OUT/front_end_soak" \
        --server-cores "$SERVER_CORES" --generator-cores "$GENERATOR_CORES" -- "${@:3}" 2>&1 | tee "$OUT/soak.log"
    status=${PIPESTATUS[0]}
    ;;
*)
    echo "unknown task $task: check, levers, throughput or soak" >&2
    exit 2
    ;;
esac
tar czf "$OUT/logs_$task.tgz" /tmp/front_door_*/launcher-* /tmp/abuse_soak_*/launcher.out /tmp/pytest-of-*/pytest-*/*/*.out \
    2>/dev/null || true
exit "$status"
