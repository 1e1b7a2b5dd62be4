"""Locust users that send ResNet-18 inference requests to Triton over gRPC or HTTP.

    locust -f loadtest/locustfile.py                                   # web UI on :8089
    locust -f loadtest/locustfile.py --headless -u 16 -r 16 -t 30s --processes 4 \\
           --model resnet18_cudnn --protocol grpc --images-per-request 8 --triton-url 127.0.0.1:8001

Options (fields of the web UI too; each also read from FUSEDRESNET_<OPTION>, e.g.
FUSEDRESNET_IMAGES_PER_REQUEST=8):
  --model               resnet18_custom | resnet18_cudnn
  --protocol            grpc | http
  --triton-url          host:port (default: locust's --host, else the protocol's default port)
  --images-per-request  images in each request (1, 8, 32, ...)
  --input-format        uint8 (IMAGE, server normalises) | fp32 (IMAGE_NORMALIZED)
  --image-pool          .npy file of uint8 crops (default: build --pool-size images in each process)
  --warmup-s            requests that finish in the first N seconds are reported under "(warm-up)"
  --measure-s           length of the measurement window after the warm-up; when given, the test
                        stops (gracefully: requests in flight finish) when the window closes
  --results-dir         where each process writes every request it sent (requests-<pid>.npz) and the
                        master writes the measurement-window markers: what `loadtest.sweep` reads

Each user owns one client, created in `on_start` (after `--processes` has forked), sends one
request at a time with no wait, and fires a locust request event with the time it measured.
The gRPC client needs gevent-aware gRPC: `init_gevent()` runs here, before any channel exists.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import gevent
import grpc.experimental.gevent as grpc_gevent
import numpy as np
from locust import User, events, task
from locust.runners import MasterRunner, WorkerRunner

grpc_gevent.init_gevent()

import tritonclient.grpc as grpcclient  # noqa: E402  (after init_gevent)
import tritonclient.http as httpclient  # noqa: E402

from fusedresnet.backend.spec import (INPUT_FP32, INPUT_UINT8, MODEL_CUSTOM, MODELS, NUM_CLASSES,  # noqa: E402
                                      OUTPUT_LOGITS)
from fusedresnet.client.resnet_client import DEFAULT_URLS, PROTOCOLS  # noqa: E402
from fusedresnet.loadtest.image_pool import (DEFAULT_POOL_SIZE, INPUT_FORMATS, RequestWindows,  # noqa: E402
                                             as_model_input, load_image_pool)
from fusedresnet.loadtest.step_files import (MEASURE_END_MARKER, MEASURE_START_MARKER, WARMUP_SUFFIX,  # noqa: E402
                                             request_log_name)

REQUEST_TIMEOUT_S = 60.0
MARKER_GRACE_S = 0.3   # the load goes on this long after the window closes, while the sweep scrapes Triton


@events.init_command_line_parser.add_listener
def add_options(parser):
    parser.add_argument("--model", choices=MODELS, default=MODEL_CUSTOM, env_var="FUSEDRESNET_MODEL")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc", env_var="FUSEDRESNET_PROTOCOL")
    parser.add_argument("--triton-url", default="", env_var="FUSEDRESNET_TRITON_URL",
                        help="host:port of Triton's gRPC or HTTP endpoint")
    parser.add_argument("--images-per-request", type=int, default=1, env_var="FUSEDRESNET_IMAGES_PER_REQUEST")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="uint8", env_var="FUSEDRESNET_INPUT_FORMAT")
    parser.add_argument("--image-pool", default="", env_var="FUSEDRESNET_IMAGE_POOL",
                        help=".npy file of uint8 [N,224,224,3] crops")
    parser.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE, env_var="FUSEDRESNET_POOL_SIZE")
    parser.add_argument("--warmup-s", type=float, default=0.0, env_var="FUSEDRESNET_WARMUP_S")
    parser.add_argument("--measure-s", type=float, default=0.0, env_var="FUSEDRESNET_MEASURE_S")
    parser.add_argument("--results-dir", default="", env_var="FUSEDRESNET_RESULTS_DIR", include_in_web_ui=False)


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
        self.test_started_at = time.time()

    def add(self, started_at: float, latency_ms: float, succeeded: bool):
        self.started_at.append(started_at)
        self.latency_ms.append(latency_ms)
        self.succeeded.append(succeeded)

    def write(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / request_log_name(os.getpid()), sent=np.int64(self.sent),
                 started_at=np.asarray(self.started_at, np.float64),
                 latency_ms=np.asarray(self.latency_ms, np.float64),
                 succeeded=np.asarray(self.succeeded, bool), cpu_warnings=np.int64(self.cpu_warnings))


REQUEST_LOG = RequestLog()
_MODEL_INPUTS: dict[tuple, np.ndarray] = {}   # per process: (pool file, size, format) -> model input array


def model_inputs(options) -> np.ndarray:
    key = (options.image_pool, options.pool_size, options.input_format)
    if key not in _MODEL_INPUTS:
        pool = load_image_pool(options.image_pool or None, options.pool_size)
        _MODEL_INPUTS[key] = as_model_input(pool, options.input_format)
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


@events.test_start.add_listener
def on_test_start(environment, **_):
    REQUEST_LOG.clear()
    options = environment.parsed_options
    if options and options.measure_s > 0 and not isinstance(environment.runner, WorkerRunner):
        folder = Path(options.results_dir) if options.results_dir else None
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
        gevent.spawn(measurement_window, environment, folder, options.warmup_s, options.measure_s)


@events.test_stop.add_listener
def on_test_stop(environment, **_):
    options = environment.parsed_options
    if options and options.results_dir and not isinstance(environment.runner, MasterRunner):
        REQUEST_LOG.write(Path(options.results_dir))
    if isinstance(environment.runner, WorkerRunner):
        # Report the last requests now, before this worker tells the master it has stopped:
        # otherwise they wait for the next periodic report, which may come after the master's summary.
        environment.runner._send_stats()
        if options and options.measure_s > 0:
            # A stopped worker is forgotten by the master, so it would never get the master's `quit`
            # and would linger until the heartbeat times out (60 s): leave once `client_stopped` is sent.
            gevent.spawn_later(0.2, environment.runner.quit)


@events.cpu_warning.add_listener
def on_cpu_warning(**_):
    REQUEST_LOG.cpu_warnings += 1


RUNNERS = []   # this process's runner, kept from the init event


@events.init.add_listener
def on_init(environment, **_):
    RUNNERS.append(environment.runner)
    # Load (and for fp32, normalise) the image pool now, before the test starts, rather than
    # in the first user's on_start, where it would eat into the warm-up and the measured window.
    if environment.parsed_options and not isinstance(environment.runner, MasterRunner):
        model_inputs(environment.parsed_options)


@events.quit.add_listener
def exit_without_interpreter_teardown(exit_code, **_):
    """Leave as soon as locust has written its stats: with gevent-patched gRPC channels open,
    interpreter shutdown sometimes hangs. The master of --processes exits normally (it waits for its workers)."""
    if not any(isinstance(runner, MasterRunner) for runner in RUNNERS):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


class TritonUser(User):
    """One client, one request in flight at a time, no think time: concurrency == number of users."""

    def on_start(self):
        options = self.environment.parsed_options
        self.model, self.protocol = options.model, options.protocol
        url = options.triton_url or (self.host or "").split("://")[-1] or DEFAULT_URLS[self.protocol]
        self.windows = RequestWindows(model_inputs(options), options.images_per_request,
                                      offset=random.randrange(1 << 30))
        self.input_name = INPUT_UINT8 if options.input_format == "uint8" else INPUT_FP32
        self.datatype = "UINT8" if options.input_format == "uint8" else "FP32"
        self.request_name = f"{self.model} x{options.images_per_request} {options.input_format}"
        self.warmup_ends_at = REQUEST_LOG.test_started_at + options.warmup_s
        if self.protocol == "grpc":
            self.client = grpcclient.InferenceServerClient(url)
        else:
            self.client = httpclient.InferenceServerClient(url, network_timeout=REQUEST_TIMEOUT_S,
                                                           connection_timeout=REQUEST_TIMEOUT_S)

    def on_stop(self):
        self.client.close()

    def infer(self, images: np.ndarray):
        lib = grpcclient if self.protocol == "grpc" else httpclient
        tensor = lib.InferInput(self.input_name, list(images.shape), self.datatype)
        tensor.set_data_from_numpy(images)
        if self.protocol == "grpc":
            return self.client.infer(self.model, [tensor], outputs=[grpcclient.InferRequestedOutput(OUTPUT_LOGITS)],
                                     client_timeout=REQUEST_TIMEOUT_S)
        return self.client.infer(self.model, [tensor],
                                 outputs=[httpclient.InferRequestedOutput(OUTPUT_LOGITS, binary_data=True)])

    @staticmethod
    def check(result, images_sent: int):
        logits = result.as_numpy(OUTPUT_LOGITS)
        if logits is None or logits.shape != (images_sent, NUM_CLASSES):
            shape = None if logits is None else logits.shape
            raise ValueError(f"expected logits [{images_sent}, {NUM_CLASSES}], got {shape}")

    def on_request_done(self, started_at: float, latency_ms: float, exception: Exception | None):
        REQUEST_LOG.add(started_at, latency_ms, exception is None)
        name = self.request_name + (WARMUP_SUFFIX if time.time() < self.warmup_ends_at else "")
        self.environment.events.request.fire(request_type=self.protocol, name=name, response_time=latency_ms,
                                             response_length=self.windows.images_per_request,
                                             exception=exception, context={})

    @task
    def classify_batch(self):
        images = self.windows.next()
        started_at, started = time.time(), time.perf_counter()
        REQUEST_LOG.sent += 1
        exception = None
        try:
            self.check(self.infer(images), len(images))
        except Exception as error:  # every failure is a failed request, reported to locust
            exception = error
        self.on_request_done(started_at, (time.perf_counter() - started) * 1e3, exception)
