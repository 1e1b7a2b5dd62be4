"""Each front end beside clients that misbehave in every way at once: the soak of results/front_end.json.

    python -m fusedresnet.campaigns.front_end_soak --seconds 600 --server-cores 0-11 --generator-cores 12-15 \\
        --out build/front_end_soak

One launcher per front end (`--front-ends`, default binary,inprocess: backend/triton_server/front_end.py), each started
as the README starts it (its default processes per GPU, under MPS on a GPU), pinned to its share of `--server-cores`,
all of them soaked at once, so that each front end faces the same minutes. This process, its valid clients and its
abusive ones run on `--generator-cores`.

Valid traffic, per front end: `--valid-processes` processes of `client_abuse valid` with the project's retries
(the clients' gRPC channel and its retry policy, UNAVAILABLE retried with backoff, as ResNetClient does) and as many
plain tritonclient users without any retry (`plain-client`: one attempt each, tritonclient's own channel), each keeping
`--valid-in-flight` single-image calls in flight, alternating custom and cuDNN. A call that never got an answer is a
failure; every answer is compared with the first answer to the same request.

Abuse, per front end, in a loop until the end, every kind in each cycle:
- `stopped-generator`: h2load with 8 connections x 64 streams stopped by its duration (1 s): hundreds of calls in
  flight when it exits;
- `killed-client`: a client process with 128 calls in flight killed (SIGKILL);
- `cut-http-bodies`: 16 HTTP infer requests whose bodies trickle in, half of them cut off half way;
- `tiny-deadlines`: 300 gRPC calls with a 3 ms deadline, 64 in flight.

Every 0.5 s a ServerReady on each front end's port, over a connection of its own: an unanswered one is half a second
without capacity. Crashes and restarts are the launchers' own lines (backend/serve.py). Writes <out>.json/.md:
per front end {name, soak: {duration_s, valid_sent, valid_failed_with_retries, valid_failed_without_retries,
capacity_zero_s, crashes, restarts, abuse_cycles}}; exits 1 if the in-process front end lost a call, crashed or
stopped answering.
"""

from __future__ import annotations

import argparse
import datetime
import json
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

from fusedresnet.backend.launcher import LaunchedServer, parse_settings
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.serve import grpc_ready
from fusedresnet.backend.spec import INPUT_SHAPES, INPUT_UINT8, MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.campaigns import client_abuse
from fusedresnet.campaigns.abuse_soak import (
    FAILURE_LINE,
    ONE_THREAD_PER_POOL,
    RECOVERY_LINE,
    port_answers,
    started_with_output,
)
from fusedresnet.loadtest.h2load_step import h2load_path
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.raw_grpc import MODEL_INFER, grpc_frame
from fusedresnet.loadtest.sweep import describe_device

ABUSE_KINDS = ("stopped-generator", "killed-client", "cut-http-bodies", "tiny-deadlines")
VALID_MODELS = (MODEL_CUSTOM, MODEL_CUDNN)
SAMPLE_EVERY_S = 0.5
KILLED_CLIENT_AFTER_S = 1.5
SETTLE_S = 120.0


def plain_client(url: str, model: str, seconds: float, in_flight: int, seed: int) -> dict:
    """A plain tritonclient user: `in_flight` threads, each with a client of its own (InferenceServerClient, its
    default channel: no retry policy), sending single-image calls one after another for `seconds`, each tried once.
    Every answer is compared with the first answer to the same image."""
    import tritonclient.grpc as grpcclient

    from fusedresnet.backend.spec import OUTPUT_LOGITS
    from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, relative_l2

    images = np.random.default_rng(seed).integers(0, 256, (4, *INPUT_SHAPES[INPUT_UINT8]), dtype=np.uint8)
    first: dict[int, np.ndarray] = {}
    counts = {"sent": 0, "answered": 0, "lost": 0, "mismatched": 0}
    failures: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def worker(slot: int):
        client = grpcclient.InferenceServerClient(url)
        n = slot
        while time.monotonic() < end:
            index = n % len(images)
            n += in_flight
            request = grpcclient.InferInput(INPUT_UINT8, [1, *INPUT_SHAPES[INPUT_UINT8]], "UINT8")
            request.set_data_from_numpy(images[index:index + 1])
            try:
                logits = client.infer(model, [request], outputs=[grpcclient.InferRequestedOutput(OUTPUT_LOGITS)],
                                      client_timeout=client_abuse.VALID_DEADLINE_S).as_numpy(OUTPUT_LOGITS)
            except Exception as error:   # noqa: BLE001 - every failure of a call is counted, whatever it is
                with lock:
                    counts["sent"] += 1
                    counts["lost"] += 1
                    failures.append(f"{time.time():.1f}: {str(error)[:160]}")
                continue
            with lock:
                counts["sent"] += 1
                counts["answered"] += 1
                counts["mismatched"] += relative_l2(logits, first.setdefault(index, logits)) > IMAGE_REL_L2_TOLERANCE
        client.close()

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**counts, "failures": failures[:10]}


