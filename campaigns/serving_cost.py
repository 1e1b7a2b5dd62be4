"""The serving cost per image, stage by stage: results/serving_cost.json (+ .md) from campaigns/front_door.py's
reports, whose steps keep the server's CPU by thread pool (`server_cpu_percent_by_thread`, from
loadtest/measurements.tree_thread_cpu_seconds).

    python -m fusedresnet.campaigns.serving_cost --code before \\
        --report binary=results/front_end_logs/front_end_profile_binary.json \\
        --report inprocess=results/front_end_logs/front_end_profile_inprocess.json --out results/serving_cost.json

Each step's server CPU (launcher, tritonservers, stubs; % of one core over the step) divided by its img/s is
the CPU per image; the thread pools fall in the stages of STAGES (the first pattern that a pool's
"process/thread" name starts with). `--code` labels the reports (`before`: today's code, `after`: the levers
kept); a report already in `--out` keeps its rows of the other label.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fusedresnet.backend.report_format import table, write_json_and_markdown
from fusedresnet.campaigns import flame_stages

# stage -> the thread pools ("process/thread name", loadtest/measurements.thread_group) that do its work
STAGES = (
    ("gRPC EventEngine threads (the 2.73 frontend's reads and writes)", ("tritonserver/event_engine",)),
    ("tritonserver's other threads: core, input buffers, the Python backend's messages (the binary: its gRPC too)",
     ("tritonserver/",)),
    ("Python-backend stubs: the shared-memory message, torch, the copy to the GPU, the model, the outputs",
     ("triton_python_backend_stub/", "triton_python_b")),
    ("the launcher", ("python",)),
)
OTHER_STAGE = "other"


def stage_of(pool: str) -> str:
    return next((name for name, prefixes in STAGES if pool.startswith(prefixes)), OTHER_STAGE)


def stage_rows(code: str, front_end: str, report: dict) -> tuple[list[dict], list[dict]]:
    """(stages, runs) of one front_door report: per model, each stage's CPU µs per image at 1 and at 32
    images/request over plain gRPC; per step, its run row."""
    stages, runs = [], []
    steps = [row for row in report["layouts"] if not row["shared_memory"] and row.get("protocol", "grpc") == "grpc"]
    for row in report["layouts"]:
        runs.append({"code": code, "front_end": front_end, "model": row["model"],
                     "images_per_request": row["images_per_request"], "shared_memory": row["shared_memory"],
                     "protocol": row.get("protocol", "grpc"),
                     "processes_per_gpu": row["processes_per_gpu"], "img_per_s": row["img_per_s"],
                     "server_cpu_cores": round(row["server_cpu_percent"] / 100, 2),
                     "cpu_us_per_image": round(1e4 * row["server_cpu_percent"] / row["img_per_s"], 1),
                     "gpu_util": row.get("gpu_util")})
    for model in dict.fromkeys(row["model"] for row in steps):
        per_images = {}
        for row in steps:
            if row["model"] == model and row.get("server_cpu_percent_by_thread"):
                spent: dict[str, float] = {}
                for pool, percent in row["server_cpu_percent_by_thread"].items():
                    spent[stage_of(pool)] = spent.get(stage_of(pool), 0.0) + percent
                per_images[row["images_per_request"]] = {stage: 1e4 * percent / row["img_per_s"]
                                                         for stage, percent in spent.items()}
        names = [name for name, _ in STAGES] + [OTHER_STAGE]
        for name in names:
            values = {images: round(spent[name], 1) for images, spent in per_images.items() if name in spent}
            if values:
                stages.append({"code": code, "front_end": front_end, "model": model, "name": name,
                               "cpu_us_per_image_1": values.get(1), "cpu_us_per_image_32": values.get(32)})
    return stages, runs


def lever_rows(name: str, report: dict) -> list[dict]:
    """One lever's figures from its front_door report: per plain-gRPC step, img/s, the server's CPU per image and
    the stubs' part of it."""
    _, runs = stage_rows("lever", name, report)
    stages, _ = stage_rows("lever", name, report)
    stub_stage = STAGES[2][0]
    stub = {(s["model"], images): s[f"cpu_us_per_image_{images}"] for s in stages if s["name"] == stub_stage
            for images in (1, 32)}
    return [{"lever": name, "model": r["model"], "images_per_request": r["images_per_request"],
             "img_per_s": r["img_per_s"], "cpu_us_per_image": r["cpu_us_per_image"],
             "stub_cpu_us_per_image": stub.get((r["model"], r["images_per_request"]))}
            for r in runs if not r["shared_memory"] and r["protocol"] == "grpc"]


