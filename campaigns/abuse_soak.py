"""A soak of valid traffic mixed with abusive clients, against the launcher as users run it.

    python -m fusedresnet.campaigns.abuse_soak --seconds 600 --valid-processes 8 --valid-in-flight 8 \\
        --images-per-request 32 --min-images-per-s 19350 --out build/abuse_soak

The launcher (`python -m fusedresnet.backend.serve`, its restart on) serves on free ports, pinned to the
cores not in `--load-cores` (default: the last quarter of this process's cores, as loadtest/perf_analyzer.py
gives its load generators); the valid processes and the abuse loop run on `--load-cores`.

Valid load: `--valid-processes` processes of `client_abuse valid`, each keeping `--valid-in-flight` calls of
`--images-per-request` images in flight for the whole soak, as a real client of the project sends them: on
the clients' gRPC channel (its retry policy) and retried on UNAVAILABLE with backoff up to `--deadline-s`
after the request was first sent (a restarting server refuses connections for longer than gRPC's own
retries last). A valid request is LOST only when it never got an answer; every answer is compared with that
process's first answer to the same request (relative L2 within the project's tolerance).

Abuse, in a loop until the end (`--abuse` picks the behaviours): a round of abandoned calls (256 in flight on
one connection, closed after 1 s), a burst of 500 calls with a 5 ms deadline, an RST_STREAM storm of 1,000
calls, then `--pause`. `--abort-server-at S` also sends SIGABRT to tritonserver S seconds in, once it serves
(the crash the launcher must recover from).

Timeline, every `--sample-every-s`: the valid img/s of the interval (answers counted by the valid processes),
Triton's own metrics for the model over the interval (requests succeeded/failed, images, queue and
compute_infer time per request), CPU% (of one core) of tritonserver + its stubs, of the valid processes and
of this process (the abuse loop), the server's RSS (tritonserver + stubs) and the GPU's memory (nvidia-smi),
and the server's pid (a new pid is a restart by the launcher).

Memory is judged per server process: on its samples from `--warm-up-s` after it first answered (its loading
and warm-up are not growth), growth = last - first of that span, at most max(128 MiB, 10%) of RSS and
256 MiB of GPU memory.

Passes (exit 0) when: no valid request was lost, no valid answer differed, every restart was followed by a
ready server (and the server is ready at the end), the valid load over the whole soak reached
--min-images-per-s, and every server's memory stayed flat (at least one server judged). Writes <out>.json/.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.serve import grpc_ready
from fusedresnet.backend.spec import MODEL_CUSTOM
from fusedresnet.backend.stub_processes import python_stubs, tritonserver_of
from fusedresnet.campaigns import client_abuse
from fusedresnet.campaigns.launched_server import LaunchedServer
from fusedresnet.loadtest import triton_metrics
from fusedresnet.loadtest.measurements import cpu_list, cpu_text, gpu_memory_used_mib
from fusedresnet.loadtest.perf_analyzer import default_load_cores
from fusedresnet.loadtest.sweep import describe_device

RSS_GROWTH_BOUND = (128 << 20, 0.10)
GPU_GROWTH_BOUND_MIB = 256
MIB = 1 << 20
ABUSE = {   # behaviour -> one cycle's statuses
    "abandon": lambda url, requests: client_abuse.abandon(url, requests, 1, 256, 1.0)[0].summary()["statuses"],
    "deadlines": lambda url, requests: client_abuse.deadlines(url, requests, 500, 64, 0.005).summary()["statuses"],
    "rst-storm": lambda url, requests: client_abuse.rst_storm(url, requests, 1000).summary()["statuses"],
}
SETTLE_S = 120.0          # after the soak, at most this long for a restart under way to end with a ready server


# The valid processes' numerical thread pools at one thread each. With the default (a BLAS thread per core of
# the host) 8 processes on 8 load cores each spun ~100% of a core for 10 requests/s (H100 host, 2026-11-26:
# valid clients at 790% of 8 cores, 2.4k img/s, the server's cores at 50-85% of one).
ONE_THREAD_PER_POOL = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def started_with_output(command: list[str], stdout: Path, stderr: Path | None = None, **popen) -> subprocess.Popen:
    """`command` started with its output in `stdout` (and `stderr`, else the same file); the files are the child's
    alone (this process closes its copies)."""
    with open(stdout, "wb") as out, open(stderr or os.devnull, "wb") as err:
        return subprocess.Popen(command, stdout=out, stderr=err if stderr else subprocess.STDOUT, **popen)


class CpuMeter:
    """CPU% (of one core) of sets of processes since the previous reading (a process seen first counts from then)."""

    def __init__(self):
        self.known: dict[int, psutil.Process] = {}

    def percent(self, processes: list[psutil.Process]) -> float:
        total = 0.0
        for process in processes:
            try:
                total += self.known.setdefault(process.pid, process).cpu_percent(None)
            except psutil.NoSuchProcess:
                pass
        return round(total, 1)


class Sampler(threading.Thread):
    """Every 0.5 s: which tritonserver serves and whether its gRPC endpoint answers ServerReady (a server hung
    in its abort handler still answers HTTP): the restart windows; every `every_s` a timeline sample."""

    def settled(self) -> bool:
        """Every server seen after the first became ready, and the one now serving answers."""
        return len(self.windows) >= len(self.pids_seen) - 1 and grpc_ready(self.grpc_url)

    def __init__(self, launcher: subprocess.Popen, grpc_url: str, metrics_url: str, model: str,
                 valid: list[subprocess.Popen], every_s: float):
        super().__init__(daemon=True)
        self.launcher, self.grpc_url, self.metrics_url, self.model = launcher, grpc_url, metrics_url, model
        self.valid, self.every_s = valid, every_s
        self.samples: list[dict] = []
        self.windows: list[list[float]] = []         # [last answer of the old server, first of the new one]
        self.pids_seen: list[int] = []
        self.stop = threading.Event()
        self.cpu = CpuMeter()
        self.previous_metrics: tuple[int, triton_metrics.MetricsSnapshot] | None = None

    def run(self):
        answered_at, pid, next_sample = time.time(), None, 0.0
        while not self.stop.is_set():
            try:
                answered_at, pid, next_sample = self.poll(answered_at, pid, next_sample)
            except psutil.Error:        # a process that vanished between two looks: look again
                pass
            self.stop.wait(0.5)

    def poll(self, answered_at: float, pid: int | None, next_sample: float) -> tuple[float, int | None, float]:
        """One look: the serving pid, its readiness (a new ready pid closes a restart window), a sample if due."""
        server = tritonserver_of(self.launcher.pid)
        if server is not None and server.pid not in self.pids_seen:
            self.pids_seen.append(server.pid)
        ready = server is not None and grpc_ready(self.grpc_url)
        if ready and pid is not None and server.pid != pid:
            self.windows.append([answered_at, time.time()])
        if ready:
            answered_at, pid = time.time(), server.pid
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + self.every_s
            self.samples.append(self.sample(server, ready))
        return answered_at, pid, next_sample

    def sample(self, server: psutil.Process | None, ready: bool) -> dict:
        processes = [server, *python_stubs(server.pid).values()] if server is not None else []
        rss = 0
        for process in processes:
            try:
                rss += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        valid = []
        for process in self.valid:
            try:
                valid.append(psutil.Process(process.pid))
            except psutil.NoSuchProcess:
                pass
        sample = {"t": round(time.time(), 2), "pid": server.pid if server else None, "ready": ready,
                  "rss_mib": round(rss / MIB, 1) if server else None, "gpu_mib": gpu_memory_used_mib(),
                  "cpu_server": self.cpu.percent(processes), "cpu_valid": self.cpu.percent(valid),
                  "cpu_abuse": self.cpu.percent([psutil.Process()])}
        sample.update(self.triton_interval(sample["pid"]) if ready else {})
        return sample

    def triton_interval(self, pid: int) -> dict:
        """Triton's counts for the model since the previous sample of the same server."""
        try:
            now = triton_metrics.scrape(self.metrics_url)
        except OSError:
            return {}
        previous, self.previous_metrics = self.previous_metrics, (pid, now)
        if previous is None or previous[0] != pid:
            return {"triton_success_total": int(now.total(triton_metrics.SUCCESS, self.model))}
        delta = triton_metrics.model_delta(previous[1], now, self.model)
        return {"triton_success_total": int(now.total(triton_metrics.SUCCESS, self.model)),
                "triton_success": delta["triton_success"], "triton_failure": delta["triton_failure"],
                "triton_img_per_s": round(delta["server_img_per_s"], 1),
                "queue_ms": None if delta["queue_us"] is None else round(delta["queue_us"] / 1e3, 2),
                "compute_infer_ms": None if delta["compute_infer_us"] is None
                else round(delta["compute_infer_us"] / 1e3, 2)}


