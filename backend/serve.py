"""Start the real Triton Inference Server on the model repository.

    python -m fusedresnet.backend.serve [--host 127.0.0.1] [--http-port 8000] [--processes-per-gpu 2] ...

Starts the `tritonserver` processes that `triton_install` finds and prepares, with the admin
token of `admin_token`, and supervises each of them and its Python-backend stubs (`stub_processes`):

- bound to 127.0.0.1 unless --host says otherwise;
- model control mode none; Triton's admin APIs (model repository, shared
  memory, statistics, trace, logging) require the admin token in the HTTP
  header `admin-key`, or over gRPC in the metadata key
  `triton-grpc-protocol-admin-key` (Triton prefixes it). The token comes from
  $FUSEDRESNET_ADMIN_TOKEN, or --admin-token-file; if neither exists a random
  token is written to build/admin-token (mode 0600). It is never printed;
- several server processes behind one port: `--processes-per-gpu N` tritonservers on each GPU (N
  on a host without a GPU), all listening on the same gRPC and HTTP ports (SO_REUSEPORT: the kernel
  hands each new connection to one of them), so the service grows past one process's gRPC front
  door and a crashed process costs a share of the capacity, not the service. Each process has its
  own metrics port (--metrics-port, +1, +2, ...), its own Python-backend shared-memory prefix and
  its own supervision; its readiness is read through its own metrics port (its models loaded and
  its endpoints started), since a probe on the shared port reaches whichever process the kernel
  picks. Default: DEFAULT_PROCESSES_PER_GPU on a GPU (docs/CONFIGURATION.md says how it was chosen),
  1 without one;
- every GPU the host has, unless `--gpus` names some (CUDA_VISIBLE_DEVICES of each process: one
  GPU per process);
- on a GPU, under a private CUDA MPS daemon (backend/cuda_mps.py) where the driver's
  nvidia-cuda-mps-control is found (`--mps auto`, the default: the layout measured best, docs/SERVING.md;
  without the daemon the launcher says so and serves without it); `--mps off`, `--mps on` (required);
- `--pinned-memory-pool-byte-size=0` when the host has no GPU (without it this
  Triton build returns empty outputs on CPU-only hosts);
- waits for readiness with a timeout; on failure it says why and shows the
  end of the server log. Ctrl-C stops the servers cleanly;
- supervises each process: this Triton build does not restart a Python-backend
  stub that died (the model stays "ready" while every request fails with "Stub
  process ... is not healthy"), and a client that abandons calls in flight can
  crash it (SIGSEGV in the gRPC frontend, or `sync.cc:105 ASSERTION FAILED: prior > 0` and
  SIGABRT, after which it may hang in its own abort handler with its endpoints still open).
  So the launcher restarts a process on the same ports, alone, when one of its stubs dies,
  when it prints a crash signal, when it exits without being asked to, or when it has not
  answered for WEDGED_AFTER_S (giving up in a crash loop: more than MAX_RESTARTS failures in a row,
  each within CRASH_LOOP_S of becoming ready),
  logging the cause (the stub, the signal or exit status, the server log's last lines). With
  --no-restart the first failure of any process stops them all and the launcher exits with
  status EXIT_STUB_DIED (3) or EXIT_SERVER_DIED (4), leaving the restart to an orchestrator;
  past the restart limit it exits with the same statuses.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .admin_token import DEFAULT_TOKEN_FILE, read_or_create_token
from .cuda_mps import MpsError, private_mps
from .front_end import FRONT_END_ENV, FRONT_ENDS, FrontEndChoice, choose_front_end
from .network import http_ready, port_is_free
from .prepared_stamp import STAMP_FILE
from .repository_copy import copy_repository, with_instances_divided
from .server_error import ServerError
from .spec import (
    AB_DISAGREEMENTS_DIR,
    AB_ROUTER_BACKEND,
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_HEADER,
    BUILD_DIR,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    MODEL_REPOSITORY,
    MODELS,
    PACKAGE_ROOT,
    RESTRICTED_APIS,
    model_config,
)
from .stub_processes import python_stubs
from .triton_install import (
    TritonInstallation,
    core_library_dir,
    find_triton,
    host_gpus,
    private_backend_tree,
)

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
# The in-process front end (backend/inprocess_server.py) crashes with Python's fatal-error report instead.
CRASH_LINE = re.compile(rb"Signal \((4|6|7|8|11)\) received|ASSERTION FAILED|"
                        rb"Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception|"
                        rb"Illegal instruction)")


def exit_cause(returncode: int) -> str:
    """How a process ended, in words: 'killed by SIGABRT (signal 6)' or 'exit status 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-returncode})"
    return f"exit status {returncode}"


