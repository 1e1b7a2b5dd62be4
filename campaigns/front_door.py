"""Several server processes behind one port, measured: the layouts of the launcher's --processes-per-gpu.

    python -m fusedresnet.campaigns.front_door --out results/front_door.json \\
        --server-cores 0-15 --generator-cores 16-31 --processes 1,2,4 --mps off,on

For each layout (processes per GPU x CUDA MPS off/on) one launcher serves on GPU 0 (`--gpu`), pinned to
`--server-cores`, with custom, cuDNN and the zero-answer model (loadtest/zero_model: the server's own
ceiling, no GPU work); the project's load generator (loadtest/grpc_flood.py) runs in this process's
children, pinned to `--generator-cores` (a stand-in for remote clients). Series: gRPC at 1 and at 32
images per request, and CUDA shared memory at 32 (every region registered with every process behind
the port). Plain gRPC is driven by h2load (loadtest/h2load_step.py, C: grpc_flood's Python processes
saturate before several server processes do), CUDA shared memory by grpc_flood. Every step keeps img/s,
client-side p50/p99, the generator's CPU and the server's (launcher, tritonservers and stubs), Triton's own
counts and queue/compute times summed over the processes' metrics ports; custom's first series runs again
from twice the generator (the generator check). After its steps, each layout's last process is killed and
the time until it is ready again is recorded with where it went (its models' load times).

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
import shlex
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fusedresnet.backend.launcher import DEFAULT_READY_TIMEOUT_S, LaunchedServer, parse_settings
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.serve import READY_AGAIN_LINE, metrics_list_models
from fusedresnet.backend.spec import MODEL_CUDNN, MODEL_CUSTOM, STARTUP_PHASES_TEXT, ZERO_MODEL
from fusedresnet.loadtest.grpc_flood import run_step
from fusedresnet.loadtest.h2load_step import run_h2load_step
from fusedresnet.loadtest.measurements import cpu_list, cpu_text, tree_thread_cpu_seconds
from fusedresnet.loadtest.perf_analyzer import build_repository
from fusedresnet.loadtest.sweep import describe_device

MODELS_MEASURED = (MODEL_CUSTOM, MODEL_CUDNN, ZERO_MODEL)
# (load generator, images per request, shared memory, requests in flight): the series of every layout. Plain
# gRPC from h2load (C: grpc_flood's Python processes saturate first), CUDA shared memory from grpc_flood.
SERIES = (("h2load", 1, "none", 512), ("h2load", 32, "none", 64), ("grpc_flood", 32, "cuda", 64))
H2LOAD_CONNECTIONS, H2LOAD_THREADS = 64, 8
TARGETS = {"grpc32_vs_cudnn": 2.0, "grpc32_vs_n1": 1.8, "grpc1_vs_n1": 1.8, "cuda_shm_img_per_s": 95_000}
RECOVERY_TARGET_S = 5.0
STEP_TABLE_HEADER = ("processes/GPU", "MPS", "model", "images/request", "shared memory", "generator", "img/s", "p50 ms",
                     "p99 ms", "generator CPU %", "server CPU %", "mean batch")
STEP_TABLE_ALIGN = "llllllrrrrrr"
ABANDONMENT_FIELDS = ("duration_s", "valid_sent", "valid_failed", "capacity_zero_s", "crashes", "restarts",
                      "max_recovery_s")


def abandonment_markdown(abandonment: dict) -> str:
    """The soak's summary (campaigns/abuse_soak.py's `front_door` block) as the report shows it."""
    return (f"{abandonment['device']}, {abandonment['date']}, code {abandonment['git_commit']}; "
            f"`{abandonment['command']}`; server on cores {abandonment['server_cores']}, valid clients and the "
            f"abandoning ones on {abandonment['load_cores']}.\n\n"
            + "\n".join(table(ABANDONMENT_FIELDS, [[abandonment[key] for key in ABANDONMENT_FIELDS]],
                              "r" * len(ABANDONMENT_FIELDS))) + "\n\n"
            + abandonment.get("pattern", ""))


class Layout(LaunchedServer):
    """One launcher, ready: `processes` per GPU on `gpu`, with or without MPS, on `server_cores`."""

    def __init__(self, processes: int, mps: bool, gpu: str, repository: Path, server_cores: list[int], work: Path,
                 launcher_args: list[str] = (), env: dict | None = None):
        # the layout first: launcher_args may override it
        settings = parse_settings(["--model-repository", str(repository), *(["--gpus", gpu] if gpu else []),
                                   "--processes-per-gpu", str(processes), "--mps", "on" if mps else "off",
                                   *launcher_args]).replace(admin_token=secrets.token_urlsafe(24))
        super().__init__(settings, work / f"launcher-n{processes}{'-mps' if mps else ''}.out", cores=server_cores,
                         env=env)
        self.processes, self.mps = processes, mps
        self.start(DEFAULT_READY_TIMEOUT_S)

    def crash_lines(self) -> list[str]:
        return [line for line in self.output().splitlines()
                if line.startswith("fusedresnet: tritonserver") and "restarting" in line]

    def wait_all_ready(self):
        """Until every process lists its models again (the launcher restarts a crashed one)."""
        deadline = time.monotonic() + DEFAULT_READY_TIMEOUT_S
        while not all(metrics_list_models(url, list(MODELS_MEASURED)) for url in self.metrics_url.split(",")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"a process not ready again:\n{self.output()[-3000:]}")
            time.sleep(0.5)


def rounded(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


def step_row(layout: Layout, model: str, images: int, shared_memory: str, record: dict) -> dict:
    """One step's figures as the report keeps them."""
    return {"processes_per_gpu": layout.processes, "mps": layout.mps, "model": model,
            "images_per_request": images, "shared_memory": shared_memory != "none",
            "protocol": record.get("protocol", "grpc"),
            "img_per_s": round(record["img_per_s"], 1), "p50_ms": rounded(record["p50_ms"]),
            "p99_ms": rounded(record["p99_ms"]),
            "concurrency": record["concurrency"], "failures": record["failures"], "sent": record["sent"],
            "client_cpu_percent": record.get("client_cpu_percent"),
            "client_cpu_saturated": bool(record.get("client_cpu_saturated")),
            "load_generator": record.get("load_generator"), "server_cpu_percent": record.get("server_cpu_percent"),
            "avg_batch": record.get("avg_batch"), "cancelled_at_end": record.get("triton_cancelled"),
            "queue_us": record.get("queue_us"),
            "compute_infer_us": record.get("compute_infer_us"),
            "gpu_util": rounded(record.get("gpu_utilization"), 3),
            "server_cpu_percent_by_thread": record.get("server_cpu_percent_by_thread", {}),
            "problems": record.get("problems", [])}


