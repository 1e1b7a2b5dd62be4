"""Several GPUs on one host: aggregate img/s on every GPU against one GPU of the same host.

    python -m fusedresnet.loadtest.multi_gpu --out results/multi_gpu.json

Starts the server twice through the launcher (`python -m fusedresnet.backend.serve
--gpus ...`), on GPU 0 alone and then on every GPU, with the same model
repository and settings (the configs' instance count on each GPU), and drives
each with the project's light load generator (`loadtest/grpc_flood.py`) at a few
levels per series: 1 image/request, 32 images/request, and 32 images/request in
system shared memory. The peak of each series on N GPUs over its peak on one
GPU is the scaling (`scaling_1`, `scaling_32`). Every step carries Triton's own
figures and `per_gpu`: the images each GPU's instances inferred, their share and
the GPU's utilisation (`triton_metrics.per_gpu`). At the peak of each series on
all GPUs one more step runs with twice the load-generator processes: if it gives
no more throughput, the generator was not the limit.

Writes the JSON (device, date, command, gpus, steps, summary) and a markdown
report beside it (`--out` with .md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import secrets
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fusedresnet.backend.spec import MODEL_CUSTOM, MODEL_REPOSITORY, MODELS
from fusedresnet.backend.triton_install import host_gpus
from fusedresnet.loadtest import grpc_flood
from fusedresnet.loadtest.serving_sequence import LaunchedServer
from fusedresnet.loadtest.sweep import describe_device

SCALING_TARGET_32 = 1.8     # issue 12: at least 1.8x on two GPUs at 32 images/request


@dataclass(frozen=True)
class Series:
    images_per_request: int
    shared_memory: str
    levels_per_gpu: tuple[int, ...]     # requests in flight per GPU served
    models: tuple[str, ...]

    @property
    def name(self) -> str:
        shm = "" if self.shared_memory == "none" else f", {self.shared_memory} shm"
        return f"{self.images_per_request} img/request{shm}"


SERIES = (
    Series(1, "none", (128, 256), MODELS),
    Series(32, "none", (32, 64), MODELS),
    Series(32, "system", (32, 64), (MODEL_CUSTOM,)),
)


def run_configuration(gpus: str, gpu_count: int, series: tuple[Series, ...], processes: int, seconds: float,
                      scratch: Path, token_file: Path, log_dir: Path) -> list[dict]:
    label = f"{gpu_count} GPU" + ("s" if gpu_count > 1 else "")
    server = LaunchedServer(MODEL_REPOSITORY, {}, MODEL_REPOSITORY.parent, token_file,
                            log_dir / f"server_{gpu_count}gpu.log", launcher_args=["--gpus", gpus])
    records = []

    def step(model, s, concurrency, step_processes, role):
        print(f"== {label}: {model}, {s.name}, {concurrency} in flight, {step_processes} processes", flush=True)
        try:
            record = grpc_flood.run_step(model, server.url, server.metrics_url, concurrency, s.images_per_request,
                                         processes=step_processes, measure_s=seconds,
                                         shared_memory=s.shared_memory, admin_token=token_file.read_text().strip())
        except Exception as error:   # one failing step is reported, the others still run
            record = {"model": model, "images_per_request": s.images_per_request, "concurrency": concurrency,
                      "shared_memory": s.shared_memory, "error": str(error)}
        record.update({"gpus": gpu_count, "visible_gpus": gpus, "series": s.name, "role": role})
        print(json.dumps({k: record.get(k) for k in ("img_per_s", "p50_ms", "p99_ms", "avg_batch",
                                                     "client_cpu_percent", "per_gpu", "error")}), flush=True)
        records.append(record)
        return record

    try:
        for s in series:
            for model in s.models:
                measured = [step(model, s, level * gpu_count, processes, "level") for level in s.levels_per_gpu]
                if gpu_count > 1:
                    best = max(measured, key=lambda r: r.get("img_per_s") or 0)
                    step(model, s, best["concurrency"], 2 * processes, "generator check")
    finally:
        server.stop()
    return records


def peak(steps: list[dict], model: str, series: str, gpus: int) -> dict | None:
    candidates = [s for s in steps if s["model"] == model and s["series"] == series and s["gpus"] == gpus
                  and s["role"] == "level" and s.get("img_per_s")]
    return max(candidates, key=lambda s: s["img_per_s"]) if candidates else None


def summarize(steps: list[dict], gpu_count: int) -> dict:
    summary = {}
    for s in SERIES:
        for model in s.models:
            one, many = peak(steps, model, s.name, 1), peak(steps, model, s.name, gpu_count)
            if not (one and many):
                continue
            check = next((r for r in steps if r["model"] == model and r["series"] == s.name
                          and r["gpus"] == gpu_count and r["role"] == "generator check" and r.get("img_per_s")), None)
            summary.setdefault(model, {})[s.name] = {
                "img_per_s_1gpu": one["img_per_s"], f"img_per_s_{gpu_count}gpu": many["img_per_s"],
                "scaling": many["img_per_s"] / one["img_per_s"],
                "p99_ms_1gpu": one.get("p99_ms"), f"p99_ms_{gpu_count}gpu": many.get("p99_ms"),
                "per_gpu_at_peak": many.get("per_gpu"),
                "utilization_1gpu": one.get("gpu_utilization"),
                "client_cpu_percent_at_peak": many.get("client_cpu_percent"),
                "generator_check_img_per_s": check["img_per_s"] if check else None,
                "generator_check_processes": check.get("processes") if check else None,
            }
    custom = summary.get(MODEL_CUSTOM, {})
    return {"per_model": summary,
            "scaling_1": custom.get(SERIES[0].name, {}).get("scaling"),
            "scaling_32": custom.get(SERIES[1].name, {}).get("scaling"),
            "scaling_32_target": SCALING_TARGET_32}


def fmt(value, spec=".0f", default="-"):
    return default if value is None else format(value, spec)


def markdown(results: dict) -> str:
    n = results["gpus"]
    summary = results["summary"]
    lines = [f"# Several GPUs: {n} GPUs against one of the same host{results.get('label', '')}", "",
             f"Device: {results['device']}. Date: {results['started_at']}. Commit: {results.get('git_commit') or '-'}.",
             f"Command: `{results['command']}`", "",
             f"Custom model at 32 images/request: **{fmt(summary['scaling_32'], '.2f')}x** on {n} GPUs "
             f"(target {summary['scaling_32_target']}x); at 1 image/request {fmt(summary['scaling_1'], '.2f')}x.", "",
             f"| model | series | img/s, 1 GPU | img/s, {n} GPUs | scaling | p99 ms 1 / {n} GPUs "
             f"| share of images per GPU | GPU utilisation per GPU | generator CPU % | {n} GPUs, 2x processes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, per_series in summary["per_model"].items():
        for series, row in per_series.items():
            per_gpu = row["per_gpu_at_peak"] or {}
            shares = " / ".join(fmt(g["share"], ".2f") for g in per_gpu.values())
            utilization = " / ".join(fmt(g["utilization"], ".2f") for g in per_gpu.values())
            lines.append(f"| {model} | {series} | {fmt(row['img_per_s_1gpu'])} | {fmt(row[f'img_per_s_{n}gpu'])} "
                         f"| {fmt(row['scaling'], '.2f')}x | {fmt(row['p99_ms_1gpu'], '.1f')} / "
                         f"{fmt(row[f'p99_ms_{n}gpu'], '.1f')} | {shares or '-'} | {utilization or '-'} "
                         f"| {fmt(row['client_cpu_percent_at_peak'])} | {fmt(row['generator_check_img_per_s'])} |")
    lines += ["", "Every step:", "",
              "| GPUs | model | series | in flight | processes | img/s | p50 ms | p99 ms | avg batch "
              "| queue us | compute infer us | failures | error |", "|---" * 13 + "|"]
    for s in results["steps"]:
        lines.append(f"| {s['gpus']} | {s['model']} | {s['series']} | {s.get('concurrency')} "
                     f"| {s.get('processes', '-')} | {fmt(s.get('img_per_s'))} | {fmt(s.get('p50_ms'), '.2f')} "
                     f"| {fmt(s.get('p99_ms'), '.2f')} | {fmt(s.get('avg_batch'), '.1f')} | {fmt(s.get('queue_us'))} "
                     f"| {fmt(s.get('compute_infer_us'))} | {s.get('failures', '-')} | {s.get('error') or ''} |")
    if results.get("notes"):
        lines += ["", results["notes"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON of the steps and summary (.md beside it)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window of each step")
    parser.add_argument("--processes", type=int, default=8, help="load-generator processes per step")
    parser.add_argument("--log-dir", type=Path, help="servers' logs (default: beside --out, named after it)")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from an existing --out")
    args = parser.parse_args(argv)
    if args.markdown_only:
        results = json.loads(args.out.read_text())
        args.out.with_suffix(".md").write_text(markdown(results))
        return 0
    gpu_count = len(host_gpus())
    if gpu_count < 2:
        print(f"multi_gpu: needs two or more GPUs, this host has {gpu_count}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = args.log_dir or args.out.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    results = {"device": describe_device(),
               "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python -m fusedresnet.loadtest.multi_gpu", *(argv or sys.argv[1:])]),
               "gpus": gpu_count, "steps": []}
    with tempfile.TemporaryDirectory(prefix="multi-gpu-") as scratch:
        token_file = Path(scratch) / "admin-token"
        token_file.write_text(secrets.token_hex(24))
        token_file.chmod(0o600)
        for gpus, count in (("0", 1), (",".join(map(str, range(gpu_count))), gpu_count)):
            results["steps"] += run_configuration(gpus, count, SERIES, args.processes, args.seconds,
                                                  Path(scratch), token_file, log_dir)
            results["summary"] = summarize(results["steps"], gpu_count)
            args.out.write_text(json.dumps(results, indent=1, default=str))
    args.out.with_suffix(".md").write_text(markdown(results))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
