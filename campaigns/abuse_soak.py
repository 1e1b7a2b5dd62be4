"""A soak of valid traffic mixed with abusive clients, against the launcher as users run it.

    python -m fusedresnet.campaigns.abuse_soak --seconds 600 --valid-processes 8 --valid-in-flight 8 \\
        --images-per-request 32 --min-images-per-s 19350 --out build/abuse_soak

The launcher (`python -m fusedresnet.backend.serve`, its restart on) serves on free ports, pinned to the
cores not in `--load-cores` (default: the last quarter of this process's cores, as loadtest/perf_analyzer.py
gives its load generators); the valid processes and the abuse loop run on `--load-cores`.

Valid load: `--valid-processes` processes of `client_abuse valid`, each keeping `--valid-in-flight` calls of
`--images-per-request` images in flight for the whole soak (past `--seconds`, until a server other than an aborted
one has served long enough to be judged, below: a restart that is slow on a busy host leaves no server unjudged; at
most SETTLE_S more), as a real client of the project sends them: on
the clients' gRPC channel (its retry policy) and retried on UNAVAILABLE with backoff up to `--deadline-s`
after the request was first sent (a restarting server refuses connections for longer than gRPC's own
retries last). A valid request is LOST only when it never got an answer; every answer is compared with that
process's first answer to the same request (relative L2 within the project's tolerance).

Abuse, in a loop until the end (`--abuse` picks the behaviours): a round of abandoned calls (256 in flight on
one connection, closed after 1 s), a burst of 500 calls with a 5 ms deadline, an RST_STREAM storm of 1,000
calls, or the abandonment storm (16 connections x 16 calls closed together after 2 s), then `--pause`; each
cycle on the next of the `--model` models in turn. `--abort-server-at S` also sends SIGABRT to tritonserver S
seconds in, once it serves and every valid process has had an answer (the crash the launcher must recover from);
the report's `aborted` says when, when the launcher's "ready again" line was seen and its recovery time, and the
valid requests each process had answered before the SIGABRT and after that line (from each answer's own time, to
a tenth of a second: answers of the aborted server and of the restarted one).

Several processes behind one port (`-- --processes-per-gpu N`): `--model` and `--images-per-request` may be
lists (valid process i sends the i-th of their combinations, in turn); a sample whose ServerReady on the shared
port went unanswered (on a new connection per try, up to one more try than there are processes, as a client
that reconnects) is a second of zero capacity; crashes and restarts are the launcher's lines, the longest
recovery its own "ready again ... s after the failure was seen". The report's `front_door` block is what
results/front_door.json keeps of it (campaigns/front_door.py --abandonment).

Timeline, every `--sample-every-s`: the valid img/s of the interval (answers counted by the valid processes),
Triton's own metrics for the model over the interval (requests succeeded/failed, images, queue and
compute_infer time per request), CPU% (of one core) of tritonserver + its stubs, of the valid processes and
of this process (the abuse loop), the server's RSS (tritonserver + stubs) and own memory (below), the GPU's
memory (nvidia-smi),
and the server's pid (a new pid is a restart by the launcher).

Memory is judged per server process: on its samples from `--warm-up-s` after it first answered (its loading
and warm-up are not growth), growth = last - first of that span of its own memory (the anonymous resident pages
of tritonserver and its stubs plus its Python-backend shared-memory regions, each counted once; RSS is reported
beside it), at most max(128 MiB, 10%) of it, and at most 256 MiB of GPU memory.

Passes (exit 0) when: no valid request was lost, no valid answer differed, every restart was followed by a
ready server (and the server is ready at the end), the valid load over the whole soak reached
--min-images-per-s, every server's memory stayed flat (at least one server judged), and with --abort-server-at
the server was aborted. Writes <out>.json/.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import re
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

from fusedresnet.backend.launcher import LaunchedServer, metrics_url_of, parse_settings
from fusedresnet.backend.launcher.stub_processes import python_stubs, tritonserver_of, tritonservers_of
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.serve import READY_AGAIN_LINE, grpc_ready, shm_prefix_of, shm_region_paths
from fusedresnet.backend.spec import INPUT_SHAPES, INPUT_UINT8, MODEL_CUSTOM
from fusedresnet.campaigns import client_abuse
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
    # the pattern that crashed Triton 2.51 twice in 80 s (issue 37): 16 connections x 16 single-image calls,
    # all closed together after 2 s
    "abandon-storm": lambda url, requests: client_abuse.abandon(url, requests, 1, 256, 2.0,
                                                                connections=16)[0].summary()["statuses"],
}
# The launcher's lines that say a process failed (backend/serve.py TritonServer.supervise), and its restart line
FAILURE_LINE = re.compile(r"^fusedresnet: (?:tritonserver\S* .*(?:exited unasked|crashed|has not answered)|"
                          r"Python stub of .* died)", re.MULTILINE)
RECOVERY_LINE = re.compile(re.escape(READY_AGAIN_LINE) + r".*?: ([\d.]+) s after the failure was seen")
SETTLE_S = 120.0          # after the soak, at most this long for a restart under way to end with a ready server
                          # (and, before it, for the valid load to go on until a server is judged)


# The valid processes' numerical thread pools at one thread each. With the default (a BLAS thread per core of
# the host) 8 processes on 8 load cores each spun ~100% of a core for 10 requests/s (H100 host:
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


def port_answers(grpc_url: str, processes: int) -> bool:
    """Whether a client gets ServerReady answered on the port. With several processes behind it a client that
    meets a dying one (its socket still listening in its abort handler) connects again, and the kernel hands
    the new connection to a process of its choice: up to one more try per process, each on a new connection."""
    return any(grpc_ready(grpc_url) for _ in range(1 if processes == 1 else processes + 1))


class Sampler(threading.Thread):
    """Every 0.5 s: which tritonservers serve and whether the gRPC port answers ServerReady (a server hung in its
    abort handler still answers HTTP): with one process, the restart windows; every `every_s` a timeline sample.
    With several processes behind the port, their failures and restarts are the launcher's lines."""

    def settled(self) -> bool:
        """Every restart became ready, and the port answers."""
        if self.processes > 1:
            output = self.server.output()
            return (len(RECOVERY_LINE.findall(output)) >= len(FAILURE_LINE.findall(output))
                    and grpc_ready(self.grpc_url))
        return len(self.windows) >= len(self.pids_seen) - 1 and grpc_ready(self.grpc_url)

    def __init__(self, server: LaunchedServer, models: list[str], valid: list[subprocess.Popen], every_s: float):
        super().__init__(daemon=True)
        self.server, self.launcher = server, server.process
        self.grpc_url, self.models = server.grpc_url, models
        self.processes = len(server.metrics_ports)     # from the launcher's ready line
        self.valid, self.every_s = valid, every_s
        self.samples: list[dict] = []
        self.windows: list[list[float]] = []         # [last answer of the old server, first of the new one]
        self.pids_seen: list[int] = []
        self.stop = threading.Event()
        self.cpu = CpuMeter()
        self.previous_metrics: tuple[tuple, triton_metrics.MetricsSnapshot] | None = None

    def run(self):
        answered_at, pid, next_sample = time.time(), None, 0.0
        while not self.stop.is_set():
            try:
                answered_at, pid, next_sample = self.poll(answered_at, pid, next_sample)
            except psutil.Error:        # a process that vanished between two looks: look again
                pass
            self.stop.wait(0.5)

    def port_answers(self) -> bool:
        return port_answers(self.grpc_url, self.processes)

    def poll(self, answered_at: float, pid: int | None, next_sample: float) -> tuple[float, int | None, float]:
        """One look: the serving pids, the port's readiness (with one process, a new ready pid closes a restart
        window), a sample if due."""
        servers = tritonservers_of(self.launcher.pid)
        self.pids_seen += [server.pid for server in servers if server.pid not in self.pids_seen]
        server = servers[0] if servers else None
        ready = server is not None and self.port_answers()
        if ready and pid is not None and server.pid != pid and self.processes == 1:
            self.windows.append([answered_at, time.time()])
        if ready:
            answered_at, pid = time.time(), server.pid
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + self.every_s
            self.samples.append(self.sample(servers, ready))
        return answered_at, pid, next_sample

    def sample(self, servers: list[psutil.Process], ready: bool) -> dict:
        processes, rss_by_pid, own_by_pid, success_by_pid, snapshots = [], {}, {}, {}, []
        metrics_ports = {pid: port for port, pid in self.server.server_pids().items()}
        for server in servers:
            mine = [server, *python_stubs(server.pid).values()]
            processes += mine
            memory = [memory_bytes(process) for process in mine]
            rss_by_pid[str(server.pid)] = round(sum(rss for rss, _ in memory) / MIB, 1)
            own_by_pid[str(server.pid)] = round((sum(private for _, private in memory) + shm_region_bytes(server))
                                                / MIB, 1)
            snapshot = own_metrics(metrics_ports.get(server.pid))    # None while it loads
            snapshots.append(snapshot)
            success_by_pid[str(server.pid)] = None if snapshot is None else int(
                sum(snapshot.total(triton_metrics.SUCCESS, model) for model in self.models))
        server = servers[0] if servers else None
        rss = sum(rss_by_pid.values()) * MIB
        valid = []
        for process in self.valid:
            try:
                valid.append(psutil.Process(process.pid))
            except psutil.NoSuchProcess:
                pass
        sample = {"t": round(time.time(), 2), "pid": server.pid if server else None, "ready": ready,
                  "rss_mib": round(rss / MIB, 1) if server else None,
                  "rss_mib_by_pid": rss_by_pid, "own_mib_by_pid": own_by_pid,
                  "success_by_pid": success_by_pid, "gpu_mib": gpu_memory_used_mib(),
                  "cpu_server": self.cpu.percent(processes), "cpu_valid": self.cpu.percent(valid),
                  "cpu_abuse": self.cpu.percent([psutil.Process()])}
        if ready and snapshots and None not in snapshots:   # every process's counts, summed
            now = triton_metrics.MetricsSnapshot(time.time(), [row for snap in snapshots for row in snap.samples])
            sample.update(self.triton_interval(tuple(sorted(rss_by_pid)), now))
        return sample

    def triton_interval(self, pids: tuple, now: triton_metrics.MetricsSnapshot) -> dict:
        """Triton's counts for the models (summed; queue and compute of the first) since the previous sample of
        the same servers."""
        previous, self.previous_metrics = self.previous_metrics, (pids, now)
        total = int(sum(now.total(triton_metrics.SUCCESS, model) for model in self.models))
        if previous is None or previous[0] != pids:
            return {"triton_success_total": total}
        deltas = [triton_metrics.model_delta(previous[1], now, model) for model in self.models]
        first = deltas[0]
        return {"triton_success_total": total,
                "triton_success": sum(d["triton_success"] for d in deltas),
                "triton_failure": sum(d["triton_failure"] for d in deltas),
                "triton_img_per_s": round(sum(d["server_img_per_s"] for d in deltas), 1),
                "queue_ms": None if first["queue_us"] is None else round(first["queue_us"] / 1e3, 2),
                "compute_infer_ms": None if first["compute_infer_us"] is None
                else round(first["compute_infer_us"] / 1e3, 2)}


