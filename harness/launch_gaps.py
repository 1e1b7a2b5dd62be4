"""Where the whole-network time goes between kernels: launch gaps, graph submission, PDL.

    python -m fusedresnet.harness.launch_gaps [--batches 1,8,128] [--json launch_gaps.json]

For each batch, the engine's captured graph with programmatic dependent launch
on and off (kernels/launch.py), timed three ways (median of --reps, ms):
- idle: CUDA events around one replay on an idle GPU, as harness/bench.py
  times it (includes the time the host takes to submit the graph, because the
  start event runs before the graph is on the GPU);
- busy: the same after a ~1 ms spin kernel on the stream, so the whole graph is
  submitted before the start event runs: the GPU's time for the graph alone;
- back_to_back: 20 replays queued together, per replay.
Also the graph's dependency edges by type (cuGraphGetEdges): how many of them
stream capture made programmatic (what PDL needs). The kernels alone: the
per-layer graph timings of harness/bench.py. Needs a GPU, CuPy, torch and cuda.bindings.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time

import cupy as cp
import torch

from ..backend.engines.config import conv_path_override
from ..backend.engines.fused_cuda import FusedCudaEngine
from ..backend.resnet.architecture import DEFAULT_SEED
from ..backend.resnet.folding import fold_resnet18
from ..backend.resnet.weights import build_resnet18
from ..backend.spec import INPUT_UINT8

SPIN_CYCLES = 2_000_000   # ~1 ms at 1.98 GHz: longer than submitting any of our graphs
BACK_TO_BACK = 20


def edge_types(graph) -> dict[str, int]:
    """Dependency edges of a captured CuPy graph, counted by type (default / programmatic / ...)."""
    from cuda.bindings import driver
    handle = driver.CUgraph(graph.graph)
    err, _, _, _, count = driver.cuGraphGetEdges(handle)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    err, _, _, data, count = driver.cuGraphGetEdges(handle, count)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    # type 0 default, 1 programmatic; from_port 0 default, 1 programmatic, 2 launch order (cuda.h). A few
    # entries read back outside those ranges (the binding's edge data is not always filled in): counted
    # as "unreadable", not as edges of a kind.
    names = {(0, 0): "default", (1, 1): "programmatic", (1, 2): "launch_order"}
    kinds = collections.Counter(names.get((int(d.type), int(d.from_port)), "unreadable") for d in data)
    return dict(kinds, total=count)


def time_graph_ways(engine: FusedCudaEngine, batch: int, reps: int) -> dict[str, float]:
    plan = engine.plan(batch, INPUT_UINT8, 224, 224)
    plan.input[...] = cp.random.randint(0, 256, plan.input.shape, dtype=cp.int32).astype(cp.uint8)
    stream = engine.cupy_stream
    result = {}
    for way in ("idle", "busy", "back_to_back"):
        times = []
        for i in range(5 + reps):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            if way == "busy":
                with torch.cuda.stream(engine.stream):
                    torch.cuda._sleep(SPIN_CYCLES)
            start.record(stream)
            for _ in range(BACK_TO_BACK if way == "back_to_back" else 1):
                plan.graph.launch(stream)
            end.record(stream)
            end.synchronize()
            if i >= 5:
                times.append(cp.cuda.get_elapsed_time(start, end) / (BACK_TO_BACK if way == "back_to_back" else 1))
        result[f"{way}_ms"] = round(statistics.median(times), 4)
    result["edges"] = edge_types(plan.graph)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,128")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    # PDL at every batch here (the engine's default rule, launch_choices.PDL_MAX_BATCH, comes from these rows)
    engines = {pdl: FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0", pdl=pdl,
                                    conv_path=conv_path_override(), pdl_max_batch=1 << 30) for pdl in (True, False)}
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for pdl, engine in engines.items():
            row = {"batch": batch, "pdl": pdl, **time_graph_ways(engine, batch, args.reps)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                       time.gmtime()), "command": "python -m fusedresnet.harness.launch_gaps " + " ".join(
                       argv if argv is not None else sys.argv[1:]), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
