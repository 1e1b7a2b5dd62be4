"""Start the real Triton Inference Server on the model repository.

    python -m fusedresnet.backend.serve [--host 127.0.0.1] [--http-port 8000] ...

Starts the `tritonserver` that `triton_install` finds and prepares, with the admin
token of `admin_token`, and supervises its Python-backend stubs (`stub_processes`):

- bound to 127.0.0.1 unless --host says otherwise;
- model control mode none; Triton's admin APIs (model repository, shared
  memory, statistics, trace, logging) require the admin token in the HTTP
  header `admin-key`, or over gRPC in the metadata key
  `triton-grpc-protocol-admin-key` (Triton prefixes it). The token comes from
  $FUSEDRESNET_ADMIN_TOKEN, or --admin-token-file; if neither exists a random
  token is written to build/admin-token (mode 0600). It is never printed;
- every GPU the host has, unless `--gpus` names some (CUDA_VISIBLE_DEVICES of the
  server; with `KIND_AUTO` each model gets its `count` of instances on every one);
- `--pinned-memory-pool-byte-size=0` when the host has no GPU (without it this
  Triton build returns empty outputs on CPU-only hosts);
- waits for readiness with a timeout; on failure it says why and shows the
  end of the server log. Ctrl-C stops the server cleanly;
- supervises the server: this Triton build does not restart a Python-backend
  stub that died (the model stays "ready" while every request fails with "Stub
  process ... is not healthy"), and a client that abandons calls in flight can
  abort it (`sync.cc:105 ASSERTION FAILED: prior > 0`, after which it may hang
  in its own abort handler with the HTTP endpoint still answering). So the
  launcher restarts the server on the same ports when a stub dies, when
  tritonserver exits without being asked to, or when its gRPC or HTTP endpoint
  has not answered for WEDGED_AFTER_S (at most MAX_RESTARTS within
  RESTART_WINDOW_S), logging the cause (the stub, the signal or exit status, the
  server log's last lines). With --no-restart it stops and exits with status
  EXIT_STUB_DIED (3) or EXIT_SERVER_DIED (4) and leaves the restart to an
  orchestrator; past the restart limit it exits with the same statuses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from .admin_token import DEFAULT_TOKEN_FILE, read_or_create_token
from .cuda_mps import MpsError, private_mps
from .network import http_ready
from .prepared_stamp import STAMP_FILE
from .spec import (
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
)
from .stub_processes import python_stubs
from .triton_install import ServerError, TritonInstallation, find_triton, host_gpus, private_backend_tree

DEFAULT_READY_TIMEOUT_S = 300.0
MAX_RESTARTS, RESTART_WINDOW_S = 3, 600.0
EXIT_STUB_DIED = 3          # a model's Python stub died (and --no-restart, or too many restarts)
EXIT_SERVER_DIED = 4        # tritonserver exited or stopped answering without being asked to (idem)
WEDGED_AFTER_S = 20.0       # an endpoint unanswered this long (probes every poll) means a hung server
PROBE_TIMEOUT_S = 5.0
LOG_LINES_ON_FAILURE = 20
# what the launcher prints once Triton is ready: at start (then the addresses) and after each restart
READY_LINE, READY_AGAIN_LINE = "fusedresnet: Triton ready on", "fusedresnet: Triton ready again"


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


@dataclass
class TritonServer:
    """One tritonserver process; a context manager that starts it, waits for readiness and stops it."""

    model_repository: Path = MODEL_REPOSITORY
    host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    admin_token: str | None = None
    log_file: Path | None = None       # None: the server's output goes to this terminal
    exit_timeout_s: int = 30
    extra_args: list[str] = field(default_factory=list)
    use_gpu: bool | None = None        # None: detect
    gpus: str | None = None            # e.g. "0,1": the GPUs the server may use (None: all of them)
    mps_environment: dict | None = None  # CUDA MPS: the variables of the daemon its processes use (backend/cuda_mps.py)
    process: subprocess.Popen | None = None
    restarts: int = 0
    instance_stubs: set = field(default_factory=set)  # model instance names whose stubs the server started
    # The stubs' shared-memory regions are named <prefix><uuid> in /dev/shm; a killed Triton leaves them behind.
    shm_region_prefix: str = field(default_factory=lambda: f"fusedresnet_{secrets.token_hex(6)}_")

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
        args = [
            str(triton.binary),
            f"--model-repository={Path(self.model_repository).resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={triton.home / 'caches'}",
            "--model-control-mode=none",
            # Both configs are complete; without auto-complete the Python backend starts no short-lived
            # stubs at load, so every stub of the server is a model instance to supervise.
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name={self.shm_region_prefix}",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--http-address={self.host}", f"--http-port={self.http_port}",
            f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
            f"--http-restricted-api={restricted}:{ADMIN_TOKEN_HEADER}={self.admin_token}",
            f"--grpc-restricted-protocol={restricted}:{ADMIN_TOKEN_HEADER}={self.admin_token}",
        ]
        if not self.use_gpu:
            args.append("--pinned-memory-pool-byte-size=0")
        return args + list(self.extra_args)

    def environment(self, triton: TritonInstallation) -> dict:
        env = dict(os.environ)
        # The stub embeds libpython and takes its packages from the first python3 on PATH:
        # make that this interpreter (the project's virtual environment).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libdirs = [str(d) for d in triton.library_dirs]
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

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> TritonServer:
        gpus = host_gpus()
        if self.use_gpu is None:
            self.use_gpu = bool(gpus)
        if self.gpus is not None:
            unknown = [item for item in self.gpus.split(",")
                       if not any(line.startswith(f"GPU {item}:") or f"UUID: {item})" in line for line in gpus)]
            if not self.use_gpu or unknown:
                raise ServerError(f"--gpus {self.gpus}: no such GPU ({', '.join(unknown) or 'no GPU in use'}); "
                                  f"this host has: {'; '.join(gpus) or 'no GPU'}")
        if self.admin_token is None:
            self.admin_token = read_or_create_token()
        project_models = [model for model in MODELS if Path(self.model_repository, model).is_dir()]
        if project_models and not Path(self.model_repository, STAMP_FILE).is_file():
            raise ServerError(f"{self.model_repository} is not prepared: run `make prepare` "
                              "(python -m fusedresnet.backend.prepare) first")
        triton = find_triton()
        backends = private_backend_tree(triton)
        stdout = None
        if self.log_file:
            Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
            stdout = open(self.log_file, "ab" if self.restarts else "wb")
        self.process = subprocess.Popen(self.command(triton, backends), env=self.environment(triton),
                                        stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                        start_new_session=True)
        if stdout:
            stdout.close()
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        return http_ready(self.http_url)

    def wait_ready(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        self.instance_stubs = set()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"tritonserver exited with code {self.process.returncode} before it was ready"
                                  + self._log_tail())
            # Note the model instances' stubs while the models load (each lives for seconds before
            # the server is ready), so a stub killed right after readiness is still missed later.
            self.instance_stubs |= set(self.model_stub_pids())
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerError(f"tritonserver was not ready after {timeout_s:.0f} s" + self._log_tail())

    def _log_tail(self, lines: int = 40) -> str:
        if not self.log_file or not Path(self.log_file).is_file():
            return ""
        text = Path(self.log_file).read_text(errors="replace").splitlines()[-lines:]
        return f"\n--- last lines of {self.log_file} ---\n" + "\n".join(text)

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
        mode none the only way back is a fresh server); tritonserver exited (nothing but this launcher
        may stop it); or its gRPC or HTTP endpoint has not answered for WEDGED_AFTER_S (Triton can
        hang in its abort handler after a crash). Returns the launcher's exit status: EXIT_STUB_DIED or
        EXIT_SERVER_DIED with restart=False or after more than MAX_RESTARTS within RESTART_WINDOW_S.
        """
        restart_times: list[float] = []
        while True:
            stub_died, cause = self.wait_for_failure(poll_s)
            print(f"fusedresnet: {cause}; " + ("restarting Triton" if restart else "stopping Triton (--no-restart)")
                  + ("" if stub_died else self._log_tail(LOG_LINES_ON_FAILURE)), file=sys.stderr, flush=True)
            now = time.monotonic()
            restart_times = [t for t in restart_times if now - t < RESTART_WINDOW_S] + [now]
            if stub_died:
                self.stop_after_stub_death()
            else:
                self.kill()
            status = EXIT_STUB_DIED if stub_died else EXIT_SERVER_DIED
            if not restart:
                return status
            if len(restart_times) > MAX_RESTARTS:
                print(f"fusedresnet: {MAX_RESTARTS} restarts within {RESTART_WINDOW_S:.0f} s already; giving up "
                      f"(exit status {status})", file=sys.stderr, flush=True)
                return status
            self.restarts += 1
            self.start(ready_timeout_s)
            print(f"{READY_AGAIN_LINE} (restart {self.restarts})", file=sys.stderr, flush=True)

    def wait_for_failure(self, poll_s: float) -> tuple[bool, str]:
        """Block until the server fails: (whether a stub died, the cause in words)."""
        expected = set(self.instance_stubs)
        answered_at = time.monotonic()
        while True:
            time.sleep(poll_s)
            if self.process.poll() is not None:
                return False, f"tritonserver exited unasked ({exit_cause(self.process.returncode)})"
            http_answers = self.is_ready()
            dead = expected - set(self.model_stub_pids())
            if dead and http_answers and self.process.poll() is None:
                # a stub that goes away while the server is not ready is part of a shutdown, not a crash
                return True, f"Python stub of {', '.join(sorted(dead))} died"
            if http_answers and grpc_ready(self.grpc_url):
                answered_at = time.monotonic()
            elif time.monotonic() - answered_at > WEDGED_AFTER_S and self.process.poll() is None:
                endpoint = "gRPC" if http_answers else "HTTP"
                return False, (f"tritonserver (pid {self.process.pid}) has not answered on {endpoint} "
                               f"for {WEDGED_AFTER_S:.0f} s")

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
        return sorted(path.name for path in Path("/dev/shm").glob(f"{self.shm_region_prefix}*"))

    def _remove_shm_regions(self):
        """A killed Triton leaves its stubs' shared-memory regions in /dev/shm (a clean exit removes them)."""
        for region in self.shm_regions:
            Path("/dev/shm", region).unlink(missing_ok=True)

    def __enter__(self):
        return self.start() if self.process is None else self

    def __exit__(self, *exc):
        self.stop()


