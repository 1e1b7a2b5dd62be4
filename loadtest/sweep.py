"""Throughput-versus-latency sweep of both models under the same conditions, then the A/B report.

    python -m fusedresnet.loadtest.sweep --start-server --out results          # starts its own Triton
    python -m fusedresnet.loadtest.sweep --grpc-port 8001 --http-port 8000 --metrics-port 8002 --out results

A *series* is a protocol, a number of images per request and a list of
concurrency levels, written PROTOCOL/IMAGES[/FORMAT]@LEVELS, e.g.
`grpc/1@1,2,4,8` or `http/8/fp32@4,16`. For every level of every series both
models run one *step* each, back to back, and the order flips from level to
level (A B, B A, A B, ...) so that drift of the machine favours neither model.

One step = one headless locust run (a subprocess: `python -m locust`) with
`users` users, each one request in flight. Requests finishing in the first
--warmup-s seconds are not measured; the next --measure-s seconds are. Triton's
metrics are scraped before the run, when the window opens and closes, and
after the run; the window's difference gives the server's view (average batch,
queue vs compute time per request, GPU utilisation) and the whole run's
difference is checked against what the clients sent:

    sent (counted by the users) == succeeded + failed (locust) == success + failure (Triton)

A mismatch is printed loudly, written into the report, and makes the exit code 3.

Outputs in --out: <name>.json (all steps, machine-readable), <name>.csv (one row
per step), <name>.md (the report), <name>_*.png (plots), and the agreement of the
two models on the same images (ab_agreement.*, see `fusedresnet.client.ab`).
Per-step raw records (locust JSON and log, per-request times, server log) go to --raw-dir.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonclient.utils import InferenceServerException

from fusedresnet.backend.serve import BUILD_DIR, TritonServer, free_ports, gpu_present
from fusedresnet.backend.spec import (DEFAULT_GRPC_PORT, DEFAULT_HOST, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT,
                                      MAX_BATCH_SIZE, MODEL_REPOSITORY, MODELS, REPO_ROOT)
from fusedresnet.client.resnet_client import PROTOCOLS, ResNetClient
from fusedresnet.loadtest import measurements, report, triton_metrics
from fusedresnet.loadtest.image_pool import (DEFAULT_POOL_SIZE, INPUT_FORMATS, as_model_input, build_image_pool,
                                             save_image_pool)
from fusedresnet.loadtest.step_files import LOCUST_JSON_STEM, LOCUST_LOG, MEASURE_END_MARKER, MEASURE_START_MARKER

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# The full sweep for the GPU host: the main curve (gRPC, one image per request) at every
# power of two, and shorter curves for batched requests and for HTTP.
DEFAULT_SERIES = ("grpc/1@1,2,4,8,16,32,64,128", "grpc/8@1,4,16,64", "http/1@1,16,64")
DEFAULT_NAME = "loadtest_ab"
RUN_TIME_MARGIN_S = 30       # the locustfile ends the test when the window closes; --run-time is a safety net
STOP_TIMEOUT_S = 30          # in-flight requests may finish this long after locust stops (none is abandoned)
SETTLE_TIMEOUT_S = 3.0       # Triton updates its counters just after it answers: wait this long for them
EXIT_GRACE_S = 15.0          # once locust has written its final stats, it must exit within this time
EXIT_SANITY_MISMATCH = 3
EXIT_SWEEP_FAILED = 4


@dataclass(frozen=True)
class Series:
    protocol: str
    images_per_request: int
    input_format: str
    levels: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> "Series":
        """PROTOCOL/IMAGES[/FORMAT]@LEVELS, e.g. grpc/1@1,2,4 or http/8/fp32@4,16."""
        try:
            head, levels = text.split("@")
            parts = head.split("/")
            protocol, images = parts[0], int(parts[1])
            input_format = parts[2] if len(parts) > 2 else "uint8"
            levels = tuple(int(level) for level in levels.split(","))
        except (ValueError, IndexError):
            raise argparse.ArgumentTypeError(f"series must look like grpc/1@1,2,4 or http/8/fp32@4,16: {text!r}")
        if protocol not in PROTOCOLS or input_format not in INPUT_FORMATS or images < 1 or min(levels) < 1:
            raise argparse.ArgumentTypeError(f"bad series {text!r}")
        return cls(protocol, images, input_format, levels)

    @property
    def label(self) -> str:
        return report.series_label((self.protocol, self.images_per_request, self.input_format))


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


def plan_steps(series_list, models=MODELS, rounds: int = 1) -> list[Step]:
    """Every (series, level) runs every model back to back; the order alternates from one pair to the next."""
    steps, pair = [], 0
    for round_index in range(rounds):
        for series in series_list:
            for users in series.levels:
                ordered = list(models) if pair % 2 == 0 else list(reversed(models))
                steps += [Step(len(steps) + i, model, series, users, round_index) for i, model in enumerate(ordered)]
                pair += 1
    return steps


@dataclass
class SweepSettings:
    warmup_s: float
    measure_s: float
    processes: int
    image_pools: dict[str, Path]    # input format -> the pool saved in that format
    raw_dir: Path


def locust_command(step: Step, endpoints: Endpoints, settings: SweepSettings, step_dir: Path) -> list[str]:
    run_s = settings.warmup_s + settings.measure_s + RUN_TIME_MARGIN_S
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
               "--results-dir", str(step_dir)]
    processes = min(settings.processes, step.users)
    if processes > 1:
        port = free_ports(1)[0]
        command += ["--processes", str(processes), "--master-bind-host", "127.0.0.1",
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
        counts = [triton_metrics.requests_seen(s, m) for s in (previous, snapshot) for m in MODELS]
        if counts[:len(MODELS)] == counts[len(MODELS):] or time.monotonic() > deadline:
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
        locust = subprocess.Popen(locust_command(step, endpoints, settings, step_dir), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  # not the repository root: locust puts its working directory first on
                                  # sys.path, where the bare fusedresnet/ folder would hide the packages
                                  cwd=step_dir)
        snapshots, during = watch_locust(locust, step_dir, metrics_url, limit_s)
    records = measurements.read_request_records(step_dir)
    expected = triton_metrics.requests_seen(before, step.model) + records.sent
    after = scrape_until_settled(metrics_url, step.model, expected)
    window = measurements.read_window(step_dir)
    locust_json = step_dir / f"{LOCUST_JSON_STEM}.json"
    if not locust_json.is_file() or window is None or set(snapshots) != {"start", "end"}:
        raise RuntimeError(f"locust step {step.index} did not complete (exit code {locust.returncode}, "
                           f"window {window}){locust_log_tail(step_dir)}")

    result = {"index": step.index, "round": step.round, "model": step.model, "protocol": step.series.protocol,
              "input_format": step.series.input_format, "users": step.users,
              "images_per_request": step.series.images_per_request,
              "processes": min(settings.processes, step.users),
              "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
                  timespec="seconds")}
    result.update(measurements.client_side_summary(records, window, step.series.images_per_request))
    result.update(measurements.all_request_counts(records))
    result.update(measurements.read_locust_totals(locust_json))
    result.update(triton_metrics.model_delta(snapshots["start"], snapshots["end"], step.model))
    whole_run = triton_metrics.model_delta(before, after, step.model)
    result["triton_success_run"] = whole_run["triton_success"]
    result["triton_failure_run"] = whole_run["triton_failure"]
    result["triton_inferences_run"] = whole_run["triton_inferences"]
    result["triton_executions_run"] = whole_run["triton_executions"]
    result["other_models_requests_run"] = int(sum(
        triton_metrics.requests_seen(after, m) - triton_metrics.requests_seen(before, m)
        for m in MODELS if m != step.model))
    result["gpu_utilization"] = triton_metrics.mean_gauge(during, triton_metrics.GPU_UTILIZATION)
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
    if step["locust_requests"] != sent or step["locust_failures"] != step["failures"]:
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


def describe_device() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 and gpus:
                name, driver = gpus[0].rsplit(",", 1)
                return f"{len(gpus)} x {name.strip()} (driver {driver.strip()}), {os.cpu_count()} CPU cores"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"CPU only: {cpu}, {os.cpu_count()} cores"


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=REPO_ROOT, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, cwd=REPO_ROOT, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    return None


def wait_until_ready(http_url: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"no ready Triton server at http://{http_url} (start one, or pass --start-server)")
        time.sleep(0.5)


def triton_version(http_url: str) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        with urllib.request.urlopen(f"http://{http_url}/v2", timeout=5) as response:
            return json.loads(response.read())["version"]
    return None


def engines_in_use(endpoints: Endpoints, pool) -> dict:
    """The engine each model runs, from one real request (output ENGINE)."""
    engines = {}
    for model in MODELS:
        with ResNetClient(model, "grpc", endpoints.grpc_url) as client:
            try:
                engines[model] = client.infer(pool[:1]).engine
            except InferenceServerException as error:
                engines[model] = f"unknown: the request failed ({error})"
    return engines


def prewarm(endpoints: Endpoints, pool, batch_sizes) -> list[str]:
    """One request of every batch size to each model, so that no step pays for a first-time
    compilation or tuning of a batch shape that the dynamic batcher happens to form there.
    Returns the failures (the steps will count them too)."""
    failures = []
    for model in MODELS:
        with ResNetClient(model, "grpc", endpoints.grpc_url) as client:
            for size in batch_sizes:
                try:
                    client.infer(pool[:size])
                except InferenceServerException as error:
                    failures.append(f"{model} batch {size}: {error}")
                    print(f"pre-warm: {failures[-1]}", file=sys.stderr)
    return failures


def new_results(args, endpoints: Endpoints, command: str, pool) -> dict:
    return {"device": args.device or describe_device(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "git_commit": git_commit(), "triton_version": triton_version(endpoints.http_url),
            "engines": engines_in_use(endpoints, pool),
            "settings": {"warmup_s": args.warmup_s, "measure_s": args.measure_s, "processes": args.processes,
                         "pool_size": len(pool), "rounds": args.rounds, "prewarm_sizes": args.prewarm_sizes,
                         "series": [asdict(s) for s in args.series], "models": list(MODELS),
                         "server": "started by the sweep" if args.start_server else "already running"},
            "steps": [], "skipped": []}


def run_steps(args, endpoints: Endpoints, settings: SweepSettings, results: dict):
    """Run the planned steps in order, appending each outcome to results["steps"] as it comes."""
    steps = plan_steps(args.series, MODELS, args.rounds)
    started = time.monotonic()
    for step in steps:
        elapsed = time.monotonic() - started
        per_step = elapsed / len(results["steps"]) if results["steps"] else 0.0
        first_of_pair = step.index % len(MODELS) == 0
        if args.time_budget_s and first_of_pair and elapsed + len(MODELS) * per_step > args.time_budget_s:
            results["skipped"] = [{"model": s.model, "protocol": s.series.protocol, "users": s.users,
                                   "images_per_request": s.series.images_per_request,
                                   "input_format": s.series.input_format} for s in steps[step.index:]]
            print(f"time budget of {args.time_budget_s:.0f} s reached: skipping {len(steps) - step.index} steps",
                  file=sys.stderr)
            return
        step_dir = settings.raw_dir / (f"{step.index:02d}-{step.model}-{step.series.protocol}"
                                       f"-x{step.series.images_per_request}-{step.series.input_format}-u{step.users}")
        outcome = run_locust_step(step, endpoints, settings, step_dir)
        results["steps"].append(outcome)
        print(f"[{step.index + 1}/{len(steps)}] {step.model:16s} {step.series.label:34s} users {step.users:4d}: "
              f"{outcome['img_per_s']:9.1f} img/s  p50 {outcome['p50_ms'] or float('nan'):8.2f} ms  "
              f"p99 {outcome['p99_ms'] or float('nan'):8.2f} ms  sent {outcome['sent']}  "
              f"failures {outcome['failures']}  avg batch {outcome['avg_batch'] or float('nan'):.2f}"
              + ("" if not outcome["problems"] else "  SANITY MISMATCH: " + "; ".join(outcome["problems"])),
              flush=True)


def run_sweep(args, endpoints: Endpoints, command: str) -> dict:
    """Pre-warm, every step, then the agreement; if something breaks, what was measured is kept."""
    raw_dir = args.raw_dir or BUILD_DIR / "loadtest" / args.name
    raw_dir.mkdir(parents=True, exist_ok=True)
    largest_request = max([*args.prewarm_sizes, *(s.images_per_request for s in args.series)])
    pool = build_image_pool(max(args.pool_size, largest_request))
    prewarm_failures = prewarm(endpoints, pool, args.prewarm_sizes)
    pools = {fmt: save_image_pool(as_model_input(pool, fmt), raw_dir.resolve() / f"image_pool_{fmt}.npy")
             for fmt in sorted({s.input_format for s in args.series})}
    settings = SweepSettings(args.warmup_s, args.measure_s, args.processes, pools, raw_dir)
    results = new_results(args, endpoints, command, pool)
    results["prewarm_failures"] = prewarm_failures
    try:
        run_steps(args, endpoints, settings, results)
        results["agreement"] = run_agreement_if_asked(args, endpoints)
    except Exception as error:  # report the steps that did run, then fail
        traceback.print_exc()
        results["error"] = f"{type(error).__name__}: {error}"
    return results


def run_agreement_if_asked(args, endpoints: Endpoints) -> dict | None:
    if not args.agreement_images:
        return None
    from fusedresnet.client import ab
    agreement = ab.run_agreement(ab.agreement_image_sets(args.agreement_images), "grpc", endpoints.grpc_url)
    ab.write_agreement_report(agreement, args.out)
    return ab.summary(agreement)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    server = parser.add_argument_group("server")
    server.add_argument("--start-server", action="store_true",
                        help="start Triton on free loopback ports for the sweep and stop it afterwards "
                             "(preparing the model repository first if it is not)")
    server.add_argument("--host", default=DEFAULT_HOST, help="host of an already running server")
    server.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    server.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    server.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    load = parser.add_argument_group("load")
    load.add_argument("--series", type=Series.parse, action="append",
                      help=f"PROTOCOL/IMAGES[/FORMAT]@LEVELS, repeatable (default: {' '.join(DEFAULT_SERIES)})")
    load.add_argument("--warmup-s", type=float, default=2.0, help="seconds of each step not measured (default 2)")
    load.add_argument("--measure-s", type=float, default=5.0, help="seconds measured per step (default 5)")
    load.add_argument("--processes", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)),
                      help="locust processes (--processes) per step, at most one per user "
                           "(default: a quarter of the CPU cores, 1 to 4)")
    load.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep this many times")
    load.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE, help="distinct images sent")
    load.add_argument("--prewarm-sizes", type=lambda text: [int(v) for v in text.split(",") if v],
                      help="batch sizes sent once to each model before the sweep (default: powers of two up to "
                           f"{MAX_BATCH_SIZE} on a GPU host, 1 elsewhere)")
    load.add_argument("--time-budget-s", type=float, default=0,
                      help="skip the remaining pairs of steps once this many seconds would be exceeded (0: none)")
    load.add_argument("--agreement-images", type=int, default=500,
                      help="generated images for the agreement check, besides the sample photos (0: skip it)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, default=BUILD_DIR / "loadtest",
                        help="folder for the report (default build/loadtest; the committed one is results/)")
    output.add_argument("--name", default=DEFAULT_NAME, help=f"file name stem of the report (default {DEFAULT_NAME})")
    output.add_argument("--raw-dir", type=Path, help="per-step raw records (default build/loadtest/NAME)")
    output.add_argument("--device", help="device description for the report (default: detected)")
    args = parser.parse_args(argv)
    args.series = args.series or [Series.parse(text) for text in DEFAULT_SERIES]
    if args.prewarm_sizes is None:
        args.prewarm_sizes = [2 ** k for k in range(MAX_BATCH_SIZE.bit_length()) if 2 ** k <= MAX_BATCH_SIZE] \
            if gpu_present() else [1]
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = " ".join(["python -m fusedresnet.loadtest.sweep"] + [shlex.quote(a) for a in argv])
    raw_dir = args.raw_dir or BUILD_DIR / "loadtest" / args.name
    sweep_started = time.monotonic()
    if args.start_server:
        from fusedresnet.backend.prepare import STAMP_FILE, prepare  # torch: only to write model files
        if not (MODEL_REPOSITORY / STAMP_FILE).is_file():
            prepare(MODEL_REPOSITORY)
        http_port, grpc_port, metrics_port = free_ports(3)
        server = TritonServer(host=DEFAULT_HOST, http_port=http_port, grpc_port=grpc_port,
                              metrics_port=metrics_port, log_file=raw_dir / "server.log")
    else:
        server = contextlib.nullcontext()
    with server:
        if args.start_server:
            endpoints = Endpoints(server.grpc_url, server.http_url, server.metrics_url)
        else:
            endpoints = Endpoints(f"{args.host}:{args.grpc_port}", f"{args.host}:{args.http_port}",
                                  f"http://{args.host}:{args.metrics_port}/metrics")
            wait_until_ready(endpoints.http_url)
        results = run_sweep(args, endpoints, command)
    results["duration_s"] = round(time.monotonic() - sweep_started, 1)
    written = report.write_report(results, args.out, args.name)
    print("wrote " + ", ".join(str(path) for path in written))
    mismatches = [(s["index"], s["model"], s["users"], p) for s in results["steps"] for p in s["problems"]]
    if mismatches:
        banner = "!" * 78
        print(f"\n{banner}\nSANITY MISMATCH in {len(mismatches)} check(s): the counts of requests sent, seen by "
              f"locust and seen by Triton do not add up\n" + "\n".join(
                  f"  step {i} {model} {users} users: {problem}" for i, model, users, problem in mismatches)
              + f"\n{banner}", file=sys.stderr)
        return EXIT_SANITY_MISMATCH
    if results.get("error"):
        print(f"the sweep stopped early: {results['error']}", file=sys.stderr)
        return EXIT_SWEEP_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