def stopped_generator(url: str, request: bytes, folder: Path) -> dict:
    """h2load, 8 connections x 64 streams, stopped by its 1-s duration with its calls in flight."""
    body = folder / "request.grpc"
    if not body.is_file():
        body.write_bytes(grpc_frame(request))
    binary = h2load_path()
    if binary is None:
        raise FileNotFoundError("h2load not found: install Debian's nghttp2-client")
    done = subprocess.run([binary, f"http://{url}{MODEL_INFER}", "-c", "8", "-m", "64", "-t", "1", "-D", "1",
                           "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers"],
                          capture_output=True, text=True, timeout=60)
    return {"exit_status": done.returncode}


def killed_client(url: str, model: str) -> dict:
    """A client process with 128 calls in flight, killed (SIGKILL) once it has sent them."""
    process = subprocess.Popen([sys.executable, "-m", "fusedresnet.campaigns.client_abuse", "deadlines", "--url", url,
                                "--model", model, "--count", "100000", "--in-flight", "128", "--deadline", "60"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, **ONE_THREAD_PER_POOL))
    time.sleep(KILLED_CLIENT_AFTER_S)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return {"killed": process.pid}


def cut_http_bodies(http_url: str, model: str, images: np.ndarray) -> dict:
    host, port = http_url.rsplit(":", 1)
    head, body = client_abuse.http_infer_message(model, images, http_url)
    # about half of each body in 1 s (100 chunks of 1/200), then half of the requests cut off there
    result = client_abuse.slow_http_bodies(host, int(port), head, body, connections=16, chunk=len(body) // 200,
                                           interval_s=0.01, seconds=1.0)
    return {"cut_short": result["cut_short"], "finished_statuses": result["finished_statuses"]}


def tiny_deadlines(url: str, requests: list[bytes]) -> dict:
    return client_abuse.deadlines(url, requests, 300, 64, 0.003).summary()["statuses"]


