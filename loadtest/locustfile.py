"""Locust users that send ResNet-18 inference requests to Triton over gRPC or HTTP.

    locust -f loadtest/locustfile.py                                   # web UI on :8089
    locust -f loadtest/locustfile.py --headless -u 16 -r 16 -t 30s --processes 4 \\
           --model resnet18_cudnn --protocol grpc --images-per-request 8 --triton-url 127.0.0.1:8001

Options (fields of the web UI too; each also read from FUSEDRESNET_<OPTION>, e.g.
FUSEDRESNET_IMAGES_PER_REQUEST=8):
  --model               resnet18_custom | resnet18_cudnn
  --protocol            grpc | http
  --triton-url          host:port (default: locust's --host, else the protocol's default port); over gRPC
                        several servers: "host:port,host:port" or "dns:///name:port", spread per request
                        by gRPC's round robin (client/resnet_client.py, grpc_channel)
  --images-per-request  images in each request (1, 8, 32, ...)
  --input-format        IMAGE (uint8 pixels, the server normalises) | IMAGE_NORMALIZED (normalised here)
  --image-pool          .npy file of uint8 crops, or of the crops already as the --input-format input
                        (default: build --pool-size images in each process)
  --warmup-s            requests that finish in the first N seconds are reported under "(warm-up)"
  --measure-s           length of the measurement window after the warm-up; when given, the test
                        stops (gracefully: requests in flight finish) when the window closes
  --results-dir         where each process writes every request it sent (requests-<pid>.npz, with its
                        own CPU seconds inside the window) and the master writes the measurement-window
                        markers: what `loadtest.sweep` reads
  --shared-memory       none | system | cuda: each user passes its input and LOGITS through its own
                        shared-memory regions (same host as the server; client/shared_memory.py)
  --admin-token-file    the admin token that registering shared memory needs (default
                        $FUSEDRESNET_ADMIN_TOKEN, else build/admin-token)

Each user owns one client, created in `on_start` (after `--processes` has forked), sends one
request at a time with no wait, and fires a locust request event with the time it measured.
The gRPC client needs gevent-aware gRPC: `init_gevent()` runs here, before any channel exists.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path

import gevent
import grpc.experimental.gevent as grpc_gevent
import numpy as np
import psutil
from locust import User, events, task
from locust.runners import MasterRunner, WorkerRunner

grpc_gevent.init_gevent()

import tritonclient.http as httpclient  # noqa: E402  (this and the gRPC client of resnet_client: after init_gevent)

from fusedresnet.backend.spec import AB_ROUTER_MODEL, INPUT_UINT8, MODEL_CUSTOM, MODELS, served_model  # noqa: E402
from fusedresnet.client.preprocess import INPUT_FORMATS, model_input  # noqa: E402
from fusedresnet.client.resnet_client import (  # noqa: E402
    DEFAULT_URLS,
    LOGITS_BYTES_PER_IMAGE,
    PROTOCOLS,
    SharedMemorySlot,
    build_request,
    check_endpoints,
    check_logits_received,
    grpc_client,
    response_bytes,
)
from fusedresnet.client.shared_memory import SHARED_MEMORY_KINDS, read_admin_token, request_regions  # noqa: E402
from fusedresnet.loadtest.image_pool import (  # noqa: E402
    DEFAULT_POOL_SIZE,
    RequestWindows,
    load_image_pool,
)
from fusedresnet.loadtest.step_files import MEASURE_END_MARKER, MEASURE_START_MARKER, WARMUP_SUFFIX, request_log_name  # noqa: E402

REQUEST_TIMEOUT_S = 60.0
MARKER_GRACE_S = 0.3   # the load goes on this long after the window closes, while the sweep scrapes Triton


@events.init_command_line_parser.add_listener
def add_options(parser):
    parser.add_argument("--model", choices=(*MODELS, AB_ROUTER_MODEL), default=MODEL_CUSTOM,
                        env_var="FUSEDRESNET_MODEL")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc", env_var="FUSEDRESNET_PROTOCOL")
    parser.add_argument("--triton-url", default="", env_var="FUSEDRESNET_TRITON_URL",
                        help="host:port of Triton's gRPC or HTTP endpoint")
    parser.add_argument("--images-per-request", type=int, default=1, env_var="FUSEDRESNET_IMAGES_PER_REQUEST")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default=INPUT_UINT8,
                        env_var="FUSEDRESNET_INPUT_FORMAT", help="the model input sent: IMAGE or IMAGE_NORMALIZED")
    parser.add_argument("--image-pool", default="", env_var="FUSEDRESNET_IMAGE_POOL",
                        help=".npy file of uint8 [N,224,224,3] crops, or of the crops already as --input-format")
    parser.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE, env_var="FUSEDRESNET_POOL_SIZE")
    parser.add_argument("--warmup-s", type=float, default=0.0, env_var="FUSEDRESNET_WARMUP_S")
    parser.add_argument("--measure-s", type=float, default=0.0, env_var="FUSEDRESNET_MEASURE_S")
    parser.add_argument("--results-dir", default="", env_var="FUSEDRESNET_RESULTS_DIR", include_in_web_ui=False)
    parser.add_argument("--shared-memory", choices=SHARED_MEMORY_KINDS, default="none",
                        env_var="FUSEDRESNET_SHARED_MEMORY")
    parser.add_argument("--admin-token-file", default="", include_in_web_ui=False,
                        help="file holding the admin token (default $FUSEDRESNET_ADMIN_TOKEN, else build/admin-token)")


def process_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


class RequestLog:
    """Every request this process sent: start time, latency, success. One per process."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.sent = 0
        self.started_at: list[float] = []
        self.latency_ms: list[float] = []
        self.succeeded: list[bool] = []
        self.cpu_warnings = 0          # locust's samples of this process above 90% CPU: the client may be the limit
        self.cpu_s = 0.0               # CPU seconds (user + system) this process used inside the measurement window
        self.cpu_window_s = 0.0        # ... over this many seconds
        self.cpu_window_started: tuple[float, float] | None = None   # (CPU seconds, monotonic time) at its start
        self.test_started_at = time.time()

    def start_cpu_window(self):
        self.cpu_window_started = (process_cpu_seconds(), time.monotonic())

    def end_cpu_window(self):
        """Close the CPU window (when it ends, or when the test stops first); only the first call counts."""
        if self.cpu_window_started and not self.cpu_window_s:
            cpu, started = self.cpu_window_started
            self.cpu_s, self.cpu_window_s = process_cpu_seconds() - cpu, time.monotonic() - started

    def add(self, started_at: float, latency_ms: float, succeeded: bool):
        self.started_at.append(started_at)
        self.latency_ms.append(latency_ms)
        self.succeeded.append(succeeded)

    def write(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / request_log_name(os.getpid()), sent=np.int64(self.sent),
                 started_at=np.asarray(self.started_at, np.float64),
                 latency_ms=np.asarray(self.latency_ms, np.float64),
                 succeeded=np.asarray(self.succeeded, bool), cpu_warnings=np.int64(self.cpu_warnings),
                 cpu_s=np.float64(self.cpu_s), cpu_window_s=np.float64(self.cpu_window_s))