def own_metrics(port: int | None) -> triton_metrics.MetricsSnapshot | None:
    """One tritonserver's metrics, from its own port; None when it does not answer (yet)."""
    try:
        return None if port is None else triton_metrics.scrape(metrics_url_of(port), timeout_s=2.0)
    except OSError:
        return None


def memory_bytes(process: psutil.Process) -> tuple[int, int]:
    """(RSS, its own anonymous pages: RSS less the resident shared pages, files and shared memory, among them the
    Python backend's regions, which the server and its stubs both map); (0, 0) once it ended."""
    try:
        info = process.memory_info()
    except psutil.NoSuchProcess:
        return 0, 0
    return info.rss, info.rss - info.shared


def shm_region_bytes(server: psutil.Process) -> int:
    """The size of the server's Python-backend shared-memory regions."""
    try:
        prefix = shm_prefix_of(server.cmdline())
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for path in shm_region_paths(prefix) if prefix else []:
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


def abort_server(server: LaunchedServer, started: float, aborted: dict, answered: list[Path], done: threading.Event):
    """SIGABRT to the launcher's tritonserver once it serves and every valid process has been answered (each wrote
    the time of its first answer in its file in `answered`) in a tenth of a second that is over: the crash it must
    recover from, with valid answers of the old server before it. Then waits for the launcher's next "ready again"
    line. `aborted` says when (s of the soak, `t`, and the epoch, `at`) and which pid, when that line was seen
    (`ready_again_t`, `ready_again_at`) and the recovery it gives; nothing happens once `done` is set."""
    def answered_in_a_past_tenth() -> bool:
        """Every valid process has its first answer (the epoch time in its file) in a tenth of a second that is
        over: answered_around, which judges the soak, counts whole tenths only."""
        try:
            firsts = [float(path.read_text().split()[0]) for path in answered]
        except (OSError, ValueError, IndexError):      # not written yet, or being written
            return False
        return all(time.time() >= (math.floor(first * 10) + 1) / 10 + 0.05 for first in firsts)

    def serving() -> psutil.Process | None:
        triton = tritonserver_of(server.process.pid)
        return triton if triton is not None and answered_in_a_past_tenth() and grpc_ready(server.grpc_url) else None

    triton = serving()
    while triton is None:
        if server.process.poll() is not None or done.wait(0.2):
            return
        triton = serving()
    recoveries_before = len(RECOVERY_LINE.findall(server.output()))
    triton.send_signal(signal.SIGABRT)
    at = time.time()
    aborted.update(t=round(at - started, 1), at=at, pid=triton.pid, ready_again_t=None, ready_again_at=None,
                   recovery_s=None)
    while not done.wait(0.2):
        recoveries = RECOVERY_LINE.findall(server.output())
        if len(recoveries) > recoveries_before:
            seen = time.time()
            aborted.update(ready_again_t=round(seen - started, 1), ready_again_at=seen,
                           recovery_s=float(recoveries[recoveries_before]))
            return


