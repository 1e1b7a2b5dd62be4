"""The one way to start a server: what a user chooses (ServerSettings, the launcher's command line as a value) and
`launch(settings)`, the started, ready ServerGroup. The command line (cli.py) parses its arguments into the settings
and launches them; a program launches them itself (`with launch(ServerSettings(...)) as group:`), or runs the
command line in a subprocess (subprocess_server.py: LaunchedServer, its command from `settings.cli_args()`)."""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from .. import spec
from ..admin_token import read_or_create_token
from ..repository.copies import copy_repository, with_instances_divided
from ..server_error import ServerError
from ..triton_server.installation import host_gpus
from .group import ServerGroup
from .settings import DEFAULT_PROCESSES_PER_GPU, DEFAULT_READY_TIMEOUT_S

# The options of the command line (cli.py's parser), by field: what cli_args renders a value that is not the
# default as.
OPTIONS = {"host": "--host", "http_port": "--http-port", "grpc_port": "--grpc-port", "metrics_port": "--metrics-port",
           "processes_per_gpu": "--processes-per-gpu", "model_repository": "--model-repository",
           "instances": "--instances", "admin_token_file": "--admin-token-file", "ready_timeout_s": "--ready-timeout",
           "exit_timeout_s": "--exit-timeout", "log_file": "--log-file", "gpus": "--gpus", "mps": "--mps",
           "front_end": "--front-end"}
FLAGS = {"restart": ("--no-restart", False), "client_shared_memory": ("--client-shared-memory", True)}


@dataclass
class ServerSettings:
    """What a user chooses for a server: the launcher's options (`python -m fusedresnet.backend.serve --help` says
    what each does), one field each, with the command line's defaults; and admin_token, which a program may hand
    over itself (never on a command line: a subprocess gets it in $FUSEDRESNET_ADMIN_TOKEN)."""

    model_repository: Path = spec.MODEL_REPOSITORY
    host: str = spec.DEFAULT_HOST
    http_port: int = spec.DEFAULT_HTTP_PORT
    grpc_port: int = spec.DEFAULT_GRPC_PORT
    metrics_port: int = spec.DEFAULT_METRICS_PORT   # the first process's; the next ones use the ports after it
    processes_per_gpu: int | None = None       # None: DEFAULT_PROCESSES_PER_GPU with a GPU, 1 without one
    gpus: str | None = None                    # "0,1": the GPUs to serve on (None: all)
    instances: str = "process"                 # INSTANCES_PER
    admin_token: str | None = None             # None: from admin_token_file, $FUSEDRESNET_ADMIN_TOKEN or build/
    admin_token_file: Path | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    exit_timeout_s: int = 30
    log_file: Path | None = None               # None: the server's output goes to standard output
    restart: bool = True                       # False: --no-restart
    mps: str = "auto"                          # MPS_CHOICES
    front_end: str | None = None               # None: $FUSEDRESNET_FRONT_END, else auto
    client_shared_memory: bool = False
    triton_args: list[str] = field(default_factory=list)   # extra tritonserver flags (after -- on the command line)

    def cli_args(self) -> list[str]:
        """The launcher's arguments for these settings (every option whose value is not the default; the admin
        token never): `python -m fusedresnet.backend.serve *settings.cli_args()` serves them."""
        defaults = ServerSettings()
        args = []
        for name, option in OPTIONS.items():
            value = getattr(self, name)
            if value != getattr(defaults, name):
                args += [option, str(value)]
        for name, (flag, when) in FLAGS.items():
            if getattr(self, name) == when:
                args.append(flag)
        if self.triton_args:
            args += ["--", *self.triton_args]
        return args

    def replace(self, **changes) -> ServerSettings:
        return dataclasses.replace(self, **changes)


CLIENT_SHM_ONE_PROCESS = ("--client-shared-memory serves one process per GPU: a region registered through one "
                          "process is unknown to the others behind the shared port")


def launch(settings: ServerSettings) -> ServerGroup:
    """The server these settings describe, started and ready (a context manager: `with launch(settings) as group:`
    stops it): the processes per GPU (default DEFAULT_PROCESSES_PER_GPU with a GPU, 1 without one or with client
    shared memory), their repository (a copy with each model's instances divided among a GPU's processes for
    instances="gpu"), their front end (said in one line), CUDA MPS (the daemon is the group's: its stop stops it).
    A ServerError says why not (after stopping what had started); so does Ctrl-C, as KeyboardInterrupt."""
    use_gpu = bool(host_gpus())
    if settings.client_shared_memory and (settings.processes_per_gpu or 1) > 1:
        raise ServerError(CLIENT_SHM_ONE_PROCESS)
    per_gpu = settings.processes_per_gpu or (DEFAULT_PROCESSES_PER_GPU if use_gpu and not settings.client_shared_memory
                                             else 1)
    repository = settings.model_repository
    if settings.instances == "gpu" and per_gpu > 1:
        # the configured count is the GPU's: each process starts its share of the stubs, so a restarted process
        # imports and makes CUDA contexts for fewer of them (results/recovery.md)
        repository = copy_repository(repository, spec.BUILD_DIR / f"model-repository-{settings.http_port}",
                                     edit=with_instances_divided(per_gpu))
    group = ServerGroup.plan(per_gpu, settings.gpus if use_gpu else None, use_gpu, settings.metrics_port,
                             log_file=settings.log_file, model_repository=repository, host=settings.host,
                             http_port=settings.http_port, grpc_port=settings.grpc_port,
                             admin_token=settings.admin_token or read_or_create_token(settings.admin_token_file),
                             exit_timeout_s=settings.exit_timeout_s, extra_args=list(settings.triton_args))
    if settings.front_end is not None:
        for server in group.servers:
            server.front_end = settings.front_end
    if settings.gpus and not use_gpu:
        group.first.gpus = settings.gpus
        group.first.check_gpus()     # says the host has no GPU
    group.choose_front_end(group.first.front_end, settings.client_shared_memory)
    try:
        group.use_mps(settings.mps, spec.BUILD_DIR / f"cuda-mps-{settings.http_port}")
        group.start(settings.ready_timeout_s)
    except BaseException:
        group.stop()                 # the MPS daemon too
        raise
    return group

