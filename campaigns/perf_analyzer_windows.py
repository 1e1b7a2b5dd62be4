"""Why perf_analyzer's default measurement does not settle for custom at 64 single-image calls, and what does.

    python -m fusedresnet.campaigns.perf_analyzer_windows --out results/perf_analyzer_windows.json \\
        --server-cores 0-15 --generator-cores 16-31 --processes 2

perf_analyzer's default measurement repeats 5-s windows until three in a row agree within 10% (at most 10
windows). Against custom at 64 one-image calls in flight it gave no result within 100 s, twice, where cuDNN
did (issue 37). This run starts the launcher with `--processes` per GPU on GPU `--gpu`, pinned to
`--server-cores`, and runs perf_analyzer from `--generator-cores`, for each of `--models`:

1. with its defaults (`-v`: each window's throughput; cut at `--timeout-s`);
2. with the settings loadtest/perf_analyzer.py uses (a fixed request count after a warm-up);
3. for `--relaxed-models`, with `--stability-percentage` `--relaxed-stability` and longer windows
   (`--relaxed-window-ms`),

while a thread reads Triton's metrics every second from every process: requests and images per second,
executions and mean batch per second, per process. A window's throughput that swings with the per-second
mean batch (the dynamic batcher forming batches of 1 to 128 from 64 calls in flight) or with the share each
process gets, and not with the generator, is the cause. Writes `--out` (.json, and .md beside it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fusedresnet.backend.launcher import LaunchedServer, ServerSettings, metrics_url_of
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV, MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.loadtest import triton_metrics
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.perf_analyzer import binary_path, build_repository, command, parse_csv, token_header
from fusedresnet.loadtest.sweep import describe_device

CONCURRENCY, IMAGES_PER_REQUEST = 64, 1
PASS_LINE = re.compile(r"Pass \[(\d+)\] throughput: ([\d.]+) infer/sec")


class PerSecond(threading.Thread):
    """Triton's counts per second, per process (metrics ports), summed over the models."""

    def __init__(self, ports: list[int], models: list[str]):
        super().__init__(daemon=True)
        self.ports, self.models = ports, models
        self.rows: list[dict] = []
        self.stop = threading.Event()

    def run(self):
        previous = None
        while not self.stop.wait(1.0 if previous else 0.2):
            try:
                now = [triton_metrics.scrape(metrics_url_of(port), timeout_s=2.0) for port in self.ports]
            except OSError:
                previous = None
                continue
            if previous is not None:
                row = {"t": round(now[0].taken_at, 2), "per_process_req_per_s": []}
                executions = inferences = 0
                for before, after in zip(previous, now, strict=True):
                    seconds = max(after.taken_at - before.taken_at, 1e-9)
                    deltas = [triton_metrics.model_delta(before, after, model) for model in self.models]
                    row["per_process_req_per_s"].append(round(sum(d["triton_success"] for d in deltas) / seconds))
                    executions += sum(d["triton_executions"] for d in deltas)
                    inferences += sum(d["triton_inferences"] for d in deltas)
                row["req_per_s"] = sum(row["per_process_req_per_s"])
                row["executions_per_s"] = executions
                row["mean_batch"] = round(inferences / executions, 1) if executions else None
                self.rows.append(row)
            previous = now


def run_perf_analyzer(binary: Path, server: LaunchedServer, model: str, mode: str, extra: list[str],
                      timeout_s: float, work: Path, token: str) -> dict:
    """One perf_analyzer run at CONCURRENCY x IMAGES_PER_REQUEST: its windows, result, and Triton per second."""
    csv_path = work / f"{model}-{mode}.csv"
    if mode == "fixed count":
        args = command(binary, model, "grpc", server.grpc_url, IMAGES_PER_REQUEST, CONCURRENCY, "none", token,
                       csv_path)
    else:
        # line-buffered, so that a run cut at the timeout still shows its windows
        args = [*(["stdbuf", "-oL"] if shutil.which("stdbuf") else []), str(binary), "-m", model, "-i", "grpc",
                "-u", server.grpc_url, "-b", str(IMAGES_PER_REQUEST),
                "--concurrency-range", f"{CONCURRENCY}:{CONCURRENCY}", "--async", "-v",
                "-H", token_header("grpc", token), "-f", str(csv_path), *extra]
    sampler = PerSecond(server.metrics_ports, [model])
    sampler.start()
    started = time.monotonic()
    try:
        completed = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
        output, code = completed.stdout + completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) \
            else (expired.stdout or "")
        code = None
    seconds = time.monotonic() - started
    sampler.stop.set()
    sampler.join(5)
    passes = [float(value) for _, value in PASS_LINE.findall(output)]
    rows = parse_csv(csv_path.read_text()) if csv_path.is_file() else []
    per_second = [row["req_per_s"] for row in sampler.rows if row["req_per_s"]]
    batches = [row["mean_batch"] for row in sampler.rows if row["mean_batch"]]
    shares = [row["per_process_req_per_s"] for row in sampler.rows if row["req_per_s"]]
    return {
        "model": model, "mode": mode, "settings": " ".join(extra) or "(defaults)",
        "command": " ".join(args).replace(token, f"${ADMIN_TOKEN_ENV}"),
        "settled": bool(rows), "seconds": round(seconds, 1), "exit_code": code,
        "img_per_s": rows[0]["img_per_s"] if rows else None, "p50_ms": rows[0]["p50_ms"] if rows else None,
        "p99_ms": rows[0]["p99_ms"] if rows else None,
        "windows_img_per_s": passes,
        "windows_spread_percent": round(100 * (max(passes) - min(passes)) / statistics.mean(passes), 1)
        if len(passes) > 1 else None,
        "per_second_req": per_second,
        "per_second_cv_percent": round(100 * statistics.pstdev(per_second) / statistics.mean(per_second), 1)
        if len(per_second) > 1 else None,
        "per_second_mean_batch": batches,
        "per_process_share": [round(sum(s[i] for s in shares) / max(sum(map(sum, shares)), 1), 3)
                              for i in range(len(server.metrics_ports))] if shares else None,
        "output_tail": "\n".join(output.replace(token, "***").splitlines()[-12:]),
    }


