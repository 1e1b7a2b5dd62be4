"""Time to ready of the real Triton server with both models: from an empty kernel cache, then with a warm one.

    python -m fusedresnet.harness.cold_start [--out results/cold_start.json] [--cache-dir DIR]

Starts `tritonserver` (backend/serve.py, on free loopback ports) with the prepared model repository,
twice, with $CUPY_CACHE_DIR pointing at a new empty folder: the first start compiles every kernel the
engine serves (kernels/nvrtc_build.py), the second finds them all on disk. Each time is from the
server's launch until it reports ready (both models loaded and warmed up, every instance); then one
request to each model checks the engine that answers (on a GPU host the custom model must answer with a
fused-cuda engine: a fallback is an error, not a time). Writes device, date, commit, cold_s, warm_s,
the engines, the kernels compiled and each instance's load line from the server log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..backend.network import free_ports
from ..backend.provenance import git_commit
from ..backend.serve import DEFAULT_READY_TIMEOUT_S, ServerSettings, launch
from ..backend.spec import DEFAULT_HOST, INPUT_SHAPES, INPUT_UINT8, MODEL_CUSTOM, MODELS
from ..backend.triton_server.installation import host_gpus
from ..client.resnet_client import ResNetClient
from ..kernels.nvrtc_build import CACHE_PREFIX

REPO = Path(__file__).resolve().parent.parent
LOAD_LINE = re.compile(r"(resnet18_\w+): engine (\S+) on (\S+) .*loaded and warmed up in ([\d.]+) s")


def start_once(cache_dir: Path, log: Path, ready_timeout_s: float) -> dict:
    """One server start with this kernel cache: seconds to ready, the engine each model answers with, the
    instances' load lines."""
    os.environ["CUPY_CACHE_DIR"] = str(cache_dir)   # the server's environment, hence every model instance's
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(host=DEFAULT_HOST, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                              processes_per_gpu=1, log_file=log, ready_timeout_s=ready_timeout_s, mps="off")
    started = time.monotonic()
    server = launch(settings)
    try:
        ready_s = time.monotonic() - started
        images = np.random.default_rng(0).integers(0, 256, (1, *INPUT_SHAPES[INPUT_UINT8]), dtype=np.uint8)
        engines = {}
        for model in MODELS:
            with ResNetClient(model, protocol="grpc", url=server.grpc_url) as client:
                engines[model] = client.infer(images).engine
    finally:
        server.stop()
    loads = [{"model": m, "engine": e, "device": d, "load_s": float(s)}
             for m, e, d, s in LOAD_LINE.findall(log.read_text(errors="replace"))]
    return {"ready_s": round(ready_s, 2), "engines": engines, "instances": loads}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "cold_start.json")
    parser.add_argument("--cache-dir", type=Path, help="the kernel cache to start from (default: a new empty folder;"
                                                        " it must be empty)")
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S)
    args = parser.parse_args(argv)
    gpus = host_gpus()
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="fusedresnet-cold-start-"))
    cache.mkdir(parents=True, exist_ok=True)
    if any(cache.iterdir()):
        raise SystemExit(f"cold_start: {cache} is not empty: a cold start needs an empty kernel cache")
    logs = args.out.parent / "cold_start_logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs = {}
    for which in ("cold", "warm"):
        runs[which] = start_once(cache, logs / f"server_{which}.log", args.ready_timeout)
        print(f"{which}: ready in {runs[which]['ready_s']:.1f} s, engines {runs[which]['engines']}", flush=True)
    custom = runs["cold"]["engines"][MODEL_CUSTOM]
    if gpus and not custom.startswith("fused-cuda"):
        raise SystemExit(f"cold_start: on a GPU host {MODEL_CUSTOM} answered with {custom}, not the fused engine")
    result = {
        "device": re.sub(r"^GPU \d+: | \(UUID.*$", "", gpus[0]) if gpus else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit() or "unknown",
        "cold_s": runs["cold"]["ready_s"],
        "warm_s": runs["warm"]["ready_s"],
        "what": "seconds from launching tritonserver (both models, every instance) until it reports ready; cold: "
                "$CUPY_CACHE_DIR empty, warm: the same cache again",
        "command": "python -m fusedresnet.harness.cold_start " + " ".join(argv if argv is not None else sys.argv[1:]),
        "kernels_compiled": len(list(cache.glob(f"{CACHE_PREFIX}*.cubin"))),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"cold {result['cold_s']:.1f} s, warm {result['warm_s']:.1f} s, {result['kernels_compiled']} kernels "
          f"compiled -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
