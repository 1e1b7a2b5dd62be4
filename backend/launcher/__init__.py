"""Start the real Triton Inference Server on the model repository.

    python -m fusedresnet.backend.serve [--host 127.0.0.1] [--http-port 8000] [--processes-per-gpu 2] ...

Starts the `tritonserver` processes that `triton_server.installation` finds and prepares, with the admin
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

One way to start a server, in three forms that take the same settings (ServerSettings: one field per option
above, the command line's defaults) and give the same handles (http_url, grpc_url, metrics_url):

    python -m fusedresnet.backend.serve ...                       from a shell (parsed into ServerSettings)
    with launch(ServerSettings(http_port=..., log_file=...)) as group:   from Python: started, ready, stopped at exit
    LaunchedServer(settings, output_file).start()                 the command in a subprocess (settings.cli_args())

The launcher's modules: settings (defaults, exit statuses, the lines it prints), stub_processes (a server's
Python-backend stubs and a launcher's tritonservers, found with psutil; the campaigns and tests use it too), health
(readiness and liveness probes), repository (the entries and backends a repository names), process (one
tritonserver: TritonServer), supervisor (its failures and restarts), group (the processes on shared ports:
ServerGroup), launch (ServerSettings and launch), cli (the command line), subprocess_server (LaunchedServer).
What a program needs is importable from here, and from backend/serve.py; TritonServer and ServerGroup are the
launcher's parts, which a program reaches through the group launch gives (group.first: its first TritonServer).
"""

from ..server_error import ServerError
from .cli import build_parser, gpu_list, main, parse_settings, positive_int
from .group import ServerGroup
from .health import exit_cause, grpc_ready, metrics_list_models
from .launch import ServerSettings, launch
from .process import TritonServer
from .repository import repository_backends, repository_models
from .settings import (
    CRASH_LINE,
    CRASH_LOOP_S,
    DEFAULT_PROCESSES_PER_GPU,
    DEFAULT_READY_TIMEOUT_S,
    EXIT_SERVER_DIED,
    EXIT_STUB_DIED,
    INSTANCES_PER,
    MAX_RESTARTS,
    MPS_CHOICES,
    READY_AGAIN_LINE,
    READY_LINE,
    SHM_PREFIX_OPTION,
    WEDGED_AFTER_S,
    shm_prefix_of,
    shm_region_paths,
)
from .subprocess_server import LaunchedServer, metrics_url_of

__all__ = [
    "CRASH_LINE", "CRASH_LOOP_S", "DEFAULT_PROCESSES_PER_GPU", "DEFAULT_READY_TIMEOUT_S", "EXIT_SERVER_DIED",
    "EXIT_STUB_DIED", "INSTANCES_PER", "MAX_RESTARTS", "MPS_CHOICES", "READY_AGAIN_LINE", "READY_LINE",
    "SHM_PREFIX_OPTION", "WEDGED_AFTER_S", "LaunchedServer", "ServerError", "ServerGroup", "ServerSettings",
    "TritonServer", "build_parser", "exit_cause", "gpu_list", "grpc_ready", "launch", "main", "metrics_list_models",
    "metrics_url_of", "parse_settings", "positive_int", "repository_backends", "repository_models", "shm_prefix_of",
    "shm_region_paths",
]
