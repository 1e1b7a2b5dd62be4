"""One Triton server process: the Triton 2.51 core (nvidia-pytriton's libtritonserver) behind Triton's current gRPC,
HTTP and metrics frontends (the tritonfrontend 2.73.0 wheel's library), in this one Python process.

    python -m fusedresnet.backend.triton_server.inprocess_server --model-repository=... --grpc-port=8001 ...
        (tritonserver's flags)

The launcher (backend/serve.py) starts it where backend/triton_server/front_end.py finds that it loads, with the command
line it gives the tritonserver binary: the flags below are that binary's, with its meanings, and a flag this process
does not know is refused (exit status 2; the binary takes it: --front-end binary). Its process is named `tritonserver`,
so whatever finds the server's process by name finds this one.

The core is made through Triton's C API (ctypes, the r24.10 signatures of backend/ab_router/ab_router_backend/include);
the frontends through backend/triton_server/frontend_shim (the admin token's restrictions on every frontend; a client
shared-memory manager, whose registrations --allow-client-shm=true allows). On SIGTERM or SIGINT it stops as the binary
does: the HTTP and gRPC frontends stop taking calls and drain those in flight, the core waits out what remains of
--exit-timeout-secs, then the gRPC and metrics frontends stop. A crash prints Python's fatal-error report (the
launcher's crash line).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import signal
import sys
import threading

from .front_end import frontend_library
from .frontend_shim_build import build as shim_library

MODEL_CONTROL = {"none": 0, "poll": 1, "explicit": 2}   # TRITONSERVER_ModelControlMode
ERROR_SIZE = 4096
HTTP_MAX_INPUT_SIZE = 1 << 26      # the binary's default (HTTP_DEFAULT_MAX_INPUT_SIZE)
HTTP_THREADS, METRICS_THREADS = 8, 1
# gRPC infer threads and pooled request states: chosen by measurement over the 2.73 frontend's defaults (2, 8),
# results/front_end.md (scripts/gpu_host_front_end.sh levers)
GRPC_INFER_THREADS, GRPC_ALLOCATION_POOL = 4, 64
GRPC_KEEPALIVE_TIME_MS, GRPC_KEEPALIVE_TIMEOUT_MS = 7_200_000, 20_000
# gRPC's own I/O: the wheel's gRPC serves through its EventEngine threads by default; these experiments, off, give
# back the completion-queue polling that the 2.51 binary's gRPC does. Measured on the H200
# (results/front_end_logs/front_end_lever_grpc_polling.md): custom at 32 images/request 54.0k against 45.5k img/s,
# the server's CPU 183 against 221 µs per image. A GRPC_EXPERIMENTS of the server's environment wins.
GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
GRPC_POLLING_EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq"


def grpc_experiments(environ=os.environ) -> str:
    """gRPC's experiments for this process (read by gRPC when it starts): the environment's, else polling's."""
    return environ.setdefault(GRPC_EXPERIMENTS_ENV, GRPC_POLLING_EXPERIMENTS)


def boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "on", "yes"):
        return True
    if text.lower() in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def restriction(text: str) -> tuple[str, str, str]:
    """--http-restricted-api / --grpc-restricted-protocol: 'category,category:key=value'."""
    categories, _, setting = text.partition(":")
    key, _, value = setting.partition("=")
    if not categories or not key or not value:
        raise argparse.ArgumentTypeError(f"expected <categories>:<key>=<value>, got {text!r}")
    return categories, key, value


def backend_config(text: str) -> tuple[str, str, str]:
    backend, _, setting = text.partition(",")
    key, _, value = setting.partition("=")
    if not backend or not key:
        raise argparse.ArgumentTypeError(f"expected <backend>,<setting>=<value>, got {text!r}")
    return backend, key, value


def cuda_pool(text: str) -> tuple[int, int]:
    device, _, size = text.partition(":")
    return int(device), int(size)


class RefusingParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"inprocess_server: {message} (the in-process front end takes the tritonserver flags listed by "
                     "--help; the launcher's --front-end binary runs the tritonserver binary with any of its flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = RefusingParser(prog="inprocess_server", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add = parser.add_argument
    add("--model-repository", required=True)
    add("--backend-directory", required=True)
    add("--cache-directory")
    add("--model-control-mode", choices=MODEL_CONTROL, default="none")
    add("--load-model", action="append", default=[])
    add("--model-load-thread-count", type=int, default=4)
    add("--disable-auto-complete-config", action="store_true")
    add("--backend-config", type=backend_config, action="append", default=[])
    add("--strict-readiness", type=boolean, default=True)
    add("--exit-on-error", type=boolean, default=True)
    add("--exit-timeout-secs", type=int, default=30)
    add("--pinned-memory-pool-byte-size", type=int)
    add("--cuda-memory-pool-byte-size", type=cuda_pool, action="append", default=[])
    add("--log-verbose", type=int, default=0)
    add("--log-info", type=boolean, default=True)
    add("--log-warning", type=boolean, default=True)
    add("--log-error", type=boolean, default=True)
    add("--log-file")
    for protocol, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        add(f"--{protocol}-address", default="0.0.0.0")
        add(f"--{protocol}-port", type=int, default=port)
    add("--http-restricted-api", type=restriction, action="append", default=[])
    add("--grpc-restricted-protocol", type=restriction, action="append", default=[])
    add("--reuse-http-port", type=boolean, default=False)
    add("--reuse-grpc-port", type=boolean, default=False)
    add("--http-thread-count", type=int, default=HTTP_THREADS)
    add("--http-max-input-size", type=int, default=HTTP_MAX_INPUT_SIZE)
    add("--grpc-infer-thread-count", type=int, default=GRPC_INFER_THREADS)
    add("--grpc-infer-allocation-pool-size", type=int, default=GRPC_ALLOCATION_POOL)
    add("--grpc-keepalive-time", type=int, default=GRPC_KEEPALIVE_TIME_MS)
    add("--grpc-keepalive-timeout", type=int, default=GRPC_KEEPALIVE_TIMEOUT_MS)
    add("--grpc-max-connection-age", type=int, default=0)
    add("--grpc-max-connection-age-grace", type=int, default=0)
    add("--metrics-thread-count", type=int, default=METRICS_THREADS)
    add("--allow-client-shm", type=boolean, default=False,
        help="whether clients may register system and CUDA shared-memory regions (Triton 2.69+'s flag)")
    return parser


def one_restriction(restrictions: list[tuple[str, str, str]], flag: str) -> tuple[str, str, str]:
    """The categories and their one key and value (the launcher passes one --*-restricted-* flag each)."""
    if len({(key, value) for _, key, value in restrictions}) > 1:
        raise SystemExit(f"inprocess_server: {flag} with more than one key=value is not supported")
    if not restrictions:
        return "", "", ""
    return ",".join(c for c, _, _ in restrictions), restrictions[0][1], restrictions[0][2]


class TritonError(RuntimeError):
    pass