def abort_server(launcher: subprocess.Popen, grpc_url: str, started: float, aborted: dict):
    """SIGABRT to the launcher's tritonserver once it serves (the crash it must recover from); `aborted` says
    when and which."""
    server = tritonserver_of(launcher.pid)
    while (server is None or not grpc_ready(grpc_url)) and launcher.poll() is None:
        time.sleep(0.5)
        server = tritonserver_of(launcher.pid)
    if server is not None:
        server.send_signal(signal.SIGABRT)
        aborted.update(t=round(time.time() - started, 1), pid=server.pid)


def add_valid_rates(samples: list[dict], valid_results: list[dict]):
    """Each sample's valid img/s: the images the valid processes had answered in its interval."""
    by_second: dict[int, int] = {}
    for result in valid_results:
        for second, count in result["answered_images_by_second"].items():
            by_second[int(second)] = by_second.get(int(second), 0) + count
    for previous, sample in zip(samples, samples[1:], strict=False):
        seconds = range(int(previous["t"]), int(sample["t"]))
        sample["valid_img_per_s"] = round(sum(by_second.get(s, 0) for s in seconds) / max(len(seconds), 1), 1)


def memory_by_server(samples: list[dict], warm_up_s: float) -> list[dict]:
    """Per tritonserver pid: its span (from `warm_up_s` after its first sample with answers) and growth in it."""
    servers = []
    for pid in dict.fromkeys(s["pid"] for s in samples if s["pid"] is not None):
        mine = [s for s in samples if s["pid"] == pid]
        answering = next((s["t"] for s in mine if s.get("triton_success_total", 0) > 0), None)
        span = [s for s in mine if answering is not None and s["t"] >= answering + warm_up_s]
        entry = {"pid": pid, "samples": len(mine), "first_answered_at": answering,
                 "span_s": [span[0]["t"], span[-1]["t"]] if len(span) >= 2 else None,
                 "rss_first_last_mib": [span[0]["rss_mib"], span[-1]["rss_mib"]] if len(span) >= 2 else None}
        if len(span) >= 2:
            entry["rss_growth_mib"] = round(span[-1]["rss_mib"] - span[0]["rss_mib"], 1)
            entry["rss_bound_mib"] = round(max(RSS_GROWTH_BOUND[0] / MIB, RSS_GROWTH_BOUND[1] * span[0]["rss_mib"]), 1)
            gpu = [s["gpu_mib"] for s in span if s["gpu_mib"] is not None]
            entry["gpu_growth_mib"] = round(gpu[-1] - gpu[0], 1) if len(gpu) >= 2 else None
            entry["gpu_bound_mib"] = GPU_GROWTH_BOUND_MIB
            gpu_flat = entry["gpu_growth_mib"] is None or entry["gpu_growth_mib"] <= GPU_GROWTH_BOUND_MIB
            entry["flat"] = bool(entry["rss_growth_mib"] <= entry["rss_bound_mib"] and gpu_flat)
        servers.append(entry)
    return servers