def gpu_list(text: str) -> str:
    """argparse type of --gpus: comma-separated device indices or GPU UUIDs, as CUDA_VISIBLE_DEVICES takes them."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() or item.startswith("GPU-") for item in items) or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices or UUIDs separated by commas, got {text!r}")
    return ",".join(items)


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes the service)")
    parser.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    parser.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--admin-token-file", type=Path,
                        help=f"file holding the admin token (default: ${ADMIN_TOKEN_ENV}, else {DEFAULT_TOKEN_FILE})")
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S)
    parser.add_argument("--exit-timeout", type=int, default=30, help="seconds to drain in-flight requests on stop")
    parser.add_argument("--log-file", type=Path, help="write the server log here instead of the terminal")
    parser.add_argument("--no-restart", action="store_true",
                        help=f"when a model's Python stub dies, stop and exit with status {EXIT_STUB_DIED}; when "
                             f"tritonserver exits or hangs, exit with status {EXIT_SERVER_DIED}; instead of "
                             "restarting Triton (for an orchestrator that restarts the service)")
    parser.add_argument("--gpus", type=gpu_list,
                        help="GPUs to serve on, e.g. 0 or 0,1 (default: all); each model gets its configured "
                             "instance count on every one")
    parser.add_argument("--mps", action="store_true",
                        help="run the server's processes under a private CUDA MPS daemon (the model instances' "
                             "kernels share the GPU instead of time-slicing it; measured +50%% over CUDA shared "
                             "memory on the H100, docs/SERVING.md); refused without a GPU or nvidia-cuda-mps-control")
    parser.add_argument("triton_args", nargs="*", help="extra tritonserver flags, after --")
    args = parser.parse_args(argv)
    server = TritonServer(args.model_repository, args.host, args.http_port, args.grpc_port, args.metrics_port,
                          read_or_create_token(args.admin_token_file), args.log_file, args.exit_timeout,
                          args.triton_args, gpus=args.gpus)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    with contextlib.ExitStack() as resources:
        if args.mps:
            if not host_gpus():
                print("fusedresnet: --mps: no GPU on this host (CUDA MPS shares a GPU among processes)",
                      file=sys.stderr)
                return 1
            try:
                server.mps_environment = resources.enter_context(private_mps(BUILD_DIR / f"cuda-mps-{args.http_port}"))
            except MpsError as error:
                print(f"fusedresnet: --mps: {error}", file=sys.stderr)
                return 1
        return _serve(server, args)


def _serve(server: TritonServer, args) -> int:
    try:
        server.start(args.ready_timeout)
        devices = f"GPUs {server.gpus or 'all'}" if server.use_gpu else "CPU only"
        if server.mps_environment:
            devices += f", CUDA MPS: CUDA_MPS_PIPE_DIRECTORY={server.mps_environment['CUDA_MPS_PIPE_DIRECTORY']}"
        print(f"{READY_LINE} gRPC {server.grpc_url}, HTTP {server.http_url}, "
              f"metrics {server.metrics_url} ({devices}); Ctrl-C stops it", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"fusedresnet: listening on {args.host}: inference is open to anyone who can reach these ports; "
                  "the admin APIs need the admin token", flush=True)
        return server.supervise(restart=not args.no_restart, ready_timeout_s=args.ready_timeout)
    except KeyboardInterrupt:
        print("fusedresnet: stopping Triton", flush=True)
        return 0
    except ServerError as error:
        print(f"fusedresnet: {error}", file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
