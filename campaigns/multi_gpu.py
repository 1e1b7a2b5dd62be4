"""Several GPUs on one host: one server per GPU behind the balancer against one server over the GPUs.

    python -m fusedresnet.campaigns.multi_gpu --out results/multi_gpu.json [--generator-cores 32-63]

One run measures 1, 2, 4, ... GPUs up to the host's (gpu_counts), so the scaling at 2 and at 4 GPUs
come from the same run. Two layouts of the same model repository (the custom model with its
configured instances per GPU, and the zero-answer model), each against the first server on one GPU:
- "server-per-gpu": one launcher per GPU (`--gpus k`), as the Kubernetes Deployment runs one pod
  per GPU; the first k servers are driven for k GPUs. Over gRPC, one load generator spreads its
  requests over them with gRPC's round_robin policy (client/resnet_client.py, grpc_channel: the
  client-side balancer); with CUDA shared memory each GPU has its own load generator, whose regions
  live on that GPU and are registered with that GPU's server (a region belongs to one server).
- "one-server": one launcher over the first k GPUs; Triton's dynamic batcher gives each batch to a
  free instance on any GPU. With CUDA shared memory there is again one load generator per GPU.
Series: gRPC at 1 and at 32 images per request, and CUDA shared memory at 32, each at its loads
(requests in flight per GPU); a series' peak over its one-GPU peak is its scaling (`scaling_1`,
`scaling_32`, `scaling_32_cuda_shm`), per layout and GPU count.

What limits gRPC at 32 images/request (the series with a target) is named from measurements
(limit_of): at each GPU count and layout the same load from twice the generator processes, and in
the per-GPU servers the zero-answer model (loadtest/zero_model: no GPU work) from that generator;
every step records the generator's CPU, the servers' process-tree CPU over the generator's window
(ServerCpu), and Triton's mean batch, queue and compute times and GPU utilisation.

The load generator is the project's own (loadtest/grpc_flood.py), run as processes pinned with
`taskset` to `--generator-cores`; the servers run on `--server-cores` (default: the host's cores
split in two halves). Concurrent generators (one per GPU) each measure their own window of the same
length after the same warm-up; their img/s are summed. Every step keeps the generators' own records
(Triton's counts, per-GPU shares, latencies). No step starts after `--budget-s`.

Writes the JSON (device, date, gpus, gpu_counts, cores, layouts with their scaling and limit, every
step) after every step, and a markdown report beside it at the end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fusedresnet.backend.launcher import LaunchedServer
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import number, table
from fusedresnet.backend.spec import MODEL_CUSTOM, MODEL_REPOSITORY, ZERO_MODEL, model_config
from fusedresnet.backend.triton_server.installation import host_gpus
from fusedresnet.campaigns.serving_sequence import repository_with_instances, start_server
from fusedresnet.loadtest.image_pool import DEFAULT_POOL_SIZE, build_image_pool, save_image_pool
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.sweep import describe_device

SCALING_TARGETS_32 = {2: 1.8, 4: 3.5}   # at 32 images/request, per GPU count
LAYOUTS = ("server-per-gpu", "one-server")
BASELINE = "one-gpu"                    # the first server of server-per-gpu driven alone
FLOOD_TIMEOUT_S = 120
# What names a limit (limit_of): each a measured figure against its threshold.
GENERATOR_LIMIT_SHARE = 0.9             # the generator's CPU over its cores above which it is a limit
GENERATOR_PROCESS_BUSY = 90.0           # its processes' mean CPU (% of a core) above which each loop is the limit
GENERATOR_GAIN = 0.10                   # twice the generator processes raising img/s this much: it was a limit
ZERO_MODEL_NEAR = 0.85                  # custom img/s at least this share of the zero model's: the serving path
SERVER_CPU_LIMIT_SHARE = 0.9            # the servers' CPU over their cores above which they are a limit
GPU_BUSY = 0.9                          # Triton's GPU utilisation above which the GPUs are a limit
FULL_BATCH = 0.9                        # mean batch over max_batch_size above which the instances are a limit
STEP_OVERHEAD_S = 3.0                   # a step beyond its warm-up and window: processes, requests, scrapes
SERVER_START_S = 25.0                   # a start of servers (engines, kernels from the CuPy cache) and their stop


@dataclass(frozen=True)
class Series:
    key: str                           # the suffix of its scaling figure: scaling_<key>
    images_per_request: int
    shared_memory: str
    levels_per_gpu: tuple[int, ...]    # requests in flight per GPU served

    @property
    def name(self) -> str:
        transport = "gRPC" if self.shared_memory == "none" else f"{self.shared_memory.upper()} shared memory"
        return f"{transport}, {self.images_per_request} image(s)/request"


SERIES = (
    Series("1", 1, "none", (256,)),
    Series("32", 32, "none", (32, 64)),
    Series("32_cuda_shm", 32, "cuda", (32,)),
)
LIMIT_SERIES = "32"                     # the series with a target, whose limit the report names
CHECKS = ("generator-x2", "zero-model")  # the limit's measurements, at that series' best load


# Exit status of a run with a step that measured nothing or had errors (perf_analyzer and grpc_flood use 3 too)
EXIT_STEPS_FAILED = 3


def gpu_counts(host_gpus: int) -> list[int]:
    """1, 2, 4, ... up to the host's GPUs, and the host's count: every figure of one run."""
    counts, k = {host_gpus}, 1
    while k <= host_gpus:
        counts.add(k)
        k *= 2
    return sorted(counts)


@dataclass(frozen=True)
class Flood:
    """One load generator (a grpc_flood process tree) of a step."""
    url: str                    # one server, or several separated by commas (round robin)
    metrics_url: str            # its server's metrics, or every server's, comma-separated
    concurrency: int
    processes: int
    visible_gpus: str | None = None   # CUDA_VISIBLE_DEVICES of the generator (shared memory on "its" GPU)
    cuda_device: int = 0              # the regions' GPU, as the server numbers its GPUs


class ServerCpu:
    """CPU seconds (user + system) of each server's process tree (launcher, tritonserver, its Python
    stubs), sampled every SAMPLE_S in a thread while a step runs: the servers' CPU over the step's window."""
    SAMPLE_S = 0.25

    def __init__(self, servers: list[LaunchedServer]):
        self.servers = servers
        self.samples: list[tuple[float, list[float], list[float]]] = []   # (time, per-server tree, tritonserver)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.sample_until_stopped, daemon=True)

    def sample_until_stopped(self):
        while not self.stopping.is_set():
            pairs = [server.cpu_seconds() for server in self.servers]
            self.samples.append((time.time(), [a for a, _ in pairs], [b for _, b in pairs]))
            self.stopping.wait(self.SAMPLE_S)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join()

    def over(self, window: list[float] | None) -> dict:
        """Each server's tree and tritonserver CPU in percent of one core over `window` (first to last sample in it)."""
        inside = [s for s in self.samples if window and window[0] <= s[0] <= window[1]]
        if len(inside) < 2:
            return {"server_cpu_percent": None, "tritonserver_cpu_percent": None}
        (t0, tree0, triton0), (t1, tree1, triton1) = inside[0], inside[-1]
        return {"server_cpu_percent": [round((b - a) / (t1 - t0) * 100, 1) for a, b in zip(tree0, tree1, strict=True)],
                "tritonserver_cpu_percent": [round((b - a) / (t1 - t0) * 100, 1)
                                             for a, b in zip(triton0, triton1, strict=True)]}


