"""Several server processes behind one port, measured: the layouts of the launcher's --processes-per-gpu.

    python -m fusedresnet.loadtest.front_door --out results/front_door.json \\
        --server-cores 0-15 --generator-cores 16-31 --processes 1,2,4 --mps off,on

For each layout (processes per GPU x CUDA MPS off/on) one launcher serves on GPU 0 (`--gpu`), pinned to
`--server-cores`, with custom, cuDNN and the zero-answer model (loadtest/zero_model: the server's own
ceiling, no GPU work); the project's load generator (loadtest/grpc_flood.py) runs in this process's
children, pinned to `--generator-cores` (a stand-in for remote clients). Series: gRPC at 1 and at 32
images per request, and CUDA shared memory at 32 (every region registered with every process behind
the port). Every step keeps grpc_flood's record: img/s, client-side p50/p99, the generator's CPU (is it
the limit?), Triton's own counts and queue/compute times summed over the processes' metrics ports.

Writes `--out` (.json, and .md beside it) after every step: device, date, git_commit, generator_cores,
server_cores, layouts [{processes_per_gpu, mps, model, images_per_request, shared_memory, img_per_s,
p50_ms, p99_ms, ...}], and the targets of custom against cuDNN and against the one-process layout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fusedresnet.backend.network import free_port_run, free_ports
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.serve import READY_LINE
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV, MODEL_CUDNN, MODEL_CUSTOM, ZERO_MODEL
from fusedresnet.loadtest.grpc_flood import run_step
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.perf_analyzer import build_repository
from fusedresnet.loadtest.sweep import describe_device

MODELS_MEASURED = (MODEL_CUSTOM, MODEL_CUDNN, ZERO_MODEL)
# (images per request, shared memory, requests in flight): the series of every layout
SERIES = ((1, "none", 256), (32, "none", 64), (32, "cuda", 64))
TARGETS = {"grpc32_vs_cudnn": 2.0, "grpc32_vs_n1": 1.8, "grpc1_vs_n1": 1.8, "cuda_shm_img_per_s": 95_000}
READY_TIMEOUT_S = 300


class Layout:
    """One launcher: `processes` per GPU on `gpu`, with or without MPS, on `server_cores`."""

    def __init__(self, processes: int, mps: bool, gpu: str, repository: Path, server_cores: list[int], work: Path):
        self.processes, self.mps = processes, mps
        self.http_port, self.grpc_port = free_ports(2)
        self.metrics_port = free_port_run(processes)
        while {self.http_port, self.grpc_port} & set(range(self.metrics_port, self.metrics_port + processes)):
            self.metrics_port = free_port_run(processes)
        self.token = secrets.token_urlsafe(24)
        self.output = work / f"launcher-n{processes}{'-mps' if mps else ''}.out"
        command = [sys.executable, "-m", "fusedresnet.backend.serve", *(["--gpus", gpu] if gpu else []),
                   "--processes-per-gpu", str(processes), "--http-port", str(self.http_port),
                   "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
                   "--model-repository", str(repository), "--log-file", str(self.output.with_suffix(".log")),
                   *(["--mps"] if mps else [])]
        env = dict(os.environ, **{ADMIN_TOKEN_ENV: self.token})
        self.started = time.monotonic()
        with open(self.output, "wb") as out:
            self.launcher = subprocess.Popen(["taskset", "-c", cpu_text(server_cores), *command], env=env,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while READY_LINE not in self.output.read_text(errors="replace"):
            if self.launcher.poll() is not None or time.monotonic() - self.started > READY_TIMEOUT_S:
                self.stop()
                raise RuntimeError(f"launcher not ready:\n{self.output.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        self.ready_s = time.monotonic() - self.started
        line = next(line for line in self.output.read_text().splitlines() if READY_LINE in line)
        self.metrics_url = ",".join(re.findall(r"http://[\d.]+:\d+/metrics", line))

    def stop(self):
        if self.launcher.poll() is None:
            self.launcher.send_signal(2)
            try:
                self.launcher.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.launcher.kill()
                self.launcher.wait()


def rounded(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


def step_row(layout: Layout, model: str, images: int, shared_memory: str, record: dict) -> dict:
    return {"processes_per_gpu": layout.processes, "mps": layout.mps, "model": model,
            "images_per_request": images, "shared_memory": shared_memory != "none",
            "img_per_s": round(record["img_per_s"], 1), "p50_ms": rounded(record["p50_ms"]),
            "p99_ms": rounded(record["p99_ms"]),
            "concurrency": record["concurrency"], "failures": record["failures"], "sent": record["sent"],
            "client_cpu_percent": record.get("client_cpu_percent"),
            "client_cpu_saturated": bool(record.get("client_cpu_saturated")),
            "avg_batch": record.get("avg_batch"), "queue_us": record.get("queue_us"),
            "compute_infer_us": record.get("compute_infer_us"), "problems": record.get("problems", [])}


def figure(rows: list[dict], processes: int, mps: bool, model: str, images: int, shm: bool) -> float | None:
    return next((r["img_per_s"] for r in rows if (r["processes_per_gpu"], r["mps"], r["model"],
                                                   r["images_per_request"], r["shared_memory"]) ==
                 (processes, mps, model, images, shm)), None)


def targets(rows: list[dict]) -> list[dict]:
    """Each layout's figures for custom against the targets (same MPS setting, one process as the base)."""
    checks = []
    for processes, mps in sorted({(r["processes_per_gpu"], r["mps"]) for r in rows}):
        def custom(images, shm, n=processes):
            return figure(rows, n, mps, MODEL_CUSTOM, images, shm)
        g32, g1, shm32 = custom(32, False), custom(1, False), custom(32, True)
        cudnn32 = figure(rows, processes, mps, MODEL_CUDNN, 32, False)
        base32, base1 = custom(32, False, 1), custom(1, False, 1)
        ratio = {"grpc32_vs_cudnn": g32 / cudnn32 if g32 and cudnn32 else None,
                 "grpc32_vs_n1": g32 / base32 if g32 and base32 else None,
                 "grpc1_vs_n1": g1 / base1 if g1 and base1 else None, "cuda_shm_img_per_s": shm32}
        checks.append({"processes_per_gpu": processes, "mps": mps,
                       **{key: None if value is None else round(value, 2) for key, value in ratio.items()},
                       "met": {key: value is not None and value >= TARGETS[key] for key, value in ratio.items()}})
    return checks