class FrontEndUnderAbuse:
    """One front end's launcher, its valid clients, its abuse loop and its capacity samples."""

    def __init__(self, name: str, cores: list[int], work: Path, args):
        self.name, self.work, self.args = name, work / name, args
        self.work.mkdir(parents=True)
        settings = parse_settings(["--front-end", name, *args.launcher_args]).replace(
            log_file=self.work / "server.log", admin_token=secrets.token_urlsafe(24))
        self.server = LaunchedServer(settings, self.work / "launcher.out", cores=cores)
        self.valid: list[tuple[bool, subprocess.Popen]] = []
        self.cycles: list[dict] = []
        self.unanswered_samples = 0
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start_valid(self, seconds: float):
        for retries in (True, False):
            for i in range(self.args.valid_processes):
                model = VALID_MODELS[i % len(VALID_MODELS)]
                tag = f"valid_{'retries' if retries else 'no_retries'}{i}"
                command = ([sys.executable, "-m", "fusedresnet.campaigns.client_abuse", "valid", "--url",
                            self.server.grpc_url, "--model", model, "--seconds", str(seconds), "--in-flight",
                            str(self.args.valid_in_flight), "--images-per-request", "1", "--seed", str(i)]
                           if retries else
                           [sys.executable, "-m", "fusedresnet.campaigns.front_end_soak", "plain-client", "--url",
                            self.server.grpc_url, "--model", model, "--seconds", str(seconds), "--in-flight",
                            str(self.args.valid_in_flight), "--seed", str(i)])
                self.valid.append((retries, started_with_output(command, self.work / f"{tag}.json",
                                                                self.work / f"{tag}.err",
                                                                env=dict(os.environ, **ONE_THREAD_PER_POOL))))

    def abuse_loop(self, end: float):
        images = np.random.default_rng(11).integers(0, 256, (4, *INPUT_SHAPES[INPUT_UINT8]), dtype=np.uint8)
        requests = {model: [client_abuse.infer_request(model, images[i:i + 1]) for i in range(4)]
                    for model in VALID_MODELS}
        while time.monotonic() < end and not self.stop.is_set():
            model = VALID_MODELS[len(self.cycles) % len(VALID_MODELS)]
            cycle = {"t": round(time.monotonic() - self.started, 1), "model": model}
            for kind in ABUSE_KINDS:
                try:
                    if kind == "stopped-generator":
                        cycle[kind] = stopped_generator(self.server.grpc_url, requests[model][0], self.work)
                    elif kind == "killed-client":
                        cycle[kind] = killed_client(self.server.grpc_url, model)
                    elif kind == "cut-http-bodies":
                        cycle[kind] = cut_http_bodies(self.server.http_url, model, images[:1])
                    else:
                        cycle[kind] = tiny_deadlines(self.server.grpc_url, requests[model])
                except (OSError, subprocess.SubprocessError) as error:   # the server refused or hung up: go on
                    cycle[kind] = {"error": f"{type(error).__name__}: {error}"[:200]}
            self.cycles.append(cycle)

    def sample_capacity(self):
        while not self.stop.wait(SAMPLE_EVERY_S):
            if not port_answers(self.server.grpc_url, len(self.server.metrics_ports)):
                self.unanswered_samples += 1

    def report(self) -> dict:
        failed = {True: 0, False: 0}
        sent = mismatched = 0
        examples: list[str] = []
        for i, (retries, process) in enumerate(self.valid):
            tag = f"valid_{'retries' if retries else 'no_retries'}{i % self.args.valid_processes}"
            try:
                result = json.loads((self.work / f"{tag}.json").read_text())
            except json.JSONDecodeError:
                raise SystemExit(f"{self.name}: valid process {tag} wrote no report (exit {process.returncode}):\n"
                                 + (self.work / f"{tag}.err").read_text(errors="replace")[-2000:]) from None
            sent += result["sent"]
            failed[retries] += result["lost"]
            mismatched += result["mismatched"]
            examples += [str(example) for example in result["failures"][:3]]
        output = self.server.output()
        return {"name": self.name, "front_end_line": next((line for line in output.splitlines()
                                                            if line.startswith("fusedresnet: front end:")), None),
                "soak": {"duration_s": self.args.seconds, "valid_sent": sent,
                         "valid_failed_with_retries": failed[True], "valid_failed_without_retries": failed[False],
                         "valid_mismatched": mismatched,
                         "capacity_zero_s": round(self.unanswered_samples * SAMPLE_EVERY_S, 1),
                         "crashes": len(FAILURE_LINE.findall(output)),
                         "restarts": len(RECOVERY_LINE.findall(output)),
                         "abuse_cycles": len(self.cycles)},
                "abuse_first_cycle": self.cycles[0] if self.cycles else None,
                "failure_lines": FAILURE_LINE.findall(output)[:10], "valid_failure_examples": examples[:10]}


# The soak's figures per front end, in its reports' tables.
SOAK_FIELDS = ("duration_s", "valid_sent", "valid_failed_with_retries", "valid_failed_without_retries",
               "capacity_zero_s", "crashes", "restarts", "abuse_cycles")


def markdown(report: dict) -> str:
    lines = [f"# Front ends under client abuse ({report['date']})", "", f"{report['device']}; code "
             f"{report['git_commit']}; `{report['command']}`; servers on cores {report['server_cores']}, clients on "
             f"{report['generator_cores']}.", "",
             *table(["front end", *SOAK_FIELDS], ([f["name"], *(f["soak"][key] for key in SOAK_FIELDS)]
                                                   for f in report["front_ends"]), "l" + "r" * len(SOAK_FIELDS))]
    lines += ["", report["pattern"], ""]
    return "\n".join(lines)


