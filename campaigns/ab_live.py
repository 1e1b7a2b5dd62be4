"""The A/B router's own cost, measured in one run on one server: through the router against direct calls.

    python -m fusedresnet.campaigns.ab_live --out results        # writes results/ab_live.json and .md

For each mode it starts Triton on free loopback ports on a copy of the shipped repository whose router
config names that mode (a mode change by the load API, `client.ab_mode`, is what a user does; on the GPU host
Triton 2.51 can crash seconds after such a reload under load, docs/HISTORY.md, so the measurement does not reload).
A step during which the server died is measured again once on a fresh server (`restarts` in the results).
For each mode (shadow, split with
the shipped candidate_percent) and each case (1 image per request with one request in flight: the latency;
32 images per request with THROUGHPUT_IN_FLIGHT in flight: the throughput), a grpc_flood step to the primary
(resnet18_cudnn, the direct call) and one to the router, back to back, the order alternating from case to case.
The router's own metrics during its steps give each arm's latency, and over the shadow steps the agreement of
the candidate with the primary (top-1, top-5 overlap, the logits' relative L2, Triton's endpoint).

Targets (docs/AB_LIVE.md): shadow mode adds at most 0.5 ms to the p50 at one request in flight, and split mode
keeps at least 90 % of the direct calls' throughput at 32 images per request.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.provenance import git_commit
from fusedresnet.backend.report_format import number, table
from fusedresnet.backend.repository.copies import both, copy_repository, with_instances, with_parameters
from fusedresnet.backend.serve import ServerGroup, ServerSettings, launch
from fusedresnet.backend.spec import (
    AB_ROUTER_MODEL,
    BUILD_DIR,
    DEFAULT_HOST,
    METRICS_FLUSH_S,
    MODEL_REPOSITORY,
    SERVED_ENTRIES,
)
from fusedresnet.client.ab_mode import router_config
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.loadtest import grpc_flood, triton_metrics
from fusedresnet.loadtest.image_pool import build_image_pool
from fusedresnet.loadtest.sweep import describe_device

MODES = ("shadow", "split")
THROUGHPUT_IN_FLIGHT = 16                          # at 32 images per request
LATENCY_CASE = (1, 1)                              # (images per request, requests in flight)
TARGET_SHADOW_EXTRA_P50_MS = 0.5                   # one image, one request in flight
TARGET_SPLIT_THROUGHPUT_SHARE = 0.90               # 32 images per request


def flood(model: str, server: ServerGroup, images: int, in_flight: int, args) -> dict:
    return grpc_flood.run_step(model, server.grpc_url, server.metrics_url, in_flight, images,
                               processes=min(in_flight, args.processes), warmup_s=args.warmup_s,
                               measure_s=args.measure_s)


def repository_in_mode(mode: str, folder: Path, router_instances: int | None = None) -> Path:
    """A copy of the prepared repository (weights linked) whose router serves in `mode` (with `router_instances`
    instances when given)."""
    edit = with_parameters(AB_ROUTER_MODEL, mode=mode)
    if router_instances:
        edit = both(edit, with_instances(router_instances, (AB_ROUTER_MODEL,)))
    return copy_repository(MODEL_REPOSITORY, folder, entries=SERVED_ENTRIES, edit=edit)


def measure_mode(server: ServerGroup, mode: str, args, order_start: int) -> tuple[list[dict], dict | None]:
    """Direct and router steps of every case in `mode`; the rows, and the router's counts over all its steps."""
    parameters = router_config(server.http_url)
    if parameters["mode"] != mode:
        raise RuntimeError(f"the router serves in mode {parameters['mode']}, not {mode}")
    primary = parameters["primary"]
    cases = (LATENCY_CASE, (32, args.throughput_in_flight))
    pool = build_image_pool(32)
    with ResNetClient(AB_ROUTER_MODEL, "grpc", server.grpc_url) as client:   # the reloaded router's first calls
        for images, _ in cases:
            client.infer(pool[:images])
    rows, first = [], None
    for index, (images, in_flight) in enumerate(cases):
        steps = {}
        targets = ("direct", "router") if (order_start + index) % 2 == 0 else ("router", "direct")
        for target in targets:
            before = triton_metrics.scrape(server.metrics_url)
            first = first or before
            steps[target] = flood(primary if target == "direct" else AB_ROUTER_MODEL, server, images, in_flight, args)
            if target == "router":
                time.sleep(3 * METRICS_FLUSH_S)   # the router's figures (the shadow answers come after the client's)
                after = triton_metrics.scrape(server.metrics_url)
                steps["ab"] = triton_metrics.ab_delta(before, after)
                # Triton's own view of the router's step, of the router and of each arm (where time went)
                steps["triton"] = {model: {key: value for key, value in
                                           triton_metrics.model_delta(before, after, model).items()
                                           if value is not None and not key.startswith("execute_")}
                                   for model in (AB_ROUTER_MODEL, primary, parameters["candidate"])}
        direct, router = steps["direct"], steps["router"]
        rows.append({
            "mode": mode, "images_per_request": images, "in_flight": in_flight, "direct_model": primary,
            "direct_img_per_s": direct["img_per_s"], "router_img_per_s": router["img_per_s"],
            "direct_p50_ms": direct["p50_ms"], "direct_p99_ms": direct["p99_ms"],
            "router_p50_ms": router["p50_ms"], "router_p99_ms": router["p99_ms"],
            "extra_p50_ms": router["p50_ms"] - direct["p50_ms"] if router["p50_ms"] and direct["p50_ms"] else None,
            "throughput_share": router["img_per_s"] / direct["img_per_s"] if direct["img_per_s"] else None,
            "router_failures": router["failures"], "direct_failures": direct["failures"],
            "problems": direct["problems"] + router["problems"], "arms": steps["ab"]["arms"],
            "shadow_timeouts": steps["ab"]["shadow_timeouts"], "shadow_skipped": steps["ab"]["shadow_skipped"],
            "triton_during_router_step": steps["triton"]})
        print(f"{mode:6s} x{images:<3d} in flight {in_flight:3d}: direct {number(direct['img_per_s'])} img/s "
              f"p50 {number(direct['p50_ms'], 2)} ms; router {number(router['img_per_s'])} img/s p50 "
              f"{number(router['p50_ms'], 2)} ms p99 {number(router['p99_ms'], 2)} ms", flush=True)
    agreement = None
    if mode == "shadow":
        time.sleep(3 * METRICS_FLUSH_S)
        counted = triton_metrics.ab_delta(first, triton_metrics.scrape(server.metrics_url))
        agreement = {key: counted[key] for key in ("requests", "top1_agree", "top5_overlap_mean", "rel_l2_p99",
                                                   "images", "disagreeing_requests", "shadow_timeouts",
                                                   "shadow_skipped")}
    return rows, agreement


