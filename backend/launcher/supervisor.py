"""The supervision of one tritonserver process: what counts as a failure (a stub that died, a crash line, an exit
unasked, a hang), the restart on the same ports, and the crash loop that gives up."""


from __future__ import annotations

import os
import signal
import sys
import time

from .health import exit_cause, grpc_ready, metrics_list_models
from .settings import (
    CRASH_LOOP_S,
    DEFAULT_READY_TIMEOUT_S,
    EXIT_SEEN_WITHIN_S,
    EXIT_SERVER_DIED,
    EXIT_STUB_DIED,
    LOG_LINES_ON_FAILURE,
    MAX_RESTARTS,
    READY_AGAIN_LINE,
    WEDGED_AFTER_S,
)


class Supervision:
    """The supervision of one TritonServer (process.py): wait for its failure, say it, restart it or stop."""

    def supervise(self, restart: bool = True, poll_s: float = 1.0,
                  ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> int:
        """Watch the server until it fails, restart it on the same ports, and go on watching.

        A failure is one of: a model's stub process died while the server was ready (Triton 2.51's
        Python backend no longer restarts a dead stub, python_backend removed the restart in 24.06,
        triton-inference-server/server#8604, and keeps reporting the model ready; with model control
        mode none the only way back is a fresh server); Triton printed a crash line (CRASH_LINE);
        tritonserver exited (nothing but this launcher may stop it); or it has not answered for
        WEDGED_AFTER_S (Triton can hang in its abort handler after a crash). Returns the launcher's exit
        status: EXIT_STUB_DIED or EXIT_SERVER_DIED with restart=False or in a crash loop (more than
        MAX_RESTARTS failures in a row, each within CRASH_LOOP_S of the process becoming ready).
        """
        quick_failures = 0
        while True:
            stub_died, cause = self.wait_for_failure(poll_s)
            if self.stopping.is_set():
                return 0
            failed_at = time.monotonic()
            print(f"fusedresnet: {cause}; " + ("restarting Triton" if restart else "stopping Triton (--no-restart)")
                  + ("" if stub_died else self._log_tail(LOG_LINES_ON_FAILURE)), file=sys.stderr, flush=True)
            served_s = failed_at - self.timings.get("ready", failed_at)
            quick_failures = quick_failures + 1 if served_s < CRASH_LOOP_S else 0
            if stub_died:
                self.stop_after_stub_death()
            else:
                self.kill()
            status = EXIT_STUB_DIED if stub_died else EXIT_SERVER_DIED
            if not restart:
                return status
            if quick_failures > MAX_RESTARTS:
                print(f"fusedresnet: a crash loop{self._named()}: {quick_failures} failures in a row, each within "
                      f"{CRASH_LOOP_S:.0f} s of becoming ready; giving up (exit status {status})",
                      file=sys.stderr, flush=True)
                return status
            self.restarts += 1
            self.start(ready_timeout_s)
            print(f"{READY_AGAIN_LINE} (restart {self.restarts}){self._named()}: "
                  f"{self.timings['ready'] - failed_at:.1f} s after the failure was seen "
                  f"(start to ready {self.timings['ready'] - self.timings['started']:.1f} s)",
                  file=sys.stderr, flush=True)

    def wait_for_failure(self, poll_s: float) -> tuple[bool, str]:
        """Block until the server fails: (whether a stub died, the cause in words)."""
        expected = set(self.instance_stubs)
        answered_at = next_probe = time.monotonic()
        while True:
            # A crash line or an exit is seen within EXIT_SEEN_WITHIN_S; the endpoints are probed every poll_s.
            if self.crashed.wait(EXIT_SEEN_WITHIN_S) and not self.stopping.is_set():
                return False, f"tritonserver{self._named()} (pid {self.process.pid}) crashed: " \
                              f"{self.crash_line.decode(errors='replace')!r}"
            if self.stopping.is_set():
                return False, "stopped"
            if self.process.poll() is not None:
                return False, f"tritonserver{self._named()} exited unasked ({exit_cause(self.process.returncode)})"
            if time.monotonic() < next_probe:
                continue
            next_probe = time.monotonic() + poll_s
            answers = self.is_ready()
            dead = expected - set(self.model_stub_pids())
            # A stub that goes away while the server still lists its models is a crash (one that goes while it
            # does not is part of a shutdown). Triton 24.10 keeps the model ready, 26.01 and later not: the
            # metrics listing tells both apart from a server that is stopping.
            if dead and self.process.poll() is None and (answers or metrics_list_models(self.metrics_url,
                                                                                        self.models)):
                return True, f"Python stub of {', '.join(sorted(dead))} died{self._named()}"
            # A process of its own ports answers on HTTP and on gRPC; one that shares them, on its metrics port.
            if answers and (self.shares_ports or grpc_ready(self.grpc_url)):
                answered_at = time.monotonic()
            elif time.monotonic() - answered_at > WEDGED_AFTER_S and self.process.poll() is None:
                endpoint = "metrics" if self.shares_ports else "gRPC" if answers else "HTTP"
                return False, (f"tritonserver{self._named()} (pid {self.process.pid}) has not answered on "
                               f"{endpoint} for {WEDGED_AFTER_S:.0f} s")

    def stop_after_stub_death(self):
        """Stop a server one of whose stubs died: let the healthy models drain and unload (their stubs
        exit), then kill it. The model whose stub died never unloads, so Triton would otherwise wait out
        the whole --exit-timeout-secs before exiting."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGINT)
            deadline = time.monotonic() + self.exit_timeout_s
            while self.model_stub_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self._remove_shm_regions()