def infer_threads(soak: dict, throughput: list[dict], name: str) -> int:
    """The in-process front end's gRPC infer threads in these reports: a --grpc-infer-thread-count of their
    launcher arguments, else the default of the code that ran (each report's code: this one's, for these results)."""
    from fusedresnet.backend.triton_server.inprocess_server import GRPC_INFER_THREADS

    given = [soak.get("command", "")] + [report.get("launcher_args", "") for report in throughput
                                         if f"--front-end {name}" in report.get("launcher_args", "")]
    counts = {int(found) for text in given for found in re.findall(r"--grpc-infer-thread-count[= ](\d+)", text)}
    if len(counts) > 1:
        raise ValueError(f"the reports ran {name} with different gRPC infer threads: {sorted(counts)}")
    return counts.pop() if counts else GRPC_INFER_THREADS


POINT = ("protocol", "model", "images_per_request", "shared_memory", "processes_per_gpu")


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per point (POINT) of a front end's throughput rows, several where it was measured in several rounds:
    the medians of img/s, p50 and p99, with every round's img/s (`img_per_s_rounds`) in the order measured."""
    points: dict[tuple, list[dict]] = {}
    for row in rows:
        points.setdefault(tuple(row[key] for key in POINT), []).append(row)
    return [{**measured[0], **{key: round(float(np.median([row[key] for row in measured])), 2)
                               for key in ("img_per_s", "p50_ms", "p99_ms")},
             "img_per_s_rounds": [row["img_per_s"] for row in measured]}
            for measured in points.values()]


def front_end_results(soak: dict, throughput: list[dict], notes: list[str]) -> dict:
    """results/front_end.json from this campaign's soak report and campaigns/front_door.py's reports (each run with
    `--launcher-args "--front-end <name> ..."`): per front end its soak and its throughput rows."""
    from fusedresnet.backend.serve import DEFAULT_PROCESSES_PER_GPU
    from fusedresnet.backend.triton_server.front_end import TRITONFRONTEND_VERSION

    changed = [report["command"] for report in throughput if report.get("server_env")]
    if changed:   # a profile's 'before' runs another path: its figures are not the front end's as shipped
        raise ValueError(f"throughput reports run with --server-env, not as shipped: {changed}")
    front_ends = []
    for entry in soak["front_ends"]:
        name = entry["name"]
        rows = median_rows([{**{key: row[key] for key in ("model", "images_per_request", "shared_memory", "img_per_s",
                                                          "p50_ms", "p99_ms", "processes_per_gpu")},
                             "protocol": row.get("protocol", "grpc")}
                            for report in throughput if f"--front-end {name}" in report.get("launcher_args", "")
                            for row in report["layouts"]])
        front_ends.append({"name": "binary-2.51" if name == "binary" else name,
                           "triton_frontend_version": "2.51.0" if name == "binary" else TRITONFRONTEND_VERSION,
                           "processes_per_gpu": DEFAULT_PROCESSES_PER_GPU,
                           "infer_threads": None if name == "binary" else infer_threads(soak, throughput, name),
                           "soak": entry["soak"], "soak_failure_examples": entry.get("valid_failure_examples", []),
                           "throughput": rows})
    return {"device": soak["device"], "date": soak["date"], "git_commit": soak["git_commit"],
            "server_cores": soak["server_cores"], "generator_cores": soak["generator_cores"],
            "soak_command": soak["command"], "soak_pattern": soak["pattern"],
            "throughput_runs": [{key: report.get(key) for key in ("date", "git_commit", "command")}
                                for report in throughput], "front_ends": front_ends,
            "notes": notes}


def best_setting(levers: list[dict], model: str = MODEL_CUSTOM) -> tuple[int, str, dict]:
    """The launcher setting of campaigns/front_door.py's lever reports (each its `launcher_args`, each layout its
    processes per GPU) that serves `model` fastest over plain gRPC: the highest geometric mean of its img/s at every
    images/request measured. Returns (processes per GPU, launcher args, {images/request: img/s})."""
    scored = []
    for report in levers:
        for processes in sorted({row["processes_per_gpu"] for row in report["layouts"]}):
            figures = {row["images_per_request"]: row["img_per_s"] for row in report["layouts"]
                       if (row["processes_per_gpu"], row["model"], row["shared_memory"]) == (processes, model, False)}
            if figures:
                score = float(np.prod(list(figures.values()))) ** (1 / len(figures))
                scored.append((score, processes, report.get("launcher_args", ""), figures))
    if not scored:
        raise ValueError(f"no plain gRPC figures of {model} in the lever reports")
    _, processes, launcher_args, figures = max(scored, key=lambda item: item[0])
    return processes, launcher_args, figures