def judged_besides(samples: list[dict], warm_up_s: float, pid: int | None) -> bool:
    """Whether a server other than `pid` has served long enough for its memory to be judged."""
    return any(m["span_s"] and m["pid"] != pid for m in memory_by_server(samples, warm_up_s))


def answered_around(result: dict, before: float, after: float) -> tuple[int, int]:
    """(requests a valid process had answered before the epoch time `before`, those it was answered at or after
    `after`), from its answers per tenth of a second: only whole tenths on either side count."""
    tenths = {int(tenth): count for tenth, count in result["answered_by_tenth_s"].items()}
    return (sum(count for tenth, count in tenths.items() if (tenth + 1) / 10 <= before),
            sum(count for tenth, count in tenths.items() if tenth / 10 >= after))


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
    """Per tritonserver pid: its span (from `warm_up_s` after its first sample with answers of its own) and growth
    in it of its own memory (`own_mib_by_pid`: the anonymous resident pages of it and its stubs, and its Python
    backend's shared-memory regions, counted once), its RSS (reported: it also counts pages of the libraries as
    new code paths touch them, and each region twice, by the server and by the stub; on a 2-core CI host it rose
    115-143 MiB in steps over the first 20 s of a restarted server while its own memory stayed within 20 MiB),
    and the GPU's memory (shared by the processes on it)."""
    servers = []
    for key in dict.fromkeys(key for s in samples for key in s.get("own_mib_by_pid", {})):
        mine = [s for s in samples if key in s["own_mib_by_pid"]]
        answering = next((s["t"] for s in mine if (s["success_by_pid"].get(key) or 0) > 0), None)
        span = [s for s in mine if answering is not None and s["t"] >= answering + warm_up_s]
        entry = {"pid": int(key), "samples": len(mine), "first_answered_at": answering,
                 "span_s": [span[0]["t"], span[-1]["t"]] if len(span) >= 2 else None}
        if len(span) >= 2:
            first, last = span[0]["own_mib_by_pid"][key], span[-1]["own_mib_by_pid"][key]
            entry["own_first_last_mib"] = [first, last]
            entry["own_growth_mib"] = round(last - first, 1)
            entry["own_bound_mib"] = round(max(RSS_GROWTH_BOUND[0] / MIB, RSS_GROWTH_BOUND[1] * first), 1)
            entry["rss_first_last_mib"] = [span[0]["rss_mib_by_pid"][key], span[-1]["rss_mib_by_pid"][key]]
            entry["rss_growth_mib"] = round(entry["rss_first_last_mib"][1] - entry["rss_first_last_mib"][0], 1)
            gpu = [s["gpu_mib"] for s in span if s["gpu_mib"] is not None]
            entry["gpu_growth_mib"] = round(gpu[-1] - gpu[0], 1) if len(gpu) >= 2 else None
            entry["gpu_bound_mib"] = GPU_GROWTH_BOUND_MIB
            gpu_flat = entry["gpu_growth_mib"] is None or entry["gpu_growth_mib"] <= GPU_GROWTH_BOUND_MIB
            entry["flat"] = bool(entry["own_growth_mib"] <= entry["own_bound_mib"] and gpu_flat)
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