def process_cpu_us(stages: list[dict], front_end: str = "inprocess", model: str = "resnet18_custom") -> dict:
    """(code, images/request, process kind) -> CPU µs per image of the thread pools measured without the profiler:
    the server process's (its gRPC EventEngine and other tritonserver threads) and the stubs' (flame_stages' kinds)."""
    kinds = {STAGES[0][0]: "server", STAGES[1][0]: "server", STAGES[2][0]: "stub"}
    spent: dict[tuple[str, int, str], float] = {}
    for row in stages:
        if (row["front_end"], row["model"]) == (front_end, model) and row["name"] in kinds:
            for images in (1, 32):
                if row[f"cpu_us_per_image_{images}"] is not None:
                    key = (row["code"], images, kinds[row["name"]])
                    spent[key] = spent.get(key, 0.0) + row[f"cpu_us_per_image_{images}"]
    return spent


def flame_cells(row: dict, images: int) -> tuple[str, str]:
    share, spent, sampled = (row[f"{key}_{images}"] for key in ("share", "cpu_us_per_image", "sampled_us_per_image"))
    return ("-" if share is None else f"{share:.0%}",
            "-" if spent is None else f"{spent} ({'-' if sampled is None else sampled})")


def flame_markdown(results: dict) -> list[str]:
    if not results.get("flame_stages"):
        return []
    lines = ["", "## The request's stages, from perf's stacks", "",
             "Each stage's share of a process kind's samples (custom, the in-process front end), times that kind's "
             "CPU per image measured without the profiler (the thread pools above); in brackets perf's own estimate, "
             "samples at 97 Hz per image served (campaigns/flame_stages.py):", "",
             *table(["code", "process", "stage", "share, 1 image/request", "µs/image, 1", "share, 32", "µs/image, 32"],
                    ([row["code"], row["process"], row["name"], *flame_cells(row, 1), *flame_cells(row, 32)]
                     for row in results["flame_stages"]), "lllrrrr")]
    lines += ["", "Flame graphs: " + ", ".join(f"[{Path(path).name}]({path})" for path in results["flame_graphs"])]
    return lines


