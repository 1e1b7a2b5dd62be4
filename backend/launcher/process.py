"""One tritonserver process (TritonServer): its command line and environment, its start and readiness, its output
and crash line, its stop; the supervision of its failures and restarts is the Supervision it inherits
(supervisor.py)."""


from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..admin_token import read_or_create_token
from ..network import http_ready
from ..repository.prepared_stamp import STAMP_FILE
from ..server_error import ServerError
from ..spec import (
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
    metrics_url,
)
from ..triton_server.front_end import FRONT_END_ENV, FrontEndChoice, choose_front_end
from ..triton_server.installation import (
    TritonInstallation,
    core_library_dir,
    find_triton,
    host_gpus,
    private_backend_tree,
)
from .health import metrics_list_models
from .repository import repository_backends, repository_models
from .settings import (
    CRASH_LINE,
    DEFAULT_READY_TIMEOUT_S,
    MODEL_LOAD_THREADS,
    SHM_PREFIX_OPTION,
    shm_region_paths,
)
from .stub_processes import python_stubs
from .supervisor import Supervision


@dataclass
class TritonServer(Supervision):
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
    # it serves through, decided at its first start (backend/triton_server/front_end.py).
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
        return metrics_url(self._client_host(), self.metrics_port)

    def _client_host(self) -> str:
        return DEFAULT_HOST if self.host in ("0.0.0.0", "::", "") else self.host

    def command(self, triton: TritonInstallation, backends: Path) -> list[str]:
        restricted = ",".join(RESTRICTED_APIS)
        if self.inprocess:
            executable = [sys.executable, "-m", "fusedresnet.backend.triton_server.inprocess_server",
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
                              "(python -m fusedresnet.backend.repository.prepare) first")
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
        """Ready: for a process that shares its ports, its models loaded and its endpoints up, read from its own
        metrics port (metrics_list_models); for a process of its own ports, Triton's readiness on them (which
        honours --strict-readiness) and its metrics service answering: Triton starts that last, so a caller told
        "ready" can read the metrics at once."""
        if self.shares_ports:
            return metrics_list_models(self.metrics_url, self.models)
        return http_ready(self.http_url) and metrics_list_models(self.metrics_url, [])

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