def markdown(report: dict) -> str:
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
                  f"{valid['mismatched_answers']} wrong; {valid['images_per_s']} img/s over its "
                  f"{report.get('valid_load_s')} s "
                  f"(at least {report['min_images_per_s']} asked).", "",
                  *table(["process", "sent", "answered first time", "answered after retry", "lost", "retries",
                          "longest to answer (s)"],
                         ([i, p["sent"], p["answered_first_time"], p["answered_after_retry"], p["lost"], p["retries"],
                           p["longest_to_answer_s"]] for i, p in enumerate(valid["per_process"])))]
        for example in valid["lost_examples"] + valid["retry_examples"]:
            lines.append(f"- {example}")
    aborted = report.get("aborted")
    if aborted:
        around = [(p.get("answered_before_abort"), p.get("answered_after_ready_again"))
                  for p in (valid or {}).get("per_process", [])]
        lines += ["", f"SIGABRT to tritonserver {aborted['pid']} at {aborted['t']} s; the launcher's ready-again line "
                  f"seen at {aborted.get('ready_again_t')} s (recovery {aborted.get('recovery_s')} s after it saw the "
                  f"failure); valid requests answered before the abort / after that line, per process: {around}."]
    if "restarts" in report:
        lines += ["", f"Server processes behind the port: {report.get('processes', 1)}; crashes (the launcher's "
                  f"failure lines): {report.get('crashes')}; restarts: {report['restarts']} (each ready again after "
                  f"{report.get('recoveries_s')} s); seconds the port answered no ServerReady: "
                  f"{report.get('capacity_zero_s')}; servers (pids) seen: {report['servers_seen']}.", ""]
        started = report["started_at"]

        def memory_cells(m):
            span = "-" if m["span_s"] is None else f"{m['span_s'][0] - started:.0f}-{m['span_s'][1] - started:.0f}"
            return [m["pid"], m["samples"], span, m.get("own_first_last_mib") or "-",
                    f"{m.get('own_growth_mib', '-')} / {m.get('own_bound_mib', '-')}",
                    m.get("rss_first_last_mib") or "-",
                    f"{m.get('gpu_growth_mib', '-')} / {m.get('gpu_bound_mib', '-')}", m.get("flat", "-")]
        lines += table(["server pid", "samples", "memory span (s of the soak)", "own memory first/last (MiB)",
                        "own growth / bound", "RSS first/last (MiB)", "GPU growth / bound (MiB)", "flat"],
                       map(memory_cells, report["memory_by_server"]))
        lines += ["", "Timeline (s of the soak; CPU in % of one core; Triton's figures for the model, per interval):",
                  "", *table(["t", *TIMELINE_COLUMNS], timeline_rows(report["timeline"], started))]
        lines += ["", f"Abuse cycles: {report['abuse_cycles']}; the first: {json.dumps(report['abuse_first_cycle'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--model", default=MODEL_CUSTOM, help="the valid models (and the abuse's), comma-separated")
    parser.add_argument("--valid-processes", type=int, default=4)
    parser.add_argument("--valid-in-flight", type=int, default=16, help="per valid process")
    parser.add_argument("--images-per-request", default="32", help="of the valid requests, comma-separated")
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
    args.models = [m for m in args.model.split(",") if m]
    args.valid_kinds = list(itertools.product(args.models, [int(n) for n in args.images_per_request.split(",")]))
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
    settings = parse_settings(list(args.launcher_args)).replace(log_file=work / "server.log",
                                                                admin_token=secrets.token_urlsafe(24))
    # the launcher, tritonserver and its stubs on the server's cores
    server = LaunchedServer(settings, work / "launcher.out", cores=server_cores)
    server.start(ready_timeout_s=None)
    os.sched_setaffinity(0, load_cores)            # this process (the abuse loop) and the valid processes
    try:
        return soak(args, server, work, server_cores, load_cores)
    finally:
        os.sched_setaffinity(0, all_cores)         # a caller in this process (the tests) gets its cores back