class Core:
    """Triton's C API on the 2.51 core, through the library that `frontend_library` loaded (its dependency)."""

    def __init__(self, library: ctypes.CDLL):
        self.lib = library
        for name in ("TRITONSERVER_ErrorMessage",):
            getattr(library, name).restype = ctypes.c_char_p
        library.TRITONSERVER_ErrorMessage.argtypes = [ctypes.c_void_p]
        library.TRITONSERVER_ErrorDelete.argtypes = [ctypes.c_void_p]

    def call(self, name: str, *args, argtypes=None):
        function = getattr(self.lib, name)
        function.restype = ctypes.c_void_p
        if argtypes is not None:
            function.argtypes = argtypes
        error = function(*args)
        if error:
            message = self.lib.TRITONSERVER_ErrorMessage(error).decode(errors="replace")
            self.lib.TRITONSERVER_ErrorDelete(error)
            raise TritonError(f"{name}: {message}")

    def new_server(self, args) -> ctypes.c_void_p:
        options = ctypes.c_void_p()
        self.call("TRITONSERVER_ServerOptionsNew", ctypes.byref(options))
        p, text, flag, uint = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_bool, ctypes.c_uint
        settings = [
            ("SetModelRepositoryPath", [p, text], args.model_repository.encode()),
            ("SetBackendDirectory", [p, text], args.backend_directory.encode()),
            ("SetModelControlMode", [p, ctypes.c_int], MODEL_CONTROL[args.model_control_mode]),
            ("SetModelLoadThreadCount", [p, uint], args.model_load_thread_count),
            ("SetStrictModelConfig", [p, flag], args.disable_auto_complete_config),
            ("SetStrictReadiness", [p, flag], args.strict_readiness),
            ("SetExitOnError", [p, flag], args.exit_on_error),
            ("SetExitTimeout", [p, uint], args.exit_timeout_secs),
            ("SetLogVerbose", [p, ctypes.c_int], args.log_verbose),
            ("SetLogInfo", [p, flag], args.log_info),
            ("SetLogWarn", [p, flag], args.log_warning),
            ("SetLogError", [p, flag], args.log_error),
            ("SetMetrics", [p, flag], True),
            ("SetGpuMetrics", [p, flag], True),
            ("SetCpuMetrics", [p, flag], True),
        ]
        settings += [("SetStartupModel", [p, text], model.encode()) for model in args.load_model]
        if args.cache_directory:
            settings.append(("SetCacheDirectory", [p, text], args.cache_directory.encode()))
        if args.log_file:
            settings.append(("SetLogFile", [p, text], args.log_file.encode()))
        if args.pinned_memory_pool_byte_size is not None:
            settings.append(("SetPinnedMemoryPoolByteSize", [p, ctypes.c_uint64], args.pinned_memory_pool_byte_size))
        try:
            for name, argtypes, value in settings:
                self.call(f"TRITONSERVER_ServerOptions{name}", options, value, argtypes=argtypes)
            for device, size in args.cuda_memory_pool_byte_size:
                self.call("TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize", options, device, size,
                          argtypes=[p, ctypes.c_int, ctypes.c_uint64])
            for backend, key, value in args.backend_config:
                self.call("TRITONSERVER_ServerOptionsSetBackendConfig", options, backend.encode(), key.encode(),
                          value.encode(), argtypes=[p, text, text, text])
            server = ctypes.c_void_p()
            self.call("TRITONSERVER_ServerNew", ctypes.byref(server), options)   # loads the models
            return server
        finally:
            self.call("TRITONSERVER_ServerOptionsDelete", options, argtypes=[p])