REQUEST_LOG = RequestLog()
_MODEL_INPUTS: dict[tuple, np.ndarray] = {}   # per process: (pool file, size, format) -> model input array


def model_inputs(options) -> np.ndarray:
    key = (options.image_pool, options.pool_size, options.input_format)
    if key not in _MODEL_INPUTS:
        pool = load_image_pool(options.image_pool or None, options.pool_size)
        _MODEL_INPUTS[key] = model_input(pool, options.input_format)
    return _MODEL_INPUTS[key]


def measurement_window(environment, folder: Path | None, warmup_s: float, measure_s: float):
    """Mark when the window opens and closes (epoch times, in `folder`), then end the test gracefully.

    runner.stop() lets every request in flight finish (--stop-timeout) and, with --processes,
    waits until every worker has stopped and reported; locust's own --run-time would instead
    send workers `quit` and give their final reports only half a second to arrive.
    """
    gevent.sleep(warmup_s)
    if folder:
        (folder / MEASURE_START_MARKER).write_text(repr(time.time()))
    gevent.sleep(measure_s)
    if folder:
        (folder / MEASURE_END_MARKER).write_text(repr(time.time()))
        gevent.sleep(MARKER_GRACE_S)
    environment.runner.stop()
    environment.runner.quit()


def measure_own_cpu(warmup_s: float, measure_s: float):
    """This process's CPU use over (about) the measurement window: is the load generator the limit?"""
    gevent.sleep(warmup_s)
    REQUEST_LOG.start_cpu_window()
    gevent.sleep(measure_s)
    REQUEST_LOG.end_cpu_window()


@events.test_start.add_listener
def on_test_start(environment, **_):
    REQUEST_LOG.clear()
    options = environment.parsed_options
    if options and options.measure_s > 0 and not isinstance(environment.runner, MasterRunner):
        gevent.spawn(measure_own_cpu, options.warmup_s, options.measure_s)
    if options and options.measure_s > 0 and not isinstance(environment.runner, WorkerRunner):
        folder = Path(options.results_dir) if options.results_dir else None
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
        gevent.spawn(measurement_window, environment, folder, options.warmup_s, options.measure_s)