@dataclass
class Bench:
    out_dir: Path
    pool_file: Path
    token_file: Path
    generator_cores: list[int]
    server_cores: list[int]
    seconds: float
    warmup_s: float

    def run_floods(self, label: str, series: Series, floods: list[Flood], servers: list[LaunchedServer],
                   model: str) -> dict:
        """The floods at once; their records, the sums over them and the servers' CPU over the window."""
        print(f"== {label}: {model} {series.name}, {sum(f.concurrency for f in floods)} in flight, "
              f"{len(floods)} generator(s) of {sum(f.processes for f in floods)} process(es)", flush=True)
        running = []
        for i, flood in enumerate(floods):
            out = self.out_dir / f"flood-{secrets.token_hex(4)}-{i}.json"
            command = ["taskset", "-c", cpu_text(self.generator_cores), sys.executable, "-m",
                       "fusedresnet.loadtest.grpc_flood", "--model", model, "--url", flood.url,
                       "--metrics-url", flood.metrics_url, "--concurrency", str(flood.concurrency),
                       "--images-per-request", str(series.images_per_request), "--processes", str(flood.processes),
                       "--seconds", str(self.seconds), "--warmup-s", str(self.warmup_s),
                       "--image-pool", str(self.pool_file), "--shared-memory", series.shared_memory,
                       "--admin-token-file", str(self.token_file), "--cuda-device", str(flood.cuda_device),
                       "--out", str(out)]
            env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}   # the servers' numbering (backend/serve.py)
            if flood.visible_gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = flood.visible_gpus
            running.append((subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True), out))
        records, errors = [], []
        with ServerCpu(servers) as server_cpu:
            for process, out in running:
                try:
                    output, _ = process.communicate(timeout=FLOOD_TIMEOUT_S + self.seconds + self.warmup_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    output, _ = process.communicate()
                if out.is_file():
                    records.append(json.loads(out.read_text()))
                else:
                    errors.append(f"generator exited {process.returncode}: {output[-1500:]}")
        record = summarize_step(label, series, records, errors, len(self.generator_cores))
        record.update(server_cpu.over(records[0].get("window_unix") if records else None))
        cpu = record["server_cpu_percent"]
        record["server_cpu_share"] = None if cpu is None else sum(cpu) / (100 * len(self.server_cores))
        record["model"] = model
        return record


def summarize_step(label: str, series: Series, records: list[dict], errors: list[str], generator_cores: int) -> dict:
    """One step from its generators' records: img/s and failures summed, the worst latencies, generator CPU,
    Triton's mean batch, queue and compute times and GPU utilisation (means over the generators' records)."""
    def total(key):
        values = [r.get(key) for r in records]
        return None if not values or None in values else sum(values)

    def mean(key):
        values = [r[key] for r in records if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    cpu = total("client_cpu_percent")
    return {"layout": label, "series": series.key, "series_name": series.name,
            "images_per_request": series.images_per_request, "shared_memory": series.shared_memory,
            "concurrency": sum(r.get("concurrency", 0) for r in records),
            "processes": sum(r.get("processes", 0) for r in records), "generators": len(records) + len(errors),
            "img_per_s": total("img_per_s") if not errors else None, "failures": total("failures"),
            "p50_ms": max((r["p50_ms"] for r in records if r.get("p50_ms") is not None), default=None),
            "p99_ms": max((r["p99_ms"] for r in records if r.get("p99_ms") is not None), default=None),
            "generator_cpu_percent": cpu,
            "generator_cpu_share": None if cpu is None else cpu / (100 * generator_cores),
            "generator_cpu_max_process": max((r["client_cpu_percent_max_process"] for r in records
                                              if r.get("client_cpu_percent_max_process") is not None), default=None),
            **{key: mean(key) for key in ("avg_batch", "queue_us", "compute_input_us", "compute_infer_us",
                                          "compute_output_us", "gpu_utilization")},
            "per_gpu": [r.get("per_gpu") for r in records],
            "problems": [p for r in records for p in r.get("problems", [])], "errors": errors,
            "generator_records": records}


def flood_processes(total: int, generators: int) -> int:
    return max(1, total // generators)


def drive(bench: Bench, label: str, servers: list[LaunchedServer], series: Series, level: int, processes: int,
          one_server_gpus: int | None = None, model: str = MODEL_CUSTOM, check: str | None = None) -> dict:
    """One step of `series` at `level` in flight per GPU over `servers`.

    server-per-gpu (one_server_gpus None): gRPC through one generator balancing over every server,
    shared memory with one generator per server on that server's GPU. one-server: the single server
    over `one_server_gpus` GPUs, shared memory with one generator per GPU."""
    gpus = one_server_gpus or len(servers)
    if series.shared_memory == "none":
        url = ",".join(s.url for s in servers)
        metrics = ",".join(s.metrics_url for s in servers)
        floods = [Flood(url, metrics, level * gpus, processes)]
    elif one_server_gpus is None:
        floods = [Flood(s.url, s.metrics_url, level, flood_processes(processes, gpus), visible_gpus=s.gpus)
                  for s in servers]
    else:
        (server,) = servers
        floods = [Flood(server.url, server.metrics_url, level, flood_processes(processes, gpus), cuda_device=k)
                  for k in range(gpus)]
    record = bench.run_floods(label, series, floods, servers, model)
    record.update({"gpus": gpus, "level_per_gpu": level, "check": check})
    print(json.dumps({k: record.get(k) for k in ("img_per_s", "p99_ms", "failures", "generator_cpu_share",
                                                 "generator_cpu_max_process", "server_cpu_share", "gpu_utilization",
                                                 "avg_batch", "errors")}), flush=True)
    return record


def gpu_server(gpus: str, repository: Path, token_file: Path, log_file: Path,
               server_cores: list[int]) -> LaunchedServer:
    """The launcher on `gpus` (PCI bus order), pinned with Triton to the servers' cores."""
    return start_server(repository, token_file, log_file, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, MODEL_REPOSITORY.parent,
                        gpus=gpus, cores=server_cores)


def custom_steps(steps: list[dict], layout: str, series: str, gpus: int) -> list[dict]:
    """The custom model's measured steps (every generator size) of one layout, series and GPU count."""
    return [s for s in steps if s["layout"] == layout and s["series"] == series and s["gpus"] == gpus
            and s.get("model", MODEL_CUSTOM) == MODEL_CUSTOM and s.get("img_per_s")]


def peak(steps: list[dict], layout: str, series: str, gpus: int) -> dict | None:
    candidates = custom_steps(steps, layout, series, gpus)
    return max(candidates, key=lambda s: s["img_per_s"]) if candidates else None


def layout_of(layout: str, gpus: int) -> str:
    """Where a layout's steps at `gpus` are: one GPU is the baseline for both layouts."""
    return BASELINE if gpus == 1 else layout


def limit_of(steps: list[dict], layout: str, gpus: int) -> dict:
    """What limits LIMIT_SERIES in `layout` on `gpus` GPUs, named from the measurements of the run:
    - the load generator: twice its processes raised img/s by >= GENERATOR_GAIN, or its CPU was at
      >= GENERATOR_LIMIT_SHARE of its cores at the peak;
    - the servers' gRPC / Python-backend path: the zero-answer model (no GPU work), served the same way
      and driven by the same generator, answered no more than 1/ZERO_MODEL_NEAR times the custom model;
    - the servers' cores: their process trees at >= SERVER_CPU_LIMIT_SHARE of the server cores;
    - the GPUs: Triton's GPU utilisation >= GPU_BUSY at the peak;
    - the model instances: Triton's mean batch >= FULL_BATCH of max_batch_size (requests wait for a
      free instance; with the GPUs not busy, the instances' CPU side of execute()).
    Each finding carries the figures that show it; with none, the figures say what was ruled out."""
    where = layout_of(layout, gpus)
    best = peak(steps, where, LIMIT_SERIES, gpus)
    base = peak(steps, BASELINE, LIMIT_SERIES, 1)
    target = SCALING_TARGETS_32.get(gpus)
    result = {"layout": layout, "gpus": gpus, "target": target, "findings": [], "figures": {}}
    if not best:
        result["text"] = "no measurement"
        return result
    scaling = best["img_per_s"] / base["img_per_s"] if base else None
    figures = result["figures"]
    figures.update({"img_per_s": best["img_per_s"], "scaling": scaling, "generator_processes": best["processes"],
                    "generator_cpu_share": best.get("generator_cpu_share"),
                    "generator_cpu_max_process": best.get("generator_cpu_max_process"),
                    "server_cpu_share": best.get("server_cpu_share"), "gpu_utilization": best.get("gpu_utilization"),
                    "avg_batch": best.get("avg_batch")})
    findings = result["findings"]
    plain = [s for s in custom_steps(steps, where, LIMIT_SERIES, gpus) if s.get("check") is None]
    doubled = [s for s in custom_steps(steps, where, LIMIT_SERIES, gpus) if s.get("check") == "generator-x2"]
    if plain and doubled:
        single = max(plain, key=lambda s: s["img_per_s"])
        twice = doubled[0]
        gain = twice["img_per_s"] / single["img_per_s"] - 1
        figures.update({"generator_x2_gain": gain, "generator_x2_processes": twice["processes"]})
        if gain >= GENERATOR_GAIN:
            findings.append(("the load generator", f"{twice['processes']} generator processes gave {gain:+.0%} "
                                                   f"img/s over {single['processes']}"))
    share = best.get("generator_cpu_share")
    per_process = best["generator_cpu_percent"] / best["processes"] \
        if best.get("generator_cpu_percent") is not None and best.get("processes") else None
    figures["generator_cpu_per_process"] = per_process
    if per_process is not None and per_process >= GENERATOR_PROCESS_BUSY:
        findings.append(("the load generator's processes", f"each of its {best['processes']} processes at "
                                                           f"{per_process:.0f}% of a core on average"))
    if share is not None and share >= GENERATOR_LIMIT_SHARE:
        findings.append(("the load generator's cores", f"generator at {share:.0%} of its cores"))
    zero = [s for s in steps if s["layout"] == where and s["gpus"] == gpus and s.get("check") == "zero-model"
            and s.get("img_per_s")]
    if zero:
        zero_img = zero[0]["img_per_s"]
        ratio = best["img_per_s"] / zero_img
        figures.update({"zero_model_img_per_s": zero_img, "custom_over_zero": ratio,
                        "zero_model_generator_cpu_share": zero[0].get("generator_cpu_share"),
                        "zero_model_server_cpu_share": zero[0].get("server_cpu_share")})
        if ratio >= ZERO_MODEL_NEAR:
            findings.append(("the servers' gRPC / Python-backend path",
                             f"the zero-answer model {zero_img:.0f} img/s vs the custom model {best['img_per_s']:.0f}"
                             f" img/s ({ratio:.0%}) on {gpus} server(s)" if layout_of(layout, gpus) != "one-server"
                             else f"the zero-answer model {zero_img:.0f} img/s vs the custom model "
                                  f"{best['img_per_s']:.0f} img/s ({ratio:.0%})"))
    server_share = best.get("server_cpu_share")
    if server_share is not None and server_share >= SERVER_CPU_LIMIT_SHARE:
        findings.append(("the servers' cores", f"servers at {server_share:.0%} of their cores"))
    busy = best.get("gpu_utilization")
    if busy is not None and busy >= GPU_BUSY:
        findings.append(("the GPUs", f"GPU utilisation {busy:.0%}"))
    batch, max_batch = best.get("avg_batch"), model_config(MODEL_CUSTOM).max_batch_size
    if batch is not None and batch >= FULL_BATCH * max_batch:
        findings.append(("the model instances", f"mean batch {batch:.0f} of {max_batch}, queue "
                                                f"{fmt(best.get('queue_us'), 0)} us, compute "
                                                f"{fmt(best.get('compute_infer_us'), 0)} us per execution"))
    measured = "; ".join(part for part in (
        f"generator at {share:.0%} of its cores" if share is not None else None,
        f"{best['processes']} generator processes at {per_process:.0f}% of a core each on average"
        if per_process is not None else None,
        f"{figures['generator_x2_processes']} generator processes {figures['generator_x2_gain']:+.0%}"
        if "generator_x2_gain" in figures else None,
        f"zero-answer model {figures['zero_model_img_per_s']:.0f} img/s" if "zero_model_img_per_s" in figures else None,
        f"servers at {server_share:.0%} of their cores" if server_share is not None else None,
        f"GPU utilisation {busy:.0%}" if busy is not None else None,
        f"mean batch {best['avg_batch']:.0f}" if best.get("avg_batch") is not None else None) if part)
    if scaling is not None and target is not None and scaling >= target:
        result["text"] = f"target met ({scaling:.2f}x >= {target}x); {measured}"
    elif findings:
        result["text"] = "limit: " + "; ".join(f"{name} ({evidence})" for name, evidence in findings) + \
                         f" [{measured}]"
    else:
        result["text"] = f"limit not separated by these measurements: {measured}"
    result["findings"] = [{"limit": name, "evidence": evidence} for name, evidence in findings]
    return result


def summarize(steps: list[dict], counts: list[int]) -> list[dict]:
    """Per layout and GPU count above one: each series' peak against its peak on one GPU, and the limit."""
    layouts = []
    for gpus in [k for k in counts if k > 1]:
        for layout in LAYOUTS:
            entry = {"layout": layout, "gpus": gpus}
            for s in SERIES:
                one, many = peak(steps, BASELINE, s.key, 1), peak(steps, layout, s.key, gpus)
                entry[f"scaling_{s.key}"] = many["img_per_s"] / one["img_per_s"] if one and many else None
                entry[f"img_per_s_{s.key}"] = many["img_per_s"] if many else None
                entry[f"img_per_s_{s.key}_1gpu"] = one["img_per_s"] if one else None
                entry[f"generator_cpu_share_{s.key}"] = many.get("generator_cpu_share") if many else None
                entry[f"p99_ms_{s.key}"] = many.get("p99_ms") if many else None
            entry["scaling_32_target"] = SCALING_TARGETS_32.get(gpus)
            entry["limit_32"] = limit_of(steps, layout, gpus)
            layouts.append(entry)
    return layouts


# A figure of the report: no thousands separator, "-" where not measured.
fmt = functools.partial(number, grouping=False, none="-")


def scaling_cell(value) -> str:
    return "-" if value is None else f"**{value:.2f}x**"


def markdown(results: dict) -> str:
    lines = ["# Several GPUs: one server per GPU against one server over every GPU", "",
             f"Device: {results['device']}. Date: {results['date']}. Commit: {results.get('git_commit') or '-'}.",
             f"Command: `{results['command']}`",
             f"Load generator (grpc_flood) pinned to cores {results['generator_cores']}, servers to "
             f"{results['server_cores']}. Wall time {fmt(results.get('wall_s'), 0)} s.", "",
             *table(["layout", "GPUs", "series", "img/s, 1 GPU", "img/s", "scaling", "target", "p99 ms",
                     "generator CPU (share of its cores)"],
                    ([entry["layout"], entry["gpus"], s.name, fmt(entry[f"img_per_s_{s.key}_1gpu"], 0),
                      fmt(entry[f"img_per_s_{s.key}"], 0), scaling_cell(entry[f"scaling_{s.key}"]),
                      fmt(entry["scaling_32_target"] if s.key == "32" else None, 1),
                      fmt(entry[f"p99_ms_{s.key}"], 1), fmt(entry[f"generator_cpu_share_{s.key}"], 0, percent=True)]
                     for entry in results["layouts"] for s in SERIES), "lrlrrrrrr")]
    lines += ["", f"What limits gRPC at 32 images/request (from this run's measurements; `{CHECKS[0]}`: the same "
              f"load from twice the generator processes on the same cores; `{CHECKS[1]}`: the zero-answer model, "
              "no GPU work, in the same servers):", ""]
    if results.get("baseline_limit_32"):
        lines.append(f"- one GPU (the baseline, one server): {results['baseline_limit_32']['text']}")
    lines += [f"- {entry['layout']}, {entry['gpus']} GPUs: {entry['limit_32']['text']}" for entry in results["layouts"]]
    def step_cells(s):
        problems = " ".join("; ".join(s["problems"] + s["errors"]).replace("|", "/").split())[-200:]  # one cell
        triton = s.get("tritonserver_cpu_percent")
        return [s["layout"], s["gpus"], s["series_name"], s.get("model", MODEL_CUSTOM), s.get("check") or "",
                s["concurrency"], s["processes"], fmt(s["img_per_s"], 0), fmt(s["p50_ms"], 2), fmt(s["p99_ms"], 2),
                s["failures"], fmt(s.get("generator_cpu_share"), 0, percent=True),
                fmt(s.get("generator_cpu_max_process"), 0), fmt(s.get("server_cpu_share"), 0, percent=True),
                "/".join(map(str, triton)) if triton else "-", fmt(s.get("gpu_utilization"), 0, percent=True),
                fmt(s.get("avg_batch"), 1), fmt(s.get("queue_us"), 0), problems]
    lines += ["", "Every step (server CPU: the servers' process trees over their cores; GPU: Triton's utilisation):",
              "",
              *table(["layout", "GPUs", "series", "model", "check", "in flight", "processes", "img/s", "p50 ms",
                      "p99 ms", "failures", "generator CPU", "busiest generator process %", "server CPU",
                      "tritonserver % of a core", "GPU", "mean batch", "queue us", "problems"],
                     map(step_cells, results["steps"]))]
    if results.get("skipped"):
        lines += ["", "Not measured (time budget): " + "; ".join(results["skipped"])]
    lines += ["", "With one server and one generator per GPU, each generator's Triton counts include the other "
              "generators' requests: its count check says so among the problems; the img/s are each generator's "
              "own."]
    return "\n".join(lines) + "\n"


def default_cores() -> tuple[list[int], list[int]]:
    """(server cores, generator cores): the first and second half of the cores this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    return cores[:half], cores[half:]


def planned_steps(counts: list[int]) -> tuple[int, int]:
    """(steps, rounds of server starts) of a run over `counts` GPUs (measure's order)."""
    per_count = sum(len(s.levels_per_gpu) for s in SERIES)
    steps = len(counts) * (per_count + len(CHECKS))               # baseline / server-per-gpu, both checks
    steps += sum(per_count + 1 for k in counts if k > 1)          # one-server, the generator check
    return steps, min(2, max(counts)) + sum(1 for k in counts if k > 1)   # the first server, the rest together


def estimate_s(counts: list[int], seconds: float, warmup_s: float) -> float:
    steps, starts = planned_steps(counts)
    return steps * (seconds + warmup_s + STEP_OVERHEAD_S) + starts * SERVER_START_S


def scaling_repository(folder: Path) -> Path:
    """The custom model's IMAGE entry alone (faster starts, all GPU memory to it) and the zero-answer model."""
    repository = repository_with_instances(MODEL_REPOSITORY, model_config(MODEL_CUSTOM).instance_group[0].count,
                                           folder, entries=(MODEL_CUSTOM,))
    from fusedresnet.loadtest.perf_analyzer import add_zero_model
    add_zero_model(repository)
    return repository


def measure(args, counts: list[int], server_cores: list[int], scratch: Path, results: dict, write,
            started: float):
    token_file = scratch / "admin-token"
    token_file.write_text(secrets.token_hex(24))
    token_file.chmod(0o600)
    repository = scaling_repository(scratch / "models")
    bench = Bench(scratch, save_image_pool(build_image_pool(DEFAULT_POOL_SIZE), scratch / "pool.npy"), token_file,
                  results["generator_cores_list"], server_cores, args.seconds, args.warmup_s)
    log_dir = args.log_dir
    steps = results["steps"]
    limit_series = next(s for s in SERIES if s.key == LIMIT_SERIES)

    def in_time(what: str) -> bool:
        if time.time() - started < args.budget_s:
            return True
        results["skipped"].append(what)
        print(f"skipped (over --budget-s {args.budget_s:.0f}): {what}", flush=True)
        return False

    def step(label, servers, series, level, processes, one_server_gpus=None, model=MODEL_CUSTOM, check=None):
        gpus = one_server_gpus or len(servers)
        if in_time(f"{label} {gpus} GPU(s) {model} {series.name} {level}/GPU {check or ''}".strip()):
            steps.append(drive(bench, label, servers, series, level, processes, one_server_gpus, model, check))
            write()

    def run(label, servers, one_server_gpus=None, zero=True):
        gpus = one_server_gpus or len(servers)
        for s in SERIES:
            for level in s.levels_per_gpu:
                step(label, servers, s, level, args.processes, one_server_gpus)
        # the limit's measurements at the target series' best load: twice the generator, the zero-answer model
        best = peak(steps, label, LIMIT_SERIES, gpus)
        level = best["level_per_gpu"] if best else limit_series.levels_per_gpu[0]
        step(label, servers, limit_series, level, 2 * args.processes, one_server_gpus, check=CHECKS[0])
        if zero:
            step(label, servers, limit_series, level, 2 * args.processes, one_server_gpus, ZERO_MODEL, CHECKS[1])

    # The first server alone compiles the kernels into the CuPy cache (and makes the launcher's backend copy);
    # the others then start together from both. (os.sched_setaffinity(0) pins the calling thread only.)
    def start(k: int) -> LaunchedServer:
        return gpu_server(str(k), repository, token_file, log_dir / f"server-gpu{k}.log", server_cores)

    servers = [start(0)]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(counts)) as pool:
            starting = [pool.submit(start, k) for k in range(1, max(counts))]
            for future in starting:
                with contextlib.suppress(Exception):     # raised again below, after every start has ended
                    servers.append(future.result())
            for future in starting:
                future.result()
        for k in counts:
            run(layout_of("server-per-gpu", k), servers[:k])
    finally:
        for server in servers:
            server.stop()
    for k in [k for k in counts if k > 1]:
        if not in_time(f"one-server {k} GPUs"):
            continue
        gpus = ",".join(map(str, range(k)))
        server = gpu_server(gpus, repository, token_file, log_dir / f"server-gpus-{k}.log", server_cores)
        try:
            run("one-server", [server], one_server_gpus=k, zero=False)
        finally:
            server.stop()


def main(argv=None) -> int:
    # `timeout`'s SIGTERM unwinds like Ctrl-C: the launchers (their own sessions) are stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON of the layouts and steps (.md beside it)")
    parser.add_argument("--seconds", type=float, default=3.5, help="measurement window of each step")
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--processes", type=int, help="load-generator processes per step, all generators together "
                                                      "(default: half the generator cores; the check doubles it)")
    parser.add_argument("--generator-cores", type=cpu_list, help="cores of the load generator, e.g. 32-63 "
                                                                 "(default: the second half of the host's)")
    parser.add_argument("--server-cores", type=cpu_list, help="cores of the servers (default: the first half)")
    parser.add_argument("--budget-s", type=float, default=390.0,
                        help="no new step or server start after this many seconds (the rest is listed as skipped)")
    parser.add_argument("--log-dir", type=Path, help="servers' logs (default: beside --out, named after it)")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from an existing --out")
    args = parser.parse_args(argv)
    if args.markdown_only:
        args.out.with_suffix(".md").write_text(markdown(json.loads(args.out.read_text())))
        return 0
    gpu_count = len(host_gpus())
    if gpu_count < 2:
        print(f"multi_gpu: needs two or more GPUs, this host has {gpu_count}", file=sys.stderr)
        return 2
    counts = gpu_counts(gpu_count)
    server_cores, generator_cores = default_cores()
    server_cores = args.server_cores or server_cores
    generator_cores = args.generator_cores or generator_cores
    args.processes = args.processes or max(1, len(generator_cores) // 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir = args.log_dir or args.out.with_suffix("")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    steps, starts = planned_steps(counts)
    print(f"multi_gpu: GPU counts {counts}, {steps} steps and {starts} server starts: about "
          f"{estimate_s(counts, args.seconds, args.warmup_s):.0f} s (budget {args.budget_s:.0f} s); generator "
          f"{args.processes} processes (the check {2 * args.processes}) on cores {cpu_text(generator_cores)}, "
          f"servers on {cpu_text(server_cores)}", flush=True)
    started = time.time()
    results = {"device": describe_device(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "git_commit": git_commit(),
               "command": " ".join(["python -m fusedresnet.campaigns.multi_gpu", *(argv or sys.argv[1:])]),
               "gpus": gpu_count, "gpu_counts": counts, "processes": args.processes,
               "generator_cores": cpu_text(generator_cores), "generator_cores_list": generator_cores,
               "server_cores": cpu_text(server_cores), "scaling_targets_32": SCALING_TARGETS_32,
               "layouts": [], "steps": [], "skipped": []}

    def write():
        results["layouts"] = summarize(results["steps"], counts)
        results["baseline_limit_32"] = limit_of(results["steps"], "server-per-gpu", 1)
        results["wall_s"] = round(time.time() - started, 1)
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="multi-gpu-") as scratch:
        measure(args, counts, server_cores, Path(scratch), results, write, started)
    write()
    args.out.with_suffix(".md").write_text(markdown(results))
    print(args.out.with_suffix(".md").read_text())
    failed = [s for s in results["steps"] if s.get("errors") or s.get("img_per_s") is None]
    return EXIT_STEPS_FAILED if failed or not results["steps"] else 0


if __name__ == "__main__":
    sys.exit(main())