def soak(args, server: LaunchedServer, work: Path, server_cores: set[int], load_cores: set[int]) -> int:
    """The soak against the started launcher: its report in args.out (.json, .md); 0 if it passed, else 1."""
    grpc_url = server.grpc_url
    argv = args.argv   # main's arguments, for the report's command line
    report = {"device": describe_device(), "commit": git_commit(), "seconds": args.seconds, "model": args.model,
              "valid_kinds": [f"{model} x{images}" for model, images in args.valid_kinds],
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": "python -m fusedresnet.campaigns.abuse_soak " + " ".join(argv or sys.argv[1:]),
              "server_cores": cpu_text(server_cores), "load_cores": cpu_text(load_cores),
              "min_images_per_s": args.min_images_per_s}
    valid, sampler, abort_timer, abort_done = [], None, None, threading.Event()
    try:
        try:
            server.wait_ready(600)
        except RuntimeError as error:
            raise SystemExit(f"the launcher's server was not ready:\n{error}") from None
        started = time.time()
        report["started_at"] = started
        kinds = [args.valid_kinds[i % len(args.valid_kinds)] for i in range(args.valid_processes)]
        valid = [started_with_output([sys.executable, "-m", "fusedresnet.campaigns.client_abuse", "valid",
                                      "--url", grpc_url, "--model", kinds[i][0], "--seconds", str(args.seconds),
                                      "--in-flight", str(args.valid_in_flight), "--deadline-s", str(args.deadline_s),
                                      "--images-per-request", str(kinds[i][1]), "--seed", str(i),
                                      "--first-answer-file", str(work / f"valid{i}.answered"),
                                      "--until-file", str(work / "valid.stop")],
                                     work / f"valid{i}.json", work / f"valid{i}.err",
                                     env=dict(os.environ, **ONE_THREAD_PER_POOL))
                 for i in range(args.valid_processes)]
        sampler = Sampler(server, args.models, valid, args.sample_every_s)
        sampler.start()
        images = np.random.default_rng(5).integers(0, 256, (8, *INPUT_SHAPES[INPUT_UINT8]), dtype=np.uint8)
        requests = {model: [client_abuse.infer_request(model, images[i:i + 1]) for i in range(8)]
                    for model in args.models}
        abuse, aborted = [], {}
        if args.abort_server_at is not None:
            abort_timer = threading.Timer(args.abort_server_at, abort_server, (
                server, started, aborted, [work / f"valid{i}.answered" for i in range(len(valid))], abort_done))
            abort_timer.daemon = True
            abort_timer.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            model = args.models[len(abuse) % len(args.models)]
            cycle = {"t": round(time.time() - started, 1), "model": model}
            for behaviour in args.abuse:
                cycle[behaviour] = ABUSE[behaviour](grpc_url, requests[model])
            abuse.append(cycle)
            time.sleep(max(0.0, min(args.pause, end - time.monotonic())))
        # The valid load goes on until a server, not the aborted one, has been judged (at most SETTLE_S more)
        extend_by = time.monotonic() + SETTLE_S
        while time.monotonic() < extend_by and not judged_besides(list(sampler.samples), args.warm_up_s,
                                                                  aborted.get("pid")):
            time.sleep(0.5)
        (work / "valid.stop").write_text("")
        load_s = max(args.seconds, time.time() - started)
        report["valid_load_s"] = round(load_s, 1)
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
        abort_done.set()
        if abort_timer is not None:
            abort_timer.cancel()
            if abort_timer.is_alive():
                abort_timer.join(timeout=10)
        add_valid_rates(sampler.samples, valid_results)
        answered = sum(r["statuses"].get("OK", 0) for r in valid_results)
        answered_images = sum(r["statuses"].get("OK", 0) * images for r, (_, images) in zip(valid_results, kinds))
        per_process = [{key: r[key] for key in ("sent", "answered_first_time", "answered_after_retry", "lost",
                                                "retries", "longest_to_answer_s", "mismatched")}
                       for r in valid_results]
        if aborted.get("ready_again_at"):
            for entry, result in zip(per_process, valid_results):
                entry["answered_before_abort"], entry["answered_after_ready_again"] = answered_around(
                    result, aborted["at"], aborted["ready_again_at"])
        memory = memory_by_server(sampler.samples, args.warm_up_s)
        restarts = len(sampler.pids_seen) - sampler.processes
        output = server.output()
        recoveries = [float(seconds) for seconds in RECOVERY_LINE.findall(output)]
        report.update({
            "valid": {"sent": sum(r["sent"] for r in valid_results), "answered": answered,
                      "lost": sum(r["lost"] for r in valid_results),
                      "images_per_s": round(answered_images / load_s, 1),
                      "mismatched_answers": sum(r["mismatched"] for r in valid_results),
                      "retries": sum(r["retries"] for r in valid_results),
                      "longest_to_answer_s": max(r["longest_to_answer_s"] for r in valid_results),
                      "deadline_s": args.deadline_s, "per_process": per_process,
                      "lost_examples": [f"{t - started:.1f} s: {text}" for r in valid_results
                                        for t, text in r["failures"]][:10],
                      "retry_examples": [f"{t - started:.1f} s: {text}" for r in valid_results
                                         for t, text in r["retry_examples"]][:5]},
            "aborted": aborted or None, "restarts": restarts, "servers_seen": sampler.pids_seen,
            "processes": sampler.processes, "crashes": len(FAILURE_LINE.findall(output)),
            "recoveries_s": recoveries,
            "capacity_zero_s": round(sum(args.sample_every_s for s in sampler.samples if not s["ready"]), 1),
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
        reasons += [f"server {m['pid']}: memory grew (its own {m['own_growth_mib']} MiB, RSS "
                    f"{m['rss_growth_mib']} MiB, GPU {m['gpu_growth_mib']} MiB)"
                    for m in judged if not m["flat"]]
        if args.abort_server_at is not None and not aborted:
            reasons.append(f"the server was not aborted (--abort-server-at {args.abort_server_at:g}): no valid "
                           "process answered, or the soak ended first")
        if sampler.processes > 1 and report["capacity_zero_s"]:
            reasons.append(f"the shared port answered no ServerReady for {report['capacity_zero_s']} s")
        report["failed_because"] = reasons
        report["ok"] = not reasons
        report["front_door"] = {
            "duration_s": args.seconds, "valid_sent": report["valid"]["sent"], "valid_failed": report["valid"]["lost"],
            "capacity_zero_s": report["capacity_zero_s"], "crashes": report["crashes"], "restarts": restarts,
            "max_recovery_s": max(recoveries, default=None),
            "device": report["device"], "date": report["date"], "git_commit": report["commit"],
            "command": report["command"], "server_cores": report["server_cores"], "load_cores": report["load_cores"],
            "processes": sampler.processes, "valid_kinds": report["valid_kinds"],
            "pattern": f"Valid: {args.valid_processes} processes x {args.valid_in_flight} calls in flight "
                       f"({', '.join(report['valid_kinds'])}), each retried on UNAVAILABLE as the project's clients "
                       f"do; abuse: {', '.join(args.abuse) or 'none'} in a loop, alternating "
                       f"{', '.join(args.models)}; capacity sampled every {args.sample_every_s:g} s "
                       f"(ServerReady on the shared port)."}
    finally:
        abort_done.set()
        if abort_timer is not None:
            abort_timer.cancel()               # an abort time past the soak's end fires into nothing
        if sampler is not None:
            sampler.stop.set()
        for process in valid:
            if process.poll() is None:
                process.kill()
        server.stop(90)
        report["work_dir"] = str(work)
        write_json_and_markdown(args.out, report, markdown(report))
    print(args.out.with_suffix(".md").read_text())
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
