"""perf_analyzer, Triton's own load generator, against the service as shipped, beside grpc_flood.

    python -m fusedresnet.loadtest.perf_analyzer --out build/perf_analyzer     # on the GPU host

perf_analyzer is the `perf-analyzer` wheel's binary (`perf_analyzer/bin/perf_analyzer` in the package;
manylinux_2_38, so it runs on the GPU host, not on a Debian 12 machine). One run here:

1. starts the server as shipped (the launcher's layout: its default processes per GPU on the same ports, under
   CUDA MPS where the driver has it; 127.0.0.1, admin APIs behind a token) on a copy of the model repository
   that also holds the zero-answer model (`loadtest/zero_model/1/model.py`, named ZERO_MODEL: the shipped
   contract and batching, no network: the ceiling of the Python backend on this host);
2. pins the server to the cores not in --load-cores and itself, perf_analyzer and grpc_flood to --load-cores,
   and reports the server's CPU use (psutil, the tritonserver processes and their stubs) for every step;
3. runs perf_analyzer for every model over SERIES (gRPC, HTTP, system and CUDA shared memory; 1 and 32 images
   per request), one run per level (plain gRPC over one connection per worker, SPREAD_ENVIRONMENT, so the
   calls reach every server process; each step keeps each process's share); each run's CSV (`-f`) is kept,
   parsed into a step record shaped as the sweep's (loadtest/step.py), with Triton's metrics read before and
   after;
4. runs grpc_flood on the gRPC levels of CROSS_CHECK, the same traffic, for the cross-check;
5. tells the serving story in the form of Triton's Conceptual Guide Part 2 (STORY): from as shipped to the
   best configuration, each step one change (client or server config), one perf_analyzer command and its output;
6. writes <out>/loadtest_ab.{json,csv,md,png} (loadtest/report.py) and <out>/perf_analyzer_csv/*.csv.

The admin token reaches perf_analyzer as `-H triton-grpc-protocol-admin-key:TOKEN` (gRPC) or
`-H admin-key:TOKEN` (HTTP), with no space after the colon: perf_analyzer keeps everything after the first ':'
as the value. perf_analyzer needs it for Triton's statistics API and to register shared memory. The token is
never written into the results (commands are kept with it replaced by $FUSEDRESNET_ADMIN_TOKEN).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import importlib.util
import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from fusedresnet.backend.launcher.stub_processes import tree_cpu_seconds
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.repository.copies import copy_repository, with_instances
from fusedresnet.backend.spec import (
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_HEADER,
    BUILD_DIR,
    GRPC_ADMIN_TOKEN_HEADER,
    INPUT_SHAPES,
    INPUT_UINT8,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    MODEL_ENTRIES,
    MODEL_REPOSITORY,
    NUM_CLASSES,
    ZERO_MODEL,
    model_config,
    served_model,
)
from fusedresnet.loadtest import report, triton_metrics
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.step import Series
from fusedresnet.loadtest.sweep import describe_device

PERF_ANALYZER = "perf_analyzer"
ZERO_MODEL_FILE = Path(__file__).with_name("zero_model") / "1" / "model.py"
MODELS_MEASURED = (MODEL_CUSTOM, MODEL_CUDNN, ZERO_MODEL)

# The A/B report's series, for perf_analyzer: levels are requests in flight (--concurrency-range N:N).
SERIES = ("grpc/1@1,64", "grpc/32@32", "http/1@64", "grpc/32/system@32", "grpc/32/cuda@32")
# The same traffic from grpc_flood (4 processes), to cross-check the two load generators, for CROSS_CHECK_MODELS.
CROSS_CHECK = ("flood:grpc/1/p4@64", "flood:grpc/32/p4@32", "flood:grpc/32/cuda/p4@32")
CROSS_CHECK_MODELS = (MODEL_CUSTOM, ZERO_MODEL)

# perf_analyzer's CSV (`-f`), as documented upstream (triton-inference-server/perf_analyzer,
# docs/measurements_metrics.md, "Visualizing Latency vs. Throughput"): latencies and times in microseconds,
# Inferences/Second counts images (requests x batch size). Column -> our field name.
CSV_COLUMNS = {
    "Concurrency": "concurrency",
    "Inferences/Second": "img_per_s",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_send_recv_us",
    "Server Queue": "pa_queue_us",
    "Server Compute Input": "pa_compute_input_us",
    "Server Compute Infer": "pa_compute_infer_us",
    "Server Compute Output": "pa_compute_output_us",
    "Client Recv": "client_recv_us",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
}
# One measurement of a fixed number of requests per step (--request-count), after a warm-up of a fifth of them.
# perf_analyzer's default, windows repeated until three agree, never ended at 64 one-image requests in flight on
# the H100 host (93 s at 11.6k img/s, synchronous or asynchronous calls, custom and zero model alike),
# and the windows' count differs between steps. The count aims at about 5 s per step at the rates measured there.
REQUESTS_PER_IN_FLIGHT = 1000        # requests per request in flight, for one image per request
MIN_REQUESTS = 3000


def request_count(concurrency: int, images_per_request: int) -> int:
    """Requests measured in one step: ~1000 per request in flight at one image (64 in flight: ~12k req/s), fewer
    for bigger requests (32 images: ~1/6 as many per request in flight), never under MIN_REQUESTS."""
    return max(MIN_REQUESTS, round(REQUESTS_PER_IN_FLIGHT * concurrency / images_per_request ** 0.5))


STEP_TIMEOUT_S = 90


def parse_csv(text: str) -> list[dict]:
    """Rows of a perf_analyzer CSV as dicts of our field names; latencies also in ms (p50_ms, ...).

    Columns beyond CSV_COLUMNS (--verbose-csv, --collect-metrics) are kept under their own names."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [column for column in CSV_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"not a perf_analyzer CSV: columns {missing} missing (header {reader.fieldnames})")
    rows = []
    for raw in reader:
        row = {CSV_COLUMNS.get(column, column): value for column, value in raw.items() if column}
        for column, field in CSV_COLUMNS.items():
            row[field] = float(raw[column])
        row["concurrency"] = int(row["concurrency"])
        for percentile in ("p50", "p90", "p95", "p99"):
            row[f"{percentile}_ms"] = row[f"{percentile}_us"] / 1e3
        rows.append(row)
    return rows


