"""Throughput-versus-latency sweep of both models under the same conditions, then the A/B report.

    python -m fusedresnet.loadtest.sweep --start-server                 # starts its own Triton
    python -m fusedresnet.loadtest.sweep --grpc-port 8001 --http-port 8000 --metrics-port 8002

A *series* is a protocol, a number of images per request and a list of
concurrency levels, written PROTOCOL/IMAGES[/FORMAT]@LEVELS, e.g.
`grpc/1@1,2,4,8` or `http/8/IMAGE_NORMALIZED@4,16`, FORMAT being the model
input sent, IMAGE (default) or IMAGE_NORMALIZED (the full syntax, with load
generator and shared memory, is in `loadtest.step`). For every level of every series both
models run one *step* each (`loadtest.step`: a headless locust run, measured by
the users and by Triton's metrics), back to back, and the order flips from level
to level (A B, B A, A B, ...) so that drift of the machine favours neither model.

Every step checks that sent (counted by the users) == succeeded + failed (locust)
== success + failure (Triton); a mismatch is printed loudly, written into the
report, and makes the exit code 3.

With --ab-router the A/B router (`resnet18_ab`, in the mode its config says) runs a step of its own at every
level beside the two models, and each of its steps carries what the router counted meanwhile (read from its
metrics: each arm's requests and latency, and in shadow mode the agreement): the report's live A/B section.

Outputs in --out (default build/loadtest): <name>.json (all steps, machine-readable), <name>.csv (one row
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
import subprocess
import sys
import time
import traceback
import urllib.request
from dataclasses import asdict
from pathlib import Path

from tritonclient.utils import InferenceServerException

from fusedresnet.backend.network import free_ports, http_ready
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import (
    AB_ROUTER_MODEL,
    BUILD_DIR,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    METRICS_FLUSH_S,
    MODEL_REPOSITORY,
    MODELS,
    REPO_ROOT,
    max_batch_size,
    power_of_two_buckets,
)
from fusedresnet.backend.triton_server.installation import gpu_present
from fusedresnet.client.preprocess import model_input
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.client.shared_memory import read_admin_token
from fusedresnet.loadtest import grpc_flood, report, triton_metrics
from fusedresnet.loadtest.image_pool import DEFAULT_POOL_SIZE, build_image_pool, save_image_pool
from fusedresnet.loadtest.step import FLOOD, Endpoints, Series, Step, SweepSettings, run_locust_step

# The full sweep for the GPU host: the main curve (gRPC, one image per request) at every
# power of two, and shorter curves for batched requests and for HTTP.
DEFAULT_SERIES = ("grpc/1@1,2,4,8,16,32,64,128", "grpc/8@1,4,16,64", "http/1@1,16,64")
# What each model's engine computes by itself on the GPU host (same inputs, CUDA events, one run
# of `python -m fusedresnet.harness.bench`): the denominator of the serving efficiency. The
# cuDNN model serves fp16 channels-last TorchScript replayed as CUDA graphs, the bench's graph_fp16.
ENGINE_BENCHMARK = REPO_ROOT / "results" / "kernels_bench.json"
ENGINE_BENCH_COLUMN = {MODELS[0]: "custom_ms", MODELS[1]: "graph_fp16_ms"}
DEFAULT_NAME = "loadtest_ab"
EXIT_SANITY_MISMATCH = 3
EXIT_SWEEP_FAILED = 4


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


def engine_reference(device: str) -> dict | None:
    """ms per batch of each model's engine alone, from the benchmark measured on this GPU model (else None)."""
    if not ENGINE_BENCHMARK.is_file():
        return None
    bench = json.loads(ENGINE_BENCHMARK.read_text())
    if bench["device"] not in device:
        return None
    return {"device": bench["device"], "date": bench["date"], "source": str(ENGINE_BENCHMARK.relative_to(REPO_ROOT)),
            "ms_per_batch": {model: {row["batch"]: row[column] for row in bench["whole_network"]}
                             for model, column in ENGINE_BENCH_COLUMN.items()}}


