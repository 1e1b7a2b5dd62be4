"""The A/B report of a sweep: JSON, CSV, markdown and PNG plots.

    python -m fusedresnet.loadtest.report results/loadtest_ab.json     # redraw from a saved sweep

A sweep saved before the inputs were named as the model names them says uint8 / fp32
where it now says IMAGE / IMAGE_NORMALIZED; `read_results` renames them as it reads.

Reads the result dictionary of `loadtest.sweep` ({"device", "date", "command",
"steps": [...], ...}) and writes, next to each other:

    <name>.json                        the sweep, machine-readable (steps with every field)
    <name>.csv                         one row per step (the raw figures)
    <name>.md                          the report: sanity, a table per series with custom / cuDNN ratios,
                                       the server-side time breakdown, the agreement summary
    <name>_latency_vs_throughput.png   p50 and p99 latency against images/s, both models, per series
    <name>_throughput_by_users.png     images/s against concurrency, per series
    <name>_server_time.png             queue / compute input / infer / output time per request
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fusedresnet.backend.report_format import number, row  # noqa: E402
from fusedresnet.backend.report_format import table as md_table  # noqa: E402  (here `table` is a sweep's)
from fusedresnet.backend.spec import (  # noqa: E402
    AB_ROUTER_MODEL,
    INPUT_FP32,
    INPUT_UINT8,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    ZERO_MODEL,
)
from fusedresnet.client.ab import MODEL_COLORS  # noqa: E402  (the same colour for a model in every plot)
from fusedresnet.loadtest.triton_metrics import TIME_BREAKDOWN  # noqa: E402

MODEL_SHORT = {MODEL_CUSTOM: "custom", MODEL_CUDNN: "cuDNN", AB_ROUTER_MODEL: "A/B router", ZERO_MODEL: "zero"}
BREAKDOWN_LABELS = {"queue_us": "queue", "compute_input_us": "compute input",
                    "compute_infer_us": "compute infer", "compute_output_us": "compute output"}
# Fields averaged over rounds when a sweep repeats itself.
AVERAGED = ("img_per_s", "req_per_s", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "avg_batch", "gpu_utilization",
            "request_us", "serving_efficiency", "engine_img_per_s", "client_cpu_percent", *TIME_BREAKDOWN)
SUMMED = ("sent", "failures", "measured_requests")
CLIENT_BOUND_MARK = " (client CPU)"
# The input formats of sweeps saved before they took the model's input names.
OLD_INPUT_FORMATS = {"uint8": INPUT_UINT8, "fp32": INPUT_FP32}


def read_results(path: Path) -> dict:
    """A saved sweep, its input formats named IMAGE / IMAGE_NORMALIZED also where it was written with uint8 / fp32."""
    results = json.loads(Path(path).read_text())
    records = [*results.get("steps", []), *results.get("skipped", []), *results.get("settings", {}).get("series", []),
               results.get("agreement") or {}]
    for record in records:
        if record.get("input_format") in OLD_INPUT_FORMATS:
            record["input_format"] = OLD_INPUT_FORMATS[record["input_format"]]
    return results


def series_key(step: dict) -> tuple:
    """(load generator, protocol, images per request, input format, shared memory, processes asked for)."""
    return (step.get("load_generator", "locust"), step["protocol"], step["images_per_request"], step["input_format"],
            step.get("shared_memory", "none"), step.get("processes_asked"))


def series_label(key: tuple) -> str:
    generator, protocol, images, input_format, shared_memory, processes = key
    name = "gRPC" if protocol == "grpc" else "HTTP"
    label = f"{name}, {images} image{'s' if images > 1 else ''}/request, {input_format}"
    if shared_memory != "none":
        label += f", {'CUDA' if shared_memory == 'cuda' else 'system'} shm"
    label += f" ({generator}" + (f", {processes} processes)" if processes else ")")
    return label


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def grouped(steps: list[dict]) -> dict:
    """{series key: {users: {model: step}}}, steps of repeated rounds averaged into one."""
    buckets = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for step in steps:
        if step.get("server_setting"):   # a serving-story step on a server changed from the shipped one
            continue
        if step.get("img_per_s") is None:  # measured nothing (a tool that timed out): the sanity section lists why
            continue
        buckets[series_key(step)][step["users"]][step["model"]].append(step)
    table = {}
    for key, by_users in buckets.items():
        table[key] = {}
        for users in sorted(by_users):
            table[key][users] = {}
            for model, runs in by_users[users].items():
                merged = dict(runs[0])
                merged.update({f: _mean([r.get(f) for r in runs]) for f in AVERAGED})
                merged.update({f: sum(r[f] for r in runs) for f in SUMMED})
                merged["rounds"] = len(runs)
                merged["client_cpu_saturated"] = any(r.get("client_cpu_saturated") for r in runs)
                table[key][users][model] = merged
    return table


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def percent(value) -> str:
    return "n/a" if value is None else f"{value:.0%}"


# ---------------------------------------------------------------- plots

def _series_axes(count: int, title: str):
    figure, axes = plt.subplots(1, count, figsize=(max(5.2 * count, 7.5), 4.2), squeeze=False)
    figure.suptitle(title, fontsize=11)
    return figure, axes[0]


def plot_latency_vs_throughput(table: dict, path: Path) -> list[list[str]]:
    """The plot; returns each panel's legend entries (one line per model measured in that series)."""
    figure, axes = _series_axes(len(table), "Latency against throughput (each point: one concurrency level)")
    for ax, (key, by_users) in zip(axes, table.items()):
        for model, color in MODEL_COLORS.items():
            points = [(users, by_users[users][model]) for users in by_users
                      if model in by_users[users] and by_users[users][model].get("p50_ms") is not None]
            if not points:   # a model this series did not measure gets no line, and no legend entry
                continue
            throughput = [s["img_per_s"] for _, s in points]
            for percentile, style in (("p50_ms", "-o"), ("p99_ms", "--s")):
                ax.plot(throughput, [s[percentile] for _, s in points], style, color=color, markersize=4,
                        label=f"{MODEL_SHORT[model]} {percentile[:3]}")
            for users, step in points:
                ax.annotate(str(users), (step["img_per_s"], step["p50_ms"]), fontsize=7, color=color,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_title(series_label(key), fontsize=10)
        ax.set_xlabel("images/s")
        ax.set_ylabel("latency per request (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    legends = [[text.get_text() for text in ax.get_legend().get_texts()] for ax in axes]
    _save(figure, path)
    return legends


def _save(figure, path: Path):
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_throughput_by_users(table: dict, path: Path):
    figure, axes = _series_axes(len(table), "Throughput against concurrency (users, one request in flight each)")
    for ax, (key, by_users) in zip(axes, table.items()):
        for model, color in MODEL_COLORS.items():
            users = [u for u in by_users if model in by_users[u]]
            if not users:
                continue
            ax.plot(users, [by_users[u][model]["img_per_s"] for u in users], "-o", color=color, markersize=4,
                    label=MODEL_SHORT[model])
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(by_users), [str(u) for u in by_users])
        ax.minorticks_off()
        ax.set_title(series_label(key), fontsize=10)
        ax.set_xlabel("concurrent users")
        ax.set_ylabel("images/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    _save(figure, path)


def plot_server_time(table: dict, path: Path):
    figure, axes = _series_axes(len(table), "Server-side time per request (Triton metrics): "
                                            "left bar custom, right bar cuDNN")
    colors = plt.get_cmap("tab10").colors
    for ax, (key, by_users) in zip(axes, table.items()):
        levels = list(by_users)
        for offset, model in ((-0.2, MODEL_CUSTOM), (0.2, MODEL_CUDNN)):
            bottoms = [0.0] * len(levels)
            for part_index, part in enumerate(TIME_BREAKDOWN):
                heights = [(by_users[u].get(model, {}).get(part) or 0.0) / 1e3 for u in levels]  # None: 0
                ax.bar([i + offset for i in range(len(levels))], heights, width=0.38, bottom=bottoms,
                       color=colors[part_index], alpha=1.0 if model == MODEL_CUSTOM else 0.55,
                       edgecolor="black", linewidth=0.4,
                       label=f"{BREAKDOWN_LABELS[part]}" if model == MODEL_CUSTOM else None)
                bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_xticks(range(len(levels)), [str(u) for u in levels])
        ax.set_title(series_label(key), fontsize=10)
        ax.set_xlabel("concurrent users")
        ax.set_ylabel("ms per request")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    _save(figure, path)


# ---------------------------------------------------------------- markdown

def sanity_section(results: dict) -> list[str]:
    steps = results["steps"]
    problems = [(s, p) for s in steps for p in s["problems"]]
    sent = sum(s["sent"] for s in steps)
    lines = ["## Sanity: every request accounted for", ""]
    if not problems:
        lines.append(f"All {len(steps)} steps add up: {sent:,} requests sent by the users == succeeded + failed "
                     "as counted by locust == success + failure as counted by Triton's metrics "
                     f"({sum(s['failures'] for s in steps)} failures in all).")
    else:
        lines += [f"**SANITY MISMATCH in {len(problems)} check(s): the figures below are not trustworthy.**", "",
                  *md_table(["step", "model", "series", "users", "problem"],
                            ([s["index"], s["model"], series_label(series_key(s)), s["users"], p]
                             for s, p in problems))]
    if results.get("skipped"):
        levels = defaultdict(set)
        for step in results["skipped"]:
            levels[series_key(step)].add(step["users"])
        lines += ["", "Skipped for lack of time (both models): " + "; ".join(
            f"{series_label(key)} at {', '.join(map(str, sorted(users)))} users" for key, users in levels.items())
            + "."]
    return lines + [""]


def summary_section(table: dict) -> list[str]:
    """Per series: each model's peak throughput (and where), and its latency with a single user."""
    lines = ["## Summary", "", *md_table(["series", "peak img/s custom (users)", "peak img/s cuDNN (users)", "ratio",
                                          "lowest-level p50 ms custom / cuDNN", "ratio"], align="lrrrrr")]
    for key, by_users in table.items():
        peaks = {}
        for model in (MODEL_CUSTOM, MODEL_CUDNN):
            runs = [(s["img_per_s"], users) for users, models in by_users.items() if (s := models.get(model))]
            peaks[model] = max(runs) if runs else (None, None)
        fewest = min(by_users)
        lowest = by_users[fewest]
        c50, n50 = (lowest.get(m, {}).get("p50_ms") for m in (MODEL_CUSTOM, MODEL_CUDNN))
        (c_peak, c_users), (n_peak, n_users) = peaks[MODEL_CUSTOM], peaks[MODEL_CUDNN]
        lines.append(row([series_label(key), f"{number(c_peak)} ({c_users})", f"{number(n_peak)} ({n_users})",
                          number(ratio(c_peak, n_peak), 2),
                          f"{number(c50, 2)} / {number(n50, 2)} ({fewest} user{'s' if fewest > 1 else ''})",
                          number(ratio(c50, n50), 2)]))
    return lines + [""]


# The serving targets on the H100, checked against each sweep's steps of the custom model.
TARGET_IMG_PER_S_1 = 20_000        # gRPC, 1 image/request, with p99 at most TARGET_P99_1_MS
TARGET_P99_1_MS = 50.0
TARGET_IMG_PER_S_32 = 35_000       # gRPC, 32 images/request
TARGET_IMG_PER_S_32_CUDA = 45_000  # CUDA shared memory, 32 images/request
TARGET_ONE_IN_FLIGHT_P50_MS, TARGET_ONE_IN_FLIGHT_P99_MS = 1.5, 5.0
TARGET_MAX_MS = 50.0               # no request slower, at any level up to the peak


def targets_section(results: dict, table: dict) -> list[str]:
    """The serving targets, met or not, from the custom model's gRPC steps; the hand-written analysis of
    what limits each (results["bottlenecks"]) follows when the sweep has one."""
    def custom_steps(images, shared_memory):
        return [(users, models[MODEL_CUSTOM], models.get(MODEL_CUDNN)) for key, by_users in table.items()
                if key[1] == "grpc" and key[2] == images and key[4] == shared_memory
                for users, models in by_users.items() if MODEL_CUSTOM in models]

    def best(images, shared_memory, p99_limit=None):
        runs = [(s["img_per_s"], s.get("p99_ms"), users, s.get("load_generator", "locust"))
                for users, s, _ in custom_steps(images, shared_memory)
                if s.get("img_per_s") and (p99_limit is None or (s.get("p99_ms") or 1e9) <= p99_limit)]
        return max(runs, key=lambda run: run[0]) if runs else None

    def target_row(name, target, value, met):
        return row([name, target, value, "met" if met else "**not met**"])

    lines = ["## Serving targets (set for the H100)", "", *md_table(["target", "wanted", "this sweep", ""])]
    for images, shared_memory, wanted, name in (
            (1, "none", TARGET_IMG_PER_S_1, f"gRPC, 1 image/request (p99 <= {TARGET_P99_1_MS:g} ms)"),
            (32, "none", TARGET_IMG_PER_S_32, "gRPC, 32 images/request"),
            (32, "cuda", TARGET_IMG_PER_S_32_CUDA, "CUDA shared memory, 32 images/request")):
        found = best(images, shared_memory, TARGET_P99_1_MS if images == 1 else None)
        value = "-" if not found else (f"{found[0]:,.0f} img/s ({found[2]} in flight, {found[3]}, "
                                       f"p99 {number(found[1])} ms)")
        lines.append(target_row(name, f">= {wanted:,} img/s", value, bool(found) and found[0] >= wanted))
    single = [s for users, s, _ in custom_steps(1, "none") if users == 1]
    for s in single:
        lines.append(target_row(f"1 request in flight ({s.get('load_generator', 'locust')})",
                         f"p50 <= {TARGET_ONE_IN_FLIGHT_P50_MS} ms, p99 <= {TARGET_ONE_IN_FLIGHT_P99_MS} ms",
                         f"p50 {number(s.get('p50_ms'), 2)} ms, p99 {number(s.get('p99_ms'), 2)} ms",
                         (s.get("p50_ms") or 1e9) <= TARGET_ONE_IN_FLIGHT_P50_MS
                         and (s.get("p99_ms") or 1e9) <= TARGET_ONE_IN_FLIGHT_P99_MS))
    # A series and its repeats with more load-generator processes (the same traffic) share one peak level:
    # the fewest in flight that reach 95% of the best img/s any of them gave; more only adds queueing.
    families = defaultdict(dict)
    for key, by_users in table.items():
        for users, models in by_users.items():
            rate = (models.get(MODEL_CUSTOM) or {}).get("img_per_s") or 0
            family = families[key[:5]]
            family[users] = max(family.get(users, 0), rate)

    def peak_level(key):
        rates = families[key[:5]]
        return min(users for users, rate in rates.items() if rate >= 0.95 * max(rates.values()))

    slowest = [(s["max_ms"], users, series_label(key)) for key, by_users in table.items()
               for users, models in by_users.items()
               if (s := models.get(MODEL_CUSTOM)) and s.get("max_ms") is not None and users <= peak_level(key)]
    if slowest:
        worst = max(slowest)
        lines.append(target_row("slowest request, every level up to each series' peak (the fewest in flight reaching "
                         "95% of the best img/s of the series and its repeats)", f"<= {TARGET_MAX_MS:g} ms",
                         f"{worst[0]:.1f} ms ({worst[2]}, {worst[1]} in flight)", worst[0] <= TARGET_MAX_MS))
    levels = [(s, n) for key, by_users in table.items() for models in by_users.values()
              if (s := models.get(MODEL_CUSTOM)) and (n := models.get(MODEL_CUDNN))]
    ahead = [s["img_per_s"] >= n["img_per_s"] and (s.get("p50_ms") or 1e9) <= (n.get("p50_ms") or 1e9)
             for s, n in levels]
    lines.append(target_row("custom ahead of cuDNN in img/s and p50", "at every level",
                            f"{sum(ahead)} of {len(ahead)} levels", all(ahead)))
    lines.append("")
    if results.get("bottlenecks"):
        lines += [results["bottlenecks"], ""]
    return lines


def series_table(key: tuple, by_users: dict) -> list[str]:
    def cells(users, models):
        c, n = models.get(MODEL_CUSTOM, {}), models.get(MODEL_CUDNN, {})
        saturated = any(m.get("client_cpu_saturated") for m in (c, n))
        return [f"{users}{CLIENT_BOUND_MARK if saturated else ''}", number(c.get("img_per_s")),
                number(n.get("img_per_s")), number(ratio(c.get("img_per_s"), n.get("img_per_s")), 2),
                number(c.get("p50_ms"), 2), number(n.get("p50_ms"), 2),
                number(ratio(c.get("p50_ms"), n.get("p50_ms")), 2),
                number(c.get("p99_ms"), 2), number(n.get("p99_ms"), 2),
                number(ratio(c.get("p99_ms"), n.get("p99_ms")), 2),
                f"{number(c.get('avg_batch'), 2)} / {number(n.get('avg_batch'), 2)}",
                f"{percent(c.get('serving_efficiency'))} / {percent(n.get('serving_efficiency'))}",
                f"{number(c.get('client_cpu_percent'), 0)} / {number(n.get('client_cpu_percent'), 0)}",
                f"{c.get('failures', 'n/a')} / {n.get('failures', 'n/a')}"]
    lines = [f"### {series_label(key)}", "",
             *md_table(["users", "custom img/s", "cuDNN img/s", "ratio", "custom p50 ms", "cuDNN p50 ms", "ratio",
                        "custom p99 ms", "cuDNN p99 ms", "ratio", "avg batch custom / cuDNN",
                        "serving efficiency custom / cuDNN", "load generator CPU % custom / cuDNN",
                        "failures custom / cuDNN"],
                       (cells(users, models) for users, models in by_users.items()), "r" * 10)]
    if any(m.get("client_cpu_saturated") for models in by_users.values() for m in models.values()):
        lines += ["", f"{CLIENT_BOUND_MARK} a load-generator process ran above 90% of a core during this level: the "
                  "load generator, not the server, may have limited it (raise --processes)."]
    return lines + [""]


def server_time_table(table: dict) -> list[str]:
    lines = ["## Server-side time per request (Triton metrics, measurement window)", "",
             "Microseconds per request. Queue: waiting for the dynamic batcher and a free model instance; "
             "compute: the model's execution of the batch the request was in.", "",
             *md_table(["series", "users", "model", "queue", "compute input", "compute infer", "compute output",
                        "avg batch", "GPU util"], align="lrlrrrrrr")]
    for key, by_users in table.items():
        for users, models in by_users.items():
            for model in (MODEL_CUSTOM, MODEL_CUDNN):
                s = models.get(model)
                if s is None:
                    continue
                gpu = s.get("gpu_utilization")
                lines.append(row([series_label(key), users, MODEL_SHORT[model],
                                  *(number(s.get(part), 0) for part in TIME_BREAKDOWN), number(s.get("avg_batch"), 2),
                                  "n/a" if gpu is None else f"{gpu:.0%}"]))
    return lines + [""]


# The targets of the serving path against its ceiling on the H100: the zero-answer model measured in the same run.
TARGET_IMG_PER_S_32_CUDA_ENGINE = 95_000   # custom, CUDA shared memory, 32 images/request: 90% of the engine
TARGET_SHARE_OF_ZERO = 0.90                 # custom over plain gRPC, 1 and 32 images/request
TARGET_ONE_IN_FLIGHT_P50_OVER_ZERO_MS = 0.3


def ceiling_section(table: dict, steps: list[dict] = ()) -> list[str]:
    """Each shipped model against the zero-answer model on the same series and level (same load generator); the
    targets against that ceiling, the CUDA shared-memory one on the best server setting of the serving story too."""
    rows = [(key, users, models) for key, by_users in table.items() for users, models in by_users.items()
            if ZERO_MODEL in models]
    if not rows:
        return []
    lines = ["## Against the zero-answer model (the Python backend's ceiling)", "",
             f"`{ZERO_MODEL}` reads its input as the shipped models do and answers zeros: what Triton, the Python "
             "backend and the load generator cost on this host with no network.", "",
             *md_table(["series", "in flight", "custom img/s", "cuDNN img/s", "zero img/s", "custom / zero",
                        "p50 ms custom / zero", "p99 ms custom / zero"],
                       ([series_label(key), users, *(number(m.get("img_per_s")) for m in (c, n, z)),
                         percent(ratio(c.get("img_per_s"), z.get("img_per_s"))),
                         f"{number(c.get('p50_ms'), 2)} / {number(z.get('p50_ms'), 2)}",
                         f"{number(c.get('p99_ms'), 2)} / {number(z.get('p99_ms'), 2)}"]
                        for key, users, models in rows
                        for c, n, z in [[models.get(m, {}) for m in (MODEL_CUSTOM, MODEL_CUDNN, ZERO_MODEL)]]),
                       "lrrrrr")]
    lines += ["", "Targets against the ceiling (H100):", "", *md_table(["target", "wanted", "this run", ""])]

    def best(generator, protocol, images, shared_memory, model):
        runs = [(m[model]["img_per_s"], users, m[model].get("p99_ms")) for key, by_users in table.items()
                if key[:3] == (generator, protocol, images) and key[4] == shared_memory
                for users, m in by_users.items() if (m.get(model) or {}).get("img_per_s")]
        return max(runs) if runs else None

    cuda_steps = [(s["img_per_s"], s["concurrency"], s.get("p99_ms"), s.get("server_setting") or "as shipped")
                  for s in steps if s.get("load_generator") == "perf_analyzer" and s.get("model") == MODEL_CUSTOM
                  and s.get("protocol") == "grpc" and s.get("images_per_request") == 32
                  and s.get("shared_memory") == "cuda" and s.get("img_per_s")]
    cuda = max(cuda_steps, key=lambda step: step[0]) if cuda_steps else None
    lines.append(f"| custom, CUDA shared memory, 32 images/request (perf_analyzer, best server setting) | >= "
                 f"{TARGET_IMG_PER_S_32_CUDA_ENGINE:,} img/s | "
                 + (f"{cuda[0]:,.0f} img/s ({cuda[1]} in flight, p99 {number(cuda[2], 2)} ms, server: {cuda[3]})"
                    if cuda else "-")
                 + f" | {'met' if cuda and cuda[0] >= TARGET_IMG_PER_S_32_CUDA_ENGINE else '**not met**'} |")
    for images in (1, 32):
        custom, zero = (best("perf_analyzer", "grpc", images, "none", m) for m in (MODEL_CUSTOM, ZERO_MODEL))
        share = ratio(custom and custom[0], zero and zero[0])
        lines.append(f"| custom over plain gRPC, {images} image{'s' if images > 1 else ''}/request, peak against "
                     f"the zero model's | >= {TARGET_SHARE_OF_ZERO:.0%} | {percent(share)} | "
                     f"{'met' if share and share >= TARGET_SHARE_OF_ZERO else '**not met**'} |")
    single = [(m[MODEL_CUSTOM]["p50_ms"], m[ZERO_MODEL]["p50_ms"]) for key, users, m in rows
              if key[:3] == ("perf_analyzer", "grpc", 1) and key[4] == "none" and users == 1
              and m.get(MODEL_CUSTOM, {}).get("p50_ms") and m[ZERO_MODEL].get("p50_ms")]
    if single:
        custom_p50, zero_p50 = single[0]
        met = custom_p50 - zero_p50 <= TARGET_ONE_IN_FLIGHT_P50_OVER_ZERO_MS
        lines.append(f"| one request in flight, p50 over the zero model's | <= +{TARGET_ONE_IN_FLIGHT_P50_OVER_ZERO_MS}"
                     f" ms | {custom_p50:.2f} - {zero_p50:.2f} = +{custom_p50 - zero_p50:.2f} ms | "
                     f"{'met' if met else '**not met**'} |")
    probe = {s["model"]: s for s in steps if s.get("server_setting") and s.get("concurrency") == 1
             and s.get("protocol") == "grpc" and s.get("images_per_request") == 1 and s.get("p50_ms")}
    if MODEL_CUSTOM in probe and ZERO_MODEL in probe:
        custom, zero = probe[MODEL_CUSTOM], probe[ZERO_MODEL]
        gap = custom["p50_ms"] - zero["p50_ms"]
        lines.append(f"| the same, server setting {custom['server_setting']} | <= "
                     f"+{TARGET_ONE_IN_FLIGHT_P50_OVER_ZERO_MS} ms | {custom['p50_ms']:.2f} - {zero['p50_ms']:.2f} = "
                     f"+{gap:.2f} ms | {'met' if gap <= TARGET_ONE_IN_FLIGHT_P50_OVER_ZERO_MS else '**not met**'} |")
        phases = [f"{phase} {number(custom.get(f'execute_{phase}_us'), 0)}"
                  for phase in ("read", "gather", "h2d", "engine", "d2h", "respond")]
        lines += ["", f"Where the custom model's time at one request in flight goes ({custom['server_setting']}, "
                  f"Triton's compute infer {number(custom.get('compute_infer_us'), 0)} us against the zero model's "
                  f"{number(zero.get('compute_infer_us'), 0)} us; the model's phases in us: {', '.join(phases)})."]
    return lines + [""]


def cross_check_section(pairs: list[dict] | None) -> list[str]:
    if not pairs:
        return []
    lines = ["## perf_analyzer against grpc_flood (the same traffic)", "",
             "perf_analyzer: one C++ process, random input data, a fixed request count after a warm-up; "
             "grpc_flood: Python asyncio processes sending the pool's images. Both pinned to the same load cores.",
             "",
             *md_table(["model", "images/request", "shm", "in flight", "perf_analyzer img/s", "grpc_flood img/s",
                        "ratio", "p50 ms pa / flood", "p99 ms pa / flood", "server CPU % (pa)", "grpc_flood CPU %"],
                       ([p["model"], p["images_per_request"], p["shared_memory"], p["concurrency"],
                         number(p["perf_analyzer_img_per_s"]), number(p["grpc_flood_img_per_s"]), number(p["ratio"], 2),
                         f"{number(p['perf_analyzer_p50_ms'], 2)} / {number(p['grpc_flood_p50_ms'], 2)}",
                         f"{number(p['perf_analyzer_p99_ms'], 2)} / {number(p['grpc_flood_p99_ms'], 2)}",
                         number(p.get("perf_analyzer_server_cpu_percent"), 0),
                         number(p.get("grpc_flood_client_cpu_percent"), 0)] for p in pairs), "lrlrrrrllrr")]
    return lines + [""]


def story_section(told: list[dict] | None, servers: dict | None) -> list[str]:
    """The serving story in the form of Triton's Conceptual Guide Part 2: change, command, output, reading."""
    if not told:
        return []
    lines = ["## The serving story: as shipped to the best configuration (perf_analyzer)", ""]
    for step in told:
        lines += [f"### {step['step']}. {step['title']}", "", f"Change: {step['change']}.", "", "```",
                  step["command"], "```", "", "```", step["output"], "```", "", *step["reading"], ""]
    for setting, outcome in (servers or {}).items():
        lines += [f"Server setting {setting}: {outcome}", ""]
    return lines


def agreement_section(agreement: dict | None) -> list[str]:
    if not agreement:
        return []
    lines = ["## Agreement on the same images", "",
             "Custom against cuDNN logits (details: [ab_agreement.md](ab_agreement.md)).", "",
             *md_table(["images", "count", "top-1 agree", "top-5 agree", "max abs diff", "rel. L2 diff", "min cosine"],
                       ([name, s["inputs"], f"{s['top1_agree']}/{s['inputs']}", f"{s['top5_agree']}/{s['inputs']}",
                         f"{s['max_abs']:.3g}", f"{s['rel_l2']:.3g}", f"{s['min_cosine']:.6f}"]
                        for name, s in agreement["sets"].items()), "lrrrrrr")]
    return lines + [""]


def live_ab_section(table: dict) -> list[str]:
    """The A/B router's steps (sweep --ab-router): its answers as the client saw them beside the primary's own
    step at the same level, each arm's latency and the agreement as the router counted them (its metrics)."""
    rows = [(key, users, models) for key, by_users in table.items() for users, models in by_users.items()
            if models.get(AB_ROUTER_MODEL, {}).get("ab")]
    if not rows:
        return []
    lines = [f"## Live A/B through the router ({AB_ROUTER_MODEL})", "",
             "Each row: the router's step (client-side img/s and latency) beside the primary's own step at the same "
             "level, then what the router counted during its step, from its metrics on Triton's endpoint: each "
             "arm's latency (p50 / p99 of its answer to the router's batched call, server side), and in shadow "
             "mode the agreement of the candidate with the primary (docs/AB_LIVE.md).", "",
             *md_table(["series", "in flight", "mode", "router img/s", "direct img/s", "router p50 / p99 ms",
                        "direct p50 / p99 ms", "primary arm p50 / p99 ms", "candidate arm p50 / p99 ms", "compared",
                        "top-1 agree", "top-5 overlap", "rel. L2 p99", "shadow late / skipped"], align="lrlrrllllrrrr")]
    for key, users, models in rows:
        router = models[AB_ROUTER_MODEL]
        ab = router["ab"]
        primary = ab["arms"].get("primary") or {}
        candidate = ab["arms"].get("candidate") or {}
        direct = models.get(MODEL_CUDNN, {})   # the shipped router's primary

        def pair(record, digits=2):
            return f"{number(record.get('p50_ms'), digits)} / {number(record.get('p99_ms'), digits)}"

        agree = ab.get("top1_agree")
        lines.append(row([series_label(key), users, ", ".join(ab.get("modes") or ["-"]),
                          number(router.get("img_per_s")), number(direct.get("img_per_s")), pair(router),
                          pair(direct), pair(primary), pair(candidate), ab.get("requests", 0),
                          "n/a" if agree is None else f"{agree:.2%}", number(ab.get("top5_overlap_mean"), 2),
                          number(ab.get("rel_l2_p99"), 4),
                          f"{ab.get('shadow_timeouts', 0)} / {ab.get('shadow_skipped', 0)}"]))
    return lines + ["", f"Direct: {MODEL_CUDNN}'s own step at the same level (the shipped router's primary).", ""]


def markdown(results: dict, table: dict, name: str) -> str:
    settings = results.get("settings", {})
    engines = results.get("engines", {})
    reference = results.get("engine_reference")
    reference_text = (f" ({reference['source']}, {reference['device']}, {reference['date']})" if reference
                      else " (n/a: no engine benchmark for this device)")
    lines = [f"# A/B load test: {MODEL_CUSTOM} against {MODEL_CUDNN}", "",
             f"- Device: {results['device']}",
             f"- Date: {results['date']}" + (f", commit {results['git_commit']}" if results.get("git_commit") else ""),
             f"- Command: `{results['command']}`",
             "- Engines: " + ", ".join(f"{model} = {engine}" for model, engine in engines.items())
             + (f"; Triton {results['triton_version']}" if results.get("triton_version") else ""),
             (f"- Each step: {settings['requests_per_step']} (one image per request at one in flight: "
              f"synchronous calls, else asynchronous); grpc_flood steps: 1 s warm-up, 4 s measured. 'users' is "
              f"requests in flight. Load generators on cores {settings.get('load_cores')}. Server: "
              f"{settings.get('server')}." if settings.get("requests_per_step") else
              f"- Each step: {settings.get('warmup_s')} s warm-up, then {settings.get('measure_s')} s measured; "
              f"locust users each keep one request in flight; up to {settings.get('processes')} locust process(es); "
              f"{settings.get('pool_size')} distinct images; the two models run back to back at every level, "
              "in alternating order. Server: " + str(settings.get("server")) + "."),
             "- Ratios are custom / cuDNN: above 1 for images/s means custom serves more, "
             "below 1 for latency means custom answers sooner.",
             "- Serving efficiency: served images/s over what the model's engine computes alone at the step's "
             f"average batch size{reference_text}.",
             "- Load generator CPU: the load-generator processes' CPU use over the window, in % of one core, summed.",
             ""]
    if results.get("error"):
        lines += [f"**The sweep stopped early: {results['error']}**", ""]
    if results.get("prewarm_failures"):
        lines += ["**Pre-warm requests failed:** " + "; ".join(results["prewarm_failures"]), ""]
    lines += sanity_section(results)
    lines += summary_section(table)
    lines += targets_section(results, table)
    lines += ["## Throughput and latency", "",
              f"![latency against throughput]({name}_latency_vs_throughput.png)", "",
              f"![throughput by concurrency]({name}_throughput_by_users.png)", ""]
    for key, by_users in table.items():
        lines += series_table(key, by_users)
    lines += server_time_table(table)
    lines += [f"![server-side time per request]({name}_server_time.png)", ""]
    lines += live_ab_section(table)
    lines += ceiling_section(table, results.get("steps", []))
    lines += cross_check_section(results.get("cross_check"))
    lines += story_section(results.get("serving_story"), results.get("settings", {}).get("story_servers"))
    lines += agreement_section(results.get("agreement"))
    lines += [f"Raw figures: [{name}.csv]({name}.csv) (one row per step), [{name}.json]({name}.json).", ""]
    return "\n".join(lines)


def write_csv(steps: list[dict], path: Path):
    fields = []
    for step in steps:
        fields += [k for k in step if k not in fields]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for step in steps:
            writer.writerow({k: "; ".join(map(str, v)) if isinstance(v, list) else v for k, v in step.items()})


def write_report(results: dict, out_dir: Path, name: str) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"{name}{suffix}" for kind, suffix in (
        ("json", ".json"), ("csv", ".csv"), ("md", ".md"), ("curves", "_latency_vs_throughput.png"),
        ("throughput", "_throughput_by_users.png"), ("server", "_server_time.png"))}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    write_csv(results["steps"], paths["csv"])
    table = grouped(results["steps"])
    if table:
        plot_latency_vs_throughput(table, paths["curves"])
        plot_throughput_by_users(table, paths["throughput"])
        plot_server_time(table, paths["server"])
    paths["md"].write_text(markdown(results, table, name))
    return [p for p in paths.values() if p.exists()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_json", type=Path)
    parser.add_argument("--out", type=Path, help="folder (default: the JSON file's folder)")
    args = parser.parse_args(argv)
    results = read_results(args.sweep_json)
    name = args.sweep_json.stem
    written = write_report(results, args.out or args.sweep_json.parent, name)
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