def binary_path(explicit: str | None = None) -> Path:
    """perf_analyzer: --perf-analyzer, else the installed wheel's perf_analyzer/bin/perf_analyzer, else PATH."""
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("perf_analyzer")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "bin" / "perf_analyzer"
        if candidate.is_file():
            return candidate
    found = shutil.which("perf_analyzer")
    if found:
        return Path(found)
    raise FileNotFoundError("perf_analyzer not found: install the perf-analyzer wheel (GPU-host bundle) "
                            "or pass --perf-analyzer")


def token_header(protocol: str, token: str) -> str:
    """perf_analyzer's -H value: no space after the colon (perf_analyzer keeps all after the first ':')."""
    return f"{GRPC_ADMIN_TOKEN_HEADER if protocol == 'grpc' else ADMIN_TOKEN_HEADER}:{token}"


def command(binary: Path, model: str, protocol: str, url: str, images_per_request: int, concurrency: int,
            shared_memory: str, token: str, csv_path: Path) -> list[str]:
    """One perf_analyzer run: `concurrency` requests in flight of `images_per_request` random images each."""
    logits_bytes = images_per_request * NUM_CLASSES * 4
    count = request_count(concurrency, images_per_request)
    args = [str(binary), "-m", model, "-i", protocol, "-u", url, "-b", str(images_per_request),
            "--concurrency-range", f"{concurrency}:{concurrency}", "--request-count", str(count),
            "--warmup-request-count", str(count // 5), "-H", token_header(protocol, token), "-f", str(csv_path)]
    if concurrency > 1:
        # Asynchronous calls from perf_analyzer's thread pool (its default synchronous mode starts a thread per
        # request in flight, 64 threads on the 4 load cores).
        args.append("--async")
        if run_environment(protocol, shared_memory, concurrency) == SPREAD_ENVIRONMENT:
            args += ["--max-threads", str(min(concurrency, SPREAD_THREADS))]
    if shared_memory != "none":
        # Regions for every output: LOGITS of the whole request (ENGINE is far smaller).
        args += ["--shared-memory", shared_memory, "--output-shared-memory-size", str(max(logits_bytes, 102400))]
    return args


# Several server processes share the port and the kernel hands each new connection to one of them, so a load
# generator reaches them all only over several connections. perf_analyzer's gRPC clients share a channel (one
# connection) among up to 6 of them; SPREAD_ENVIRONMENT gives each of its workers its own. Its shared-memory runs
# need the opposite: perf_analyzer registers its regions over one connection, with one process, and every call
# naming them must reach that process, so all its clients share one channel (ONE_CHANNEL_ENVIRONMENT; with the
# default its 16 workers open 3 connections and the calls on the others fail, "Unable to find shared memory
# region"; docs/HISTORY.md).
SPREAD_ENVIRONMENT = {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"}
ONE_CHANNEL_ENVIRONMENT = {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1024"}
SPREAD_THREADS = 16      # --max-threads of the spread runs: that many workers, each with its own connection


def run_environment(protocol: str, shared_memory: str, concurrency: int) -> dict[str, str]:
    """The variables a perf_analyzer run gets beside this process's own: over gRPC, spread over connections when
    several requests are in flight, else on one channel (shared memory; and one request in flight: spread, its
    warm-up, its measurement and its statistics client can reach three different processes, which fails the
    run, "failed to find the requested model version"; docs/HISTORY.md)."""
    if protocol != "grpc":
        return {}
    spread = shared_memory == "none" and concurrency > 1
    return dict(SPREAD_ENVIRONMENT if spread else ONE_CHANNEL_ENVIRONMENT)


def shown(args: list[str], token: str) -> str:
    """The command as a user would type it: the binary by its name, the CSV by its file name, the token
    replaced by the variable that holds it."""
    words = [Path(args[0]).name, *args[1:]]
    words[words.index("-f") + 1] = Path(words[words.index("-f") + 1]).name
    return " ".join(word.replace(token, f"${ADMIN_TOKEN_ENV}") for word in words)


def default_load_cores() -> str:
    """The last quarter of this process's cores (at least one): the rest is the server's."""
    cores = sorted(os.sched_getaffinity(0))
    count = max(1, len(cores) // 4)
    return cpu_text(cores[-count:])


def server_cpu_seconds(group) -> float:
    """CPU seconds (user + system) of the server's processes (a ServerGroup's tritonservers) and all their
    children (the stubs); a process that has ended counts 0."""
    total = 0.0
    for server in group.servers:
        try:
            total += tree_cpu_seconds(psutil.Process(server.process.pid))[0]
        except (psutil.NoSuchProcess, AttributeError):
            pass
    return total


# ------------------------------------------------------------------------------------------- repository

def zero_model_config() -> str:
    """The zero model's config.pbtxt: resnet18_custom's input, outputs, batching and instances, nothing else."""
    from google.protobuf import text_format
    config = model_config(MODEL_CUSTOM)
    config.name = ZERO_MODEL
    for key in [k for k in config.parameters if k != "FORCE_CPU_ONLY_INPUT_TENSORS"]:
        del config.parameters[key]
    for output in config.output:
        output.label_filename = ""
    return text_format.MessageToString(config)


def add_zero_model(repository: Path) -> None:
    """The zero-answer model (its model.py and zero_model_config()) in `repository`."""
    (repository / ZERO_MODEL / "1").mkdir(parents=True)
    shutil.copy2(ZERO_MODEL_FILE, repository / ZERO_MODEL / "1" / "model.py")
    (repository / ZERO_MODEL / "config.pbtxt").write_text(zero_model_config())


def zero_model_repository(folder: Path) -> Path:
    """A model repository of the zero-answer model alone, in `folder` (new or empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    add_zero_model(folder)
    return folder


def build_repository(folder: Path, entries=MODEL_ENTRIES, zero: bool = True, instances: int | None = None) -> Path:
    """The prepared model repository with only `entries` (and the zero model) in `folder`, linked
    (backend/repository/copies.py); `instances` sets the instance count of every entry (a config change of the
    serving story)."""
    from google.protobuf import text_format
    edit = with_instances(instances) if instances else None
    copy_repository(MODEL_REPOSITORY, folder, entries=entries, edit=edit)
    if zero:
        add_zero_model(folder)
        if edit is not None:
            config = model_config(ZERO_MODEL, folder)
            edit(ZERO_MODEL, config)
            (folder / ZERO_MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    return folder


@contextlib.contextmanager
def pinned_server(repository: Path, token: str, server_cores: set[int], load_cores: set[int], log_file: Path):
    """The server as shipped, on free loopback ports: the launcher's layout (backend/serve.py: its default
    processes per GPU on the same gRPC and HTTP ports, under a private CUDA MPS daemon where the driver has one,
    --mps auto), its processes on `server_cores`; this process and the load generators it starts on `load_cores`
    while it runs (perf_analyzer_step runs perf_analyzer under the server's MPS daemon)."""
    from fusedresnet.backend.network import server_ports
    from fusedresnet.backend.serve import DEFAULT_PROCESSES_PER_GPU, ServerSettings, launch
    from fusedresnet.backend.triton_server.installation import host_gpus
    gpus = len(host_gpus())
    processes = DEFAULT_PROCESSES_PER_GPU if gpus else 1
    http_port, grpc_port, metrics_port = server_ports(processes * max(gpus, 1))
    settings = ServerSettings(repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                              processes_per_gpu=processes, admin_token=token, log_file=log_file)
    os.sched_setaffinity(0, server_cores)      # inherited by tritonserver and the stubs it starts at load
    try:
        with launch(settings) as group:
            os.sched_setaffinity(0, load_cores)
            yield group
    finally:
        os.sched_setaffinity(0, server_cores | load_cores)


# ------------------------------------------------------------------------------------------------ steps

@dataclasses.dataclass
class Run:
    """What every step of one run shares."""
    binary: Path
    token: str
    out: Path
    load_cores: set[int]
    deadline: float
    records: list = dataclasses.field(default_factory=list)


def perf_analyzer_step(run: Run, server, model: str, series: Series, concurrency: int, note: str = "") -> dict:
    """One perf_analyzer run, its CSV parsed into a step record, with Triton's metrics and the server's CPU."""
    csv_dir = run.out / "perf_analyzer_csv"
    csv_dir.mkdir(parents=True, exist_ok=True)
    name = (f"{len(run.records):02d}-{model}-{series.protocol}-{series.images_per_request}img-"
            f"{series.shared_memory}-c{concurrency}{note and '-' + note}")
    csv_path = csv_dir / f"{name}.csv"
    url = server.grpc_url if series.protocol == "grpc" else server.http_url
    args = command(run.binary, model, series.protocol, url, series.images_per_request, concurrency,
                   series.shared_memory, run.token, csv_path)
    environment = run_environment(series.protocol, series.shared_memory, concurrency)
    process_urls = server.metrics_url.split(",")
    before = [triton_metrics.scrape(url) for url in process_urls]
    cpu_before, started = server_cpu_seconds(server), time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        completed = subprocess.run(args, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                                   env={**os.environ, **(server.first.mps_environment or {}), **environment})
        output, returncode = completed.stdout + completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        output, returncode = f"{expired.stdout or ''}{expired.stderr or ''}\ntimed out after {STEP_TIMEOUT_S} s", 124
    elapsed = time.monotonic() - started
    server_cpu = (server_cpu_seconds(server) - cpu_before) / elapsed * 100
    after = [triton_metrics.scrape(url) for url in process_urls]
    (csv_dir / f"{name}.log").write_text(output.replace(run.token, f"${ADMIN_TOKEN_ENV}"))
    entry = served_model(model, series.input_format)
    per_process = [triton_metrics.model_delta(b, a, entry) for b, a in zip(before, after)]
    delta = triton_metrics.model_delta(triton_metrics.combined(before), triton_metrics.combined(after), entry)
    record = {
        "index": len(run.records), "model": model, "protocol": series.protocol, "input_format": series.input_format,
        "users": concurrency, "concurrency": concurrency, "images_per_request": series.images_per_request,
        "shared_memory": series.shared_memory, "load_generator": PERF_ANALYZER, "processes_asked": None,
        "started_at": started_at, "wall_s": round(elapsed, 2),
        "command": " ".join([*(f"{k}={v}" for k, v in environment.items()), shown(args, run.token)]),
        # each server process's answered requests: over several connections the calls spread over the processes
        "process_requests": [d["triton_success"] + d["triton_failure"] for d in per_process],
        "perf_analyzer_csv": f"perf_analyzer_csv/{csv_path.name}", "exit_code": returncode,
        "output_tail": "\n".join(output.replace(run.token, "***").strip().splitlines()[-25:]),
        "load_cores": cpu_text(run.load_cores), "server_cpu_percent": round(server_cpu, 1),
        "host_cpus": psutil.cpu_count(),
        # perf_analyzer counts its own requests only in its stable windows; Triton counts the whole run.
        "sent": delta["triton_success"] + delta["triton_failure"], "failures": delta["triton_failure"],
        "completed": delta["triton_success"] + delta["triton_failure"],
        "triton_success_run": delta["triton_success"], "triton_failure_run": delta["triton_failure"],
        "triton_inferences_run": delta["triton_inferences"], "triton_executions_run": delta["triton_executions"],
        "measured_requests": delta["triton_success"],
    }
    record.update(delta)
    record["problems"] = []
    try:
        rows = parse_csv(csv_path.read_text()) if csv_path.is_file() else []
    except ValueError as error:
        rows, record["problems"] = [], [str(error)]
    if rows:
        record.update({k: v for k, v in rows[0].items() if k != "concurrency"})
    else:
        record.update({"img_per_s": None, "p50_ms": None, "p99_ms": None})
        record["problems"].append(f"perf_analyzer gave no result (exit code {returncode}): "
                                  + " / ".join(output.strip().splitlines()[-3:]).replace(run.token, "***"))
    if returncode and rows:
        record["problems"].append(f"perf_analyzer exit code {returncode}")
    if delta["triton_failure"]:
        record["problems"].append(f"{delta['triton_failure']} requests failed (Triton's count)")
    run.records.append(record)
    return record


def flood_step(run: Run, server, model: str, series: Series, concurrency: int) -> dict:
    """The same traffic from grpc_flood (its processes inherit this process's cores: --load-cores)."""
    from fusedresnet.loadtest import grpc_flood
    from fusedresnet.loadtest.image_pool import DEFAULT_POOL_SIZE, build_image_pool, save_image_pool
    pool = run.out / "image_pool.npy"
    if not pool.is_file():
        save_image_pool(build_image_pool(DEFAULT_POOL_SIZE), pool)
    cpu_before, started = server_cpu_seconds(server), time.monotonic()
    record = grpc_flood.run_step(model, server.grpc_url, server.metrics_url, concurrency, series.images_per_request,
                                 series.processes or 4, 1.0, 4.0, series.input_format, image_pool=pool,
                                 shared_memory=series.shared_memory, admin_token=run.token,
                                 server_processes=len(server.servers))
    server_cpu = (server_cpu_seconds(server) - cpu_before) / (time.monotonic() - started) * 100
    record.update({"index": len(run.records), "processes_asked": series.processes,
                   "server_cpu_percent": round(server_cpu, 1),
                   "load_cores": cpu_text(run.load_cores)})
    run.records.append(record)
    return record


def print_step(record: dict):
    value = "-" if record.get("img_per_s") is None else f"{record['img_per_s']:,.0f} img/s"
    p = {k: "-" if record.get(k) is None else f"{record[k]:.2f}" for k in ("p50_ms", "p99_ms")}
    print(f"[{record['index']:2d}] {record['load_generator']:13s} {record['model']:16s} {record['protocol']:4s} "
          f"x{record['images_per_request']:<3d} shm={record['shared_memory']:6s} c={record['concurrency']:<4d} "
          f"{value}, p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms, server CPU "
          f"{record.get('server_cpu_percent', '-')}%" + (f"  PROBLEM {record['problems']}" if record['problems']
                                                         else ""), flush=True)


def cross_check(records: list[dict]) -> list[dict]:
    """perf_analyzer against grpc_flood on the same (model, images, shared memory, concurrency)."""
    pairs = []
    for flood in (r for r in records if r["load_generator"] == "grpc_flood"):
        same = [r for r in records if r["load_generator"] == PERF_ANALYZER and not r.get("server_setting")
                and all(r[k] == flood[k] for k in ("model", "protocol", "images_per_request", "shared_memory",
                                                    "concurrency"))]
        if same and same[0].get("img_per_s") and flood.get("img_per_s"):
            pa = same[0]
            pairs.append({"model": pa["model"], "images_per_request": pa["images_per_request"],
                          "shared_memory": pa["shared_memory"], "concurrency": pa["concurrency"],
                          "perf_analyzer_img_per_s": pa["img_per_s"], "grpc_flood_img_per_s": flood["img_per_s"],
                          "ratio": pa["img_per_s"] / flood["img_per_s"],
                          "perf_analyzer_p50_ms": pa["p50_ms"], "grpc_flood_p50_ms": flood["p50_ms"],
                          "perf_analyzer_p99_ms": pa["p99_ms"], "grpc_flood_p99_ms": flood["p99_ms"],
                          "perf_analyzer_server_cpu_percent": pa.get("server_cpu_percent"),
                          "grpc_flood_client_cpu_percent": flood.get("client_cpu_percent")})
    return pairs


# Server settings of the story and of the latency probe: name -> every entry's instance count (the rest as shipped).
SERVER_SETTINGS = {"instances8": 8, "instances1": 1}

# The serving story (Conceptual Guide Part 2): each step one change from the one before, custom model only.
# (title, what changes, series, concurrency, server setting: None = the shipped server of the series steps)
STORY = (
    ("as shipped", "none: the shipped launcher (2 server processes per GPU on one port, under CUDA MPS where the "
     "driver has it) and config, plain gRPC, one image per request", "grpc/1@64", 64, None),
    ("+ 32 images per request", "client: -b 32 (the dynamic batcher gathers 4 requests into a batch of 128)",
     "grpc/32@32", 32, None),
    ("+ CUDA shared memory", "client: --shared-memory cuda (input and LOGITS never cross the wire; perf_analyzer "
     "registers its regions with the one process its connection reaches, so all its calls go there)",
     "grpc/32/cuda@32", 32, None),
    ("+ 8 instances", "config: instance_group count 8", "grpc/32/cuda@32", 32, "instances8"),
    ("+ 64 requests in flight", "client: --concurrency-range 64:64 (16 batches of 128 in flight: every one of the "
     "8 instances has the next batch queued while it answers one)", "grpc/32/cuda@64", 64, "instances8"),
)
# One request in flight on a server with one instance per model, custom and zero model: what the rotation of
# successive requests over the 4 stub processes costs at one request in flight.
LATENCY_PROBE = ("grpc/1@1", 1, "instances1", (MODEL_CUSTOM, ZERO_MODEL))


def story(records: list[dict]) -> list[dict]:
    """The story's steps with their records, each read against the one before."""
    told, previous = [], None
    for index, (title, change, _, _, _) in enumerate(STORY):
        record = next((r for r in records if r.get("story_step") == index), None)
        if record is None:
            continue
        reading = [f"{record['img_per_s']:,.0f} img/s, p50 {record['p50_ms']:.2f} ms, p99 {record['p99_ms']:.2f} ms; "
                   f"server CPU {record['server_cpu_percent']:.0f}% of a core, avg batch "
                   f"{report.number(record.get('avg_batch'), 1)}, queue {report.number(record.get('queue_us'), 0)} us, "
                   f"compute infer {report.number(record.get('compute_infer_us'), 0)} us per request (Triton)."
                   if record.get("img_per_s") else f"no result: {record['problems']}"]
        if previous and previous.get("img_per_s") and record.get("img_per_s"):
            reading.append(f"{record['img_per_s'] / previous['img_per_s']:.2f}x the img/s of the step before, "
                           f"p99 {record['p99_ms'] / previous['p99_ms']:.2f}x.")
        told.append({"step": index, "title": title, "change": change, "command": record["command"],
                     "output": record["output_tail"], "reading": reading, "index": record["index"]})
        previous = record
    return told


def main(argv=None) -> int:
    # `timeout`'s SIGTERM unwinds like Ctrl-C: the server (its own session) and the MPS daemon are stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=BUILD_DIR / "perf_analyzer")
    parser.add_argument("--perf-analyzer", help="the binary (default: the perf-analyzer wheel's)")
    parser.add_argument("--load-cores", default=default_load_cores(),
                        help="cores of the load generators (perf_analyzer, grpc_flood); the server gets the others")
    parser.add_argument("--models", default=",".join(MODELS_MEASURED))
    parser.add_argument("--series", action="append", help=f"perf_analyzer series (default: {' '.join(SERIES)})")
    parser.add_argument("--cross-check", action="append", help=f"grpc_flood series (default: {' '.join(CROSS_CHECK)})")
    parser.add_argument("--cross-check-models", default=",".join(CROSS_CHECK_MODELS))
    parser.add_argument("--no-story", action="store_true", help="skip the serving story's server restarts")
    parser.add_argument("--merge", type=Path, help="a sweep's JSON (loadtest/sweep.py: locust, grpc_flood) of the "
                                                   "same code, whose steps the report shows beside these")
    parser.add_argument("--time-budget-s", type=float, default=330.0,
                        help="steps not started within this many seconds are skipped (and listed)")
    args = parser.parse_args(argv)
    load_cores = set(cpu_list(args.load_cores))
    all_cores = set(os.sched_getaffinity(0))
    server_cores = all_cores - load_cores
    if not server_cores or not load_cores <= all_cores:
        parser.error(f"--load-cores {args.load_cores} must leave the server some of the cores {sorted(all_cores)}")
    models = args.models.split(",")
    series = [dataclasses.replace(Series.parse(s), load_generator=PERF_ANALYZER) for s in args.series or SERIES]
    floods = [Series.parse(s) for s in args.cross_check or CROSS_CHECK]
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(binary_path(args.perf_analyzer), secrets.token_urlsafe(24), args.out, load_cores,
              time.monotonic() + args.time_budget_s)
    skipped = []

    def in_time(model: str, s: Series, level: int) -> bool:
        if time.monotonic() < run.deadline:
            return True
        skipped.append({"model": model, "protocol": s.protocol, "images_per_request": s.images_per_request,
                        "input_format": s.input_format, "shared_memory": s.shared_memory,
                        "load_generator": s.load_generator, "processes_asked": s.processes, "users": level})
        return False

    started = datetime.datetime.now(datetime.timezone.utc)
    engines, story_servers = {}, {}
    repository = build_repository(BUILD_DIR / "perf_analyzer_repository")
    with pinned_server(repository, run.token, server_cores, load_cores, args.out / "server.log") as server:
        layout = (f"{len(server.servers)} tritonserver process(es) on the same ports, CUDA MPS "
                  + ("on" if server.first.mps_environment else "off"))
        from fusedresnet.client.resnet_client import ResNetClient
        for model in (MODEL_CUSTOM, MODEL_CUDNN):
            with ResNetClient(model, "grpc", server.grpc_url) as client:
                engines[model] = client.infer(np.zeros((1, *INPUT_SHAPES[INPUT_UINT8]), np.uint8)).engine
        for s in series:
            for level in s.levels:
                for model in models:
                    if in_time(model, s, level):
                        print_step(perf_analyzer_step(run, server, model, s, level))
        for s in floods:
            for level in s.levels:
                for model in args.cross_check_models.split(","):
                    if in_time(model, s, level):
                        print_step(flood_step(run, server, model, s, level))
        for index, (_, _, text, level, setting) in enumerate(STORY):
            if setting is None:   # the shipped server's step of the same traffic: the story cites it
                s = dataclasses.replace(Series.parse(text), load_generator=PERF_ANALYZER)
                same = next((r for r in run.records if r["load_generator"] == PERF_ANALYZER
                             and r["model"] == MODEL_CUSTOM and r["concurrency"] == level
                             and (r["protocol"], r["images_per_request"], r["shared_memory"])
                             == (s.protocol, s.images_per_request, s.shared_memory)), None)
                if same is None and in_time(MODEL_CUSTOM, s, level):
                    same = perf_analyzer_step(run, server, MODEL_CUSTOM, s, level, note="story")
                    print_step(same)
                if same is not None:
                    same["story_step"] = index
    if not args.no_story:
        # (setting, [(story index or None for the probe, series text, level, model)]) in order of first use
        plan: dict[str, list] = {}
        for index, (_, _, text, level, setting) in enumerate(STORY):
            if setting is not None:
                plan.setdefault(setting, []).append((index, text, level, MODEL_CUSTOM))
        text, level, setting, probe_models = LATENCY_PROBE
        plan.setdefault(setting, []).extend((None, text, level, model) for model in probe_models)
        for setting, steps in plan.items():
            instances = SERVER_SETTINGS[setting]
            probing = any(index is None for index, *_ in steps)
            folder = build_repository(BUILD_DIR / f"perf_analyzer_story_{setting}", entries=(MODEL_CUSTOM,),
                                      zero=probing, instances=instances)
            runnable = [(index, dataclasses.replace(Series.parse(text), load_generator=PERF_ANALYZER), level, model)
                        for index, text, level, model in steps]
            runnable = [step for step in runnable if in_time(step[3], step[1], step[2])]
            if not runnable:
                continue
            try:
                with pinned_server(folder, run.token, server_cores, load_cores,
                                      args.out / f"server_story_{setting}.log") as server:
                    for index, s, level, model in runnable:
                        record = perf_analyzer_step(run, server, model, s, level, note=f"story-{setting}")
                        record["server_setting"] = setting
                        if index is not None:
                            record["story_step"] = index
                        print_step(record)
            except Exception as error:   # the story goes on without this setting; the report says why
                story_servers[setting] = f"failed: {error}"
                print(f"story setting {setting} failed: {error}", file=sys.stderr)
    merged = report.read_results(args.merge)["steps"] if args.merge else []
    results = {
        "device": describe_device(), "date": started.isoformat(timespec="seconds"), "git_commit": git_commit(),
        "command": "python -m fusedresnet.loadtest.perf_analyzer " + " ".join(argv or sys.argv[1:]),
        "engines": engines, "steps": merged + run.records, "skipped": skipped,
        "settings": {"server": f"as shipped (127.0.0.1, admin token; {layout}), its processes on cores "
                               f"{sorted(server_cores)}",
                     "load_cores": sorted(load_cores),
                     "requests_per_step": "perf_analyzer --request-count: max(3000, 1000 x in flight / sqrt(images))",
                     "series": [dataclasses.asdict(s) for s in series],
                     "cross_check": [dataclasses.asdict(s) for s in floods], "story_servers": story_servers},
        "cross_check": cross_check(run.records), "serving_story": story(run.records),
    }
    written = report.write_report(results, args.out, "loadtest_ab")
    print("wrote " + ", ".join(map(str, written)))
    return 0 if all(not r["problems"] for r in run.records) else 3


if __name__ == "__main__":
    sys.exit(main())