def markdown(results: dict) -> str:
    lines = [f"# Several server processes behind one port ({results['date']})", "",
             f"{results['device']}; code {results['git_commit']}; server on cores {results['server_cores']} and "
             f"GPU {results['gpu']}, load generator (grpc_flood) on cores {results['generator_cores']}, a stand-in "
             "for remote clients. Command: `" + results["command"] + "`.", "",
             "| processes/GPU | MPS | model | images/request | shared memory | img/s | p50 ms | p99 ms | "
             "generator CPU % | mean batch |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results["layouts"]:
        lines.append(f"| {r['processes_per_gpu']} | {'on' if r['mps'] else 'off'} | {r['model']} | "
                     f"{r['images_per_request']} | {'CUDA' if r['shared_memory'] else '-'} | {r['img_per_s']:,.0f} | "
                     f"{r['p50_ms']} | {r['p99_ms']} | {r['client_cpu_percent']} | "
                     f"{'-' if r['avg_batch'] is None else round(r['avg_batch'], 1)} |")
    lines += ["", "Targets for custom (" + ", ".join(f"{k} >= {v}" for k, v in TARGETS.items()) + "):", "",
              "| processes/GPU | MPS | " + " | ".join(TARGETS) + " |", "|---|---|" + "---|" * len(TARGETS)]
    for check in results["targets"]:
        cells = [f"{check[key]}{'' if check['met'][key] else ' (missed)'}" for key in TARGETS]
        mps = "on" if check["mps"] else "off"
        lines.append(f"| {check['processes_per_gpu']} | {mps} | " + " | ".join(cells) + " |")
    lines += ["", "Launcher start to ready: " + ", ".join(f"{k}: {v} s" for k, v in results["ready_s"].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/front_door.json"))
    parser.add_argument("--server-cores", required=True)
    parser.add_argument("--generator-cores", required=True)
    parser.add_argument("--gpu", default="0", help="the GPU of the servers ('': no --gpus, as on a host without one)")
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--mps", default="off", help="off, on, or off,on")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--generator-processes", type=int, default=12)
    parser.add_argument("--series", default=",".join(f"{i}:{m}:{c}" for i, m, c in SERIES),
                        help="images:shared-memory:in-flight of each step, comma-separated")
    args = parser.parse_args(argv)
    server_cores, generator_cores = cpu_list(args.server_cores), cpu_list(args.generator_cores)
    series = [(int(images), memory, int(in_flight)) for images, memory, in_flight in
              (item.split(":") for item in args.series.split(","))]
    os.sched_setaffinity(0, generator_cores)    # this process and its load processes
    work = Path(tempfile.mkdtemp(prefix="front_door_"))
    repository = build_repository(work / "model_repository", entries=(MODEL_CUSTOM, MODEL_CUDNN), zero=True)
    results = {"device": describe_device(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "git_commit": git_commit(), "gpu": args.gpu,
        "server_cores": cpu_text(server_cores), "generator_cores": cpu_text(generator_cores),
        "command": "python -m fusedresnet.loadtest.front_door " + " ".join(argv or sys.argv[1:]),
        "layouts": [], "targets": [], "ready_s": {}, "work": str(work)}

    def write():
        results["targets"] = targets(results["layouts"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=lambda value: value.item()) + "\n")
        args.out.with_suffix(".md").write_text(markdown(results))

    status = 0
    for mps in [m == "on" for m in args.mps.split(",")]:
        for processes in (int(p) for p in args.processes.split(",")):
            layout = Layout(processes, mps, args.gpu, repository, server_cores, work)
            results["ready_s"][f"n{processes}{'-mps' if mps else ''}"] = round(layout.ready_s, 1)
            print(f"== {processes} process(es) per GPU, MPS {'on' if mps else 'off'}: ready in {layout.ready_s:.1f} s",
                  flush=True)
            try:
                for model in MODELS_MEASURED:
                    for images, shared_memory, concurrency in series:
                        record = run_step(model, f"127.0.0.1:{layout.grpc_port}", layout.metrics_url, concurrency,
                                          images, args.generator_processes, args.warmup_s, args.seconds,
                                          shared_memory=shared_memory, admin_token=layout.token,
                                          server_processes=processes)
                        row = step_row(layout, model, images, shared_memory, record)
                        status |= bool(row["failures"])
                        results["layouts"].append(row)
                        print(f"  {model} x{images} shm={shared_memory}: {row['img_per_s']:,.0f} img/s, p50 "
                              f"{row['p50_ms']} ms, p99 {row['p99_ms']} ms, generator {row['client_cpu_percent']}%, "
                              f"failures {row['failures']} {row['problems'][:2]}", flush=True)
                        write()
            finally:
                layout.stop()
    write()
    print(markdown(results))
    return 3 if status else 0


if __name__ == "__main__":
    sys.exit(main())
