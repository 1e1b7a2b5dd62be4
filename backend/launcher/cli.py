"""The launcher's command line: `python -m fusedresnet.backend.serve` (backend/serve.py) runs `main`; its help is
the launcher package's description (backend/launcher/__init__.py)."""


from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ..admin_token import DEFAULT_TOKEN_FILE
from ..server_error import ServerError
from ..spec import (
    ADMIN_TOKEN_ENV,
)
from ..triton_server.front_end import FRONT_END_ENV, FRONT_ENDS
from .group import ServerGroup
from .launch import ServerSettings, launch
from .settings import (
    DEFAULT_PROCESSES_PER_GPU,
    EXIT_SERVER_DIED,
    EXIT_STUB_DIED,
    INSTANCES_PER,
    MPS_CHOICES,
    READY_LINE,
)


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


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=sys.modules[__package__].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ServerSettings()   # the defaults of every option (front end: None, $FUSEDRESNET_FRONT_END when it starts)
    parser.add_argument("--host", default=default.host,
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes the service)")
    parser.add_argument("--http-port", type=int, default=default.http_port)
    parser.add_argument("--grpc-port", type=int, default=default.grpc_port)
    parser.add_argument("--metrics-port", type=int, default=default.metrics_port,
                        help="metrics of the first server process; the next ones use the ports after it")
    parser.add_argument("--processes-per-gpu", type=positive_int,
                        help=f"tritonserver processes on each GPU, all on the same gRPC and HTTP ports (default "
                             f"{DEFAULT_PROCESSES_PER_GPU} with a GPU, 1 without one: that many on the CPU)")
    parser.add_argument("--model-repository", type=Path, default=default.model_repository)
    parser.add_argument("--instances", choices=INSTANCES_PER, default=default.instances,
                        help="what each model's configured instance count is per: each process (default), or each "
                             "GPU, divided among its processes (rounded up; fewer stubs for a restart to start)")
    parser.add_argument("--admin-token-file", type=Path,
                        help=f"file holding the admin token (default: ${ADMIN_TOKEN_ENV}, else {DEFAULT_TOKEN_FILE})")
    parser.add_argument("--ready-timeout", type=float, default=default.ready_timeout_s)
    parser.add_argument("--exit-timeout", type=int, default=default.exit_timeout_s,
                        help="seconds to drain in-flight requests on stop")
    parser.add_argument("--log-file", type=Path, help="write the server log here instead of the terminal (several "
                                                      "processes: one file, each line prefixed with its process)")
    parser.add_argument("--no-restart", action="store_true",
                        help=f"when a model's Python stub dies, stop and exit with status {EXIT_STUB_DIED}; when "
                             f"a tritonserver exits, crashes or hangs, exit with status {EXIT_SERVER_DIED}; instead of "
                             "restarting it (for an orchestrator that restarts the service)")
    parser.add_argument("--gpus", type=gpu_list,
                        help="GPUs to serve on, e.g. 0 or 0,1 (default: all); each GPU gets --processes-per-gpu "
                             "processes, each with the models' configured instance counts")
    parser.add_argument("--mps", nargs="?", choices=MPS_CHOICES, const="on", default=default.mps,
                        help="run the server's processes under a private CUDA MPS daemon (the model instances' "
                             "kernels share the GPU instead of time-slicing it: 2 processes per GPU serve 1.9-2.0x one "
                             "over gRPC under MPS, 1.2-1.6x without, docs/SERVING.md). auto (default): on a GPU host "
                             "where nvidia-cuda-mps-control is found, else off, said in one line; on (or --mps alone): "
                             "refused without a GPU or the daemon; off")
    parser.add_argument("--front-end", choices=FRONT_ENDS, default=default.front_end,
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
                                                       "the tritonserver flags that "
                                                       "backend/triton_server/inprocess_server.py lists)")
    return parser


def parse_settings(argv=None) -> ServerSettings:
    """The command line's arguments as the ServerSettings they choose (its inverse: ServerSettings.cli_args)."""
    args = build_parser().parse_args(argv)
    return ServerSettings(model_repository=args.model_repository, host=args.host, http_port=args.http_port,
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                          processes_per_gpu=args.processes_per_gpu, gpus=args.gpus, instances=args.instances,
                          admin_token_file=args.admin_token_file, ready_timeout_s=args.ready_timeout,
                          exit_timeout_s=args.exit_timeout, log_file=args.log_file, restart=not args.no_restart,
                          mps=args.mps, front_end=args.front_end, client_shared_memory=args.client_shared_memory,
                          triton_args=list(args.triton_args))


def main(argv=None):
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    # also when started with SIGINT ignored (a background job of a non-interactive shell): SIGINT stops it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        group = launch(settings)
    except KeyboardInterrupt:
        print("fusedresnet: stopping Triton", flush=True)
        return 0
    except ServerError as error:
        print(f"fusedresnet: {error}", file=sys.stderr)
        return 1
    return _serve(group, settings)


def _serve(group: ServerGroup, settings: ServerSettings) -> int:
    try:
        first = group.first
        if not first.use_gpu:
            devices = "CPU only"
        else:
            devices = f"GPUs {settings.gpus or 'all'}"
        if len(group.servers) > 1:
            devices += f", {len(group.servers)} server processes on the shared ports"
        if first.mps_environment:
            devices += f", CUDA MPS: CUDA_MPS_PIPE_DIRECTORY={first.mps_environment['CUDA_MPS_PIPE_DIRECTORY']}"
        print(f"{READY_LINE} gRPC {group.grpc_url}, HTTP {group.http_url}, "
              f"metrics {', '.join(s.metrics_url for s in group.servers)} ({devices}); Ctrl-C stops it", flush=True)
        if settings.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"fusedresnet: listening on {settings.host}: inference is open to anyone who can reach these ports; "
                  "the admin APIs need the admin token", flush=True)
        return group.supervise(restart=settings.restart, ready_timeout_s=settings.ready_timeout_s)
    except KeyboardInterrupt:
        print("fusedresnet: stopping Triton", flush=True)
        return 0
    except ServerError as error:
        print(f"fusedresnet: {error}", file=sys.stderr)
        return 1
    finally:
        group.stop()
