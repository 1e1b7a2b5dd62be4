"""Several GPUs on one host: one server per GPU behind the balancer against one server over all GPUs.

    python -m fusedresnet.loadtest.multi_gpu --out results/multi_gpu.json [--generator-cores 16-31]

Two layouts of the same model repository (the custom model, its configured instances per GPU), each
against the same server on one GPU:
- "server-per-gpu": one launcher per GPU (`--gpus k`), as the Kubernetes Deployment runs one pod
  per GPU. Over gRPC, one load generator spreads its requests over every server with gRPC's
  round_robin policy (client/resnet_client.py, grpc_channel: the client-side balancer); with CUDA
  shared memory each GPU has its own load generator, whose regions live on that GPU and are
  registered with that GPU's server (a region belongs to one server).
- "one-server": one launcher over every GPU; Triton's dynamic batcher gives each batch to a free
  instance on any GPU. With CUDA shared memory there is again one load generator per GPU, its
  regions on that GPU.
The one-GPU figures are the first server of "server-per-gpu" driven alone. Series: gRPC at 1 and at
32 images per request, and CUDA shared memory at 32; each at a few loads (requests in flight per
GPU); a series' peak over its one-GPU peak is its scaling (`scaling_1`, `scaling_32`,
`scaling_32_cuda_shm`).

The load generator is the project's own (loadtest/grpc_flood.py), run as processes pinned with
`taskset` to `--generator-cores`; the servers run on `--server-cores` (default: the host's cores
split in two halves). Each step records the generator's CPU in percent of one core and as a share
of its cores: near 100% the generator, not the servers, is the limit. Concurrent generators (one
per GPU) each measure their own window of the same length after the same warm-up; their img/s are
summed. Every step keeps the generators' own records (Triton's counts, per-GPU shares, latencies).

Writes the JSON (device, date, gpus, cores, layouts with their scaling, every step) and a markdown
report beside it. Works for any number of GPUs (2 or more).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.spec import MODEL_CUSTOM, MODEL_REPOSITORY, model_config
from fusedresnet.backend.triton_install import host_gpus
from fusedresnet.loadtest.image_pool import DEFAULT_POOL_SIZE, build_image_pool, save_image_pool
from fusedresnet.loadtest.serving_sequence import LaunchedServer, repository_with_instances
from fusedresnet.loadtest.sweep import describe_device

SCALING_TARGETS_32 = {2: 1.8, 4: 3.5}   # issue 32: at 32 images/request
LAYOUTS = ("server-per-gpu", "one-server")
GENERATOR_LIMIT_SHARE = 0.9             # the generator's CPU over its cores above which it may be the limit
FLOOD_TIMEOUT_S = 120


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
    Series("1", 1, "none", (128, 256)),
    Series("32", 32, "none", (32, 64)),
    Series("32_cuda_shm", 32, "cuda", (32, 64)),
)


def cpu_list(text: str) -> list[int]:
    """"0-7,16" -> [0, 1, ..., 7, 16] (taskset's list format)."""
    cores = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return sorted(cores)


def cpu_text(cores: list[int]) -> str:
    return ",".join(map(str, cores))


@dataclass(frozen=True)
class Flood:
    """One load generator (a grpc_flood process tree) of a step."""
    url: str                    # one server, or several separated by commas (round robin)
    metrics_url: str            # its server's metrics, or every server's, comma-separated
    concurrency: int
    processes: int
    visible_gpus: str | None = None   # CUDA_VISIBLE_DEVICES of the generator (shared memory on "its" GPU)
    cuda_device: int = 0              # the regions' GPU, as the server numbers its GPUs


@dataclass
class Bench:
    out_dir: Path
    pool_file: Path
    token_file: Path
    generator_cores: list[int]
    seconds: float
    warmup_s: float

    def run_floods(self, label: str, series: Series, floods: list[Flood]) -> dict:
        """The floods at once; their records and the sums over them."""
        print(f"== {label}: {series.name}, {sum(f.concurrency for f in floods)} in flight, "
              f"{len(floods)} generator(s)", flush=True)
        running = []
        for i, flood in enumerate(floods):
            out = self.out_dir / f"flood-{secrets.token_hex(4)}-{i}.json"
            command = ["taskset", "-c", cpu_text(self.generator_cores), sys.executable, "-m",
                       "fusedresnet.loadtest.grpc_flood", "--model", MODEL_CUSTOM, "--url", flood.url,
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
        return summarize_step(label, series, records, errors, len(self.generator_cores))


def summarize_step(label: str, series: Series, records: list[dict], errors: list[str], generator_cores: int) -> dict:
    """One step from its generators' records: img/s and failures summed, the worst latencies, generator CPU."""
    def total(key):
        values = [r.get(key) for r in records]
        return None if not values or None in values else sum(values)

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
            "per_gpu": [r.get("per_gpu") for r in records],
            "problems": [p for r in records for p in r.get("problems", [])], "errors": errors,
            "generator_records": records}


def flood_processes(total: int, generators: int) -> int:
    return max(1, total // generators)


def drive(bench: Bench, label: str, servers: list[LaunchedServer], series: Series, level: int, processes: int,
          one_server_gpus: int | None = None) -> dict:
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
    record = bench.run_floods(label, series, floods)
    record["gpus"] = gpus
    print(json.dumps({k: record.get(k) for k in ("img_per_s", "p99_ms", "failures", "generator_cpu_percent",
                                                 "generator_cpu_share", "errors")}), flush=True)
    return record


class GpuServer(LaunchedServer):
    def __init__(self, gpus: str, repository: Path, token_file: Path, log_file: Path, server_cores: list[int]):
        self.gpus = gpus
        inherited = os.sched_getaffinity(0)
        os.sched_setaffinity(0, server_cores)    # the launcher and Triton inherit the servers' cores
        try:
            super().__init__(repository, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, MODEL_REPOSITORY.parent, token_file,
                             log_file, launcher_args=["--gpus", gpus])
        finally:
            os.sched_setaffinity(0, inherited)


def peak(steps: list[dict], layout: str, series: str, gpus: int) -> dict | None:
    candidates = [s for s in steps if s["layout"] == layout and s["series"] == series and s["gpus"] == gpus
                  and s.get("img_per_s")]
    return max(candidates, key=lambda s: s["img_per_s"]) if candidates else None


def summarize(steps: list[dict], gpu_count: int) -> list[dict]:
    """Per layout: each series' peak on every GPU against its peak on one GPU."""
    layouts = []
    for layout in LAYOUTS:
        entry = {"layout": layout, "gpus": gpu_count}
        for s in SERIES:
            one, many = peak(steps, "one-gpu", s.key, 1), peak(steps, layout, s.key, gpu_count)
            entry[f"scaling_{s.key}"] = many["img_per_s"] / one["img_per_s"] if one and many else None
            entry[f"img_per_s_{s.key}"] = many["img_per_s"] if many else None
            entry[f"img_per_s_{s.key}_1gpu"] = one["img_per_s"] if one else None
            entry[f"generator_cpu_share_{s.key}"] = many.get("generator_cpu_share") if many else None
            entry[f"p99_ms_{s.key}"] = many.get("p99_ms") if many else None
        entry["scaling_32_target"] = SCALING_TARGETS_32.get(gpu_count)
        layouts.append(entry)
    return layouts


def fmt(value, spec=".0f", default="-"):
    return default if value is None else format(value, spec)


def scaling_cell(value) -> str:
    return "-" if value is None else f"**{value:.2f}x**"


def markdown(results: dict) -> str:
    n = results["gpus"]
    lines = [f"# Several GPUs: one server per GPU against one server over {n} GPUs", "",
             f"Device: {results['device']}. Date: {results['date']}. Commit: {results.get('git_commit') or '-'}.",
             f"Command: `{results['command']}`",
             f"Load generator (grpc_flood) pinned to cores {results['generator_cores']}, servers to "
             f"{results['server_cores']}.", "",
             f"| layout | series | img/s, 1 GPU | img/s, {n} GPUs | scaling | target | p99 ms | generator CPU "
             "(share of its cores) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for entry in results["layouts"]:
        for s in SERIES:
            target = entry["scaling_32_target"] if s.key == "32" else None
            lines.append(f"| {entry['layout']} | {s.name} | {fmt(entry[f'img_per_s_{s.key}_1gpu'])} "
                         f"| {fmt(entry[f'img_per_s_{s.key}'])} | {scaling_cell(entry[f'scaling_{s.key}'])} "
                         f"| {fmt(target, '.1f')} | {fmt(entry[f'p99_ms_{s.key}'], '.1f')} "
                         f"| {fmt(entry[f'generator_cpu_share_{s.key}'], '.0%')} |")
    lines += ["", "Every step:", "",
              "| layout | GPUs | series | in flight | generators | processes | img/s | p50 ms | p99 ms | failures "
              "| generator CPU % of a core | problems |", "|---" * 12 + "|"]
    for s in results["steps"]:
        problems = "; ".join(s["problems"] + s["errors"])[:200]
        lines.append(f"| {s['layout']} | {s['gpus']} | {s['series_name']} | {s['concurrency']} | {s['generators']} "
                     f"| {s['processes']} | {fmt(s['img_per_s'])} | {fmt(s['p50_ms'], '.2f')} "
                     f"| {fmt(s['p99_ms'], '.2f')} | {s['failures']} | {fmt(s['generator_cpu_percent'])} "
                     f"| {problems} |")
    lines += ["", "With one server and one generator per GPU, each generator's Triton counts include the other "
              "generators' requests: its count check says so among the problems; the img/s are each generator's "
              "own."]
    return "\n".join(lines) + "\n"


def default_cores() -> tuple[list[int], list[int]]:
    """(server cores, generator cores): the first and second half of the cores this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    return cores[:half], cores[half:]


def measure(args, gpu_count: int, server_cores: list[int], scratch: Path, results: dict, write):
    token_file = scratch / "admin-token"
    token_file.write_text(secrets.token_hex(24))
    token_file.chmod(0o600)
    # the custom model's IMAGE entry alone: faster starts, all GPU memory to it
    repository = repository_with_instances(MODEL_REPOSITORY, model_config(MODEL_CUSTOM).instance_group[0].count,
                                           scratch / "models", entries=(MODEL_CUSTOM,))
    bench = Bench(scratch, save_image_pool(build_image_pool(DEFAULT_POOL_SIZE), scratch / "pool.npy"), token_file,
                  results["generator_cores_list"], args.seconds, args.warmup_s)
    log_dir = args.log_dir
    steps = results["steps"]

    def run(label, servers, one_server_gpus=None):
        for s in SERIES:
            for level in s.levels_per_gpu:
                steps.append(drive(bench, label, servers, s, level, args.processes, one_server_gpus))
                write()

    # The first server alone compiles the kernels into the CuPy cache (and makes the launcher's backend copy);
    # the others then start together from both. (os.sched_setaffinity(0) pins the calling thread only.)
    def start(k: int) -> GpuServer:
        return GpuServer(str(k), repository, token_file, log_dir / f"server-gpu{k}.log", server_cores)

    servers = [start(0)]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=gpu_count) as pool:
            starting = [pool.submit(start, k) for k in range(1, gpu_count)]
            for future in starting:
                with contextlib.suppress(Exception):     # raised again below, after every start has ended
                    servers.append(future.result())
            for future in starting:
                future.result()
        run("one-gpu", servers[:1])
        run("server-per-gpu", servers)
    finally:
        for server in servers:
            server.stop()
    everything = ",".join(map(str, range(gpu_count)))
    server = GpuServer(everything, repository, token_file, log_dir / "server-all-gpus.log", server_cores)
    try:
        run("one-server", [server], one_server_gpus=gpu_count)
    finally:
        server.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON of the layouts and steps (.md beside it)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measurement window of each step")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--processes", type=int, default=8, help="load-generator processes per step (all generators)")
    parser.add_argument("--generator-cores", type=cpu_list, help="cores of the load generator, e.g. 16-31 "
                                                                 "(default: the second half of the host's)")
    parser.add_argument("--server-cores", type=cpu_list, help="cores of the servers (default: the first half)")
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
    server_cores, generator_cores = default_cores()
    server_cores = args.server_cores or server_cores
    generator_cores = args.generator_cores or generator_cores
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir = args.log_dir or args.out.with_suffix("")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = {"device": describe_device(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "git_commit": git_commit(),
               "command": " ".join(["python -m fusedresnet.loadtest.multi_gpu", *(argv or sys.argv[1:])]),
               "gpus": gpu_count, "generator_cores": cpu_text(generator_cores), "generator_cores_list": generator_cores,
               "server_cores": cpu_text(server_cores), "layouts": [], "steps": []}

    def write():
        results["layouts"] = summarize(results["steps"], gpu_count)
        results["wall_s"] = round(time.time() - started, 1)
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="multi-gpu-") as scratch:
        measure(args, gpu_count, server_cores, Path(scratch), results, write)
    write()
    args.out.with_suffix(".md").write_text(markdown(results))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