def grpc_ready(grpc_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether Triton's gRPC endpoint answers ServerReady, over a connection of its own (a connection
    shared with earlier probes could hide a listener that accepts but no longer serves)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(grpc_url, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s).ready
        except grpc.RpcError:
            return False


def repository_models(repository: Path) -> list[str]:
    """The model entries of a model repository: its folders with a config.pbtxt."""
    return sorted(path.parent.name for path in Path(repository).glob("*/config.pbtxt"))


def repository_backends(repository: Path) -> dict[str, Path]:
    """The project's own C++ backends that the entries of a model repository name (`backend:` in config.pbtxt),
    each built now where missing (or found prebuilt): {"fusedresnet_ab": the A/B router's library} when an entry is
    the router (backend/ab_router_build.py), else nothing, so a server without the router neither imports nor
    builds it. A config that does not parse is Triton's to report when it loads it."""
    from google.protobuf import text_format

    def backend_of(entry: str) -> str:
        try:
            return model_config(entry, repository).backend
        except text_format.ParseError:
            return ""

    if not any(backend_of(entry) == AB_ROUTER_BACKEND for entry in repository_models(repository)):
        return {}
    from . import ab_router_build
    try:
        return {AB_ROUTER_BACKEND: ab_router_build.build()}
    except ab_router_build.RouterBuildError as error:
        raise ServerError(str(error)) from None


