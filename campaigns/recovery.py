"""How fast a crashed server process is back: the shipped server, one process killed, again and again.

    python -m fusedresnet.campaigns.recovery --out results/recovery.json --server-cores 0-15 \\
        --mps off,on --early-context off,on --kills 3

For each variant (CUDA MPS off/on x the early CUDA context off/on, backend/engines/cuda_context.py) one launcher
serves the shipped model repository (every entry, the configured instance counts; the launcher's default
processes per GPU unless --processes says) on GPU `--gpu`, pinned to `--server-cores`. Once it is ready, its newest
tritonserver is killed with SIGKILL (a crash) `--kills` times, each time after the launcher had it ready again
and `--settle-s` more. Kept per kill: seconds from the kill to the launcher's "ready again" line, and where the
restart went, read from Triton's own log: its first line, each model loaded, the endpoints started, and each
model's start phases (its slowest instance: stub start and imports, CUDA context, engine, warm-up;
backend/triton_adapter/python_model.py). Each variant's median is set against the target (RECOVERY_TARGET_S).

Writes `--out` (.json, and .md beside it): device, date, git_commit, command, server_cores, and the variants
[{mps, early_context, processes_per_gpu, ready_again_s: [...], median_s, kills: [...]}].
"""

from __future__ import annotations

import argparse
import datetime
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fusedresnet.backend.engines.cuda_context import EARLY_CONTEXT_ENV
from fusedresnet.backend.launcher import DEFAULT_READY_TIMEOUT_S, LaunchedServer, parse_settings
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.backend.spec import MODEL_REPOSITORY
from fusedresnet.campaigns.front_door import RECOVERY_TARGET_S, recovery
from fusedresnet.loadtest.measurements import cpu_list, cpu_text
from fusedresnet.loadtest.sweep import describe_device


def on_off(text: str) -> list[bool]:
    values = text.split(",")
    if not set(values) <= {"on", "off"}:
        raise argparse.ArgumentTypeError(f"on, off or both (comma-separated), not {text!r}")
    return [value == "on" for value in values]


def measure_variant(mps: bool, early_context: bool, args, work: Path) -> dict:
    name = f"mps-{'on' if mps else 'off'}-early-{'on' if early_context else 'off'}"
    # the campaign's choices first: launcher_args may override them
    settings = parse_settings(["--model-repository", str(args.repository), *(["--gpus", args.gpu] if args.gpu else []),
                               *(["--processes-per-gpu", str(args.processes)] if args.processes else []),
                               "--mps", "on" if mps else "off", *shlex.split(args.launcher_args)])
    settings = settings.replace(log_file=work / f"{name}.log", admin_token=secrets.token_urlsafe(24))
    server = LaunchedServer(settings, work / f"{name}.out", cores=cpu_list(args.server_cores),
                            env={EARLY_CONTEXT_ENV: "1" if early_context else "0"})
    server.start(DEFAULT_READY_TIMEOUT_S)
    kills = []
    try:
        for _ in range(args.kills):
            time.sleep(args.settle_s)
            kill = recovery(server)
            kills.append(kill)
            print(f"  {name}: ready again {kill['ready_again_s']} s; {kill.get('model_loads', {})}", flush=True)
            if kill["ready_again_s"] is None:
                break
    finally:
        server.stop()
    times = [kill["ready_again_s"] for kill in kills if kill["ready_again_s"] is not None]
    return {"mps": mps, "early_context": early_context, "processes_per_gpu": args.processes,
            "first_start_s": round(server.ready_s, 2), "ready_again_s": times,
            "median_s": round(statistics.median(times), 2) if times else None, "kills": kills}


def markdown(results: dict) -> str:
    lines = [f"# Recovery: a crashed server process ready again ({results['date']})", "",
             f"{results['device']}; code {results['git_commit']}; server on cores {results['server_cores']}, GPU "
             f"{results['gpu']}; the shipped model repository ({results['repository']})"
             + (f"; launcher options `{results['launcher_args']}`" if results.get("launcher_args") else "") + ".",
             f"Command: `{results['command']}`.", "",
             f"Each kill: SIGKILL to the newest tritonserver, seconds until the launcher's ready-again line (target "
             f"<= {RECOVERY_TARGET_S:.0f} s); where the last restart went, from its first log line (Triton's "
             "timestamps).", ""]

    def cells(v):
        last = v["kills"][-1].get("model_loads", {}) if v["kills"] else {}
        loads = ", ".join(f"{k} {value}" for k, value in last.items() if k != "start_phases")
        met = "-" if v["median_s"] is None else ("met" if v["median_s"] <= RECOVERY_TARGET_S else "**missed**")
        return ["on" if v["mps"] else "off", "on" if v["early_context"] else "off", v["processes_per_gpu"] or "default",
                v["first_start_s"], ", ".join(map(str, v["ready_again_s"])), v["median_s"], met, loads]
    lines += table(["CUDA MPS", "early CUDA context", "processes/GPU", "first start s", "ready again s (each kill)",
                    "median s", "target", "last restart: models loaded, s from its first log line"],
                   map(cells, results["variants"]), "llrrlr")
    lines += ["", "Start phases of the last restart (each model's slowest instance, s):", ""]
    for v in results["variants"]:
        last = v["kills"][-1].get("model_loads", {}) if v["kills"] else {}
        for model, phases in last.get("start_phases", {}).items():
            lines.append(f"- MPS {'on' if v['mps'] else 'off'}, early context {'on' if v['early_context'] else 'off'}, "
                         f"{model}: " + ", ".join(f"{name} {value:.2f}" for name, value in phases.items()))
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/recovery.json"))
    parser.add_argument("--server-cores", required=True)
    parser.add_argument("--gpu", default="0", help="the GPU of the server ('': no --gpus, as on a host without one)")
    parser.add_argument("--processes", type=int, help="--processes-per-gpu (default: the launcher's)")
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--mps", type=on_off, default=[False, True], help="off, on, or off,on")
    parser.add_argument("--early-context", type=on_off, default=[False, True], help="off, on, or off,on")
    parser.add_argument("--launcher-args", default="", help="more launcher options, e.g. '--instances gpu'")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=3.0, help="seconds between ready (again) and a kill")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="recovery_"))
    results = {"device": describe_device(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "git_commit": git_commit(), "gpu": args.gpu, "server_cores": cpu_text(cpu_list(args.server_cores)),
               "repository": str(args.repository), "launcher_args": args.launcher_args,
               "command": "python -m fusedresnet.campaigns.recovery " + " ".join(argv or sys.argv[1:]),
               "target_s": RECOVERY_TARGET_S, "variants": [], "work": str(work)}
    for mps in args.mps:
        for early in args.early_context:
            print(f"== MPS {'on' if mps else 'off'}, early CUDA context {'on' if early else 'off'}", flush=True)
            results["variants"].append(measure_variant(mps, early, args, work))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_json_and_markdown(args.out, results, markdown(results))
    print(markdown(results))
    return 0 if all(v["median_s"] is not None for v in results["variants"]) else 3


if __name__ == "__main__":
    sys.exit(main())
