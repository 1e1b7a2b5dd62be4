"""The launcher's settings: its defaults, exit statuses, the lines it prints and reads, and the names of what its
processes leave behind (docs/CONFIGURATION.md says how each default was chosen)."""


from __future__ import annotations

import re
from pathlib import Path

DEFAULT_READY_TIMEOUT_S = 300.0
# Processes behind the shared ports on each GPU: chosen by results/front_door.md (docs/CONFIGURATION.md).
DEFAULT_PROCESSES_PER_GPU = 2
# A crash loop: a process that failed MAX_RESTARTS + 1 times in a row, each within CRASH_LOOP_S of becoming
# ready (a broken model or GPU fails at once). A process that served longer before failing starts the count
# afresh: Triton 2.51 crashes at random when clients abandon calls (docs/ROBUSTNESS.md), which a long-lived
# service must outlast (results/front_door.md: a 10-minute abandonment soak).
MAX_RESTARTS, CRASH_LOOP_S = 3, 10.0
EXIT_STUB_DIED = 3          # a model's Python stub died (and --no-restart, or too many restarts)
EXIT_SERVER_DIED = 4        # tritonserver exited or stopped answering without being asked to (idem)
WEDGED_AFTER_S = 20.0       # an endpoint unanswered this long (probes every poll) means a hung server
PROBE_TIMEOUT_S = 5.0
EXIT_SEEN_WITHIN_S = 0.05   # how often the supervisor looks for an exit or a crash line (a wait on an event)
LOG_LINES_ON_FAILURE = 20
# Models load in parallel up to this many (Triton's default is 4; the repository has more entries).
MODEL_LOAD_THREADS = 8
# what the launcher prints once Triton is ready: at start (then the addresses) and after each restart
READY_LINE, READY_AGAIN_LINE = "fusedresnet: Triton ready on", "fusedresnet: Triton ready again"
# What Triton prints when it crashes: its handler of SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL writes
# "Signal (N) received." (as its SIGINT/SIGTERM handler does for 2 and 15, which are not crashes), and an
# assertion of its gRPC frontend "ASSERTION FAILED" before it aborts. Seen at once, a crash is handled at
# once, where waiting for the exit can take seconds (the backtrace) or forever (a hang in the handler).
# The in-process front end (backend/triton_server/inprocess_server.py) crashes with Python's fatal-error report instead.
CRASH_LINE = re.compile(rb"Signal \((4|6|7|8|11)\) received|ASSERTION FAILED|"
                        rb"Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception|"
                        rb"Illegal instruction)")


INSTANCES_PER = ("process", "gpu")   # --instances: what a model's configured instance count is per


MPS_CHOICES = ("auto", "on", "off")
SHM_PREFIX_OPTION = "shm-region-prefix-name"   # the Python backend's option: the prefix of its stubs' regions


def shm_region_paths(prefix: str) -> list[Path]:
    """The shared-memory regions (files of /dev/shm) whose names start with `prefix`."""
    return sorted(Path("/dev/shm").glob(f"{prefix}*"))


def shm_prefix_of(command: list[str]) -> str | None:
    """The Python backend's region prefix in a tritonserver command line (TritonServer.command sets it)."""
    return next((arg.split(f"{SHM_PREFIX_OPTION}=", 1)[1] for arg in command if f"{SHM_PREFIX_OPTION}=" in arg),
                None)