def serving_efficiency(step: dict, reference: dict | None) -> dict:
    """Served img/s over what the engine computes alone at the step's average batch (ms per batch
    interpolated linearly between the measured batch sizes)."""
    batch = step.get("avg_batch")
    if reference is None or not batch or not step.get("img_per_s"):
        return {"engine_img_per_s": None, "serving_efficiency": None}
    points = sorted((int(b), ms) for b, ms in reference["ms_per_batch"][step["model"]].items())
    below = max((p for p in points if p[0] <= batch), default=points[0])
    above = min((p for p in points if p[0] >= batch), default=points[-1])
    share = 0.0 if above[0] == below[0] else (batch - below[0]) / (above[0] - below[0])
    engine = batch / (below[1] + share * (above[1] - below[1])) * 1e3
    return {"engine_img_per_s": round(engine, 1), "serving_efficiency": round(step["img_per_s"] / engine, 4)}


def run_flood_step(step: Step, endpoints: Endpoints, settings: SweepSettings) -> dict:
    record = grpc_flood.run_step(step.model, endpoints.grpc_url, endpoints.metrics_url, step.users,
                                 step.series.images_per_request, processes=settings.processes_for(step),
                                 warmup_s=settings.warmup_s, measure_s=settings.measure_s,
                                 input_format=step.series.input_format,
                                 image_pool=settings.image_pools[step.series.input_format],
                                 shared_memory=step.series.shared_memory, admin_token=settings.admin_token)
    record.update(index=step.index, round=step.round, processes_asked=step.series.processes)
    return record


