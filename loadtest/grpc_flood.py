"""A light load generator of the project's own: many gRPC requests in flight per process.

    python -m fusedresnet.loadtest.grpc_flood --model resnet18_custom --url 127.0.0.1:8001 \\
        --metrics-url http://127.0.0.1:8002/metrics --concurrency 256 --images-per-request 1 \\
        --processes 4 --seconds 5 --shared-memory system --out build/flood.json

Where locust on the server's host cannot saturate the server (each locust user is a
greenlet driving a blocking client: about a core per few thousand requests per
second), this sends the same requests for a fraction of the CPU: each process runs
tritonclient's asyncio gRPC client (`tritonclient.grpc.aio`) with `concurrency /
processes` coroutines, each keeping one request in flight, so `concurrency` plays the
part of locust's users. Requests are built before the step, once per window of the
image pool (loadtest/image_pool.py) through the same `build_request` as the client
and the locust users; with `--shared-memory system|cuda` the whole pool lives in one
registered input region and each request only names its window, and every in-flight
slot has its own place for LOGITS in the process's output region.

A step is measured as the locust steps are (loadtest/step.py): a warm-up, then a
measurement window whose requests give throughput and exact latency percentiles;
Triton's metrics are scraped before, at both ends of the window, every second inside
it, and after; every request sent must be counted by Triton. The load generator's own
CPU use (psutil, user + system, of every process, summed) is taken over the window:
`client_cpu_percent` is in percent of one core (400 = four cores busy), and
`client_cpu_saturated` says a process ran above 90% of its core, where this
generator, not the server, may be the limit.

Several servers: `--url` "host:port,host:port" (or "dns:///name:port") spreads the requests over
them by gRPC's round robin (client/resnet_client.py, grpc_channel), and `--metrics-url` takes every
server's metrics URL, comma-separated: Triton's counts are then the servers' sums.

`run_step(...) -> dict` is the entry point (the sweep's); the CLI prints and writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import multiprocessing
import queue
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from fusedresnet.backend.spec import (
    AB_ROUTER_MODEL,
    DEFAULT_GRPC_URL,
    DEFAULT_METRICS_URL,
    INPUT_UINT8,
    MODEL_CUSTOM,
    MODELS,
    ZERO_MODEL,
    served_model,
)
from fusedresnet.client.preprocess import INPUT_FORMATS, model_input
from fusedresnet.client.resnet_client import (
    LOGITS_BYTES_PER_IMAGE,
    SharedMemorySlot,
    build_request,
    check_endpoints,
    check_logits_received,
    grpc_client,
)
from fusedresnet.client.shared_memory import SHARED_MEMORY_KINDS, read_admin_token, registered_on_every_process
from fusedresnet.loadtest import measurements, triton_metrics
from fusedresnet.loadtest.image_pool import (
    DEFAULT_POOL_SIZE,
    load_image_pool,
    save_image_pool,
)
from fusedresnet.loadtest.step_files import GRPC_FLOOD

LOAD_GENERATOR = GRPC_FLOOD
REQUEST_TIMEOUT_S = 60.0
LOAD_GRACE_S = 0.3            # the load goes on this long after the window closes, while Triton is scraped
START_DELAY_S = 0.2           # between "every process is ready" and the first request
PREBUILT_BYTES = 256 << 20    # at most this much request payload is pre-built per process (without shared memory)
ERROR_EXAMPLES = 5


@dataclass(frozen=True)
class FloodSettings:
    model: str                     # the model entry serving the input sent (spec.served_model)
    url: str                       # host:port of Triton's gRPC endpoint
    images_per_request: int
    input_format: str              # IMAGE or IMAGE_NORMALIZED: the model input sent
    image_pool: str                # .npy of the pool (uint8 crops, or already converted to the input format)
    shared_memory: str             # none | system | cuda
    admin_token: str | None
    input_region: str | None       # the registered region holding the whole model-input pool (shared memory)
    warmup_s: float
    measure_s: float
    cuda_device: int = 0
    server_processes: int = 1      # tritonservers behind the one port: each region is registered with each


def request_windows(pool_length: int, images_per_request: int, count: int, offset: int) -> list[int]:
    """`count` window starts, consecutive from `offset`, as RequestWindows walks the pool."""
    starts = pool_length - images_per_request + 1
    return [(offset + i) % starts for i in range(min(count, starts))]


def prebuilt_inputs(settings: FloodSettings, inputs: np.ndarray, offset: int) -> list[list]:
    """The inputs of one request per window of the pool, built once (payload or shared-memory reference)."""
    n = settings.images_per_request
    if settings.shared_memory == "none":
        count = max(1, PREBUILT_BYTES // inputs[:n].nbytes)
    else:
        count = len(inputs)
    built = []
    for start in request_windows(len(inputs), n, count, offset):
        images = inputs[start:start + n]
        slot = None
        if settings.shared_memory != "none":
            slot = SharedMemorySlot(settings.input_region, "", input_offset=start * inputs[:1].nbytes)
        built.append(build_request("grpc", images, engine=False, shared_memory=slot)[0])
    return built


def slot_outputs(settings: FloodSettings, sample: np.ndarray, logits_region: str | None, slots: int) -> list[list]:
    """Requested outputs of each in-flight slot: LOGITS in the response, or in the slot's part of the region."""
    if logits_region is None:
        return [build_request("grpc", sample, engine=False)[1]] * slots
    per_slot = len(sample) * LOGITS_BYTES_PER_IMAGE
    return [build_request("grpc", sample, engine=False,
                          shared_memory=SharedMemorySlot("", logits_region, logits_offset=k * per_slot))[1]
            for k in range(slots)]