def targets(rows: list[dict]) -> list[dict]:
    def row(mode, images):
        return next((r for r in rows if r["mode"] == mode and r["images_per_request"] == images), None)

    shadow, split = row("shadow", 1), row("split", 32)
    found = []
    if shadow and shadow["extra_p50_ms"] is not None:
        found.append({"target": "shadow: extra p50 at one request in flight, 1 image/request",
                      "limit": f"<= {TARGET_SHADOW_EXTRA_P50_MS} ms", "value": round(float(shadow["extra_p50_ms"]), 3),
                      "met": bool(shadow["extra_p50_ms"] <= TARGET_SHADOW_EXTRA_P50_MS)})
    if split and split["throughput_share"] is not None:
        found.append({"target": "split: throughput through the router over direct calls, 32 images/request",
                      "limit": f">= {TARGET_SPLIT_THROUGHPUT_SHARE:.0%}",
                      "value": round(float(split["throughput_share"]), 3),
                      "met": bool(split["throughput_share"] >= TARGET_SPLIT_THROUGHPUT_SHARE)})
    return found


def markdown(results: dict) -> str:
    lines = [f"# Live A/B: the router's own cost ({AB_ROUTER_MODEL})", "",
             f"- Device: {results['device']}", f"- Date: {results['date']}, commit {results['git_commit']}",
             f"- Command: `{results['command']}`",
             f"- Each step: grpc_flood, {results['settings']['warmup_s']:g} s warm-up, "
             f"{results['settings']['measure_s']:g} s measured; direct = the router's primary "
             f"({results['modes'][0]['direct_model'] if results['modes'] else 'n/a'}) called directly, in the same "
             "run, back to back with the router's step. Router parameters: "
             + ", ".join(f"{k} {v}" for k, v in results["router_parameters"].items()) + ".", "",
             *table(["mode", "images/request", "in flight", "direct img/s", "router img/s", "router / direct",
                     "direct p50 ms", "router p50 ms", "extra p50 ms", "router p99 ms", "primary arm p50 ms",
                     "candidate arm p50 ms"],
                    ([r["mode"], r["images_per_request"], r["in_flight"], number(r["direct_img_per_s"]),
                      number(r["router_img_per_s"]), number(r["throughput_share"], 3),
                      *(number(r[key], 2) for key in ("direct_p50_ms", "router_p50_ms", "extra_p50_ms",
                                                      "router_p99_ms")),
                      *(number(r["arms"].get(arm, {}).get("p50_ms"), 2) for arm in ("primary", "candidate"))]
                     for r in results["modes"]), "l" + "r" * 11)]
    lines += ["", "## Targets", "",
              *table(["target", "limit", "measured", ""],
                     ([t["target"], t["limit"], t["value"], "met" if t["met"] else "**not met**"]
                      for t in results["targets"]), "llr")]
    a = results.get("agreement")
    if a:
        lines += ["", "## Agreement on the shadow traffic (the router's metrics)", "",
                  *table(["requests compared", "images", "top-1 agree", "mean top-5 overlap", "logits rel. L2 p99",
                          "disagreeing requests", "shadow late / skipped"],
                         [[a["requests"], a["images"], f"{number(a['top1_agree'] and a['top1_agree'] * 100, 2)} %",
                           f"{number(a['top5_overlap_mean'], 2)} / 5", number(a["rel_l2_p99"], 4),
                           a["disagreeing_requests"], f"{a['shadow_timeouts']} / {a['shadow_skipped']}"]], "rrrrrr"),
                  "", "Relative L2 p99: interpolated within the histogram's buckets (as Prometheus's "
                  "histogram_quantile), so it is as coarse as they are."]
    problems = [p for r in results["modes"] for p in r["problems"]]
    if problems:
        lines += ["", "**Request accounting problems:** " + "; ".join(problems)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=BUILD_DIR / "ab_live", help="folder of ab_live.json and .md")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--measure-s", type=float, default=4.0)
    parser.add_argument("--processes", type=int, default=4, help="grpc_flood processes (at most one per request "
                                                                  "in flight)")
    parser.add_argument("--throughput-in-flight", type=int, default=THROUGHPUT_IN_FLIGHT,
                        help=f"requests in flight at 32 images per request (default {THROUGHPUT_IN_FLIGHT})")
    parser.add_argument("--device", help="device description (default: detected)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated (default {','.join(MODES)})")
    parser.add_argument("--router-instances", type=int, help="override the router's instance count")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m fusedresnet.campaigns.ab_live", *(argv if argv is not None else sys.argv[1:])])
    results = {"device": args.device or describe_device(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "git_commit": git_commit(), "command": command,
               "settings": {"warmup_s": args.warmup_s, "measure_s": args.measure_s, "processes": args.processes,
                            "router_instances": args.router_instances or "as shipped",
                            "cases": [{"images_per_request": i, "in_flight": n}
                                      for i, n in (LATENCY_CASE, (32, args.throughput_in_flight))]},
               "modes": [], "agreement": None, "restarts": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ab_live_") as scratch:
        for index, mode in enumerate(args.modes.split(",")):
            repository = repository_in_mode(mode, Path(scratch) / mode, args.router_instances)
            for attempt in range(2):
                http_port, grpc_port, metrics_port = free_ports(3)
                settings = ServerSettings(repository, DEFAULT_HOST, http_port, grpc_port, metrics_port,
                                          processes_per_gpu=1, mps="off",
                                          log_file=args.out / f"ab_live_server_{mode}_{attempt}.log")
                server = None
                try:
                    with launch(settings) as server:
                        results["router_parameters"] = {k: v for k, v in router_config(server.http_url).items()
                                                        if k != "mode"}
                        rows, agreement = measure_mode(server, mode, args, index)
                    break
                except (OSError, RuntimeError) as error:   # the server died under a step: once more, afresh
                    server_exit = server.first.process.returncode if server is not None else None
                    results["restarts"].append({"mode": mode, "attempt": attempt, "error": str(error)[:300],
                                                "server_exit": server_exit})
                    print(f"{mode}: the step failed ({error}); server exit {server_exit}", flush=True)
                    if attempt:
                        raise
            results["modes"] += rows
            results["agreement"] = results["agreement"] or agreement
    results["targets"] = targets(results["modes"])
    results["duration_s"] = round(time.monotonic() - started, 1)
    # NumPy scalars (the load generator's percentiles) as plain numbers
    (args.out / "ab_live.json").write_text(json.dumps(results, indent=1, default=lambda value: value.item()) + "\n")
    (args.out / "ab_live.md").write_text(markdown(results))
    print(f"wrote {args.out / 'ab_live.json'} and {args.out / 'ab_live.md'} in {results['duration_s']} s")
    return 0 if all(not r["problems"] for r in results["modes"]) else 3


if __name__ == "__main__":
    sys.exit(main())