TIMELINE_COLUMNS = ("valid_img_per_s", "triton_img_per_s", "triton_success", "triton_failure", "queue_ms",
                    "compute_infer_ms", "cpu_server", "cpu_valid", "cpu_abuse", "rss_mib", "gpu_mib", "pid")


def timeline_rows(samples: list[dict], started: float) -> list[list]:
    """The timeline as table rows: every sample, or per minute (means; the last pid) when it is long."""
    if len(samples) <= 40:
        groups = [[s] for s in samples]
    else:
        minutes: dict[int, list[dict]] = {}
        for s in samples:
            minutes.setdefault(int((s["t"] - started) // 60), []).append(s)
        groups = list(minutes.values())
    rows = []
    for group in groups:
        row = [f"{group[0]['t'] - started:.0f}-{group[-1]['t'] - started:.0f}" if len(group) > 1
               else f"{group[0]['t'] - started:.0f}"]
        for column in TIMELINE_COLUMNS:
            values = [s.get(column) for s in group if s.get(column) is not None]
            if column == "pid":
                row.append(values[-1] if values else "-")
            elif column in ("triton_success", "triton_failure"):
                row.append(sum(values) if values else "-")
            else:
                row.append(round(float(np.mean(values)), 1) if values else "-")
        rows.append(row)
    return rows


def write_markdown(report: dict, path: Path):
    lines = [f"# abuse soak: {'PASSED' if report.get('ok') else 'FAILED'}", "",
             f"{report['device']}, {report['date']}, commit {report['commit']}", "", f"`{report['command']}`", "",
             f"Cores: server {report.get('server_cores')}, load (valid processes, abuse loop) "
             f"{report.get('load_cores')}.",
             ""]
    for reason in report.get("failed_because", []):
        lines.append(f"- FAILED: {reason}")
    valid = report.get("valid")
    if valid:
        lines += ["", f"Valid: {valid['answered']} of {valid['sent']} requests answered, {valid['lost']} lost, "
                  f"{valid['mismatched_answers']} wrong; {valid['images_per_s']} img/s over the soak "
                  f"(at least {report['min_images_per_s']} asked).", "",
                  "| process | sent | answered first time | answered after retry | lost | retries "
                  "| longest to answer (s) |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {i} | {p['sent']} | {p['answered_first_time']} | {p['answered_after_retry']} | {p['lost']} | "
                  f"{p['retries']} | {p['longest_to_answer_s']} |" for i, p in enumerate(valid["per_process"])]
        for example in valid["lost_examples"] + valid["retry_examples"]:
            lines.append(f"- {example}")
    if "restarts" in report:
        lines += ["", f"Restarts: {report['restarts']}; servers (pids) seen: {report['servers_seen']}.", "",
                  "| server pid | samples | memory span (s of the soak) | RSS first/last (MiB) | RSS growth / bound | "
                  "GPU growth / bound (MiB) | flat |", "|---|---|---|---|---|---|---|"]
        started = report["started_at"]
        for m in report["memory_by_server"]:
            span = "-" if m["span_s"] is None else f"{m['span_s'][0] - started:.0f}-{m['span_s'][1] - started:.0f}"
            lines.append(f"| {m['pid']} | {m['samples']} | {span} | {m['rss_first_last_mib'] or '-'} | "
                         f"{m.get('rss_growth_mib', '-')} / {m.get('rss_bound_mib', '-')} | "
                         f"{m.get('gpu_growth_mib', '-')} / {m.get('gpu_bound_mib', '-')} | {m.get('flat', '-')} |")
        lines += ["", "Timeline (s of the soak; CPU in % of one core; Triton's figures for the model, per interval):",
                  "", "| t | " + " | ".join(TIMELINE_COLUMNS) + " |", "|---" * (len(TIMELINE_COLUMNS) + 1) + "|"]
        lines += ["| " + " | ".join(map(str, row)) + " |" for row in timeline_rows(report["timeline"], started)]
        lines += ["", f"Abuse cycles: {report['abuse_cycles']}; the first: {json.dumps(report['abuse_first_cycle'])}"]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--model", default=MODEL_CUSTOM)
    parser.add_argument("--valid-processes", type=int, default=4)
    parser.add_argument("--valid-in-flight", type=int, default=16, help="per valid process")
    parser.add_argument("--images-per-request", type=int, default=32)
    parser.add_argument("--deadline-s", type=float, default=client_abuse.VALID_DEADLINE_S,
                        help="a valid request unanswered this long after it was first sent is lost")
    parser.add_argument("--pause", type=float, default=10.0, help="seconds between abuse cycles")
    parser.add_argument("--abuse", type=lambda text: [b for b in text.split(",") if b], default=list(ABUSE),
                        help=f"the behaviours of each abuse cycle, comma-separated (default {','.join(ABUSE)}; "
                             "empty: none)")
    parser.add_argument("--min-images-per-s", type=float, default=0.0,
                        help="the valid load must reach this (e.g. half the measured peak)")
    parser.add_argument("--load-cores", default=default_load_cores(),
                        help="cores of the valid processes and the abuse loop (e.g. 12-15); the server gets the others")
    parser.add_argument("--warm-up-s", type=float, default=60.0,
                        help="a server's memory is judged from this long after it first answered")
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--abort-server-at", type=float, help="send SIGABRT to tritonserver this many seconds in")
    parser.add_argument("--out", type=Path, default=Path("build/abuse_soak"))
    parser.add_argument("launcher_args", nargs="*", help="extra launcher arguments, after --")
    args = parser.parse_args(argv)
    args.argv = argv
    if set(args.abuse) - set(ABUSE):
        parser.error(f"--abuse: unknown {sorted(set(args.abuse) - set(ABUSE))}; known: {', '.join(ABUSE)}")
    load_cores = set(cpu_list(args.load_cores))
    all_cores = os.sched_getaffinity(0)
    server_cores = all_cores - load_cores
    if not server_cores or not load_cores <= all_cores:
        parser.error(f"--load-cores {args.load_cores} must be a proper subset of this process's cores "
                     f"{sorted(all_cores)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="abuse_soak_", dir=args.out.parent))
    server = LaunchedServer(work / "launcher.out", log_file=work / "server.log", admin_token=secrets.token_urlsafe(24),
                            args=args.launcher_args, cores=server_cores)   # the launcher, tritonserver, its stubs
    server.start(ready_timeout_s=None)
    os.sched_setaffinity(0, load_cores)            # this process (the abuse loop) and the valid processes
    try:
        return soak(args, server, work, server_cores, load_cores)
    finally:
        os.sched_setaffinity(0, all_cores)         # a caller in this process (the tests) gets its cores back


def soak(args, server: LaunchedServer, work: Path, server_cores: set[int], load_cores: set[int]) -> int:
    """The soak against the started launcher: its report in args.out (.json, .md); 0 if it passed, else 1."""
    launcher, grpc_url = server.process, server.grpc_url
    argv = args.argv   # main's arguments, for the report's command line
    report = {"device": describe_device(), "commit": git_commit(), "seconds": args.seconds, "model": args.model,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": "python -m fusedresnet.campaigns.abuse_soak " + " ".join(argv or sys.argv[1:]),
              "server_cores": cpu_text(server_cores), "load_cores": cpu_text(load_cores),
              "min_images_per_s": args.min_images_per_s}
    valid, sampler, abort_timer = [], None, None
    try:
        try:
            server.wait_ready(600)
        except RuntimeError as error:
            raise SystemExit(f"the launcher's server was not ready:\n{error}") from None
        metrics_url = server.metrics_url     # every process's, from the launcher's ready line
        started = time.time()
        report["started_at"] = started
        valid = [started_with_output([sys.executable, "-m", "fusedresnet.campaigns.client_abuse", "valid",
                                      "--url", grpc_url, "--model", args.model, "--seconds", str(args.seconds),
                                      "--in-flight", str(args.valid_in_flight), "--deadline-s", str(args.deadline_s),
                                      "--images-per-request", str(args.images_per_request), "--seed", str(i)],
                                     work / f"valid{i}.json", work / f"valid{i}.err",
                                     env=dict(os.environ, **ONE_THREAD_PER_POOL))
                 for i in range(args.valid_processes)]
        sampler = Sampler(launcher, grpc_url, metrics_url, args.model, valid, args.sample_every_s)
        sampler.start()
        images = np.random.default_rng(5).integers(0, 256, (8, 224, 224, 3), dtype=np.uint8)
        requests = [client_abuse.infer_request(args.model, images[i:i + 1]) for i in range(8)]
        abuse, aborted = [], {}
        if args.abort_server_at is not None:
            abort_timer = threading.Timer(args.abort_server_at, abort_server, (launcher, grpc_url, started, aborted))
            abort_timer.daemon = True
            abort_timer.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            cycle = {"t": round(time.time() - started, 1)}
            for behaviour in args.abuse:
                cycle[behaviour] = ABUSE[behaviour](grpc_url, requests)
            abuse.append(cycle)
            time.sleep(max(0.0, min(args.pause, end - time.monotonic())))
        valid_results = []
        for i, process in enumerate(valid):
            process.wait(timeout=args.deadline_s + 120)
            try:
                valid_results.append(json.loads((work / f"valid{i}.json").read_text()))
            except json.JSONDecodeError:
                raise SystemExit(f"valid process {i} wrote no report (exit {process.returncode}); its stderr ends:\n"
                                 + (work / f"valid{i}.err").read_text(errors="replace")[-2000:]) from None
        # A crash of the last moments (a hung server is restarted after the launcher's WEDGED_AFTER_S) must end
        # with a ready server too: settled twice, a sample apart
        settle_by = time.monotonic() + SETTLE_S
        while time.monotonic() < settle_by:
            if sampler.settled():
                time.sleep(args.sample_every_s)
                if sampler.settled():
                    break
            time.sleep(1)
        sampler.stop.set()
        sampler.join(timeout=60)
        add_valid_rates(sampler.samples, valid_results)
        answered = sum(r["statuses"].get("OK", 0) for r in valid_results)
        per_process = [{key: r[key] for key in ("sent", "answered_first_time", "answered_after_retry", "lost",
                                                "retries", "longest_to_answer_s", "mismatched")}
                       for r in valid_results]
        memory = memory_by_server(sampler.samples, args.warm_up_s)
        restarts = len(sampler.pids_seen) - 1
        report.update({
            "valid": {"sent": sum(r["sent"] for r in valid_results), "answered": answered,
                      "lost": sum(r["lost"] for r in valid_results),
                      "images_per_s": round(answered * args.images_per_request / args.seconds, 1),
                      "mismatched_answers": sum(r["mismatched"] for r in valid_results),
                      "retries": sum(r["retries"] for r in valid_results),
                      "longest_to_answer_s": max(r["longest_to_answer_s"] for r in valid_results),
                      "deadline_s": args.deadline_s, "per_process": per_process,
                      "lost_examples": [f"{t - started:.1f} s: {text}" for r in valid_results
                                        for t, text in r["failures"]][:10],
                      "retry_examples": [f"{t - started:.1f} s: {text}" for r in valid_results
                                         for t, text in r["retry_examples"]][:5]},
            "aborted": aborted or None, "restarts": restarts, "servers_seen": sampler.pids_seen,
            "restart_windows_s": [[round(a - started, 1), round(b - started, 1)] for a, b in sampler.windows],
            "memory_by_server": memory, "warm_up_s": args.warm_up_s,
            "abuse_cycles": len(abuse), "abuse_first_cycle": abuse[0] if abuse else None, "abuse": abuse,
            "timeline": sampler.samples,
            "launcher_output_tail": (work / "launcher.out").read_text(errors="replace")[-3000:],
        })
        judged = [m for m in memory if "flat" in m]
        reasons = []
        if report["valid"]["lost"]:
            reasons.append(f"{report['valid']['lost']} valid requests lost")
        if report["valid"]["mismatched_answers"]:
            reasons.append(f"{report['valid']['mismatched_answers']} valid answers differed")
        if not answered:
            reasons.append("no valid request was answered")
        if not sampler.settled():
            reasons.append(f"{restarts} restarts, {len(sampler.windows)} followed by a ready server; "
                           f"ready at the end: {grpc_ready(grpc_url)}")
        if report["valid"]["images_per_s"] < args.min_images_per_s:
            reasons.append(f"valid load {report['valid']['images_per_s']} img/s < {args.min_images_per_s}")
        if not judged:
            reasons.append(f"no server answered for {args.warm_up_s} s plus two samples: memory not judged")
        reasons += [f"server {m['pid']}: memory grew (RSS {m['rss_growth_mib']} MiB, GPU {m['gpu_growth_mib']} MiB)"
                    for m in judged if not m["flat"]]
        report["failed_because"] = reasons
        report["ok"] = not reasons
    finally:
        if abort_timer is not None:
            abort_timer.cancel()               # an abort time past the soak's end fires into nothing
        if sampler is not None:
            sampler.stop.set()
        for process in valid:
            if process.poll() is None:
                process.kill()
        server.stop(90)
        report["work_dir"] = str(work)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        write_markdown(report, args.out.with_suffix(".md"))
    print(args.out.with_suffix(".md").read_text())
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