class Recorder:
    """Every request of one process: start (epoch s), latency (ms), success; errors counted by message."""

    def __init__(self):
        self.sent = 0
        self.started_at: list[float] = []
        self.latency_ms: list[float] = []
        self.succeeded: list[bool] = []
        self.errors: Counter = Counter()

    def result(self) -> dict:
        return {"sent": self.sent, "started_at": np.asarray(self.started_at, np.float64),
                "latency_ms": np.asarray(self.latency_ms, np.float64),
                "succeeded": np.asarray(self.succeeded, bool), "errors": dict(self.errors)}


async def keep_one_in_flight(client, settings: FloodSettings, inputs: list, outputs: list, first: int, stride: int,
                             stop_at: float, recorder: Recorder):
    n, index = settings.images_per_request, first
    in_shared_memory = settings.shared_memory != "none"
    while time.time() < stop_at:
        request_inputs = inputs[index % len(inputs)]
        index += stride
        recorder.sent += 1
        started_at, started = time.time(), time.perf_counter()
        try:
            result = await client.infer(settings.model, request_inputs, outputs=outputs,
                                        client_timeout=REQUEST_TIMEOUT_S)
            check_logits_received(result, n, in_shared_memory)
            ok = True
        except Exception as error:  # every failure is a failed request, counted by its message
            recorder.errors[str(error)[:300]] += 1
            ok = False
        recorder.latency_ms.append((time.perf_counter() - started) * 1e3)
        recorder.started_at.append(started_at)
        recorder.succeeded.append(ok)


async def flood(settings: FloodSettings, slots: int, offset: int, logits_region: str | None, ready, go, start_at,
                recorder: Recorder):
    import tritonclient.grpc.aio as grpcaio  # in the worker process only: grpc.aio binds to this event loop

    pool = model_input(load_image_pool(Path(settings.image_pool)), settings.input_format)
    inputs = prebuilt_inputs(settings, pool, offset)
    outputs = slot_outputs(settings, pool[:settings.images_per_request], logits_region, slots)
    async with grpc_client(settings.url, grpcaio.InferenceServerClient) as client:
        await client.is_server_ready()        # the channel is connected before the clock starts
        ready()
        while not go.is_set():
            await asyncio.sleep(0.005)
        await asyncio.sleep(max(0.0, start_at.value - time.time()))
        stop_at = start_at.value + settings.warmup_s + settings.measure_s + LOAD_GRACE_S
        await asyncio.gather(*(keep_one_in_flight(client, settings, inputs, outputs[k], k, slots, stop_at, recorder)
                               for k in range(slots)))