def choose_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="front_end_soak choose", description=best_setting.__doc__)
    parser.add_argument("levers", type=Path, nargs="+", help="front_door.py reports (.json)")
    args = parser.parse_args(argv)
    processes, launcher_args, figures = best_setting([json.loads(path.read_text()) for path in args.levers])
    print(f"chosen: {processes} process(es) per GPU, launcher args {launcher_args!r}: {figures}", file=sys.stderr)
    print(processes)
    print(launcher_args)
    return 0


def plain_client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="front_end_soak plain-client")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default=MODEL_CUSTOM)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(plain_client(args.url, args.model, args.seconds, args.in_flight, args.seed)))
    return 0


def results_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="front_end_soak results")
    parser.add_argument("--soak", type=Path, required=True, help="this campaign's report (.json)")
    parser.add_argument("--throughput", type=Path, nargs="*", default=[], help="front_door.py reports (.json)")
    parser.add_argument("--note", action="append", default=[], help="a line for the report's notes")
    parser.add_argument("--out", type=Path, default=Path("results/front_end.json"))
    args = parser.parse_args(argv)
    results = front_end_results(json.loads(args.soak.read_text()),
                                [json.loads(path.read_text()) for path in args.throughput], args.note)
    write_json_and_markdown(args.out, results, results_markdown(results))
    return 0


