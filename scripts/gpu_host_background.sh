#!/usr/bin/env bash
# A job longer than one call to the GPU host (each call is capped at 10 minutes; the
# host stays up between calls made within its idle time): the first call starts it
# in the background, the next ones wait for it.
#
#   bash scripts/gpu_host_background.sh start SECONDS "COMMAND"   # from the repository root
#   bash scripts/gpu_host_background.sh wait SECONDS
#
# start copies this tree (with what the call carried: .gpu-bundle) to $BG_DIR/tree and runs
# COMMAND there in its own session, with OUT=$BG_DIR/out, so the GPU-host scripts write where
# they would write for one call. Both modes then
# wait up to SECONDS for it to end, and pack what it has written so far into $OUT/out.tgz
# (out/, console.log and, once it has ended, rc), so a call that runs out of time still
# brings back the logs. The exit status is COMMAND's once it has ended, 124 while it runs.
# Example, the final H100 run (about 15 minutes with torch.compile):
#   start 585 "FUSEDRESNET_GIT_COMMIT=<hash> bash kernels/gpu_check.sh tuned --compile --batches 1,8,32,128,256"
#   wait 585
set -uo pipefail
mode=${1:?start or wait}
seconds=${2:?seconds to wait}
BG_DIR=${BG_DIR:-/tmp/fusedresnet-background}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"

case $mode in
start)
    command=${3:?the command to run}
    if [[ -d $BG_DIR && ! -f $BG_DIR/rc && -f $BG_DIR/pid ]] && kill -0 "$(cat "$BG_DIR/pid")" 2>/dev/null; then
        echo "a job still runs in $BG_DIR (pid $(cat "$BG_DIR/pid")): wait for it first" >&2
        exit 2
    fi
    rm -rf "$BG_DIR"
    mkdir -p "$BG_DIR/tree" "$BG_DIR/out"
    cp -a . "$BG_DIR/tree/"
    printf '%s\n' "$command" > "$BG_DIR/command"
    # COMMAND in a shell of its own (an `exit` in it ends only that shell), its status written after it
    (cd "$BG_DIR/tree" || exit 1
     # shellcheck disable=SC2016  # $1 and $2 expand in the inner shell
     OUT="$BG_DIR/out" setsid bash -c 'bash -c "$1"; echo $? > "$2.tmp"; mv "$2.tmp" "$2"' \
        background "$command" "$BG_DIR/rc" > "$BG_DIR/console.log" 2>&1 < /dev/null &
     echo $! > "$BG_DIR/pid")
    echo "started at $(date -u +%H:%M:%S) UTC in $BG_DIR: $command"
    ;;
wait)
    [[ -f $BG_DIR/command ]] || { echo "no job was started in $BG_DIR (a fresh host?)" >&2; exit 2; }
    echo "waiting for: $(cat "$BG_DIR/command")"
    ;;
*)
    echo "usage: $0 start SECONDS COMMAND | wait SECONDS" >&2
    exit 2
    ;;
esac

deadline=$(( $(date +%s) + seconds ))
while [[ ! -f $BG_DIR/rc ]] && (( $(date +%s) < deadline )); do
    sleep 2
done
packed=(out console.log)
[[ -f $BG_DIR/rc ]] && packed+=(rc)
tar -czf "$OUT/out.tgz" -C "$BG_DIR" "${packed[@]}"
tail -n 40 "$BG_DIR/console.log"
if [[ -f $BG_DIR/rc ]]; then
    echo "ended with exit status $(cat "$BG_DIR/rc") at $(date -u +%H:%M:%S) UTC; results in \$OUT/out.tgz"
    exit "$(cat "$BG_DIR/rc")"
fi
echo "still running at $(date -u +%H:%M:%S) UTC: call 'wait' again (logs so far in \$OUT/out.tgz)"
exit 124