def markdown(results: dict) -> str:
    commits = ", ".join(f"{code} {commit}" for code, commit in results.get("commits", {}).items())
    lines = [f"# Serving cost per image, stage by stage ({results['date']})", "",
             f"{results['device']}; code {commits or results['git_commit']}; server on cores "
             f"{results['server_cores']}, load generator on {results['generator_cores']}. From: "
             + ", ".join(f"`{c['command']}` ({c['code']})" for c in results["commands"]),
             "", "Server CPU per image (µs) by stage, plain gRPC, uint8 224x224x3, LOGITS only:", "",
             *table(["code", "front end", "model", "stage", "1 image/request", "32 images/request"],
                    ([s["code"], s["front_end"], s["model"], s["name"],
                      *("-" if s[key] is None else s[key] for key in ("cpu_us_per_image_1", "cpu_us_per_image_32"))]
                     for s in results["stages"]), "llllrr")]
    lines += ["", *table(["code", "front end", "protocol", "model", "images/request", "shared memory", "img/s",
                          "server CPU (cores)", "CPU µs/image", "GPU util"],
                         ([r["code"], r["front_end"], r.get("protocol", "grpc"), r["model"], r["images_per_request"],
                           "CUDA" if r["shared_memory"] else "-", f"{r['img_per_s']:,.0f}", r["server_cpu_cores"],
                           r["cpu_us_per_image"], "-" if r.get("gpu_util") is None else f"{r['gpu_util']:.0%}"]
                          for r in results["runs"]), "lllllrrrrr")]
    lines += flame_markdown(results)
    if results.get("levers"):
        lines += ["", "## Levers", "", "Each lever's prediction, then what it measured and whether it was kept:", ""]
        lines += [f"- **{lever['name']}**: predicted: {lever['prediction']} Measured and decided: {lever['verdict']}"
                  for lever in results["levers"]]
        lines += ["", *table(["lever", "model", "images/request", "img/s", "server CPU µs/image",
                              "stubs' CPU µs/image"],
                             ([row["lever"], row["model"], row["images_per_request"], f"{row['img_per_s']:,.0f}",
                               row["cpu_us_per_image"],
                               "-" if row["stub_cpu_us_per_image"] is None else row["stub_cpu_us_per_image"]]
                              for lever in results["levers"] for row in lever["figures"]), "llrrrr")]
    lines += ["", "## Notes", "", *(f"- {note}" for note in results["notes"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", choices=("before", "after"), required=True)
    parser.add_argument("--report", action="append", required=True, metavar="FRONT_END=PATH",
                        help="a front_door.py report (.json) and the front end it measured")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME|PATH|PREDICTION|VERDICT",
                        help="a lever's front_door.py report, what was predicted and what was decided")
    parser.add_argument("--flame", type=Path, help="a folder of campaigns/flame_stages.py's collapsed stacks and flame "
                                                    "graphs (scripts/gpu_host_front_end.sh flame)")
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--out", type=Path, default=Path("results/serving_cost.json"))
    args = parser.parse_args(argv)
    reports = [(name, json.loads(Path(path).read_text()))
               for name, path in (item.split("=", 1) for item in args.report)]
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    first = reports[0][1]
    old_commands = [c for c in old.get("commands", []) if isinstance(c, dict) and c["code"] != args.code]
    results = {"device": first["device"], "date": first["date"], "git_commit": first["git_commit"],
               "commits": {**old.get("commits", {}), args.code: first["git_commit"]},
               "server_cores": first["server_cores"], "generator_cores": first["generator_cores"],
               "commands": old_commands + [{"code": args.code, "command": report["command"]} for _, report in reports],
               "stages": [s for s in old.get("stages", []) if s["code"] != args.code],
               "runs": [r for r in old.get("runs", []) if r["code"] != args.code],
               "levers": old.get("levers", []), "notes": args.note or old.get("notes", []),
               "flame_stages": old.get("flame_stages", []), "flame_graphs": old.get("flame_graphs", [])}
    if args.lever:
        results["levers"] = []
        for item in args.lever:
            name, path, prediction, verdict = item.split("|", 3)
            results["levers"].append({"name": name, "report": path, "prediction": prediction, "verdict": verdict,
                                      "figures": lever_rows(name, json.loads(Path(path).read_text()))})
    for front_end, report in reports:
        stages, runs = stage_rows(args.code, front_end, report)
        results["stages"] += stages
        results["runs"] += runs
    results["stages"].sort(key=lambda s: s["code"] != "before")
    if args.flame:
        results["flame_stages"] = flame_stages.stage_table(args.flame, process_cpu_us(results["stages"]))
        results["flame_graphs"] = [Path(os.path.relpath(path, args.out.parent)).as_posix()
                                   for path in sorted(args.flame.glob("*.svg"))]
    results["runs"].sort(key=lambda r: r["code"] != "before")
    results["commits"] = dict(sorted(results["commits"].items(), key=lambda item: item[0] != "before"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_and_markdown(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
