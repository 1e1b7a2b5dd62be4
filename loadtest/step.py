"""One step of the sweep: one model, one series, one concurrency level, one headless locust run.

A *series* is a load generator, a protocol, a number of images per request, an
input format, a shared-memory kind and a list of concurrency levels, written
[flood:]PROTOCOL/IMAGES[/FORMAT][/SHM][/pPROCESSES]@LEVELS, e.g. `grpc/1@1,2,4,8`,
`http/8/IMAGE_NORMALIZED@4,16`, `grpc/1/system@64` or `flood:grpc/32/cuda/p8@16,64`.
Without `flood:` the steps are locust runs (below); with it, steps of the
project's lighter generator (`loadtest/grpc_flood.py`, gRPC only), measured the
same way. FORMAT is the model input the images are sent as: IMAGE (default) or
IMAGE_NORMALIZED. SHM is none (default), system or cuda; pN overrides --processes.

A step runs `python -m locust` headless with `users` users, each keeping one
request in flight. Requests finishing in the first --warmup-s seconds are not
measured; the next --measure-s seconds are. Triton's metrics are scraped before
the run, when the window opens and closes (the locust master marks both
moments in files), every second inside it, and after the run. The window's
difference gives the server's view (average batch, queue vs compute time per
request, GPU utilisation); the whole run's difference is checked against what
the users sent:

    sent (counted by the users) == succeeded + failed (locust) == success + failure (Triton)

and every way in which these fail to add up is returned as a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV, DEFAULT_HOST, INPUT_UINT8, MODEL_ENTRIES, served_model
from fusedresnet.client.preprocess import INPUT_FORMATS
from fusedresnet.client.resnet_client import PROTOCOLS
from fusedresnet.client.shared_memory import SHARED_MEMORY_KINDS
from fusedresnet.loadtest import measurements, report, triton_metrics
from fusedresnet.loadtest.step_files import GRPC_FLOOD as FLOOD
from fusedresnet.loadtest.step_files import (
    LOCUST,
    LOCUST_JSON_STEM,
    LOCUST_LOG,
    MEASURE_END_MARKER,
    MEASURE_START_MARKER,
)

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
RUN_TIME_MARGIN_S = 30       # the locustfile ends the test when the window closes; --run-time is a safety net
STOP_TIMEOUT_S = 30          # in-flight requests may finish this long after locust stops (none is abandoned)
SETTLE_TIMEOUT_S = 3.0       # Triton updates its counters just after it answers: wait this long for them
EXIT_GRACE_S = 15.0          # once locust has written its final stats, it must exit within this time




@dataclass(frozen=True)
class Series:
    protocol: str
    images_per_request: int
    input_format: str
    levels: tuple[int, ...]
    shared_memory: str = "none"
    load_generator: str = LOCUST
    processes: int | None = None      # None: the sweep's --processes

    @classmethod
    def parse(cls, text: str) -> Series:
        """[flood:]PROTOCOL/IMAGES[/FORMAT][/SHM][/pN]@LEVELS, e.g. grpc/1@1,2,4 or flood:grpc/32/cuda@16."""
        usage = (f"series must look like grpc/1@1,2,4, http/8/IMAGE_NORMALIZED@4,16 or flood:grpc/32/system/p8@16: "
                 f"{text!r}")
        try:
            generator, _, spec = text.rpartition(":")
            head, levels = spec.split("@")
            protocol, images, *options = head.split("/")
            input_format, shared_memory, processes = INPUT_UINT8, "none", None
            for option in options:
                if option in INPUT_FORMATS:
                    input_format = option
                elif option in SHARED_MEMORY_KINDS:
                    shared_memory = option
                elif option.startswith("p"):
                    processes = int(option[1:])
                else:
                    raise ValueError(option)
            levels = tuple(int(level) for level in levels.split(","))
            images = int(images)
        except (ValueError, IndexError) as error:
            raise argparse.ArgumentTypeError(usage) from error
        load_generator = {"": LOCUST, "flood": FLOOD}.get(generator)
        if (protocol not in PROTOCOLS or images < 1 or min(levels) < 1 or load_generator is None
                or (load_generator == FLOOD and protocol != "grpc") or (processes is not None and processes < 1)):
            raise argparse.ArgumentTypeError(f"bad series {text!r}")
        return cls(protocol, images, input_format, levels, shared_memory, load_generator, processes)

    @property
    def key(self) -> tuple:
        return (self.load_generator, self.protocol, self.images_per_request, self.input_format, self.shared_memory,
                self.processes)

    @property
    def label(self) -> str:
        return report.series_label(self.key)


@dataclass(frozen=True)
class Step:
    index: int
    model: str
    series: Series
    users: int
    round: int


@dataclass(frozen=True)
class Endpoints:
    grpc_url: str
    http_url: str
    metrics_url: str

    def url_for(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url


@dataclass
class SweepSettings:
    warmup_s: float
    measure_s: float
    processes: int
    image_pools: dict[str, Path]    # input format -> the pool saved in that format
    raw_dir: Path
    admin_token: str | None = None  # registers the shared-memory regions of series that use them

    def processes_for(self, step: Step) -> int:
        return min(step.series.processes or self.processes, step.users)


def locust_command(step: Step, endpoints: Endpoints, settings: SweepSettings, step_dir: Path) -> list[str]:
    run_s = math.ceil(settings.warmup_s + settings.measure_s + RUN_TIME_MARGIN_S)
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
               "-u", str(step.users), "-r", str(step.users), "-t", f"{run_s:g}s",
               "--stop-timeout", str(STOP_TIMEOUT_S), "--exit-code-on-error", "0",
               "--json-file", str(step_dir / LOCUST_JSON_STEM),
               "--model", step.model, "--protocol", step.series.protocol,
               "--triton-url", endpoints.url_for(step.series.protocol),
               "--images-per-request", str(step.series.images_per_request),
               "--input-format", step.series.input_format,
               "--image-pool", str(settings.image_pools[step.series.input_format]),
               "--warmup-s", f"{settings.warmup_s:g}", "--measure-s", f"{settings.measure_s:g}",
               "--shared-memory", step.series.shared_memory, "--results-dir", str(step_dir)]
    processes = settings.processes_for(step)
    if processes > 1:
        port = free_ports(1)[0]
        command += ["--processes", str(processes), "--master-bind-host", DEFAULT_HOST,
                    "--master-bind-port", str(port), "--master-port", str(port)]
    return command


def scrape_until_settled(metrics_url: str, model: str, expected_requests: float) -> triton_metrics.MetricsSnapshot:
    """Scrape until Triton has counted `expected_requests` for `model`, or SETTLE_TIMEOUT_S has passed."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        snapshot = triton_metrics.scrape(metrics_url)
        if triton_metrics.requests_seen(snapshot, model) >= expected_requests or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.1)


