"""The launcher (`python -m fusedresnet.backend.serve`) in a subprocess, as a user runs it (LaunchedServer): the
command-line form of `launch(settings)`, its arguments `settings.cli_args()`; what the campaigns and the tests that
need the launcher itself (its restarts, its processes, its exit statuses) start.

Free loopback ports (HTTP, gRPC, and a run of consecutive metrics ports, one per tritonserver process of
--processes-per-gpu), the admin token in the environment (or the launcher's own resolution), the launcher's
output in a file of its own and Triton's log in another, optionally pinned to cores (the launcher, Triton and
its stubs inherit them). Ready once the launcher printed backend.serve.READY_LINE and HTTP answers. Stopped with
Ctrl-C (the launcher stops Triton, which drains), then SIGKILL to whatever is left: the launcher, and the
process group of each tritonserver it ran (Triton runs in a session of its own and would outlive it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from ..network import http_ready, server_ports
from ..spec import ADMIN_TOKEN_ENV, DEFAULT_HOST, metrics_url
from .launch import ServerSettings
from .settings import DEFAULT_READY_TIMEOUT_S, READY_LINE
from .stub_processes import SERVER_BINARY, live_children, python_stubs, tree_cpu_seconds, tritonserver_of


def metrics_url_of(port: int) -> str:
    return metrics_url(DEFAULT_HOST, port)


class LaunchedServer:
    """`python -m fusedresnet.backend.serve *settings.cli_args()` in a subprocess of its own session, on free
    loopback ports (they replace the settings' ports).

    settings.admin_token: put in the launcher's environment ($FUSEDRESNET_ADMIN_TOKEN); None: the variable is
    removed and the launcher resolves the token itself (settings.admin_token_file, or build/admin-token).
    settings.processes_per_gpu (None: the launcher's default) metrics ports are reserved per GPU named in
    settings.gpus (one when none is named). The metrics ports of a server that runs more processes than reserved
    are read from its ready line. settings.log_file: Triton's log (None: beside output_file, .log).
    What only a subprocess has: output_file (the launcher's own output), env (added to this process's), cwd,
    cores (the launcher's CPU affinity), stop_timeout_s (how long stop() waits for the launcher before SIGKILL;
    default settings.exit_timeout_s + 60), ready_line (what the launcher prints when ready; None: HTTP alone
    tells, for a launcher of earlier code)."""

    def __init__(self, settings: ServerSettings, output_file: Path, *, env: dict | None = None,
                 cwd: Path | None = None, cores: Iterable[int] | None = None, stop_timeout_s: float | None = None,
                 ready_line: str | None = READY_LINE):
        self.output_file = Path(output_file)
        self.env, self.cwd, self.ready_line = dict(env or {}), cwd, ready_line
        self.cores = sorted(cores) if cores is not None else None
        gpus = settings.gpus
        reserved = (settings.processes_per_gpu or 1) * (len(gpus.split(",")) if gpus else 1)
        http_port, grpc_port, metrics_port = server_ports(reserved)
        self.settings = settings.replace(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                         log_file=Path(settings.log_file or self.output_file.with_suffix(".log")))
        self.stop_timeout_s = stop_timeout_s if stop_timeout_s is not None else settings.exit_timeout_s + 60
        self.metrics_ports = [metrics_port + i for i in range(reserved)]
        self.process: subprocess.Popen | None = None
        self.started: float | None = None     # time.monotonic() at the launcher's start
        self.ready_s: float | None = None     # its start to ready

    http_port = property(lambda self: self.settings.http_port)
    grpc_port = property(lambda self: self.settings.grpc_port)
    metrics_port = property(lambda self: self.settings.metrics_port)
    log_file = property(lambda self: self.settings.log_file)
    admin_token = property(lambda self: self.settings.admin_token)
    exit_timeout_s = property(lambda self: self.settings.exit_timeout_s)
    http_url = property(lambda self: f"{DEFAULT_HOST}:{self.http_port}")
    grpc_url = property(lambda self: f"{DEFAULT_HOST}:{self.grpc_port}")
    url = grpc_url
    # every process's metrics, comma-separated: triton_metrics.scrape sums them
    metrics_url = property(lambda self: ",".join(metrics_url_of(port) for port in self.metrics_ports))

    def command(self) -> list[str]:
        """The launcher's command line: its settings' arguments."""
        return [sys.executable, "-m", "fusedresnet.backend.serve", *self.settings.cli_args()]

    def start(self, ready_timeout_s: float | None = DEFAULT_READY_TIMEOUT_S) -> LaunchedServer:
        """Start the launcher; with a timeout, wait until it is ready (else stop it and raise RuntimeError)."""
        env = dict(os.environ)
        env.pop(ADMIN_TOKEN_ENV, None)
        if self.admin_token is not None:
            env[ADMIN_TOKEN_ENV] = self.admin_token
        env.update(self.env)
        inherited = os.sched_getaffinity(0)
        if self.cores is not None:
            os.sched_setaffinity(0, self.cores)    # the launcher, Triton and its stubs inherit them
        try:
            with open(self.output_file, "wb") as output:   # the child's alone: this process closes its copy
                self.process = subprocess.Popen(self.command(), env=env, cwd=self.cwd, stdout=output,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.sched_setaffinity(0, inherited)
        self.started = time.monotonic()
        if ready_timeout_s is not None:
            self.wait_ready(ready_timeout_s)
        return self

    def wait_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> LaunchedServer:
        """Until the launcher printed its ready line and HTTP answers: the launcher itself has seen Triton ready (a
        caller that kills Triton before the launcher's own readiness poll would see a failed start, not a
        restart). The metrics ports are then those of its ready line."""
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and not self.launcher_ready():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if self.process.poll() is not None or not self.launcher_ready():
            self.stop()
            log = self.log_file.read_text(errors="replace")[-3000:] if self.log_file.is_file() else ""
            raise RuntimeError(f"launcher not ready:\n{self.output()[-3000:]}\n{log}")
        self.ready_s = time.monotonic() - self.started
        line = next((line for line in self.output().splitlines() if READY_LINE in line), "")
        ports = [int(port) for port in re.findall(r"http://[\d.]+:(\d+)/metrics", line)]
        if ports:
            self.metrics_ports = ports
        return self

    def launcher_ready(self) -> bool:
        return (self.ready_line is None or self.ready_line in self.output()) and self.ready()

    def output(self) -> str:
        return self.output_file.read_text(errors="replace") if self.output_file.is_file() else ""

    def ready(self) -> bool:
        return http_ready(self.http_url)

    def server_pid(self) -> int | None:
        """pid of the (first) tritonserver that the launcher runs now (it changes when the launcher restarts it)."""
        server = tritonserver_of(self.process.pid) if self.process is not None else None
        return server.pid if server is not None else None

    def server_pids(self) -> dict[int, int]:
        """metrics port -> pid of the tritonserver the launcher runs on it now (for every process alive)."""
        if self.process is None:
            return {}
        found = {}
        for server in live_children(self.process.pid, SERVER_BINARY):
            try:
                port = next(int(arg.split("=", 1)[1]) for arg in server.cmdline() if arg.startswith("--metrics-port="))
            except (psutil.NoSuchProcess, StopIteration):
                continue
            found[port] = server.pid
        return found

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds (user + system) of the launcher's process tree (launcher, tritonservers, their stubs) and of
        the tritonservers among them, so far: sampled around a window, the server's CPU over it."""
        return tree_cpu_seconds(psutil.Process(self.process.pid)) if self.process is not None else (0.0, 0.0)

    def stub_pids(self) -> dict[str, int]:
        """Model instance name -> pid of each live Python-backend stub of the (first) tritonserver."""
        server_pid = self.server_pid()
        return {instance: stub.pid for instance, stub in python_stubs(server_pid).items()} if server_pid else {}

    def stop(self, timeout_s: float | None = None):
        """Ctrl-C to the launcher (it stops Triton, which drains); SIGKILL for whatever is left after the timeout:
        the launcher and each tritonserver's process group."""
        if self.process is None:
            return
        server_pids = list(self.server_pids().values())
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout_s or self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for server_pid in server_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server_pid, signal.SIGKILL)   # tritonserver runs in its own session (pgid == pid)

    def __enter__(self):
        return self.start() if self.process is None else self

    def __exit__(self, *exc):
        self.stop()
