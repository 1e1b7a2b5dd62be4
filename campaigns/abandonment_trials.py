"""Crash rate of Triton 2.51 under repeated gRPC abandonment, per candidate mitigation.

    python -m fusedresnet.campaigns.abandonment_trials --rounds 40 --out results/robustness_abandonment

For each candidate (a set of tritonserver flags), a server on the zero-answer model
(loadtest/zero_model, alone in a repository: the fastest answers, where the crash is likeliest) takes
`rounds` rounds of `client_abuse.abandon`: 256 calls kept in flight for `hold` seconds on a
fresh connection, then the connection closed with whatever is in flight. After each round the
server counts as crashed when it has exited or its gRPC endpoint does not answer ServerReady
within 5 s twice (after `sync.cc:105 ASSERTION FAILED: prior > 0` Triton 2.51 may hang in its
abort handler, HTTP still answering). A crashed server is killed and started again, and the
rounds go on, so each candidate gets the same load: crashes per round is its crash rate.

Writes <out>.json and <out>.md (device, date, commit, command, one row per candidate).
"""

from __future__ import annotations

import argparse
import datetime
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.serve import ServerSettings, TritonServer, exit_cause, grpc_ready, launch
from fusedresnet.backend.spec import INPUT_SHAPES, INPUT_UINT8, ZERO_MODEL
from fusedresnet.campaigns.client_abuse import abandon, infer_request
from fusedresnet.loadtest.perf_analyzer import zero_model_repository
from fusedresnet.loadtest.sweep import describe_device

CANDIDATES = {
    "as shipped": [],
    "keepalive 10 s + ping strikes 2": ["--grpc-keepalive-time=10000", "--grpc-keepalive-timeout=5000",
                                        "--grpc-http2-max-ping-strikes=2"],
    "max connection age 30 s (+5 s grace)": ["--grpc-max-connection-age=30000",
                                             "--grpc-max-connection-age-grace=5000"],
    "infer allocation pool 0": ["--grpc-infer-allocation-pool-size=0"],
}


def crashed(server: TritonServer) -> str | None:
    """Why the server counts as crashed, or None while it answers."""
    if server.process.poll() is not None:
        return exit_cause(server.process.returncode)
    if grpc_ready(server.grpc_url) or grpc_ready(server.grpc_url):
        return None
    return "gRPC unanswered (alive: hung)" if server.process.poll() is None else exit_cause(server.process.returncode)


def run_candidate(name: str, flags: list[str], rounds: int, in_flight: int, hold_s: float, log_dir: Path,
                  admin_token: str, repository: Path) -> dict:
    request = [infer_request(ZERO_MODEL, np.zeros((1, *INPUT_SHAPES[INPUT_UINT8]), np.uint8))]
    http_port, grpc_port, metrics_port = free_ports(3)
    slug = re.sub(r"\W+", "_", name).strip("_")
    settings = ServerSettings(repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                              processes_per_gpu=1, admin_token=admin_token, log_file=log_dir / f"{slug}.log",
                              triton_args=flags, mps="off")
    crashes, answered, abandoned, sent = [], 0, 0, 0
    started = time.monotonic()
    server = launch(settings).first     # restarted here, by hand, after each crash
    try:
        for round_index in range(rounds):
            outcome = abandon(server.grpc_url, request, 1, in_flight, hold_s)[0]
            sent += outcome.sent
            answered += outcome.statuses.get("OK", 0)
            abandoned += outcome.statuses.get("ABANDONED", 0)
            cause = crashed(server)
            print(f"{name}: round {round_index + 1}/{rounds}: {dict(outcome.statuses)}"
                  + (f"; CRASHED ({cause})" if cause else ""), flush=True)
            if cause:
                log = Path(server.log_file).read_text(errors="replace")
                crashes.append({"round": round_index + 1, "cause": cause,
                                "assertion": "sync.cc:105" in log.split("Started GRPCInferenceService")[-1]})
                server.kill()
                server.restarts += 1
                server.start()
    finally:
        server.kill()
    return {"candidate": name, "flags": flags, "rounds": rounds, "crashes": len(crashes),
            "crashes_per_100_rounds": round(100 * len(crashes) / rounds, 1), "crash_details": crashes,
            "calls_sent": sent, "calls_answered": answered, "calls_abandoned": abandoned,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--hold", type=float, default=1.5, help="seconds of load before each abandonment")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated names of CANDIDATES")
    parser.add_argument("--out", type=Path, default=Path("build/robustness_abandonment"))
    args = parser.parse_args(argv)
    names = [name for name in args.candidates.split(",") if name]
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; known: {list(CANDIDATES)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path("build") / f"{args.out.name}_logs"   # server logs: the crashes' tails are in the report
    log_dir.mkdir(exist_ok=True)
    report = {"device": describe_device(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                  "%Y-%m-%dT%H:%M:%SZ"), "commit": git_commit(),
              "command": "python -m fusedresnet.campaigns.abandonment_trials " + " ".join(argv or sys.argv[1:]),
              "model": f"{ZERO_MODEL} (loadtest/zero_model)", "in_flight": args.in_flight,
              "hold_s": args.hold, "candidates": []}
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="abandonment-") as scratch:
        repository = zero_model_repository(Path(scratch) / "models")
        for name in names:
            report["candidates"].append(run_candidate(name, CANDIDATES[name], args.rounds, args.in_flight, args.hold,
                                                      log_dir, token, repository))
            write_report(report, args.out)
    return 0


def write_report(report: dict, out: Path):
    lines = ["# Triton 2.51 under repeated gRPC abandonment: crash rate per candidate", "",
             f"{report['device']}, {report['date']}, commit {report['commit']}; model {report['model']}; each round "
             f"keeps {report['in_flight']} calls in flight for {report['hold_s']} s on a fresh connection, then "
             "closes it with whatever is in flight.", "", f"`{report['command']}`", ""]

    def cells(row):
        where = ", ".join(f"{c['round']} ({c['cause']}{', sync.cc:105' if c['assertion'] else ''})"
                          for c in row["crash_details"]) or "-"
        return [row["candidate"], " ".join(row["flags"]) or "-", row["rounds"], row["crashes"],
                row["crashes_per_100_rounds"], row["calls_answered"], row["calls_abandoned"], where]
    lines += table(["candidate", "tritonserver flags", "rounds", "crashes", "per 100 rounds", "calls answered",
                    "calls abandoned", "crashed at rounds (cause)"], map(cells, report["candidates"]))
    write_json_and_markdown(out, report, "\n".join(lines) + "\n", indent=2)


if __name__ == "__main__":
    sys.exit(main())