def markdown(results: dict) -> str:
    lines = [f"# perf_analyzer's windows at {CONCURRENCY} single-image calls ({results['date']})", "",
             f"{results['device']}; code {results['git_commit']}; {results['processes']} server process(es) per GPU "
             f"on GPU {results['gpu']} and cores {results['server_cores']}; perf_analyzer on cores "
             f"{results['generator_cores']}.", f"Command: `{results['command']}`.", ""]

    def cells(r):
        batches = r["per_second_mean_batch"]
        return [r["model"], f"{r['mode']}: `{r['settings']}`", "yes" if r["settled"] else "NO", r["seconds"],
                r["img_per_s"] or "-", r["p50_ms"] or "-", r["p99_ms"] or "-",
                ", ".join(f"{v:,.0f}" for v in r["windows_img_per_s"]) or "-", r["windows_spread_percent"] or "-",
                r["per_second_cv_percent"] or "-", f"{min(batches)}-{max(batches)}" if batches else "-",
                r["per_process_share"] or "-"]
    lines += table(["model", "measurement", "settled", "seconds", "img/s", "p50 ms", "p99 ms", "windows (img/s)",
                    "window spread %", "per-second CV %", "per-second mean batch (min-max)", "share per process"],
                   map(cells, results["runs"]), "lllrrrrlrr")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/perf_analyzer_windows.json"))
    parser.add_argument("--server-cores", required=True)
    parser.add_argument("--generator-cores", required=True)
    parser.add_argument("--gpu", default="0")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--models", default=f"{MODEL_CUSTOM},{MODEL_CUDNN}")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a measurement is cut after this")
    parser.add_argument("--relaxed-window-ms", type=int, default=8000)
    parser.add_argument("--relaxed-stability", type=int, default=25)
    parser.add_argument("--relaxed-models", default=MODEL_CUSTOM, help="the models also measured with relaxed windows")
    parser.add_argument("--perf-analyzer", help="the binary (default: the perf-analyzer wheel's)")
    args = parser.parse_args(argv)
    server_cores, generator_cores = cpu_list(args.server_cores), cpu_list(args.generator_cores)
    os.sched_setaffinity(0, generator_cores)
    binary = binary_path(args.perf_analyzer)
    work = Path(tempfile.mkdtemp(prefix="perf_analyzer_windows_"))
    token = secrets.token_urlsafe(24)
    repository = build_repository(work / "model_repository", entries=(MODEL_CUSTOM, MODEL_CUDNN), zero=True)
    results = {"device": describe_device(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "git_commit": git_commit(), "gpu": args.gpu, "processes": args.processes,
        "server_cores": cpu_text(server_cores), "generator_cores": cpu_text(generator_cores),
        "command": "python -m fusedresnet.campaigns.perf_analyzer_windows " + " ".join(argv or sys.argv[1:]),
        "runs": []}
    settings = ServerSettings(model_repository=repository, admin_token=token, processes_per_gpu=args.processes,
                              gpus=args.gpu or None)
    server = LaunchedServer(settings, work / "launcher.out", cores=server_cores)
    server.start()
    relaxed = ["--measurement-interval", str(args.relaxed_window_ms),
               "--stability-percentage", str(args.relaxed_stability)]
    try:
        for model in args.models.split(","):
            modes = [("defaults", []), ("fixed count", [])]
            modes += [("relaxed windows", relaxed)] if model in args.relaxed_models.split(",") else []
            for mode, extra in modes:
                run = run_perf_analyzer(binary, server, model, mode, extra, args.timeout_s, work, token)
                results["runs"].append(run)
                print(f"{model} {mode}: settled {run['settled']} in {run['seconds']} s, windows "
                      f"{run['windows_img_per_s']}, per-second CV {run['per_second_cv_percent']}%, batches "
                      f"{run['per_second_mean_batch'][:12]}, shares {run['per_process_share']}", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                write_json_and_markdown(args.out, results, markdown(results))
    finally:
        server.stop()
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
