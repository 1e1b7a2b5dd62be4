"""Measure every tile shape and split-K factor for every ResNet-18 convolution.

    python -m fusedresnet.kernels.tune [--out tuned_plans.json] [--batches 1,2,...,256]

For each convolution shape at 224x224 and each batch bucket of the engine,
each candidate (tile config x split-K) runs REPS times inside a captured CUDA
graph (so launch gaps do not count) and the fastest is kept. The result is
the table `kernels/tuned_plans.json` that `KernelLibrary.plan` consults before
falling back to the cost model in `configs.plan_conv` (other input sizes). The
table is for the GPU model and convolution path it was measured on (`device`,
`conv_path`): run it with FUSEDRESNET_CONV_PATH=mma for the mma.sync table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import cupy as cp

from .configs import BK, CONV_TILES, PATCH_TILES, ConvPlan, conv_tiles, make_plan, patch_applies, plan_conv, plan_key
from .launch import conv_out_size, library

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def time_graph(fn, reps: int = 10, samples: int = 5) -> float:
    """Median milliseconds of one fn() call, from replays of a graph holding `reps` calls."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.begin_capture()
        try:
            for _ in range(reps):
                fn()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(samples):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / reps)
    return statistics.median(times)


def candidates(m: int, k: int, k_tiles: int, sms: int, patch=None, path: str = "mma"):
    """Every (tile, split-K) worth timing; `patch` = (n, p, q, c, r, stride, pad) adds the patch kernels.

    On the wgmma path the wgmma tiles come first, then the mma.sync ones (compiled there too).
    """
    if patch is not None:
        n, p, q, c, r, stride, pad = patch
        for tile in PATCH_TILES:
            if patch_applies(tile, c, k, r, stride, pad):
                yield make_plan(tile, 1, m, k, k_tiles, n, p, q)
    for tile in (conv_tiles(path) + CONV_TILES if path == "wgmma" else CONV_TILES):
        tiles_mn = math.ceil(m / tile.bm) * math.ceil(k / tile.bn)
        seen = set()
        for splits in SPLITS:
            per = math.ceil(k_tiles / splits)
            real = math.ceil(k_tiles / per)
            if real in seen or (real > 1 and per < 2) or (real > 1 and tiles_mn >= 2 * sms):
                continue
            seen.add(real)
            yield ConvPlan(tile, real, per, (math.ceil(m / tile.bm), math.ceil(k / tile.bn), real))


def tune_conv(lib, n, h, w, c, k, r, stride, pad, relu=True, residual=False):
    p, q = conv_out_size(h, r, stride, pad), conv_out_size(w, r, stride, pad)
    m, k_tiles = n * p * q, r * r * c // BK
    x = cp.random.standard_normal((n, h, w, c), dtype=cp.float32).astype(cp.float16)
    weight = (cp.random.standard_normal((k, r, r, c), dtype=cp.float32) * 0.05).astype(cp.float16)
    bias = cp.zeros(k, dtype=cp.float32)
    y = cp.empty((n, p, q, k), dtype=cp.float16)
    res = cp.ones_like(y) if residual else None
    rows = []
    workspace = None
    for plan in candidates(m, k, k_tiles, lib.sms, (n, p, q, c, r, stride, pad), lib.path):
        if plan.splits > 1 and (workspace is None or workspace.size < plan.splits * y.size):
            workspace = cp.empty(plan.splits * y.size, dtype=cp.float32)
        ms = time_graph(lambda: lib.conv(x, weight, bias, y, stride=stride, pad=pad, relu=relu, residual=res,
                                         plan=plan, workspace=workspace))
        rows.append((ms, plan))
    rows.sort(key=lambda t: t[0])
    model = plan_conv(m, k, k_tiles, lib.sms, conv_tiles(lib.path))
    model_ms = next((ms for ms, pl in rows if pl.tile == model.tile and pl.splits == model.splits), None)
    return rows, model_ms


def main(argv=None):
    from ..backend.engine_cuda import BATCH_BUCKETS
    from .check import layer_shapes
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tuned_plans.json")
    parser.add_argument("--batches", default=",".join(str(b) for b in BATCH_BUCKETS))
    args = parser.parse_args(argv)
    lib = library(0)
    lib.tuned = {}   # measure the candidates themselves, not an older table
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    table = {}
    started = time.time()
    seen = set()
    for n in [int(b) for b in args.batches.split(",")]:
        total_best = total_model = 0.0
        for spec, h, w in layer_shapes():
            key = plan_key(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.stride)
            if key in seen:
                continue
            seen.add(key)
            rows, model_ms = tune_conv(lib, n, h, w, spec.in_channels, spec.out_channels, spec.kernel,
                                       spec.stride, spec.padding, spec.relu, spec.adds_residual)
            best_ms, best = rows[0]
            table[key] = {"tile": best.tile.label, "splits": best.splits, "ms": round(best_ms, 5),
                          "model_ms": round(model_ms, 5) if model_ms else None,
                          "runner_up": [f"{pl.tile.label}/k{pl.splits}:{ms:.4f}" for ms, pl in rows[1:4]]}
            total_best += best_ms
            total_model += model_ms or best_ms
        print(f"batch {n:>3}: tuned sum {total_best:.3f} ms, cost model {total_model:.3f} ms "
              f"({time.time() - started:.0f}s)", flush=True)
    result = {"device": device, "conv_path": lib.path, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "plans": table}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