def results_markdown(results: dict) -> str:
    """results/front_end.md from front_end_results()."""
    lines = [f"# Front ends: Triton 2.51's binary against the in-process one ({results['date']})", "",
             f"{results['device']}; code {results['git_commit']}; servers on cores {results['server_cores']}, clients "
             f"on {results['generator_cores']}.", "", f"Soak: `{results['soak_command']}`. {results['soak_pattern']}",
             "", *table(["front end", "frontend version", "processes/GPU", *SOAK_FIELDS],
                        ([f["name"], f["triton_frontend_version"], f["processes_per_gpu"],
                          *(f["soak"][key] for key in SOAK_FIELDS)] for f in results["front_ends"]),
                        "llr" + "r" * len(SOAK_FIELDS))]
    rows = [(f["name"], row) for f in results["front_ends"] for row in f["throughput"]]
    lines += ["", "## Throughput", ""]
    runs = {(run["date"], run["git_commit"]) for run in results.get("throughput_runs", []) if run.get("date")}
    if runs and runs != {(results["date"], results["git_commit"])}:
        lines += [f"Measured in steps starting {', '.join(sorted(date[:16].replace('T', ' ') for date, _ in runs))} "
                  f"(code {', '.join(sorted({(commit or '?')[:7] for _, commit in runs}))}), not in the soak's run.",
                  ""]
    if rows:
        lines += table(["front end", "processes/GPU", "protocol", "model", "images/request", "shared memory",
                        "img/s (median)", "each round", "p50 ms", "p99 ms"],
                       ([name, r["processes_per_gpu"], r["protocol"], r["model"], r["images_per_request"],
                         "CUDA" if r["shared_memory"] else "-", f"{r['img_per_s']:,.0f}",
                         ", ".join(f"{figure:,.0f}" for figure in r.get("img_per_s_rounds", [r["img_per_s"]])),
                         r["p50_ms"], r["p99_ms"]]
                        for name, r in rows), "lrllrlrrrr")
        by_point = {(name, r["protocol"], r["model"], r["images_per_request"], r["processes_per_gpu"]): r["img_per_s"]
                    for name, r in rows if not r["shared_memory"]}
        ratios = [(point, figure / by_point[("binary-2.51", *point)]) for (name, *point), figure in by_point.items()
                  if name == "inprocess" and ("binary-2.51", *point) in by_point]
        if ratios:
            lines += ["", "In-process over binary, without shared memory (target: at least 1.00 at every point):", "",
                      *table(["protocol", "model", "images/request", "processes/GPU", "in-process / binary"],
                             ([*point, f"{ratio:.2f}"] for point, ratio in ratios), "llrrr")]
    else:
        lines.append("Not measured in this run.")
    lines += ["", "## Notes", "", *(f"- {note}" for note in results["notes"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plain-client"]:
        return plain_client_main(argv[1:])
    if argv[:1] == ["results"]:
        return results_main(argv[1:])
    if argv[:1] == ["choose"]:
        return choose_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--front-ends", default="binary,inprocess")
    parser.add_argument("--server-cores", required=True)
    parser.add_argument("--generator-cores", required=True)
    parser.add_argument("--valid-processes", type=int, default=2, help="per front end, with retries and without each")
    parser.add_argument("--valid-in-flight", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("build/front_end_soak"))
    parser.add_argument("launcher_args", nargs="*", help="more launcher arguments, after --")
    args = parser.parse_args(argv)
    if h2load_path() is None:
        parser.error("h2load not found (the stopped generators): install Debian's nghttp2-client")
    names = [name for name in args.front_ends.split(",") if name]
    server_cores, generator_cores = cpu_list(args.server_cores), cpu_list(args.generator_cores)
    share = len(server_cores) // len(names)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="front_end_soak_", dir=args.out.parent))
    inherited = os.sched_getaffinity(0)
    front_ends = [FrontEndUnderAbuse(name, server_cores[i * share:(i + 1) * share], work, args)
                  for i, name in enumerate(names)]
    report = {"device": describe_device(), "git_commit": git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python -m fusedresnet.campaigns.front_end_soak " + " ".join(argv),
              "server_cores": cpu_text(server_cores), "generator_cores": cpu_text(generator_cores),
              "pattern": f"Valid, per front end: {args.valid_processes} client processes with the project's retries "
                         f"and {args.valid_processes} without, {args.valid_in_flight} single-image calls in flight "
                         f"each ({', '.join(VALID_MODELS)} in turn); abuse, per front end, every cycle: "
                         f"{', '.join(ABUSE_KINDS)}; ServerReady on each port every {SAMPLE_EVERY_S} s (on up to "
                         "N+1 new connections where N processes share it, as a reconnecting client gets it)."}
    try:
        began = time.monotonic()
        for front_end in front_ends:   # one after the other: their model loads do not compete
            front_end.server.start(ready_timeout_s=600)
            print(f"{front_end.name}: ready {time.monotonic() - began:.1f} s after the start", flush=True)
        os.sched_setaffinity(0, generator_cores)   # this process, its clients and its abusers
        end = time.monotonic() + args.seconds
        for front_end in front_ends:
            front_end.started = time.monotonic()
            front_end.start_valid(args.seconds)
            for target, target_args in ((front_end.abuse_loop, (end,)), (front_end.sample_capacity, ())):
                thread = threading.Thread(target=target, args=target_args, daemon=True)
                thread.start()
                front_end.threads.append(thread)
        for front_end in front_ends:
            for _, process in front_end.valid:
                process.wait(timeout=args.seconds + client_abuse.VALID_DEADLINE_S + 120)
        print(f"valid clients done {time.monotonic() - began:.1f} s after the start", flush=True)
        # a restart of the last moments must end with a ready server
        settle_by = time.monotonic() + SETTLE_S
        while time.monotonic() < settle_by and not all(grpc_ready(f.server.grpc_url) for f in front_ends):
            time.sleep(1)
        for front_end in front_ends:
            front_end.stop.set()
            for thread in front_end.threads:
                thread.join(timeout=120)
        print(f"abuse over {time.monotonic() - began:.1f} s after the start", flush=True)
        report["front_ends"] = [front_end.report() for front_end in front_ends]
    finally:
        os.sched_setaffinity(0, inherited)
        for front_end in front_ends:
            front_end.stop.set()
            for _, process in front_end.valid:
                if process.poll() is None:
                    process.kill()
            front_end.server.stop(90)
        report["work_dir"] = str(work)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        if "front_ends" in report:
            args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    inprocess = next((f["soak"] for f in report["front_ends"] if f["name"] == "inprocess"), None)
    if inprocess and (inprocess["crashes"] or inprocess["valid_failed_with_retries"]
                      or inprocess["valid_failed_without_retries"] or inprocess["capacity_zero_s"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
