"""Where a running server's CPU goes, native frames and Python's C frames alike, on a host with no perf: a
debugger's stack samples (a "poor man's profiler").

    python -m fusedresnet.loadtest.stack_samples --pids 1234,5678 --samples 8 --out build/stacks.folded

Each sample attaches a gdb (`--debugger`: gdb, else cuda-gdb, which the GPU host has and which debugs
programs with no GPU code too) to every pid in turn, prints every thread's backtrace and detaches. The
threads that were running (not waiting in a futex, epoll, poll or a condition variable) are counted, one line
per distinct stack in the folded format of flame graphs (`process;thread;outermost;...;innermost count`).
The attach stops the process for the time the backtraces take, so samples are few and coarse: they show which
code is busy, not exact shares.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

THREAD_LINE = re.compile(r'^Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)(?: "([^"]*)")?\)')
FRAME_LINE = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?([^\s(]+)")
# innermost frames of a thread that waits rather than computes
WAITING = re.compile(r"futex|epoll_wait|__poll|poll$|pthread_cond|nanosleep|sem_wait|clock_nanosleep|select$|"
                     r"accept|recvmsg|read$|__GI___libc_read|sigtimedwait|do_futex_wait|__lll_lock_wait")


def debugger() -> str | None:
    return shutil.which("gdb") or shutil.which("cuda-gdb")


def backtraces(pid: int, tool: str, timeout_s: float) -> str:
    command = [tool, "-batch", "-nx", "-p", str(pid), "-ex", "set pagination off", "-ex", "thread apply all bt"]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s).stdout
    except subprocess.TimeoutExpired as error:
        return error.stdout.decode(errors="replace") if isinstance(error.stdout, bytes) else (error.stdout or "")


def running_stacks(text: str, process: str) -> list[str]:
    """The folded stacks (outermost first) of the threads in gdb's `thread apply all bt` output that were not
    waiting; the process and the thread's name lead each."""
    stacks, thread, frames = [], None, []

    def close():
        if thread is not None and frames and not WAITING.search(frames[0]):
            stacks.append(";".join([process, thread, *reversed(frames)]))

    for line in text.splitlines():
        if match := THREAD_LINE.match(line):
            close()
            thread, frames = (match.group(2) or "thread").rstrip("0123456789"), []
        elif thread is not None and (match := FRAME_LINE.match(line)):
            frames.append(match.group(1))
    close()
    return stacks


def sample(pids: list[int], samples: int, interval_s: float, timeout_s: float, tool: str) -> collections.Counter:
    folded: collections.Counter = collections.Counter()
    names = {}
    for pid in pids:
        try:
            names[pid] = psutil.Process(pid).name()
        except psutil.Error:
            names[pid] = str(pid)
    for _ in range(samples):
        for pid in pids:
            folded.update(running_stacks(backtraces(pid, tool, timeout_s), names[pid]))
        time.sleep(interval_s)
    return folded


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pids", required=True, help="comma-separated")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--interval-s", type=float, default=0.2)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per attach")
    parser.add_argument("--debugger", default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    tool = args.debugger or debugger()
    if tool is None:
        parser.error("no gdb or cuda-gdb on PATH")
    folded = sample([int(p) for p in args.pids.split(",") if p], args.samples, args.interval_s, args.timeout_s, tool)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f"{stack} {count}\n" for stack, count in folded.most_common()))
    print(f"{sum(folded.values())} running-thread stacks in {len(folded)} distinct ones: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
