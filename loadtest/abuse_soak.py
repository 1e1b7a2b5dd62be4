"""A soak of valid traffic mixed with abusive clients, against the launcher as users run it.

    python -m fusedresnet.loadtest.abuse_soak --seconds 600 --valid-processes 4 --out build/abuse_soak

The launcher (`python -m fusedresnet.backend.serve`, its restart on) serves on free ports. Valid
load: `--valid-processes` processes of `client_abuse valid`, each keeping `--valid-in-flight`
calls of `--images-per-request` images in flight for the whole soak; every answer is compared
with that process's first answer to the same request (relative L2 within the project's
tolerance), every failure is kept with its time. Abuse, in a loop until the end: a round of
abandoned calls (256 in flight on one connection, closed after 1 s), a burst of calls with a
5 ms deadline, an RST_STREAM storm, then a pause. Every 5 s: tritonserver's and its stubs' RSS,
the GPU's memory (nvidia-smi), the server's pid (a new pid is a restart by the launcher).

Passes (exit 0) when: no valid request failed outside a restart window (from the last moment the
old server answered to the first the new one did), no valid answer differed, every restart was
followed by a ready server, the valid load reached --min-images-per-s, and memory grew over
the second half of the soak by at most max(128 MiB, 10%) (GPU: 256 MiB), judged on the samples
of one server. Writes <out>.json / .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from fusedresnet.backend.network import free_ports, http_ready
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV, MODEL_CUSTOM
from fusedresnet.backend.stub_processes import python_stubs
from fusedresnet.loadtest import client_abuse
from fusedresnet.loadtest.sweep import describe_device, git_commit

RSS_GROWTH_BOUND = (128 << 20, 0.10)
GPU_GROWTH_BOUND_MIB = 256


def tritonserver_of(launcher: subprocess.Popen) -> psutil.Process | None:
    try:
        children = psutil.Process(launcher.pid).children()
    except psutil.NoSuchProcess:
        return None
    return next((c for c in children if c.name() == "tritonserver" and c.status() != psutil.STATUS_ZOMBIE), None)


def memory_sample(server: psutil.Process | None) -> dict:
    sample = {"t": time.time(), "pid": server.pid if server else None, "rss_bytes": 0, "gpu_mib": None}
    if server is not None:
        processes = [server, *python_stubs(server.pid).values()]
        for process in processes:
            try:
                sample["rss_bytes"] += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            sample["gpu_mib"] = sum(float(v) for v in out.stdout.split())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    return sample


def growth(samples: list[dict], key: str) -> float | None:
    """Growth of `key` over the second half of the soak, on the samples of the server that served last."""
    if not samples or samples[-1][key] is None:
        return None
    last_pid = samples[-1]["pid"]
    middle = (samples[0]["t"] + samples[-1]["t"]) / 2
    half = [s[key] for s in samples if s["pid"] == last_pid and s["t"] >= middle and s[key] is not None]
    return float(max(half) - half[0]) if len(half) >= 2 else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--model", default=MODEL_CUSTOM)
    parser.add_argument("--valid-processes", type=int, default=4)
    parser.add_argument("--valid-in-flight", type=int, default=16, help="per valid process")
    parser.add_argument("--images-per-request", type=int, default=32)
    parser.add_argument("--pause", type=float, default=10.0, help="seconds between abuse cycles")
    parser.add_argument("--min-images-per-s", type=float, default=0.0,
                        help="the valid load must reach this (e.g. half the measured peak)")
    parser.add_argument("--out", type=Path, default=Path("build/abuse_soak"))
    parser.add_argument("launcher_args", nargs="*", help="extra launcher arguments, after --")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="abuse_soak_", dir=args.out.parent))
    http_port, grpc_port, metrics_port = free_ports(3)
    grpc_url, http_url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
    env = dict(os.environ, **{ADMIN_TOKEN_ENV: secrets.token_urlsafe(24)})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fusedresnet.backend.serve", "--http-port", str(http_port), "--grpc-port",
         str(grpc_port), "--metrics-port", str(metrics_port), "--log-file", str(work / "server.log"),
         *args.launcher_args], env=env, stdout=open(work / "launcher.out", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    report = {"device": describe_device(), "commit": git_commit(), "seconds": args.seconds, "model": args.model,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": "python -m fusedresnet.loadtest.abuse_soak " + " ".join(argv or sys.argv[1:])}
    valid = []
    try:
        deadline = time.monotonic() + 600
        while not http_ready(http_url) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(1)
        if not http_ready(http_url):
            raise SystemExit(f"the launcher's server was not ready:\n{(work / 'launcher.out').read_text()}")
        valid = [subprocess.Popen([sys.executable, "-m", "fusedresnet.loadtest.client_abuse", "valid",
                                   "--url", grpc_url, "--model", args.model, "--seconds", str(args.seconds),
                                   "--in-flight",
                                   str(args.valid_in_flight), "--images-per-request", str(args.images_per_request),
                                   "--seed", str(i)], stdout=open(work / f"valid{i}.json", "wb"),
                                  stderr=open(work / f"valid{i}.err", "wb")) for i in range(args.valid_processes)]
        images = np.random.default_rng(5).integers(0, 256, (8, 224, 224, 3), dtype=np.uint8)
        requests = [client_abuse.infer_request(args.model, images[i:i + 1]) for i in range(8)]
        samples, abuse, answered_at, windows, pid = [], [], time.time(), [], None
        started = time.monotonic()
        next_sample = 0.0
        while time.monotonic() - started < args.seconds:
            cycle = {"t": time.time(),
                     "abandon": client_abuse.abandon(grpc_url, requests, 1, 256, 1.0)[0].summary()["statuses"],
                     "deadlines": client_abuse.deadlines(grpc_url, requests, 500, 64, 0.005).summary()["statuses"],
                     "rst_storm": client_abuse.rst_storm(grpc_url, requests, 1000).summary()["statuses"]}
            abuse.append(cycle)
            pause_end = time.monotonic() + args.pause
            while time.monotonic() < min(pause_end, started + args.seconds) or time.monotonic() < next_sample:
                server = tritonserver_of(launcher)
                ready = server is not None and http_ready(http_url)
                if ready and pid is not None and server.pid != pid:
                    windows.append([answered_at, time.time()])
                if ready:
                    answered_at, pid = time.time(), server.pid
                if time.monotonic() >= next_sample:
                    samples.append(memory_sample(server))
                    next_sample = time.monotonic() + 5
                time.sleep(0.5)
                if time.monotonic() >= pause_end:
                    break
        valid_results = []
        for i, process in enumerate(valid):
            process.wait(timeout=300)
            valid_results.append(json.loads((work / f"valid{i}.json").read_text()))
        failures_outside = [f for result in valid_results for f in result["failures"]
                            if not any(start - 1 <= f[0] <= end + 1 for start, end in windows)]
        rss, gpu = growth(samples, "rss_bytes"), growth(samples, "gpu_mib")
        rss_bound = max(RSS_GROWTH_BOUND[0], RSS_GROWTH_BOUND[1] * (samples[-1]["rss_bytes"] or 0))
        answered = sum(r["statuses"].get("OK", 0) for r in valid_results)
        report.update({
            "valid": {"sent": sum(r["sent"] for r in valid_results), "answered": answered,
                      "images_per_s": round(answered * args.images_per_request / args.seconds, 1),
                      "mismatched_answers": sum(r["mismatched"] for r in valid_results),
                      "statuses": [r["statuses"] for r in valid_results],
                      "failed_outside_restarts": len(failures_outside),
                      "failure_examples": sorted({f[1] for f in failures_outside})[:5]},
            "restarts": {"count": len(windows), "windows_s": [round(end - start, 1) for start, end in windows]},
            "abuse_cycles": len(abuse), "abuse_first_cycle": abuse[0] if abuse else None,
            "memory": {"rss_growth_second_half_mib": None if rss is None else round(rss / 2**20, 1),
                       "rss_bound_mib": round(rss_bound / 2**20, 1),
                       "gpu_growth_second_half_mib": gpu, "gpu_bound_mib": GPU_GROWTH_BOUND_MIB,
                       "rss_first_last_mib": [round(samples[0]["rss_bytes"] / 2**20),
                                              round(samples[-1]["rss_bytes"] / 2**20)]},
            "launcher_output_tail": (work / "launcher.out").read_text(errors="replace")[-3000:],
        })
        report["ok"] = bool(not failures_outside and not report["valid"]["mismatched_answers"]
                            and http_ready(http_url) and (rss is None or rss <= rss_bound)
                            and (gpu is None or gpu <= GPU_GROWTH_BOUND_MIB) and answered > 0
                            and report["valid"]["images_per_s"] >= args.min_images_per_s)
        report["min_images_per_s"] = args.min_images_per_s
    finally:
        for process in valid:
            if process.poll() is None:
                process.kill()
        if launcher.poll() is None:
            launcher.send_signal(2)
            try:
                launcher.wait(timeout=90)
            except subprocess.TimeoutExpired:
                launcher.kill()
        report["work_dir"] = str(work)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        lines = [f"# abuse soak: {report.get('ok')}", "", f"{report['device']}, {report['date']}, commit "
                 f"{report['commit']}", "", f"`{report['command']}`", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {json.dumps(v)} |" for k, v in report.items() if k != "launcher_output_tail"]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "launcher_output_tail"}, indent=2))
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