WINDOW_MARKERS = (("start", MEASURE_START_MARKER), ("end", MEASURE_END_MARKER))


def locust_log_tail(step_dir: Path, lines: int = 15) -> str:
    log = step_dir / LOCUST_LOG
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    return f"\n--- end of {log} ---\n" + "\n".join(text)


def scrape_new_window_markers(step_dir: Path, metrics_url: str, snapshots: dict):
    """Scrape Triton as soon as the locust master marks that the window opened or closed."""
    for marker, file_name in WINDOW_MARKERS:
        if marker not in snapshots and (step_dir / file_name).is_file():
            snapshots[marker] = triton_metrics.scrape(metrics_url)


def end_process_group(locust: subprocess.Popen):
    """Make sure nothing of a step outlives it: the master and any worker it forked (--processes)."""
    if locust.poll() is None:
        locust.kill()
        locust.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(locust.pid, signal.SIGKILL)   # its own session: only this step's processes


def watch_locust(locust: subprocess.Popen, step_dir: Path, metrics_url: str, limit_s: float):
    """Follow a running locust step: Triton snapshots at the window's ends and every second inside it."""
    snapshots: dict[str, triton_metrics.MetricsSnapshot] = {}
    during: list[triton_metrics.MetricsSnapshot] = []
    locust_json = step_dir / f"{LOCUST_JSON_STEM}.json"
    started, last_sample, stats_written_at = time.monotonic(), 0.0, None
    try:
        while locust.poll() is None:
            if time.monotonic() - started > limit_s:
                raise RuntimeError(f"locust ran past {limit_s:.0f} s{locust_log_tail(step_dir)}")
            if stats_written_at is None and locust_json.is_file():
                stats_written_at = time.monotonic()
            if stats_written_at and time.monotonic() - stats_written_at > EXIT_GRACE_S:
                break   # its results are all written; only its shutdown is stuck
            scrape_new_window_markers(step_dir, metrics_url, snapshots)
            if "start" in snapshots and "end" not in snapshots and time.monotonic() - last_sample >= 1.0:
                during.append(triton_metrics.scrape(metrics_url))
                last_sample = time.monotonic()
            time.sleep(0.05)
    finally:
        end_process_group(locust)
    scrape_new_window_markers(step_dir, metrics_url, snapshots)   # in case locust outran the polling
    return snapshots, during