def run_series_step(layout: Layout, model: str, generator: str, images: int, shared_memory: str, in_flight: int,
                    args, scale: int = 1) -> dict:
    """One step of a series (`scale` x the generator's connections and threads: the generator check), with the
    server's CPU (launcher, tritonservers and stubs, in % of one core) over it."""
    url = layout.grpc_url
    threads_before = tree_thread_cpu_seconds(psutil.Process(layout.process.pid))
    cpu_before, started = layout.cpu_seconds()[0], time.monotonic()
    if generator == "h2load":
        connections = min(H2LOAD_CONNECTIONS, in_flight) * scale
        record = run_h2load_step(model, url, layout.metrics_url, images, connections,
                                 max(1, in_flight // min(H2LOAD_CONNECTIONS, in_flight)), H2LOAD_THREADS * scale,
                                 args.seconds, args.warmup_s)
    elif generator == "h2load_http":     # HTTP/1.1: a connection per call in flight
        record = run_h2load_step(model, layout.http_url, layout.metrics_url, images, in_flight * scale, 1,
                                 H2LOAD_THREADS * scale, args.seconds, args.warmup_s, protocol="http")
    else:
        record = run_step(model, url, layout.metrics_url, in_flight * scale, images, args.generator_processes * scale,
                          args.warmup_s, args.seconds, shared_memory=shared_memory, admin_token=layout.admin_token,
                          server_processes=layout.processes)
    window_s = time.monotonic() - started
    record["server_cpu_percent"] = round(100 * (layout.cpu_seconds()[0] - cpu_before) / window_s, 1)
    threads_after = tree_thread_cpu_seconds(psutil.Process(layout.process.pid))
    # where the server's CPU went, by thread pool, in % of one core over the same window
    record["server_cpu_percent_by_thread"] = dict(sorted(
        ((group, round(100 * (seconds - threads_before.get(group, 0.0)) / window_s, 1))
         for group, seconds in threads_after.items() if seconds - threads_before.get(group, 0.0) > 0.005 * window_s),
        key=lambda item: -item[1]))
    return record


def recovery(layout: Layout) -> dict:
    """SIGKILL the layout's last process, as a crash: seconds until the launcher has it ready again (its own
    line), and where the restart's time went (the launcher's start-to-ready and Triton's model-load lines)."""
    launcher = psutil.Process(layout.process.pid)
    servers = [p for p in launcher.children() if p.name() == "tritonserver"]
    victim = max(servers, key=lambda p: p.pid)
    seen = layout.output().count(READY_AGAIN_LINE)
    killed = time.monotonic()
    victim.kill()
    while layout.output().count(READY_AGAIN_LINE) == seen:
        if time.monotonic() - killed > DEFAULT_READY_TIMEOUT_S:
            return {"killed_pid": victim.pid, "ready_again_s": None}
        time.sleep(0.05)
    ready_again_s = time.monotonic() - killed
    line = [row for row in layout.output().splitlines() if READY_AGAIN_LINE in row][-1]
    return {"killed_pid": victim.pid, "ready_again_s": round(ready_again_s, 2), "launcher_line": line,
            "model_loads": model_load_times(layout.log_file)}


def model_load_times(log_file: Path) -> dict:
    """Seconds from the newest tritonserver's first log line to each model's 'successfully loaded' and to its
    endpoints' start, from Triton's own timestamps (I1128 02:00:17.123456 <pid> ...)."""
    stamp = re.compile(r"^(?:\[[^]]+\] )?[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) +(\d+) ")
    rows = [(m, line) for line in log_file.read_text(errors="replace").splitlines() if (m := stamp.match(line))]
    if not rows:
        return {}
    newest = max(int(m.group(4)) for m, _ in rows)
    times = [(int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)), line)
             for m, line in rows if int(m.group(4)) == newest]
    first = times[0][0]
    events = {}
    phases: dict[str, dict[str, float]] = {}   # model -> phase -> its slowest instance's seconds
    for seconds, line in times:
        instance = re.search(r'"(\w+): engine .*\(' + STARTUP_PHASES_TEXT + r": ([^)]*)\)", line)
        if instance:
            mine = phases.setdefault(instance.group(1), {})
            for name, value in re.findall(r"([A-Za-z][\w -]*?) ([\d.]+) s", instance.group(2)):
                mine[name.strip()] = max(mine.get(name.strip(), 0.0), float(value))
        loaded = re.search(r"successfully loaded '([^']+)'", line)
        if loaded:
            events[loaded.group(1)] = round(seconds - first, 2)
        elif "Started GRPCInferenceService" in line:
            events["grpc_started"] = round(seconds - first, 2)
        elif "Started Metrics Service" in line:
            events["metrics_started"] = round(seconds - first, 2)
    if phases:
        events["start_phases"] = phases
    return events


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


