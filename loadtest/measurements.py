"""What the locust processes of one step recorded, read back and summarised.

Each locust process writes every request it sent (start time, latency,
success) to `requests-<pid>.npz` in the step's folder; the master writes the
epoch times the measurement window opened and closed; `--json-file` writes
locust's own totals. Latency percentiles come from the exact per-request
times (locust's own percentiles are rounded to 2 significant digits, too
coarse at a few milliseconds); locust's totals are kept to cross-check counts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from fusedresnet.loadtest.step_files import MEASURE_END_MARKER, MEASURE_START_MARKER, REQUEST_LOG_PATTERN, WARMUP_SUFFIX

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecords:
    """All requests of one step, over all locust processes."""
    sent: int
    started_at: np.ndarray      # epoch seconds
    latency_ms: np.ndarray
    succeeded: np.ndarray       # bool
    cpu_warnings: int = 0       # times a locust process ran above 90% CPU (the client, not the server, may limit)
    cpu_percent: tuple = ()     # per process: CPU (user + system) over the measurement window, % of one core

    @property
    def finished_at(self) -> np.ndarray:
        return self.started_at + self.latency_ms / 1e3


def cpu_list(text: str) -> list[int]:
    """Cores in taskset's list format: "0-7,16" -> [0, 1, ..., 7, 16]."""
    cores = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return sorted(cores)


def cpu_text(cores) -> str:
    """Cores written in taskset's list format, one by one: [16, 17] -> "16,17" (what cpu_list reads)."""
    return ",".join(map(str, sorted(cores)))


def gpu_memory_used_mib() -> float | None:
    """The GPUs' used memory in MiB, summed (nvidia-smi); None without a GPU or a reading."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [float(v) for v in out.stdout.split() if v.replace(".", "", 1).isdigit()]
    return sum(values) if out.returncode == 0 and values else None


def thread_group(process_name: str, thread_name: str) -> str:
    """A thread's place in a server's tree: its process's name and its own with a trailing index dropped
    ("tritonserver/grpc_global_tim", "triton_python_b/pb_stub" and "tritonserver/resnet18_custom_"): threads
    of one pool fall in one group."""
    return f"{process_name}/{thread_name.rstrip('0123456789') or thread_name}"


def tree_thread_cpu_seconds(root: psutil.Process) -> dict[str, float]:
    """CPU seconds (user + system) so far of every thread of `root` and its descendants, summed per
    thread_group (the thread's name from /proc/<pid>/task/<tid>/comm); sampled around a window, where the
    server's CPU went, by thread pool. Threads and processes that ended meanwhile count as nothing."""
    groups: dict[str, float] = {}
    with contextlib.suppress(psutil.Error):
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                name = process.name()
                for thread in process.threads():
                    try:
                        comm = Path(f"/proc/{process.pid}/task/{thread.id}/comm").read_text().strip()
                    except OSError:
                        continue
                    key = thread_group(name, comm)
                    groups[key] = groups.get(key, 0.0) + thread.user_time + thread.system_time
    return groups


def read_request_records(folder: Path) -> RequestRecords:
    logs = [np.load(path) for path in sorted(Path(folder).glob(REQUEST_LOG_PATTERN))]
    if not logs:
        return RequestRecords(0, np.zeros(0), np.zeros(0), np.zeros(0, bool))
    return RequestRecords(sum(int(log["sent"]) for log in logs),
                          np.concatenate([log["started_at"] for log in logs]),
                          np.concatenate([log["latency_ms"] for log in logs]),
                          np.concatenate([log["succeeded"] for log in logs]),
                          sum(int(log["cpu_warnings"]) for log in logs),
                          tuple(100.0 * float(log["cpu_s"]) / float(log["cpu_window_s"]) for log in logs
                                if "cpu_window_s" in log and float(log["cpu_window_s"]) > 0))


# A load-generator process above this share of one core may be what limits a step (locust warns at 90% too).
CPU_SATURATED_PERCENT = 90.0


def client_cpu_summary(per_process) -> dict:
    """The load generator's CPU use over the measurement window: summed (% of one core), busiest process."""
    per_process = list(per_process)
    if not per_process:
        return {"client_cpu_percent": None, "client_cpu_percent_max_process": None, "client_cpu_saturated": None}
    return {"client_cpu_percent": round(sum(per_process), 1),
            "client_cpu_percent_max_process": round(max(per_process), 1),
            "client_cpu_saturated": max(per_process) > CPU_SATURATED_PERCENT}


def read_marker(folder: Path, marker: str) -> float | None:
    path = Path(folder) / marker
    return float(path.read_text()) if path.is_file() else None


def read_window(folder: Path) -> tuple[float, float] | None:
    start, end = read_marker(folder, MEASURE_START_MARKER), read_marker(folder, MEASURE_END_MARKER)
    return (start, end) if start is not None and end is not None else None


def read_locust_totals(json_path: Path) -> dict:
    """Locust's request and failure counts (all entries, warm-up included) and its measured-entry percentiles."""
    entries = json.loads(Path(json_path).read_text())
    totals = {"locust_requests": sum(e["num_requests"] for e in entries),
              "locust_failures": sum(e["num_failures"] for e in entries)}
    measured = [e for e in entries if not e["name"].endswith(WARMUP_SUFFIX)]
    buckets: dict[float, int] = {}
    for entry in measured:
        for bucket, count in entry["response_times"].items():
            buckets[float(bucket)] = buckets.get(float(bucket), 0) + count
    for p in (50, 99):
        totals[f"locust_p{p}_ms"] = bucket_percentile(buckets, p)
    return totals


def bucket_percentile(buckets: dict[float, int], percent: float) -> float | None:
    """Percentile of locust's rounded response-time histogram {rounded ms: count}."""
    total = sum(buckets.values())
    if not total:
        return None
    needed, seen = total * percent / 100.0, 0
    for value in sorted(buckets):
        seen += buckets[value]
        if seen >= needed:
            return value
    return max(buckets)


def client_side_summary(records: RequestRecords, window: tuple[float, float], images_per_request: int) -> dict:
    """Throughput and latency of the requests that finished inside the measurement window."""
    start, end = window
    seconds = end - start
    inside = (records.finished_at >= start) & (records.finished_at < end)
    ok = inside & records.succeeded
    latencies = records.latency_ms[ok]
    summary = {
        "window_s": seconds,
        "measured_requests": int(ok.sum()),
        "measured_failures": int((inside & ~records.succeeded).sum()),
        "req_per_s": ok.sum() / seconds,
        "img_per_s": ok.sum() * images_per_request / seconds,
        "mean_ms": float(latencies.mean()) if latencies.size else None,
    }
    for p in PERCENTILES:
        summary[f"p{p}_ms"] = float(np.percentile(latencies, p)) if latencies.size else None
    return summary


def all_request_counts(records: RequestRecords) -> dict:
    return {"sent": records.sent, "completed": int(records.succeeded.size),
            "succeeded": int(records.succeeded.sum()), "failures": int((~records.succeeded).sum()),
            "client_cpu_saturated": records.cpu_warnings > 0}