def scrape_when_quiet(metrics_url: str) -> triton_metrics.MetricsSnapshot:
    """A snapshot once Triton's request counters stand still (it counts a request just after answering it)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    previous = triton_metrics.scrape(metrics_url)
    while True:
        time.sleep(0.1)
        snapshot = triton_metrics.scrape(metrics_url)
        counts = [triton_metrics.requests_seen(s, m) for s in (previous, snapshot) for m in MODEL_ENTRIES]
        if counts[:len(MODEL_ENTRIES)] == counts[len(MODEL_ENTRIES):] or time.monotonic() > deadline:
            return snapshot
        previous = snapshot


def run_locust_step(step: Step, endpoints: Endpoints, settings: SweepSettings, step_dir: Path) -> dict:
    """Run one step; scrape Triton's metrics before, at both ends of the window, during it, and after."""
    step_dir = step_dir.resolve()
    shutil.rmtree(step_dir, ignore_errors=True)
    step_dir.mkdir(parents=True)
    metrics_url = endpoints.metrics_url
    before = scrape_when_quiet(metrics_url)
    started = time.time()
    limit_s = settings.warmup_s + settings.measure_s + RUN_TIME_MARGIN_S + STOP_TIMEOUT_S + 60
    with open(step_dir / LOCUST_LOG, "wb") as log:
        env = dict(os.environ)
        if settings.admin_token:   # by environment, not on a command line others can read
            env[ADMIN_TOKEN_ENV] = settings.admin_token
        locust = subprocess.Popen(locust_command(step, endpoints, settings, step_dir), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True, env=env)
        snapshots, during = watch_locust(locust, step_dir, metrics_url, limit_s)
    records = measurements.read_request_records(step_dir)
    entry = served_model(step.model, step.series.input_format)   # Triton counts per model entry
    expected = triton_metrics.requests_seen(before, entry) + records.sent
    after = scrape_until_settled(metrics_url, entry, expected)
    window = measurements.read_window(step_dir)
    locust_json = step_dir / f"{LOCUST_JSON_STEM}.json"
    if not locust_json.is_file() or window is None or set(snapshots) != {"start", "end"}:
        raise RuntimeError(f"locust step {step.index} did not complete (exit code {locust.returncode}, "
                           f"window {window}){locust_log_tail(step_dir)}")

    result = {"index": step.index, "round": step.round, "model": step.model, "protocol": step.series.protocol,
              "input_format": step.series.input_format, "users": step.users,
              "images_per_request": step.series.images_per_request,
              "shared_memory": step.series.shared_memory, "load_generator": LOCUST,
              "processes_asked": step.series.processes,
              "processes": settings.processes_for(step),
              "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
                  timespec="seconds")}
    result.update(measurements.client_side_summary(records, window, step.series.images_per_request))
    result.update(measurements.client_cpu_summary(records.cpu_percent))
    result.update(measurements.all_request_counts(records))
    result.update(measurements.read_locust_totals(locust_json))
    result.update(triton_metrics.model_delta(snapshots["start"], snapshots["end"], entry))
    whole_run = triton_metrics.model_delta(before, after, entry)
    result["triton_success_run"] = whole_run["triton_success"]
    result["triton_failure_run"] = whole_run["triton_failure"]
    result["triton_inferences_run"] = whole_run["triton_inferences"]
    result["triton_executions_run"] = whole_run["triton_executions"]
    result["other_models_requests_run"] = triton_metrics.other_entries_requests(before, after, entry)
    result["gpu_utilization"] = triton_metrics.mean_gauge(during, triton_metrics.GPU_UTILIZATION)
    result["per_gpu"] = triton_metrics.per_gpu(snapshots["start"], snapshots["end"], entry, during)
    result["server_cpu_utilization"] = triton_metrics.mean_gauge(during, triton_metrics.CPU_UTILIZATION)
    result["wall_s"] = round(time.time() - started, 2)
    result["problems"] = sanity_problems(result)
    return result


def sanity_problems(step: dict) -> list[str]:
    """Every way in which the counts of one step fail to add up (empty when they all agree)."""
    problems = []
    sent, n = step["sent"], step["images_per_request"]
    if step["completed"] != sent:
        problems.append(f"{sent} requests sent but {step['completed']} completed")
    if step.get("load_generator", LOCUST) == LOCUST and (
            step["locust_requests"] != sent or step["locust_failures"] != step["failures"]):
        problems.append(f"sent {sent} (failed {step['failures']}) but locust counted "
                        f"{step['locust_requests']} (failed {step['locust_failures']})")
    triton_total = step["triton_success_run"] + step["triton_failure_run"]
    if triton_total != sent:
        problems.append(f"sent {sent} but Triton counted {step['triton_success_run']} successes + "
                        f"{step['triton_failure_run']} failures = {triton_total}")
    if step["triton_inferences_run"] != step["triton_success_run"] * n:
        problems.append(f"Triton inferred {step['triton_inferences_run']} images for "
                        f"{step['triton_success_run']} successful requests of {n}")
    if step["other_models_requests_run"]:
        problems.append(f"{step['other_models_requests_run']} requests reached the other model during the step "
                        "(someone else is sending traffic)")
    if step["measured_requests"] == 0:
        problems.append("no request finished inside the measurement window")
    return problems