class Frontends:
    """The gRPC, HTTP and metrics frontends of one core, through the shim."""

    def __init__(self, shim: ctypes.CDLL, server: ctypes.c_void_p, args):
        self.shim, self.error = shim, ctypes.create_string_buffer(ERROR_SIZE)
        self.addresses = {protocol: f"{getattr(args, protocol + '_address')}:{getattr(args, protocol + '_port')}"
                          for protocol in ("grpc", "http", "metrics")}
        shim.fr_shared_memory_manager_new.restype = ctypes.c_void_p
        shm = ctypes.c_void_p(shim.fr_shared_memory_manager_new(int(args.allow_client_shm)))
        grpc_categories, grpc_key, grpc_value = one_restriction(args.grpc_restricted_protocol,
                                                                "--grpc-restricted-protocol")
        http_categories, http_key, http_value = one_restriction(args.http_restricted_api, "--http-restricted-api")
        self.grpc, self.http, self.metrics = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        trace = ctypes.c_void_p()
        self.check(shim.fr_trace_manager_new(ctypes.byref(trace), self.error, ERROR_SIZE))
        self.check(shim.fr_grpc_new(
            server, trace, shm, args.grpc_address.encode(), args.grpc_port, int(args.reuse_grpc_port),
            args.grpc_infer_thread_count, args.grpc_infer_allocation_pool_size, args.grpc_keepalive_time,
            args.grpc_keepalive_timeout, args.grpc_max_connection_age, args.grpc_max_connection_age_grace,
            grpc_categories.encode(), grpc_key.encode(), grpc_value.encode(), ctypes.byref(self.grpc),
            self.error, ERROR_SIZE))
        self.check(shim.fr_http_new(
            server, trace, shm, args.http_address.encode(), args.http_port, int(args.reuse_http_port),
            args.http_thread_count, ctypes.c_ulonglong(args.http_max_input_size), http_categories.encode(),
            http_key.encode(), http_value.encode(), ctypes.byref(self.http), self.error, ERROR_SIZE))
        self.check(shim.fr_metrics_new(server, args.metrics_address.encode(), args.metrics_port,
                                       args.metrics_thread_count, ctypes.byref(self.metrics), self.error, ERROR_SIZE))

    def check(self, status: int):
        if status != 0:
            raise TritonError(self.error.value.decode(errors="replace"))

    def start(self):
        # As the binary: gRPC, then HTTP, then metrics (the launcher reads a shared-port process's readiness on its
        # metrics port: it answers once the others are up).
        # The binary's lines (campaigns read the start's phases from them).
        self.check(self.shim.fr_grpc_start(self.grpc, self.error, ERROR_SIZE))
        print(f"Started GRPCInferenceService at {self.addresses['grpc']}", flush=True)
        self.check(self.shim.fr_http_start(self.http, self.error, ERROR_SIZE))
        print(f"Started HTTPService at {self.addresses['http']}", flush=True)
        self.check(self.shim.fr_http_start(self.metrics, self.error, ERROR_SIZE))
        print(f"Started Metrics Service at {self.addresses['metrics']}", flush=True)

    def drain(self, exit_timeout_s: int) -> int:
        """Stop taking calls on HTTP and gRPC and wait for those in flight: the seconds of the timeout left."""
        remaining = ctypes.c_uint32(exit_timeout_s)
        for stop, frontend in ((self.shim.fr_http_stop, self.http), (self.shim.fr_grpc_graceful_stop, self.grpc)):
            if stop(frontend, ctypes.byref(remaining), self.error, ERROR_SIZE) != 0:
                print(f"inprocess_server: {self.error.value.decode(errors='replace')}", file=sys.stderr, flush=True)
        return remaining.value

    def stop(self):
        if self.shim.fr_grpc_stop(self.grpc, self.error, ERROR_SIZE) != 0 \
                or self.shim.fr_http_stop(self.metrics, None, self.error, ERROR_SIZE) != 0:
            print(f"inprocess_server: {self.error.value.decode(errors='replace')}", file=sys.stderr, flush=True)


def name_process(name: bytes = b"tritonserver"):
    """This process's name (its main thread's), as ps and psutil show it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)   # PR_SET_NAME


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    faulthandler.enable()          # a crash prints "Fatal Python error: Segmentation fault" (the launcher's crash line)
    name_process()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    grpc_experiments()
    frontend = frontend_library()
    if frontend is None:
        print("inprocess_server: the tritonfrontend wheel is not installed", file=sys.stderr)
        return 1
    bindings = ctypes.CDLL(str(frontend), mode=os.RTLD_NOW | os.RTLD_GLOBAL)   # and the 2.51 core it links
    shim = ctypes.CDLL(str(shim_library()), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    core = Core(bindings)
    try:
        server = core.new_server(args)
    except TritonError as error:
        print(f"inprocess_server: {error}", file=sys.stderr, flush=True)
        return 1
    try:
        frontends = Frontends(shim, server, args)
        frontends.start()
    except TritonError as error:
        print(f"inprocess_server: {error}", file=sys.stderr, flush=True)
        core.call("TRITONSERVER_ServerStop", server, argtypes=[ctypes.c_void_p])
        return 1
    while not stop.wait(1.0):
        pass
    remaining = frontends.drain(args.exit_timeout_secs)
    core.call("TRITONSERVER_ServerSetExitTimeout", server, remaining, argtypes=[ctypes.c_void_p, ctypes.c_uint])
    try:
        core.call("TRITONSERVER_ServerStop", server, argtypes=[ctypes.c_void_p])
    except TritonError as error:
        print(f"inprocess_server: failed to stop the server: {error}", file=sys.stderr, flush=True)
        return 1
    frontends.stop()
    core.call("TRITONSERVER_ServerDelete", server, argtypes=[ctypes.c_void_p])   # the stubs exit, their regions go
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)   # the frontends' objects are never deleted: no static destructors race their threads