@events.test_stop.add_listener
def on_test_stop(environment, **_):
    options = environment.parsed_options
    if options and options.results_dir and not isinstance(environment.runner, MasterRunner):
        REQUEST_LOG.end_cpu_window()
        REQUEST_LOG.write(Path(options.results_dir))
    if isinstance(environment.runner, WorkerRunner):
        # Report the last requests now, before this worker tells the master it has stopped:
        # otherwise they wait for the next periodic report, which may come after the master's summary.
        # (What the worker's own stats reporter sends, through locust's public event and message API.)
        report = {}
        environment.events.report_to_master.fire(client_id=environment.runner.client_id, data=report)
        environment.runner.send_message("stats", report)
        if options and options.measure_s > 0:
            # A stopped worker is forgotten by the master, so it would never get the master's `quit`
            # and would linger until the heartbeat times out (60 s): leave once `client_stopped` is sent.
            gevent.spawn_later(0.2, environment.runner.quit)


@events.cpu_warning.add_listener
def on_cpu_warning(**_):
    REQUEST_LOG.cpu_warnings += 1


@events.init.add_listener
def on_init(environment, **_):
    # Load (and for IMAGE_NORMALIZED, normalise) the image pool now, before the test starts, rather than
    # in the first user's on_start, where it would eat into the warm-up and the measured window.
    if environment.parsed_options and not isinstance(environment.runner, MasterRunner):
        model_inputs(environment.parsed_options)


class TritonUser(User):
    """One client, one request in flight at a time, no think time: concurrency == number of users."""

    def on_start(self):
        options = self.environment.parsed_options
        self.model, self.protocol = served_model(options.model, options.input_format), options.protocol
        url = options.triton_url or (self.host or "").split("://")[-1] or DEFAULT_URLS[self.protocol]
        self.windows = RequestWindows(model_inputs(options), options.images_per_request,
                                      offset=random.randrange(1 << 30))
        self.request_name = f"{options.model} x{options.images_per_request} {options.input_format}"
        if options.shared_memory != "none":
            self.request_name += f" {options.shared_memory}-shm"
        self.warmup_ends_at = REQUEST_LOG.test_started_at + options.warmup_s
        self.resources = contextlib.ExitStack()   # the client and its shared-memory regions, closed in on_stop
        check_endpoints(self.protocol, url, options.shared_memory)
        if self.protocol == "grpc":
            self.client = grpc_client(url)
        else:
            self.client = httpclient.InferenceServerClient(url, network_timeout=REQUEST_TIMEOUT_S,
                                                           connection_timeout=REQUEST_TIMEOUT_S)
        self.resources.callback(self.client.close)
        self.regions = None
        if options.shared_memory != "none":
            first = self.windows.inputs[:self.windows.images_per_request]
            self.regions = self.resources.enter_context(request_regions(
                self.client, self.protocol, options.shared_memory, first.nbytes,
                len(first) * LOGITS_BYTES_PER_IMAGE, read_admin_token(options.admin_token_file or None)))

    def on_stop(self):
        self.resources.close()   # unregister and free the regions, then close the client
        # Drop the closed client now, while gevent's hub runs: tritonclient's __del__ closes the gRPC channel
        # again, and at interpreter shutdown that second close can hang (seen without this).
        self.client = self.regions = None

    def infer(self, images: np.ndarray):
        slot = None
        if self.regions is not None:
            self.regions.input.write(images)
            slot = SharedMemorySlot(self.regions.input.name, self.regions.logits.name)
        inputs, outputs = build_request(self.protocol, images, engine=False, shared_memory=slot)
        kwargs = {"client_timeout": REQUEST_TIMEOUT_S} if self.protocol == "grpc" else {}
        return self.client.infer(self.model, inputs, outputs=outputs, **kwargs)

    def on_request_done(self, started_at: float, latency_ms: float, exception: Exception | None,
                        received_bytes: int = 0):
        REQUEST_LOG.add(started_at, latency_ms, exception is None)
        name = self.request_name + (WARMUP_SUFFIX if time.time() < self.warmup_ends_at else "")
        # response_length is bytes (locust reports it as the content size); the images of a request are in
        # its name ("x8") and in the context.
        self.environment.events.request.fire(request_type=self.protocol, name=name, response_time=latency_ms,
                                             response_length=received_bytes, exception=exception,
                                             context={"images": self.windows.images_per_request})

    @task
    def classify_batch(self):
        images = self.windows.next()
        started_at, started = time.time(), time.perf_counter()
        REQUEST_LOG.sent += 1
        exception, received = None, 0
        try:
            result = self.infer(images)
            received = response_bytes(result)
            check_logits_received(result, len(images), in_shared_memory=self.regions is not None)
        except Exception as error:  # every failure is a failed request, reported to locust
            exception = error
        self.on_request_done(started_at, (time.perf_counter() - started) * 1e3, exception, received)