def metrics_list_models(metrics_url: str, models: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the Triton process behind `metrics_url` answers and has loaded every one of `models`.

    Triton starts its metrics service after its gRPC and HTTP endpoints, and lists a model's counters
    once the model is loaded: the readiness of one process, read through a port that is its own."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, http.client.HTTPException):   # HTTPException: a probe of a port
        # no one listens on yet can connect to itself (TCP self-connect in the ephemeral range) and read its request
        return False
    loaded = set(re.findall(r'^nv_inference_count\{[^}]*model="([^"]+)"', text, re.MULTILINE))
    return set(models) <= loaded


@dataclass
class TritonServer:
    """One tritonserver process; a context manager that starts it, waits for readiness and stops it.

    With `shares_ports` it listens on its gRPC and HTTP ports beside other processes (SO_REUSEPORT),
    and its readiness and liveness are read through its own metrics port."""

    model_repository: Path = MODEL_REPOSITORY
    host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    admin_token: str | None = None
    log_file: Path | None = None       # None: the server's output goes to this process's standard output
    exit_timeout_s: int = 30
    extra_args: list[str] = field(default_factory=list)
    use_gpu: bool | None = None        # None: detect
    gpus: str | None = None            # e.g. "0,1": the GPUs the server may use (None: all of them)
    mps_environment: dict | None = None  # CUDA MPS: the variables of the daemon its processes use (backend/cuda_mps.py)
    shares_ports: bool = False         # gRPC and HTTP ports shared with other processes (SO_REUSEPORT)
    label: str = ""                    # the process's name in a group, prefixed to its log lines ("gpu0.p1")
    # The front end asked for (--front-end: auto, inprocess, binary; $FUSEDRESNET_FRONT_END, else auto) and the one
    # it serves through, decided at its first start (backend/front_end.py).
    front_end: str = field(default_factory=lambda: os.environ.get(FRONT_END_ENV, "auto"))
    front_end_choice: FrontEndChoice | None = None
    client_shared_memory: bool = False  # clients may register shared-memory regions (in-process: off by default)
    truncate_log: bool = True          # the first start empties log_file (a group empties it once, itself)
    process: subprocess.Popen | None = None
    restarts: int = 0
    instance_stubs: set = field(default_factory=set)  # model instance names whose stubs the server started
    # The stubs' shared-memory regions are named <prefix><uuid> in /dev/shm; a killed Triton leaves them behind.
    shm_region_prefix: str = field(default_factory=lambda: f"fusedresnet_{secrets.token_hex(6)}_")
    crash_line: bytes | None = None    # the crash line Triton printed (CRASH_LINE), if any, since its start
    crashed: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)  # stop() was called: no failure, no restart
    timings: dict = field(default_factory=dict)  # monotonic times of the last start: started, ready
    models: list = field(default_factory=list)  # the repository's model entries when the process started

    @property
    def http_url(self) -> str:
        return f"{self._client_host()}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host()}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host()}:{self.metrics_port}/metrics"

    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def command(self, triton: TritonInstallation, backends: Path) -> list[str]:
        restricted = ",".join(RESTRICTED_APIS)
        if self.inprocess:
            executable = [sys.executable, "-m", "fusedresnet.backend.inprocess_server",
                          f"--allow-client-shm={str(self.client_shared_memory).lower()}"]
        else:
            executable = [str(triton.binary)]   # Triton 2.51 lets every client register regions (with the token)
        args = [
            *executable,
            f"--model-repository={Path(self.model_repository).resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={triton.home / 'caches'}",
            "--model-control-mode=none",
            f"--model-load-thread-count={MODEL_LOAD_THREADS}",
            # Both configs are complete; without auto-complete the Python backend starts no short-lived
            # stubs at load, so every stub of the server is a model instance to supervise.
            "--disable-auto-complete-config",
            f"--backend-config=python,{SHM_PREFIX_OPTION}={self.shm_region_prefix}",
            f"--backend-config={AB_ROUTER_BACKEND},disagreements-dir={AB_DISAGREEMENTS_DIR}",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--http-address={self.host}", f"--http-port={self.http_port}",
            f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
            f"--http-restricted-api={restricted}:{ADMIN_TOKEN_HEADER}={self.admin_token}",
            f"--grpc-restricted-protocol={restricted}:{ADMIN_TOKEN_HEADER}={self.admin_token}",
        ]
        if self.shares_ports:
            args += ["--reuse-grpc-port=true", "--reuse-http-port=true"]
        if not self.use_gpu:
            args.append("--pinned-memory-pool-byte-size=0")
        return args + list(self.extra_args)

    @property
    def inprocess(self) -> bool:
        return self.front_end_choice is not None and self.front_end_choice.name == "inprocess"

    def resolve_front_end(self, triton: TritonInstallation) -> FrontEndChoice:
        """What this process serves through (decided once): a ServerError where `inprocess` cannot serve here."""
        if self.front_end_choice is None:
            try:
                self.front_end_choice = choose_front_end(self.front_end, self.environment(triton, inprocess=True),
                                                         self.client_shared_memory)
            except ValueError as error:
                raise ServerError(str(error)) from None
        return self.front_end_choice

    def environment(self, triton: TritonInstallation, inprocess: bool | None = None) -> dict:
        env = dict(os.environ)
        # The stub embeds libpython and takes its packages from the first python3 on PATH:
        # make that this interpreter (the project's virtual environment).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libdirs = [str(d) for d in triton.library_dirs]
        if self.inprocess if inprocess is None else inprocess:
            libdirs.insert(0, str(core_library_dir(triton)))   # the tritonfrontend library's libtritonserver.so
        libpython_dir = sysconfig.get_config_var("LIBDIR")
        if libpython_dir:
            libdirs.append(libpython_dir)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
        if PACKAGE_ROOT.name == "fusedresnet":
            # A regular (not editable) install: tell the stub where this interpreter found the package.
            search_path = [str(PACKAGE_ROOT.parent), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(search_path).rstrip(os.pathsep)
        env.setdefault("CUPY_CACHE_DIR", str(BUILD_DIR / "cupy-cache"))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.pop(ADMIN_TOKEN_ENV, None)  # the models have no use for it
        if not self.use_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # indices as nvidia-smi numbers the GPUs (checked in start)
        if self.use_gpu and self.mps_environment:
            env.update(self.mps_environment)
        return env

    def check_gpus(self):
        """Decide use_gpu (None: whether the host has a GPU) and refuse GPUs the host does not have."""
        gpus = host_gpus()
        if self.use_gpu is None:
            self.use_gpu = bool(gpus)
        if self.gpus is not None:
            unknown = [item for item in self.gpus.split(",")
                       if not any(line.startswith(f"GPU {item}:") or f"UUID: {item})" in line for line in gpus)]
            if not self.use_gpu or unknown:
                raise ServerError(f"--gpus {self.gpus}: no such GPU ({', '.join(unknown) or 'no GPU in use'}); "
                                  f"this host has: {'; '.join(gpus) or 'no GPU'}")

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> TritonServer:
        if not self.restarts:
            self.stopping.clear()
            self.check_gpus()       # nvidia-smi: once (about 0.4 s on the H100 host, off every restart's time)
        if self.admin_token is None:
            self.admin_token = read_or_create_token()
        project_models = [model for model in MODELS if Path(self.model_repository, model).is_dir()]
        if project_models and not Path(self.model_repository, STAMP_FILE).is_file():
            raise ServerError(f"{self.model_repository} is not prepared: run `make prepare` "
                              "(python -m fusedresnet.backend.prepare) first")
        triton = find_triton()
        self.resolve_front_end(triton)
        backends = private_backend_tree(triton, repository_backends(self.model_repository))
        if self.log_file:
            Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
            if self.truncate_log and not self.restarts:
                Path(self.log_file).write_bytes(b"")
        self.timings = {"started": time.monotonic()}
        self.models = repository_models(self.model_repository)
        self.process = subprocess.Popen(self.command(triton, backends), env=self.environment(triton),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        # after the new process is in place: the last lines of a killed one are no crash of this one
        self.crash_line = None
        self.crashed.clear()
        threading.Thread(target=self._copy_output, args=(self.process,), daemon=True,
                         name=f"triton-output-{self.label or self.process.pid}").start()
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self._terminate()
            raise
        self.timings["ready"] = time.monotonic()
        return self

    def _copy_output(self, process: subprocess.Popen):
        """Copy the server's output, line by line, to its log file (or standard output), and note a crash line."""
        prefix = f"[{self.label}] ".encode() if self.label else b""
        sink = open(self.log_file, "ab", buffering=0) if self.log_file else None
        try:
            for line in iter(process.stdout.readline, b""):
                if sink is not None:
                    sink.write(prefix + line)       # one write per line: lines of several processes stay whole
                else:
                    sys.stdout.buffer.write(prefix + line)
                    sys.stdout.buffer.flush()
                if self.crash_line is None and process is self.process and CRASH_LINE.search(line):
                    self.crash_line = line.strip()
                    self.crashed.set()
        except (OSError, ValueError):
            pass                                    # our own output closed: the server's ends with it
        finally:
            process.stdout.close()
            if sink is not None:
                sink.close()

    def is_ready(self) -> bool:
        """Ready: for a process of its own ports, Triton's readiness on them; for one that shares them, its
        models loaded and its endpoints up, read from its own metrics port (metrics_list_models)."""
        if self.shares_ports:
            return metrics_list_models(self.metrics_url, self.models)
        return http_ready(self.http_url)

    def wait_ready(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        self.instance_stubs = set()
        while time.monotonic() < deadline:
            if self.stopping.is_set():      # stop() from another thread (a group stopped while it starts)
                raise ServerError(f"tritonserver{self._named()} stopped while it started")
            if self.process.poll() is not None:
                self.process.wait()
                raise ServerError(f"tritonserver{self._named()} exited with code {self.process.returncode} "
                                  "before it was ready" + self._log_tail())
            # Note the model instances' stubs while the models load (each lives for seconds before
            # the server is ready), so a stub killed right after readiness is still missed later.
            self.instance_stubs |= set(self.model_stub_pids())
            if self.is_ready():
                return
            time.sleep(0.1)
        raise ServerError(f"tritonserver{self._named()} was not ready after {timeout_s:.0f} s" + self._log_tail())

    def _named(self) -> str:
        return f" {self.label}" if self.label else ""

    def _log_tail(self, lines: int = 40) -> str:
        if not self.log_file or not Path(self.log_file).is_file():
            return ""
        text = Path(self.log_file).read_text(errors="replace").splitlines()
        if self.label:
            text = [line for line in text if line.startswith(f"[{self.label}] ")]
        return f"\n--- last lines of {self.log_file}{self._named()} ---\n" + "\n".join(text[-lines:])

    def model_stub_pids(self) -> dict[str, int]:
        """Model instance name (e.g. resnet18_custom_0_0) -> pid, for each live Python-backend stub of this server."""
        if self.process is None or self.process.poll() is not None:
            return {}
        return {instance: stub.pid for instance, stub in python_stubs(self.process.pid).items()}

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

    def kill(self):
        """SIGKILL the server's process group (the server and its stubs) and remove what it leaves behind."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self._remove_shm_regions()

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

    def stop(self):
        """SIGINT (Triton drains for up to --exit-timeout-secs), then SIGKILL if it still runs."""
        self.stopping.set()
        self._terminate()

    def _terminate(self):
        if self.process is None or self.process.poll() is not None:
            self._remove_shm_regions()
            return
        try:
            os.killpg(self.process.pid, signal.SIGINT)
            self.process.wait(timeout=self.exit_timeout_s + 15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
        self._remove_shm_regions()

    @property
    def shm_regions(self) -> list[str]:
        """The shared-memory regions of this server's stubs that exist now."""
        return [path.name for path in shm_region_paths(self.shm_region_prefix)]

    def _remove_shm_regions(self):
        """A killed Triton leaves its stubs' shared-memory regions in /dev/shm (a clean exit removes them)."""
        for region in self.shm_regions:
            Path("/dev/shm", region).unlink(missing_ok=True)

    def __enter__(self):
        return self.start() if self.process is None else self

    def __exit__(self, *exc):
        self.stop()


@dataclass
class ServerGroup:
    """The launcher's tritonserver processes: `processes_per_gpu` on each GPU (that many on a host without
    one), all on the same gRPC and HTTP ports when there are several, each with its own metrics port
    (metrics_port + its index). Started together, supervised one by one, stopped together."""

    servers: list[TritonServer]

    @classmethod
    def plan(cls, processes_per_gpu: int, gpus: str | None, use_gpu: bool, metrics_port: int,
             log_file: Path | None = None, **server) -> ServerGroup:
        """The processes for these GPUs ("0,1"; None: every GPU of the host) and server settings."""
        if processes_per_gpu < 1:
            raise ServerError(f"--processes-per-gpu must be at least 1, not {processes_per_gpu}")
        devices = (gpus.split(",") if gpus else [str(i) for i in range(len(host_gpus()))]) if use_gpu else [None]
        layout = [(device, k) for device in devices for k in range(processes_per_gpu)]
        shares_ports = len(layout) > 1
        servers = []
        for index, (device, k) in enumerate(layout):
            label = "" if not shares_ports else f"gpu{device}.p{k}" if device is not None else f"p{k}"
            servers.append(TritonServer(**server, metrics_port=metrics_port + index, log_file=log_file,
                                        use_gpu=use_gpu, gpus=device if gpus or shares_ports else None,
                                        shares_ports=shares_ports, label=label, truncate_log=not shares_ports))
        return cls(servers)

    first = property(lambda self: self.servers[0])
    http_url = property(lambda self: self.first.http_url)
    grpc_url = property(lambda self: self.first.grpc_url)
    # every process's metrics, comma-separated (loadtest/triton_metrics.scrape sums them)
    metrics_url = property(lambda self: ",".join(server.metrics_url for server in self.servers))

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> ServerGroup:
        first = self.first
        if len(self.servers) > 1:
            # SO_REUSEPORT would let these processes join another server already on the ports: refuse that.
            taken = [port for port in (first.http_port, first.grpc_port) if not port_is_free(port, first.host)]
            taken += [s.metrics_port for s in self.servers if not port_is_free(s.metrics_port, s.host)]
            if taken:
                raise ServerError(f"port(s) {', '.join(map(str, taken))} on {first.host} already in use")
            if first.log_file:
                Path(first.log_file).parent.mkdir(parents=True, exist_ok=True)
                Path(first.log_file).write_bytes(b"")
        if first.admin_token is None:
            token = read_or_create_token()
            for server in self.servers:
                server.admin_token = token
        failures: list[BaseException] = []

        def start_one(server: TritonServer):
            try:
                server.start(ready_timeout_s)
            except BaseException as error:   # noqa: BLE001 - reported below, with the others stopped
                failures.append(error)

        threads = [threading.Thread(target=start_one, args=(server,)) for server in self.servers]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:             # Ctrl-C while the processes start: none may outlive the launcher
            while any(thread.is_alive() for thread in threads):
                for server in self.servers:
                    server.stopping.set()   # again each time: a start that had not begun clears it
                for thread in threads:
                    thread.join(timeout=0.1)
            self.stop()
            raise
        if failures:
            self.stop()
            raise failures[0]
        return self

    def supervise(self, restart: bool = True, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> int:
        """Supervise every process (TritonServer.supervise, each in a thread of its own: a restart of one
        leaves the others serving). Returns the first status a process's supervision gives up with
        (with restart=False: its first failure), once every process is stopped."""
        statuses: queue.Queue = queue.Queue()

        def watch(server: TritonServer):
            try:
                statuses.put(server.supervise(restart=restart, ready_timeout_s=ready_timeout_s))
            except ServerError as error:        # a restart that did not become ready (or was stopped)
                if not server.stopping.is_set():
                    print(f"fusedresnet: {error}", file=sys.stderr, flush=True)
                statuses.put(EXIT_SERVER_DIED)

        for server in self.servers:
            threading.Thread(target=watch, args=(server,), daemon=True, name=f"supervise-{server.label}").start()
        while True:
            try:
                status = statuses.get(timeout=0.5)   # a timeout, so that Ctrl-C reaches this thread
                break
            except queue.Empty:
                continue
        self.stop()
        return status

    def stop(self):
        threads = [threading.Thread(target=server.stop) for server in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def choose_front_end(self, requested: str, client_shared_memory: bool = False) -> FrontEndChoice:
        """Serve through the front end that --front-end `requested` gives here (backend/front_end.py), said in one
        line; a ServerError where `inprocess` was asked for and cannot serve."""
        self.first.front_end, self.first.client_shared_memory = requested, client_shared_memory
        choice = self.first.resolve_front_end(find_triton())
        for server in self.servers:
            server.front_end, server.front_end_choice = requested, choice
            server.client_shared_memory = client_shared_memory
        print(choice.line(), file=sys.stderr, flush=True)
        return choice

    def use_mps(self, choice: str, folder: Path, resources: contextlib.ExitStack):
        """Put the processes under a private CUDA MPS daemon (its pipes under `folder`, stopped when `resources`
        closes) as --mps `choice` says: on (ServerError where it cannot run), auto (on a GPU host, where the daemon
        starts; else a line says why not), off."""
        use_gpu = self.first.use_gpu
        if choice == "off" or (choice == "auto" and not use_gpu):
            return
        if not use_gpu:
            raise ServerError("--mps: no GPU on this host (CUDA MPS shares a GPU among processes)")
        try:
            environment = resources.enter_context(private_mps(folder))
        except MpsError as error:
            if choice == "on":
                raise ServerError(f"--mps: {error}") from error
            print(f"fusedresnet: CUDA MPS off (--mps auto): {error}", file=sys.stderr, flush=True)
            return
        for server in self.servers:
            server.mps_environment = environment

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


INSTANCES_PER = ("process", "gpu")   # --instances: what a model's configured instance count is per


def gpu_list(text: str) -> str:
    """argparse type of --gpus: comma-separated device indices or GPU UUIDs, as CUDA_VISIBLE_DEVICES takes them."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() or item.startswith("GPU-") for item in items) or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices or UUIDs separated by commas, got {text!r}")
    return ",".join(items)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


MPS_CHOICES = ("auto", "on", "off")
SHM_PREFIX_OPTION = "shm-region-prefix-name"   # the Python backend's option: the prefix of its stubs' regions


def shm_region_paths(prefix: str) -> list[Path]:
    """The shared-memory regions (files of /dev/shm) whose names start with `prefix`."""
    return sorted(Path("/dev/shm").glob(f"{prefix}*"))


def shm_prefix_of(command: list[str]) -> str | None:
    """The Python backend's region prefix in a tritonserver command line (TritonServer.command sets it)."""
    return next((arg.split(f"{SHM_PREFIX_OPTION}=", 1)[1] for arg in command if f"{SHM_PREFIX_OPTION}=" in arg),
                None)


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes the service)")
    parser.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="metrics of the first server process; the next ones use the ports after it")
    parser.add_argument("--processes-per-gpu", type=positive_int,
                        help=f"tritonserver processes on each GPU, all on the same gRPC and HTTP ports (default "
                             f"{DEFAULT_PROCESSES_PER_GPU} with a GPU, 1 without one: that many on the CPU)")
    parser.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--instances", choices=INSTANCES_PER, default="process",
                        help="what each model's configured instance count is per: each process (default), or each "
                             "GPU, divided among its processes (rounded up; fewer stubs for a restart to start)")
    parser.add_argument("--admin-token-file", type=Path,
                        help=f"file holding the admin token (default: ${ADMIN_TOKEN_ENV}, else {DEFAULT_TOKEN_FILE})")
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S)
    parser.add_argument("--exit-timeout", type=int, default=30, help="seconds to drain in-flight requests on stop")
    parser.add_argument("--log-file", type=Path, help="write the server log here instead of the terminal (several "
                                                      "processes: one file, each line prefixed with its process)")
    parser.add_argument("--no-restart", action="store_true",
                        help=f"when a model's Python stub dies, stop and exit with status {EXIT_STUB_DIED}; when "
                             f"a tritonserver exits, crashes or hangs, exit with status {EXIT_SERVER_DIED}; instead of "
                             "restarting it (for an orchestrator that restarts the service)")
    parser.add_argument("--gpus", type=gpu_list,
                        help="GPUs to serve on, e.g. 0 or 0,1 (default: all); each GPU gets --processes-per-gpu "
                             "processes, each with the models' configured instance counts")
    parser.add_argument("--mps", nargs="?", choices=MPS_CHOICES, const="on", default="auto",
                        help="run the server's processes under a private CUDA MPS daemon (the model instances' "
                             "kernels share the GPU instead of time-slicing it: 2 processes per GPU serve 1.9-2.0x one "
                             "over gRPC under MPS, 1.2-1.6x without, docs/SERVING.md). auto (default): on a GPU host "
                             "where nvidia-cuda-mps-control is found, else off, said in one line; on (or --mps alone): "
                             "refused without a GPU or the daemon; off")
    parser.add_argument("--front-end", choices=FRONT_ENDS, default=os.environ.get(FRONT_END_ENV, "auto"),
                        help=f"what serves gRPC, HTTP and metrics (default ${FRONT_END_ENV}, else auto): auto: Triton "
                             "2.73's frontends in-process on the 2.51 core where they load (CPython 3.12, glibc "
                             "2.38+, the tritonfrontend wheel), "
                             "else the tritonserver 2.51 binary, said in one line at start; inprocess (refused where "
                             "it does not load); binary")
    parser.add_argument("--client-shared-memory", action="store_true",
                        help="let clients on this host register system and CUDA shared-memory regions (the admin "
                             "token still guards registration): one process per GPU, since a region registered "
                             "through one process is unknown to the others on the shared port; served through the "
                             "tritonserver binary (CUDA regions do not register through the in-process frontends; "
                             "with --front-end inprocess: system regions only)")
    parser.add_argument("triton_args", nargs="*", help="extra server flags, after -- (the in-process front end takes "
                                                       "the tritonserver flags that backend/inprocess_server.py lists)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    use_gpu = bool(host_gpus())
    if args.client_shared_memory and (args.processes_per_gpu or 1) > 1:
        print("fusedresnet: --client-shared-memory serves one process per GPU: a region registered through one "
              "process is unknown to the others behind the shared port", file=sys.stderr)
        return 1
    per_gpu = args.processes_per_gpu or (DEFAULT_PROCESSES_PER_GPU if use_gpu and not args.client_shared_memory
                                         else 1)
    repository = args.model_repository
    if args.instances == "gpu" and per_gpu > 1:
        # the configured count is the GPU's: each process starts its share of the stubs, so a restarted process
        # imports and makes CUDA contexts for fewer of them (results/recovery.md)
        repository = copy_repository(repository, BUILD_DIR / f"model-repository-{args.http_port}",
                                     edit=with_instances_divided(per_gpu))
    try:
        group = ServerGroup.plan(per_gpu, args.gpus if use_gpu else None, use_gpu, args.metrics_port,
                                 log_file=args.log_file, model_repository=repository, host=args.host,
                                 http_port=args.http_port, grpc_port=args.grpc_port,
                                 admin_token=read_or_create_token(args.admin_token_file),
                                 exit_timeout_s=args.exit_timeout, extra_args=args.triton_args)
        if args.gpus and not use_gpu:
            group.first.gpus = args.gpus
            group.first.check_gpus()     # says the host has no GPU
        group.choose_front_end(args.front_end, args.client_shared_memory)
    except ServerError as error:
        print(f"fusedresnet: {error}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    # also when started with SIGINT ignored (a background job of a non-interactive shell): SIGINT stops it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.ExitStack() as resources:
        try:
            group.use_mps(args.mps, BUILD_DIR / f"cuda-mps-{args.http_port}", resources)
        except ServerError as error:
            print(f"fusedresnet: {error}", file=sys.stderr)
            return 1
        return _serve(group, args)


def _serve(group: ServerGroup, args) -> int:
    try:
        group.start(args.ready_timeout)
        first = group.first
        if not first.use_gpu:
            devices = "CPU only"
        else:
            devices = f"GPUs {args.gpus or 'all'}"
        if len(group.servers) > 1:
            devices += f", {len(group.servers)} server processes on the shared ports"
        if first.mps_environment:
            devices += f", CUDA MPS: CUDA_MPS_PIPE_DIRECTORY={first.mps_environment['CUDA_MPS_PIPE_DIRECTORY']}"
        print(f"{READY_LINE} gRPC {group.grpc_url}, HTTP {group.http_url}, "
              f"metrics {', '.join(s.metrics_url for s in group.servers)} ({devices}); Ctrl-C stops it", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"fusedresnet: listening on {args.host}: inference is open to anyone who can reach these ports; "
                  "the admin APIs need the admin token", flush=True)
        return group.supervise(restart=not args.no_restart, ready_timeout_s=args.ready_timeout)
    except KeyboardInterrupt:
        print("fusedresnet: stopping Triton", flush=True)
        return 0
    except ServerError as error:
        print(f"fusedresnet: {error}", file=sys.stderr)
        return 1
    finally:
        group.stop()


if __name__ == "__main__":
    sys.exit(main())
