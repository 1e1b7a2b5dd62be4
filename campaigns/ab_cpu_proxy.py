"""The A/B router's own cost on any host, as a proxy for the GPU run (campaigns/ab_live.py): arms that cost nothing.

    python -m fusedresnet.campaigns.ab_cpu_proxy                      # zero-answer arms, shadow/split/primary
    python -m fusedresnet.campaigns.ab_cpu_proxy --modes shadow --json build/ab_proxy.json

Both arms are the zero-answer model (loadtest/zero_model: it reads the images and answers zeros at once, under
two entry names), so what a step through the router costs beyond the direct step is Triton's, the Python
backend's and the router's own work, not an engine's. For each mode a fresh server (the router's config names
the mode), and for each case (1 image per request at one in flight: the latency; 32 images per request at
16 in flight: the throughput) a grpc_flood step to the primary directly and one through the router, back to back,
the order alternating. Prints one line per case and mode; `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import AB_ROUTER_MODEL, DEFAULT_HOST, MODEL_REPOSITORY, ZERO_MODEL
from fusedresnet.loadtest import grpc_flood
from fusedresnet.loadtest.perf_analyzer import add_zero_model

CANDIDATE = "zero_candidate"


def set_router_parameters(text: str, **parameters) -> str:
    """The router's config.pbtxt text with the given parameters' string values replaced."""
    for key, value in parameters.items():
        text, found = re.subn(rf'(key: "{key}" value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        if not found:
            raise ValueError(f"the router's config has no parameter {key}")
    return text


def proxy_repository(folder: Path, mode: str, router_instances: int | None) -> Path:
    """Two zero-answer entries (primary ZERO_MODEL, candidate CANDIDATE) and the shipped router in `mode`."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    add_zero_model(folder)
    shutil.copytree(folder / ZERO_MODEL, folder / CANDIDATE)
    config = folder / CANDIDATE / "config.pbtxt"
    config.write_text(re.sub(rf'name: "{ZERO_MODEL}"', f'name: "{CANDIDATE}"', config.read_text()))
    router = folder / AB_ROUTER_MODEL
    shutil.copytree(MODEL_REPOSITORY / AB_ROUTER_MODEL, router, ignore=shutil.ignore_patterns("__pycache__"))
    text = set_router_parameters((router / "config.pbtxt").read_text(), mode=mode, primary=ZERO_MODEL,
                                 candidate=CANDIDATE)
    if router_instances:
        text = re.sub(r"count: \d+", f"count: {router_instances}", text)
    (router / "config.pbtxt").write_text(text)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="shadow,split,primary")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--measure-s", type=float, default=5.0)
    parser.add_argument("--cases", default="1@1,32@16", help="images@in-flight, comma-separated")
    parser.add_argument("--processes", type=int, default=1, help="grpc_flood processes")
    parser.add_argument("--router-instances", type=int, help="override the router's instance count")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--log-dir", type=Path, help="keep the servers' logs here")
    args = parser.parse_args(argv)
    cases = [tuple(int(n) for n in case.split("@")) for case in args.cases.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ab_proxy_") as scratch:
        log_dir = args.log_dir or Path(scratch)
        log_dir.mkdir(parents=True, exist_ok=True)
        for mode in args.modes.split(","):
            repository = proxy_repository(Path(scratch) / mode, mode, args.router_instances)
            http_port, grpc_port, metrics_port = free_ports(3)
            settings = ServerSettings(repository, DEFAULT_HOST, http_port, grpc_port, metrics_port, processes_per_gpu=1,
                                      log_file=log_dir / f"ab_proxy_{mode}.log", mps="off")
            with launch(settings) as server:
                for index, (images, in_flight) in enumerate(cases):
                    steps = {}
                    for target in (("direct", "router") if index % 2 == 0 else ("router", "direct")):
                        steps[target] = grpc_flood.run_step(
                            ZERO_MODEL if target == "direct" else AB_ROUTER_MODEL, server.grpc_url,
                            server.metrics_url, in_flight, images, processes=min(in_flight, args.processes),
                            warmup_s=args.warmup_s, measure_s=args.measure_s)
                    direct, router = steps["direct"], steps["router"]
                    row = {"mode": mode, "images_per_request": images, "in_flight": in_flight,
                           "direct_img_per_s": direct["img_per_s"], "router_img_per_s": router["img_per_s"],
                           "direct_p50_ms": direct["p50_ms"], "router_p50_ms": router["p50_ms"],
                           "router_p99_ms": router["p99_ms"], "failures": direct["failures"] + router["failures"],
                           # Triton's view of the router's step: its batches and where their time went
                           "router_triton": {key: router.get(key) for key in (
                               "avg_batch", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")}}
                    rows.append(row)
                    print(f"{mode:7s} x{images:<2d} @{in_flight:<2d}: direct {direct['img_per_s']:8.1f} img/s p50 "
                          f"{direct['p50_ms']:6.2f} ms | router {router['img_per_s']:8.1f} img/s p50 "
                          f"{router['p50_ms']:6.2f} ms p99 {router['p99_ms']:6.2f} ms | extra p50 "
                          f"{router['p50_ms'] - direct['p50_ms']:+.2f} ms, share "
                          f"{router['img_per_s'] / direct['img_per_s']:.2f}, failures {row['failures']}; router "
                          + ", ".join(f"{k} {v:.1f}" for k, v in row["router_triton"].items() if v is not None),
                          flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1, default=float) + "\n")
    return 0 if all(r["failures"] == 0 for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