def on_off(flag) -> str:
    return "on" if flag else "off"


def step_table(steps: list[dict]) -> list[str]:
    """The steps' table: one row per step (a layout's, or the generator check's)."""
    def cells(r):
        generator = f"{r['load_generator']}{' x2' if r.get('generator_scale', 1) > 1 else ''}"
        return [r["processes_per_gpu"], on_off(r["mps"]), r["model"], r["images_per_request"],
                "CUDA" if r["shared_memory"] else "-", generator, f"{r['img_per_s']:,.0f}", r["p50_ms"], r["p99_ms"],
                r["client_cpu_percent"], r["server_cpu_percent"],
                "-" if r["avg_batch"] is None else round(r["avg_batch"], 1)]
    return table(STEP_TABLE_HEADER, map(cells, steps), STEP_TABLE_ALIGN)


def markdown(results: dict) -> str:
    lines = [f"# Several server processes behind one port ({results['date']})", "",
             f"{results['device']}; code {results['git_commit']}; server on cores {results['server_cores']} and "
             f"GPU {results['gpu']}, load generators (h2load for plain gRPC, grpc_flood for CUDA shared memory) on "
             f"cores {results['generator_cores']}, a stand-in for remote clients.",
             "Command: `" + results["command"] + "`.", "",
             *([f"Launcher options of every layout: `{results['launcher_args']}`.", ""]
               if results.get("launcher_args") else []),
             *step_table(results["layouts"])]
    lines += ["", "The generator check: custom's first series again from twice the generator (connections and "
              "threads); no more img/s than the row above means the generator was not the limit.", "",
              *step_table(results["generator_checks"])]
    lines += ["", "Targets for custom (" + ", ".join(f"{k} >= {v}" for k, v in TARGETS.items()) + "):", "",
              *table(["processes/GPU", "MPS", *TARGETS],
                     ([check["processes_per_gpu"], on_off(check["mps"]),
                       *(f"{check[key]}{'' if check['met'][key] else ' (missed)'}" for key in TARGETS)]
                      for check in results["targets"]))]
    lines += ["", "Launcher start to ready: " + ", ".join(f"{k}: {v} s" for k, v in results["ready_s"].items()), ""]
    lines += ["Recovery: the last process of each layout killed (SIGKILL) after its steps; seconds until the launcher "
              "had it ready again, and from the new process's first log line to each model loaded:", "",
              *table(["processes/GPU", "MPS", "ready again s", "models loaded (s from the process's first log line)"],
                     ([r["processes_per_gpu"], on_off(r["mps"]), r["ready_again_s"],
                       ", ".join(f"{k} {v}" for k, v in r.get("model_loads", {}).items() if k != "start_phases")]
                      for r in results["recoveries"]), "llr")]
    lines += ["", f"Where each restarted model's start went (its slowest instance, s; target: ready again within "
              f"{RECOVERY_TARGET_S:.0f} s of the crash):", ""]
    for r in results["recoveries"]:
        for model, phases in r.get("model_loads", {}).get("start_phases", {}).items():
            lines.append(f"- {r['processes_per_gpu']}/GPU, MPS {'on' if r['mps'] else 'off'}, {model}: "
                         + ", ".join(f"{name} {value:.2f}" for name, value in phases.items()))
    abandonment = results.get("abandonment")
    if abandonment:
        lines += ["", "## Abandonment soak", "", abandonment_markdown(abandonment)]
    lines.append("")
    return "\n".join(lines)


