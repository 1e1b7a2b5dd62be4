#!/usr/bin/env bash
# The two front ends on a GPU host (results/front_end.md, docs/ROBUSTNESS.md): the in-process one (Triton 2.73's
# frontends on the 2.51 core, backend/triton_server/front_end.py) against the tritonserver 2.51 binary.
#   bash scripts/gpu_host_front_end.sh check        # the tests against the in-process front end (about 5 min)
#   bash scripts/gpu_host_front_end.sh levers       # its settings: processes per GPU x gRPC infer threads and
#                                                   # allocation pool, custom at 1 and 32 images/request (4 min)
#   bash scripts/gpu_host_front_end.sh processes    # both, each at PROCESSES per GPU (default 2,3) under MPS, custom
#                                                   # at 1 and 32 images/request over gRPC, binary, in-process,
#                                                   # in-process, binary (about 5 min)
#   bash scripts/gpu_host_front_end.sh throughput   # both: custom, cuDNN, zero at 1 and 32 images/request over
#                                                   # gRPC and HTTP, and CUDA shared memory at 32, in
#                                                   # THROUGHPUT_ROUNDS rounds (default 2, about 6 min each: past
#                                                   # one call's 10 minutes, run it through gpu_host_background.sh);
#                                                   # the in-process one with the setting the levers chose, if run
#   bash scripts/gpu_host_front_end.sh profile      # where each one's server CPU goes, by thread pool, at 1 and
#                                                   # 32 images/request, before and after the stub's levers,
#                                                   # each lever alone, gRPC's polling (about 12 min; issue 46's
#                                                   # before and after only: PROFILE_RUNS="binary_before
#                                                   # inprocess" PROFILE_LEVERS=none, about 5 min)
#   bash scripts/gpu_host_front_end.sh flame        # perf's stacks and flame graphs of an in-process server and
#                                                   # its custom stubs under h2load, 32 then 1 image/request,
#                                                   # before and after the stubs' levers (about 3 min; carry
#                                                   # .perf/perf.tar.xz only: the host unpacks it);
#                                                   # FLAME_FRONT_ENDS="inprocess binary" records the binary too
#                                                   # ($OUT/flame_binary), FLAME_CODES="after" only as shipped
#   bash scripts/gpu_host_front_end.sh levers,throughput,check   # several, one after the other
#   bash scripts/gpu_host_front_end.sh soak SECONDS [LAUNCHER ARGS]  # both at once, each beside abusive clients of
#                                                   # every kind, each launcher as the README starts it (plus ARGS)
# The servers run on SERVER_CORES (default 0-11), the load generators on GENERATOR_CORES (12-15). h2load comes
# carried as .h2load/h2load.tar.xz (scripts/gpu_host_front_door.sh says how to make it).
# Writes $OUT (default build/gpu-host): device.txt, <task>.log, front_end_*.json/.md, logs.tgz.
set -uo pipefail
OUT="${OUT:-build/gpu-host}"
TASKS="check, levers, processes, throughput, profile, flame or soak"
tasks="${1:?$TASKS (several: comma-separated)}"
# shellcheck source=scripts/gpu_host_prologue.sh
source scripts/gpu_host_prologue.sh
SERVER_CORES="${SERVER_CORES:-0-11}" GENERATOR_CORES="${GENERATOR_CORES:-12-15}"
front_door() {   # name, then campaigns/front_door.py's arguments
    local name=$1; shift
    python3 -m fusedresnet.campaigns.front_door --out "$OUT/front_end_$name.json" --server-cores "$SERVER_CORES" \
        --generator-cores "$GENERATOR_CORES" "$@" 2>&1 | tee -a "$OUT/$task.log"
}
status=0
IFS=, read -ra task_list <<< "$tasks"
for task in "${task_list[@]}"; do
case $task in
check)
    # the README's two starts and its two perf_analyzer commands (the shared-memory one against
    # --client-shared-memory), the photos through the models over gRPC, HTTP and CUDA shared memory; then the tests
    export FUSEDRESNET_ADMIN_TOKEN="${FUSEDRESNET_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(24))')}"
    pa="$(python3 -c 'from fusedresnet.loadtest.perf_analyzer import binary_path; print(binary_path())')"
    for start in "--client-shared-memory" ""; do
        name=smoke${start:+_shm}
        # shellcheck disable=SC2086  # no word or one on purpose
        taskset -c "$SERVER_CORES" python3 -m fusedresnet.backend.serve $start --log-file "$OUT/${name}_server.log" \
            > "$OUT/${name}_launcher.log" 2>&1 &
        launcher=$!
        for _ in $(seq 240); do grep -q "Triton ready on" "$OUT/${name}_launcher.log" && break; sleep 0.5; done
        cat "$OUT/${name}_launcher.log"
        if [[ -n $start ]]; then
            timeout 120 taskset -c "$GENERATOR_CORES" "$pa" -m resnet18_custom -i grpc -u 127.0.0.1:8001 -b 32 \
                --concurrency-range 32 --shared-memory cuda --output-shared-memory-size 128000 \
                -H "triton-grpc-protocol-admin-key:$FUSEDRESNET_ADMIN_TOKEN" 2>&1 | tee -a "$OUT/smoke_perf_analyzer.log"
            protocols=("--shared-memory cuda")
        else
            timeout 120 taskset -c "$GENERATOR_CORES" "$pa" -m resnet18_custom -i http -u 127.0.0.1:8000 \
                -H "admin-key:$FUSEDRESNET_ADMIN_TOKEN" 2>&1 | tee -a "$OUT/smoke_perf_analyzer.log"
            protocols=("--protocol grpc" "--protocol http")
        fi
        status=$((status | PIPESTATUS[0]))
        for protocol in "${protocols[@]}"; do
            # shellcheck disable=SC2086  # two words on purpose
            python3 -m fusedresnet.client.classify client/samples/*.png client/samples/*.jpg $protocol \
                --model resnet18_custom --top-k 1 2>&1 | tee -a "$OUT/smoke_classify.log" | tail -n 3
        done
        kill -INT "$launcher"; wait "$launcher"; echo "launcher exit status $?"; tail -n 5 "$OUT/${name}_launcher.log"
    done
    FUSEDRESNET_FRONT_END=inprocess timeout "${CHECK_TIMEOUT_S:-420}" python3 -m pytest -q -p no:cacheprovider --durations=10 \
        tests/test_front_end.py tests/test_security.py tests/test_serving.py tests/test_client_abuse.py \
        tests/test_front_door.py 2>&1 | tee "$OUT/check.log"
    status=$((status | PIPESTATUS[0]))
    ;;
levers)
    # processes per GPU under MPS with the 2.73 frontend's own gRPC infer threads and pool (2 and 8), then the in-process
    # server's defaults (4 and 64, backend/triton_server/inprocess_server.py): both passed explicitly, so that the two
    # settings differ whatever the defaults are
    for setting in "threads2:-- --grpc-infer-thread-count=2 --grpc-infer-allocation-pool-size=8" \
                   "threads4:-- --grpc-infer-thread-count=4 --grpc-infer-allocation-pool-size=64"; do
        front_door "lever_${setting%%:*}" --processes "${PROCESSES:-1,2}" --mps on --models resnet18_custom \
            --series h2load:1:none:512,h2load:32:none:64 --no-generator-check --no-recovery \
            --launcher-args "--front-end inprocess ${setting#*:}"
        status=$((status | $?))
    done
    ;;
processes)
    # issue 45's "processes per GPU: throughput decides", both front ends in one run; each front end twice, first and
    # last in turn (binary, in-process, in-process, binary), so that neither always meets the host first
    for run in binary_a inprocess_a inprocess_b binary_b; do
        front_door "processes_$run" --processes "${PROCESSES:-2,3}" --mps on --models resnet18_custom \
            --series h2load:1:none:512,h2load:32:none:64 --no-generator-check --no-recovery \
            --launcher-args "--front-end ${run%_*}"
        status=$((status | $?))
    done
    ;;
throughput)
    # as each front end is shipped, then client shared memory chosen (--client-shared-memory: one process, the binary);
    # THROUGHPUT_ROUNDS rounds (default 2), the two front ends in turn, which goes first alternating, so that neither
    # always meets the host first: front_end_soak results compares their medians
    http=h2load_http:1:none:512,h2load_http:32:none:64     # KServe HTTP/1.1, a connection per call in flight
    inprocess_processes=2 inprocess_args="--front-end inprocess"
    if compgen -G "$OUT/front_end_lever_*.json" > /dev/null; then   # the fastest setting of the levers' run
        mapfile -t chosen < <(python3 -m fusedresnet.campaigns.front_end_soak choose "$OUT"/front_end_lever_*.json \
                              2>> "$OUT/$task.log")
        inprocess_processes=${chosen[0]:-2} inprocess_args=${chosen[1]:-$inprocess_args}
    fi
    for round in $(seq "${THROUGHPUT_ROUNDS:-2}"); do
        order=(binary inprocess)
        (( round % 2 == 0 )) && order=(inprocess binary)
        for front_end in "${order[@]}"; do
            if [[ $front_end == binary ]]; then   # the generator check and the CUDA shared-memory steps once
                extra=(--series "h2load:1:none:512,h2load:32:none:64,grpc_flood:32:cuda:64,$http")
                (( round > 1 )) && extra=(--series "h2load:1:none:512,h2load:32:none:64,$http" --no-generator-check
                                          --no-recovery)
                front_door "binary_r$round" --processes 2 --mps on --launcher-args "--front-end binary" "${extra[@]}"
            else
                extra=()
                (( round > 1 )) && extra=(--no-generator-check --no-recovery)
                front_door "inprocess_r$round" --processes "$inprocess_processes" --mps on \
                    --launcher-args "$inprocess_args" --series "h2load:1:none:512,h2load:32:none:64,$http" "${extra[@]}"
            fi
            status=$((status | $?))
        done
    done
    front_door client_shm --processes 1 --mps on --series grpc_flood:32:cuda:64 --no-recovery \
        --launcher-args "--front-end binary --client-shared-memory"
    status=$((status | $?))
    ;;
profile)
    # issue 46 (results/serving_cost.md): correctness of the stub's GPU path first, then where each front end's
    # server CPU goes by thread pool (front_door's server_cpu_percent_by_thread) before and after the stub's
    # levers, and each lever alone, in one run: before = FUSEDRESNET_HOST_INPUT=staging FUSEDRESNET_GPU_WAIT=spin
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_pinned_shm.py tests/test_serving.py 2>&1 \
        | tee "$OUT/profile_pytest.log"
    if (( PIPESTATUS[0] != 0 )); then echo "the stub's GPU path is wrong: nothing timed" | tee -a "$OUT/$task.log"
        status=1; continue; fi
    before=(--server-env FUSEDRESNET_HOST_INPUT=staging --server-env FUSEDRESNET_GPU_WAIT=spin)
    profile_run() {   # name, front end, models, then front_door's arguments
        local name=$1 front_end=$2 models=$3; shift 3
        front_door "$name" --processes 2 --mps on --models "$models" --series h2load:1:none:512,h2load:32:none:64 \
            --no-generator-check --no-recovery --launcher-args "--front-end $front_end" "$@"
        status=$((status | $?))
    }
    # PROFILE_RUNS: which of each front end's before and after (issue 46's own before and after, in one run:
    # PROFILE_RUNS="binary_before inprocess", the 2.51 binary with the stub's levers off, then as shipped)
    for run in ${PROFILE_RUNS:-inprocess_before inprocess binary_before binary}; do
        if [[ $run == *_before ]]; then
            profile_run "profile_$run" "${run%_before}" resnet18_custom,resnet18_cudnn,zero_answer "${before[@]}"
        else
            profile_run "profile_$run" "$run" resnet18_custom,resnet18_cudnn,zero_answer
        fi
    done
    [[ ${PROFILE_LEVERS:-each} == each ]] || continue   # none: before and after only
    profile_run lever_registered inprocess resnet18_custom,resnet18_cudnn --server-env FUSEDRESNET_GPU_WAIT=spin
    profile_run lever_block inprocess resnet18_custom,resnet18_cudnn --server-env FUSEDRESNET_HOST_INPUT=staging
    # the in-process gRPC's EventEngine threads are its largest extra cost: gRPC's own switches back to the
    # completion-queue polling that the 2.51 binary's gRPC does (its experiments, read from GRPC_EXPERIMENTS)
    profile_run lever_grpc_polling inprocess resnet18_custom,zero_answer \
        --server-env "GRPC_EXPERIMENTS=-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq"
    ;;
flame)
    # issue 46: native frames beside Python ones, by Linux perf (carried as .perf/perf.tar.xz: scripts/gpu_host_prologue.sh
    # says how to make it; py-spy cannot: it sees only threads with a Python state and its pauses crashed the server).
    # perf records one in-process server process as shipped (2 per GPU under MPS) and its custom stubs, with DWARF
    # unwinding (campaigns/flame_stages.py's rate per busy thread and window), while h2load sends custom at 32
    # images/request, then at 1, before the stubs' levers (staging, spin) and after; Python 3.12 names its functions
    # to perf (PYTHONPERFSUPPORT=1).
    # campaigns/flame_stages.py collapse writes the stacks per process kind and their flame graphs (.svg)
    if ! command -v perf > /dev/null; then echo "no perf: carry .perf" | tee -a "$OUT/$task.log"; status=1; continue; fi
    export FUSEDRESNET_ADMIN_TOKEN="${FUSEDRESNET_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(24))')}"
    # FLAME_FRONT_ENDS (default inprocess; "inprocess binary" also records the 2.51 binary's server, into
    # $OUT/flame_binary) and FLAME_CODES (default "before after") choose what is recorded
    for front_end in ${FLAME_FRONT_ENDS:-inprocess}; do
        flame_dir="$OUT/flame"
        [[ $front_end == inprocess ]] || flame_dir="$OUT/flame_$front_end"
        mkdir -p "$flame_dir"
        # the rate and window campaigns/flame_stages.py divides by: defined there once
        read -r rate_hz window_s < <(python3 -c "from fusedresnet.campaigns.flame_stages import SAMPLE_RATE_HZ, SAMPLE_SECONDS
print(SAMPLE_RATE_HZ, SAMPLE_SECONDS)")
        for code in ${FLAME_CODES:-before after}; do
            server_env=(PYTHONPERFSUPPORT=1)
            [[ $code == before ]] && server_env+=(FUSEDRESNET_HOST_INPUT=staging FUSEDRESNET_GPU_WAIT=spin)
            env "${server_env[@]}" taskset -c "$SERVER_CORES" python3 -m fusedresnet.backend.serve --front-end "$front_end" \
                --log-file "$flame_dir/${code}_server.log" > "$flame_dir/${code}_launcher.log" 2>&1 &
            launcher=$!
            for _ in $(seq 240); do grep -q "Triton ready on" "$flame_dir/${code}_launcher.log" && break; sleep 0.5; done
            if [[ $front_end == inprocess ]]; then
                server_pid=$(for pid in $(pgrep -f "fusedresnet.backend.triton_server.inprocess_server"); do
                                 readlink "/proc/$pid/exe" | grep -q python && echo "$pid"; done | head -n 1)
            else
                server_pid=$(pgrep -x tritonserver | head -n 1)
            fi
            pids=$(python3 -c "from fusedresnet.backend.launcher.stub_processes import python_stubs
print(','.join(['$server_pid'] + [str(s.pid) for n, s in sorted(python_stubs($server_pid).items())
                                  if n.startswith('resnet18_custom_')]))")
            echo "$front_end, $code: the server process and its custom stubs: $pids" | tee -a "$OUT/$task.log"
            if [[ -z $server_pid || $pids != *,* ]]; then
                echo "$front_end, $code: no ready server or no custom stub: nothing recorded" | tee -a "$OUT/$task.log"
                status=1; kill -INT "$launcher"; wait "$launcher"; continue
            fi
            for images in 32 1; do
                taskset -c "$GENERATOR_CORES" python3 -m fusedresnet.loadtest.h2load_step --model resnet18_custom \
                    --images-per-request "$images" --connections 64 --streams $((images == 1 ? 8 : 1)) --seconds 20 \
                    > "$flame_dir/${code}_h2load_$images.json" 2>> "$OUT/$task.log" &
                generator=$!
                sleep 6
                if ! taskset -c "$GENERATOR_CORES" perf record -F "$rate_hz" --call-graph dwarf,16384 -p "$pids" \
                        -o "/tmp/flame_${code}_$images.data" -- sleep "$window_s" >> "$OUT/$task.log" 2>&1 \
                        || [[ ! -s /tmp/flame_${code}_$images.data ]]; then
                    echo "$code, $images image(s)/request: perf recorded nothing (see above)" | tee -a "$OUT/$task.log"
                    status=1
                fi
                wait "$generator"
                tail -c 300 "$flame_dir/${code}_h2load_$images.json" | tee -a "$OUT/$task.log"
            done
            kill -INT "$launcher"; wait "$launcher"
            for images in 32 1; do   # after the server: perf script reads the processes' perf-<pid>.map files
                taskset -c "$GENERATOR_CORES" perf script --no-inline -F comm,pid,tid,ip,sym,dso \
                    -i "/tmp/flame_${code}_$images.data" 2>> "$OUT/$task.log" | gzip > "/tmp/flame_${code}_$images.txt.gz"
                python3 -m fusedresnet.campaigns.flame_stages collapse "/tmp/flame_${code}_$images.txt.gz" --code "$code" \
                    --images "$images" --server-pid "$server_pid" --out "$flame_dir" 2>&1 | tee -a "$OUT/$task.log"
                status=$((status | PIPESTATUS[0]))
            done
        done
    done
    ;;
soak)
    seconds="${2:-600}"
    python3 -m fusedresnet.campaigns.front_end_soak --seconds "$seconds" --out "$OUT/front_end_soak" \
        --server-cores "$SERVER_CORES" --generator-cores "$GENERATOR_CORES" -- "${@:3}" 2>&1 | tee "$OUT/soak.log"
    status=$((status | PIPESTATUS[0]))
    ;;
*)
    echo "unknown task $task: $TASKS" >&2
    exit 2
    ;;
esac
done
tar czf "$OUT/logs_${tasks//,/_}.tgz" /tmp/front_door_*/launcher-* /tmp/abuse_soak_*/launcher.out /tmp/pytest-of-*/pytest-*/*/*.out \
    2>/dev/null || true
exit "$status"