def wait_until_ready(http_url: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not http_ready(http_url):
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
    device = args.device or describe_device()
    return {"device": device, "engine_reference": engine_reference(device),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "git_commit": git_commit(), "triton_version": triton_version(endpoints.http_url),
            "engines": engines_in_use(endpoints, pool),
            "settings": {"warmup_s": args.warmup_s, "measure_s": args.measure_s, "processes": args.processes,
                         "pool_size": len(pool), "rounds": args.rounds, "prewarm_sizes": args.prewarm_sizes,
                         "series": [asdict(s) for s in args.series], "models": list(swept_models(args)),
                         "server": "started by the sweep" if args.start_server else "already running"},
            "steps": [], "skipped": []}


def run_steps(args, endpoints: Endpoints, settings: SweepSettings, results: dict):
    """Run the planned steps in order, appending each outcome to results["steps"] as it comes."""
    models = swept_models(args)
    steps = plan_steps(args.series, models, args.rounds)
    started = time.monotonic()
    for step in steps:
        elapsed = time.monotonic() - started
        per_step = elapsed / len(results["steps"]) if results["steps"] else 0.0
        first_of_pair = step.index % len(models) == 0
        if args.time_budget_s and first_of_pair and elapsed + len(models) * per_step > args.time_budget_s:
            results["skipped"] = [{"model": s.model, "protocol": s.series.protocol, "users": s.users,
                                   "images_per_request": s.series.images_per_request,
                                   "input_format": s.series.input_format, "shared_memory": s.series.shared_memory,
                                   "load_generator": s.series.load_generator,
                                   "processes_asked": s.series.processes} for s in steps[step.index:]]
            print(f"time budget of {args.time_budget_s:.0f} s reached: skipping {len(steps) - step.index} steps",
                  file=sys.stderr)
            return
        before = triton_metrics.scrape(endpoints.metrics_url) if step.model == AB_ROUTER_MODEL else None
        if step.series.load_generator == FLOOD:
            outcome = run_flood_step(step, endpoints, settings)
        else:
            step_dir = settings.raw_dir / (f"{step.index:02d}-{step.model}-{step.series.protocol}"
                                           f"-x{step.series.images_per_request}-{step.series.input_format}"
                                           f"-{step.series.shared_memory}-u{step.users}")
            outcome = run_locust_step(step, endpoints, settings, step_dir)
        if before is not None:   # the router writes its figures every METRICS_FLUSH_S; shadow answers come later
            time.sleep(3 * METRICS_FLUSH_S)
            outcome["ab"] = triton_metrics.ab_delta(before, triton_metrics.scrape(endpoints.metrics_url))
        outcome.update(serving_efficiency(outcome, results.get("engine_reference")))
        results["steps"].append(outcome)
        print(f"[{step.index + 1}/{len(steps)}] {step.model:16s} {step.series.label:50s} users {step.users:4d}: "
              f"{outcome['img_per_s']:9.1f} img/s  p50 {outcome['p50_ms'] or float('nan'):8.2f} ms  "
              f"p99 {outcome['p99_ms'] or float('nan'):8.2f} ms  sent {outcome['sent']}  "
              f"failures {outcome['failures']}  avg batch {outcome['avg_batch'] or float('nan'):.2f}  "
              f"client CPU {outcome.get('client_cpu_percent')}%"
              + ("" if not outcome["problems"] else "  SANITY MISMATCH: " + "; ".join(outcome["problems"])),
              flush=True)


def swept_models(args) -> tuple[str, ...]:
    """The model entries each level runs: both models, and the A/B router with --ab-router."""
    return (*MODELS, AB_ROUTER_MODEL) if args.ab_router else MODELS


def run_sweep(args, endpoints: Endpoints, command: str, admin_token: str | None = None) -> dict:
    """Pre-warm, every step, then the agreement; if something breaks, what was measured is kept."""
    raw_dir = args.raw_dir or BUILD_DIR / "loadtest" / args.name
    raw_dir.mkdir(parents=True, exist_ok=True)
    largest_request = max([*args.prewarm_sizes, *(s.images_per_request for s in args.series)])
    pool = build_image_pool(max(args.pool_size, largest_request))
    prewarm_failures = prewarm(endpoints, pool, args.prewarm_sizes)
    pools = {fmt: save_image_pool(model_input(pool, fmt), raw_dir.resolve() / f"image_pool_{fmt}.npy")
             for fmt in sorted({s.input_format for s in args.series})}
    settings = SweepSettings(args.warmup_s, args.measure_s, args.processes, pools, raw_dir, admin_token)
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
    server.add_argument("--admin-token-file", type=Path,
                        help="admin token of a running server, for shared-memory series (default "
                             "$FUSEDRESNET_ADMIN_TOKEN, else build/admin-token)")
    load = parser.add_argument_group("load")
    load.add_argument("--series", type=Series.parse, action="append",
                      help="[flood:]PROTOCOL/IMAGES[/FORMAT][/SHM][/pPROCESSES]@LEVELS, repeatable "
                           f"(default: {' '.join(DEFAULT_SERIES)}; see loadtest/step.py)")
    load.add_argument("--warmup-s", type=float, default=2.0, help="seconds of each step not measured (default 2)")
    load.add_argument("--measure-s", type=float, default=5.0, help="seconds measured per step (default 5)")
    load.add_argument("--processes", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)),
                      help="locust processes (--processes) per step, at most one per user "
                           "(default: a quarter of the CPU cores, 1 to 4)")
    load.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep this many times")
    load.add_argument("--ab-router", action="store_true",
                      help=f"also step {AB_ROUTER_MODEL} (the A/B router) at every level, with what it counted: "
                           "each arm's latency and the agreement (the report's live A/B section)")
    load.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE, help="distinct images sent")
    load.add_argument("--prewarm-sizes", type=lambda text: [int(v) for v in text.split(",") if v],
                      help="batch sizes sent once to each model before the sweep (default: powers of two up to "
                           f"{max_batch_size()} on a GPU host, 1 elsewhere)")
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
        args.prewarm_sizes = list(power_of_two_buckets(max_batch_size())) if gpu_present() else [1]
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = " ".join(["python -m fusedresnet.loadtest.sweep"] + [shlex.quote(a) for a in argv])
    raw_dir = args.raw_dir or BUILD_DIR / "loadtest" / args.name
    sweep_started = time.monotonic()
    if args.start_server:
        from fusedresnet.backend.repository.prepare import STAMP_FILE, prepare  # torch: only to write model files
        if not (MODEL_REPOSITORY / STAMP_FILE).is_file():
            prepare(MODEL_REPOSITORY)
        http_port, grpc_port, metrics_port = free_ports(3)
        server = launch(ServerSettings(host=DEFAULT_HOST, http_port=http_port, grpc_port=grpc_port,
                                       metrics_port=metrics_port, processes_per_gpu=1, log_file=raw_dir / "server.log",
                                       mps="off"))
    else:
        server = contextlib.nullcontext()
    with server:
        if args.start_server:
            endpoints = Endpoints(server.grpc_url, server.http_url, server.metrics_url)
        else:
            endpoints = Endpoints(f"{args.host}:{args.grpc_port}", f"{args.host}:{args.http_port}",
                                  f"http://{args.host}:{args.metrics_port}/metrics")
            wait_until_ready(endpoints.http_url)
        admin_token = server.first.admin_token if args.start_server else read_admin_token(args.admin_token_file)
        results = run_sweep(args, endpoints, command, admin_token)
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