def worker_main(settings: FloodSettings, slots: int, offset: int, results, go, start_at):
    """One load process: its output region (with shared memory), `slots` requests in flight, records sent back."""

    recorder = Recorder()
    try:
        with contextlib.ExitStack() as resources:
            logits_region = None
            if settings.shared_memory != "none":
                region = resources.enter_context(registered_on_every_process(
                    settings.url, settings.shared_memory, slots * settings.images_per_request * LOGITS_BYTES_PER_IMAGE,
                    settings.admin_token, settings.server_processes, "logits", settings.cuda_device))
                logits_region = region.name
            asyncio.run(flood(settings, slots, offset, logits_region, lambda: results.put(("ready", None)),
                              go, start_at, recorder))
        results.put(("done", recorder.result()))
    except BaseException:
        results.put(("failed", traceback.format_exc()))


def split_concurrency(concurrency: int, processes: int) -> list[int]:
    """In-flight requests of each process: as even as possible, every process at least one."""
    processes = max(1, min(processes, concurrency))
    return [concurrency // processes + (i < concurrency % processes) for i in range(processes)]


def cpu_seconds(processes: list[psutil.Process]) -> list[float]:
    times = [p.cpu_times() for p in processes]
    return [t.user + t.system for t in times]


def sleep_until(moment: float):
    time.sleep(max(0.0, moment - time.time()))


@contextlib.contextmanager
def pool_file(image_pool: Path | None, pool_size: int):
    """The pool's .npy file, saved to a temporary folder first when none is given."""
    if image_pool:
        yield Path(image_pool)
        return
    from fusedresnet.loadtest.image_pool import build_image_pool
    with tempfile.TemporaryDirectory(prefix="grpc-flood-") as folder:
        yield save_image_pool(build_image_pool(pool_size), Path(folder) / "pool.npy")


@contextlib.contextmanager
def pool_region(settings_url: str, kind: str, pool: np.ndarray, admin_token: str | None, cuda_device: int,
                server_processes: int = 1):
    """The whole model-input pool in one registered region, which every process's requests name (registered
    with every server process behind the port: a request may reach any of them)."""
    if kind == "none":
        yield None
        return
    with registered_on_every_process(settings_url, kind, pool.nbytes, admin_token, server_processes, "pool",
                                     cuda_device) as region:
        region.write(pool)
        yield region.name


def run_step(model: str, url: str, metrics_url: str, concurrency: int, images_per_request: int = 1,
             processes: int = 1, warmup_s: float = 1.0, measure_s: float = 5.0, input_format: str = INPUT_UINT8,
             image_pool: Path | None = None, pool_size: int = DEFAULT_POOL_SIZE, shared_memory: str = "none",
             admin_token: str | None = None, cuda_device: int = 0, server_processes: int = 1) -> dict:
    """One step: `concurrency` requests kept in flight by `processes` processes, measured over `measure_s`
    after `warmup_s`; returns a step record shaped like the locust steps of loadtest/step.py."""
    from fusedresnet.loadtest import step  # here, not at the top: the load processes need none of it (matplotlib)

    if shared_memory not in SHARED_MEMORY_KINDS:
        raise ValueError(f"shared memory must be one of {SHARED_MEMORY_KINDS}, not {shared_memory!r}")
    check_endpoints("grpc", url, shared_memory)
    if shared_memory != "none" and admin_token is None:
        admin_token = read_admin_token()
    shares = split_concurrency(concurrency, processes)
    context = multiprocessing.get_context("spawn")   # no fork of a process that may hold gRPC state
    wall_started = time.time()
    with pool_file(image_pool, pool_size) as pool_path:
        pool = model_input(load_image_pool(pool_path), input_format)
        with pool_region(url, shared_memory, pool, admin_token, cuda_device, server_processes) as input_region:
            settings = FloodSettings(served_model(model, input_format), url, images_per_request, input_format,
                                     str(pool_path), shared_memory, admin_token, input_region, warmup_s, measure_s,
                                     cuda_device, server_processes)
            results, go, start_at = context.Queue(), context.Event(), context.Value("d", 0.0)
            workers = [context.Process(target=worker_main, daemon=True, name=f"grpc-flood-{i}",
                                       args=(settings, slots, i * 7919, results, go, start_at))
                       for i, slots in enumerate(shares)]
            before = step.scrape_when_quiet(metrics_url)
            for worker in workers:
                worker.start()
            try:
                record = drive(workers, results, go, start_at, settings, metrics_url, before)
            except BaseException:
                if not go.is_set():       # let the waiting processes leave cleanly (and free their regions)
                    start_at.value = 0.0
                    go.set()
                raise
            finally:
                for worker in workers:
                    worker.join(timeout=10)
                    if worker.is_alive():
                        worker.kill()
    record.update({"model": model, "protocol": "grpc", "input_format": input_format, "users": concurrency,
                   "concurrency": concurrency, "images_per_request": images_per_request,
                   "processes": len(shares), "shared_memory": shared_memory, "load_generator": LOAD_GENERATOR,
                   "started_at": datetime.datetime.fromtimestamp(wall_started, datetime.timezone.utc).isoformat(
                       timespec="seconds")})
    record["wall_s"] = round(time.time() - wall_started, 2)
    # No locust here: its cross-check of the counts is vacuous; the users' and Triton's counts are checked.
    record["problems"] = step.sanity_problems({**record, "locust_requests": record["sent"],
                                               "locust_failures": record["failures"]})
    return record


def wait_for(results, expected: int, kind: str, deadline: float) -> list:
    """`expected` messages of `kind` from the workers (a worker's failure raises with its traceback)."""
    received = []
    while len(received) < expected:
        try:
            message_kind, payload = results.get(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            raise RuntimeError(f"{expected - len(received)} load process(es) gave no '{kind}' in time") from None
        if message_kind == "failed":
            raise RuntimeError(f"a load process failed:\n{payload}")
        if message_kind == kind:
            received.append(payload)
    return received


def drive(workers, results, go, start_at, settings: FloodSettings, metrics_url: str,
          before: triton_metrics.MetricsSnapshot) -> dict:
    """Start the load once every process is ready; scrape Triton and take the processes' CPU around the window."""
    from fusedresnet.loadtest import step
    wait_for(results, len(workers), "ready", time.time() + 120)
    start_at.value = time.time() + START_DELAY_S
    go.set()
    window = (start_at.value + settings.warmup_s, start_at.value + settings.warmup_s + settings.measure_s)
    handles = [psutil.Process(worker.pid) for worker in workers]
    sleep_until(window[0])
    cpu_start, cpu_started = cpu_seconds(handles), time.monotonic()
    psutil.cpu_percent(interval=None)   # the next call reports the host's CPU use since this one
    start = triton_metrics.scrape(metrics_url)
    during = []
    while time.time() < window[1] - 1.0:
        time.sleep(min(1.0, window[1] - 1.0 - time.time()))
        during.append(triton_metrics.scrape(metrics_url))
    sleep_until(window[1])
    cpu_end, host_cpu_percent = cpu_seconds(handles), psutil.cpu_percent(interval=None)
    cpu_window_s = time.monotonic() - cpu_started
    end = triton_metrics.scrape(metrics_url)
    outputs = wait_for(results, len(workers), "done", window[1] + LOAD_GRACE_S + REQUEST_TIMEOUT_S + 30)

    records = measurements.RequestRecords(
        sum(o["sent"] for o in outputs), np.concatenate([o["started_at"] for o in outputs]),
        np.concatenate([o["latency_ms"] for o in outputs]), np.concatenate([o["succeeded"] for o in outputs]))
    after = step.scrape_until_settled(metrics_url, settings.model,
                                      triton_metrics.requests_seen(before, settings.model) + records.sent)
    record = measurements.client_side_summary(records, window, settings.images_per_request)
    record["window_unix"] = list(window)     # the measurement window (time.time()), for others' samples of it
    inside = (records.finished_at >= window[0]) & (records.finished_at < window[1]) & records.succeeded
    record["max_ms"] = float(records.latency_ms[inside].max()) if inside.any() else None
    record.update(measurements.all_request_counts(records))
    errors = Counter()
    for output in outputs:
        errors.update(output["errors"])
    record["error_examples"] = [f"{count} x {message}" for message, count in errors.most_common(ERROR_EXAMPLES)]

    per_process = [(e - s) / cpu_window_s * 100 for s, e in zip(cpu_start, cpu_end, strict=True)]
    record.update({
        **measurements.client_cpu_summary(per_process),
        "host_cpu_percent": host_cpu_percent,    # all cores of the host (server and generator together)
        "host_cpus": psutil.cpu_count(),
    })
    record.update(triton_metrics.model_delta(start, end, settings.model))
    whole_run = triton_metrics.model_delta(before, after, settings.model)
    for key in ("triton_success", "triton_failure", "triton_inferences", "triton_executions"):
        record[f"{key}_run"] = whole_run[key]
    record["other_models_requests_run"] = triton_metrics.other_entries_requests(before, after, settings.model)
    record["gpu_utilization"] = triton_metrics.mean_gauge(during, triton_metrics.GPU_UTILIZATION)
    record["per_gpu"] = triton_metrics.per_gpu(start, end, settings.model, during)
    record["server_cpu_utilization"] = triton_metrics.mean_gauge(during, triton_metrics.CPU_UTILIZATION)
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=(*MODELS, AB_ROUTER_MODEL, ZERO_MODEL), default=MODEL_CUSTOM)
    parser.add_argument("--url", default=DEFAULT_GRPC_URL,
                        help="Triton's gRPC endpoint; several: host:port,host:port or dns:///name:port")
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL,
                        help="Triton's metrics; with several servers, each one's URL, comma-separated")
    parser.add_argument("--concurrency", type=int, required=True, help="requests in flight, over all processes")
    parser.add_argument("--images-per-request", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the measurement window")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default=INPUT_UINT8)
    parser.add_argument("--image-pool", type=Path, help=".npy pool (default: build one of --pool-size images)")
    parser.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    parser.add_argument("--shared-memory", choices=SHARED_MEMORY_KINDS, default="none")
    parser.add_argument("--admin-token-file", type=Path,
                        help="admin token for registering shared memory (default: $FUSEDRESNET_ADMIN_TOKEN, "
                             "else build/admin-token)")
    parser.add_argument("--cuda-device", type=int, default=0,
                        help="with --shared-memory cuda: the GPU of the regions, as the server numbers its GPUs")
    parser.add_argument("--server-processes", type=int, default=1,
                        help="with shared memory: tritonserver processes behind --url's port (the launcher's "
                             "--processes-per-gpu x GPUs): each region is registered with each of them")
    parser.add_argument("--out", type=Path, help="write the step record here as JSON")
    args = parser.parse_args(argv)
    token = read_admin_token(args.admin_token_file) if args.shared_memory != "none" else None
    record = run_step(args.model, args.url, args.metrics_url, args.concurrency, args.images_per_request,
                      args.processes, args.warmup_s, args.seconds, args.input_format, args.image_pool,
                      args.pool_size, args.shared_memory, token, args.cuda_device, args.server_processes)
    p = {k: "-" if record[k] is None else f"{record[k]:.1f}" for k in ("p50_ms", "p99_ms", "max_ms")}
    print(f"{record['model']} x{record['images_per_request']} {record['input_format']} shm={record['shared_memory']}"
          f" concurrency {record['concurrency']} in {record['processes']} process(es): "
          f"{record['img_per_s']:.1f} img/s, p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms, max {p['max_ms']} ms; "
          f"{record['sent']} sent, {record['failures']} failed; load generator CPU {record['client_cpu_percent']}% "
          f"of a core (max process {record['client_cpu_percent_max_process']}%)")
    for problem in record["problems"]:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    for example in record["error_examples"]:
        print(f"error: {example}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=float) + "\n")
    return 3 if record["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