def write_report(results: dict, args):
    """`--out` (.json and .md), with the abandonment soak's summary when `--abandonment` names a report."""
    if args.abandonment and args.abandonment.is_file():
        results["abandonment"] = json.loads(args.abandonment.read_text()).get("front_door")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_and_markdown(args.out, results, markdown(results), default=lambda value: value.item())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/front_door.json"))
    parser.add_argument("--server-cores", required=True)
    parser.add_argument("--generator-cores", required=True)
    parser.add_argument("--gpu", default="0", help="the GPU of the servers ('': no --gpus, as on a host without one)")
    parser.add_argument("--processes", default="1,2,4",
                        help="the layouts' processes per GPU ('': only add --abandonment to the report in --out)")
    parser.add_argument("--mps", default="off", help="off, on, or off,on")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--generator-processes", type=int, default=12)
    parser.add_argument("--models", default=",".join(MODELS_MEASURED), help="the models driven, comma-separated")
    parser.add_argument("--launcher-args", default="", help="more launcher options, e.g. '--instances gpu'")
    parser.add_argument("--abandonment", type=Path,
                        help="an abandonment soak's report (campaigns/abuse_soak.py --out, .json) to include")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the launcher's environment (and its servers'), e.g. LD_PRELOAD=<allocator>")
    parser.add_argument("--no-generator-check", action="store_true",
                        help="skip the step that drives custom's first series from twice the generator")
    parser.add_argument("--no-recovery", action="store_true", help="skip killing each layout's last process")
    parser.add_argument("--series", default=",".join(":".join(map(str, item)) for item in SERIES),
                        help="generator:images:shared-memory:in-flight of each step, comma-separated (generators: "
                             "h2load, gRPC; h2load_http, HTTP/1.1, a connection per call in flight; grpc_flood)")
    args = parser.parse_args(argv)
    if not args.processes:       # no layouts: add the soak's summary to the report already in --out
        results = json.loads(args.out.read_text())
        write_report(results, args)
        return 0
    server_cores, generator_cores = cpu_list(args.server_cores), cpu_list(args.generator_cores)
    series = [(generator, int(images), memory, int(in_flight)) for generator, images, memory, in_flight in
              (item.split(":") for item in args.series.split(","))]
    os.sched_setaffinity(0, generator_cores)    # this process and its load processes
    work = Path(tempfile.mkdtemp(prefix="front_door_"))
    repository = build_repository(work / "model_repository", entries=(MODEL_CUSTOM, MODEL_CUDNN), zero=True)
    results = {"device": describe_device(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "git_commit": git_commit(), "gpu": args.gpu,
        "server_cores": cpu_text(server_cores), "generator_cores": cpu_text(generator_cores),
        "command": "python -m fusedresnet.campaigns.front_door " + " ".join(argv or sys.argv[1:]),
        "launcher_args": args.launcher_args, "server_env": args.server_env, "layouts": [], "generator_checks": [],
        "recoveries": [],
        "crashed_steps": [], "targets": [], "ready_s": {}, "work": str(work)}

    def write():
        results["targets"] = targets(results["layouts"])
        write_report(results, args)

    status = 0
    for mps in [m == "on" for m in args.mps.split(",")]:
        for processes in (int(p) for p in args.processes.split(",")):
            layout = Layout(processes, mps, args.gpu, repository, server_cores, work, shlex.split(args.launcher_args),
                            dict(item.split("=", 1) for item in args.server_env))
            results["ready_s"][f"n{processes}{'-mps' if mps else ''}"] = round(layout.ready_s, 1)
            print(f"== {processes} process(es) per GPU, MPS {'on' if mps else 'off'}: ready in {layout.ready_s:.1f} s",
                  flush=True)
            try:
                steps = [(model, *item, 1) for model in args.models.split(",") for item in series]
                # the generator check: the first series of custom again from twice the generator
                if not args.no_generator_check:
                    steps.insert(1, (MODEL_CUSTOM, *series[0], 2))
                for model, generator, images, shared_memory, concurrency, scale in steps:
                    try:
                        record = run_series_step(layout, model, generator, images, shared_memory, concurrency, args,
                                                 scale)
                    except OSError as error:   # a metrics port gone: a process crashed during the step
                        crashes = layout.crash_lines()
                        print(f"  {model} x{images} {generator}: not measured ({error}); crashes: {crashes}",
                              flush=True)
                        results["crashed_steps"].append({"processes_per_gpu": processes, "mps": mps, "model": model,
                                                         "images_per_request": images, "generator": generator,
                                                         "error": str(error), "crashes": crashes})
                        layout.wait_all_ready()
                        continue
                    row = step_row(layout, model, images, shared_memory, record)
                    row["generator_scale"] = scale
                    status |= bool(row["failures"])
                    (results["generator_checks"] if scale > 1 else results["layouts"]).append(row)
                    print(f"  {model} x{images} shm={shared_memory} {generator}{' x2' if scale > 1 else ''}: "
                          f"{row['img_per_s']:,.0f} img/s, p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
                          f"generator {row['client_cpu_percent']}%, server {row['server_cpu_percent']}%, "
                          f"failures {row['failures']} {row['problems'][:2]}", flush=True)
                    write()
                results["crashes"] = results.get("crashes", 0) + len(layout.crash_lines())
                if not args.no_recovery:
                    results["recoveries"].append({"processes_per_gpu": processes, "mps": mps, **recovery(layout)})
                    print(f"  recovery: {results['recoveries'][-1]}", flush=True)
                write()
            finally:
                layout.stop()
    write()
    print(markdown(results))
    return 3 if status else 0


if __name__ == "__main__":
    sys.exit(main())
