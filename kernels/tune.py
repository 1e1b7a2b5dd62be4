"""Measure every tile shape and split-K factor of both kernel families for one convolution.

`tune_conv` is what the network tuner (`python -m fusedresnet.harness.tune`,
which knows ResNet-18's layer shapes and the engine's batch buckets) runs for
each convolution shape at 224x224 and each batch bucket of the engine:
each candidate (tile config x split-K) runs REPS times inside a captured CUDA
graph (so launch gaps do not count) and the fastest is kept. On compute
capability 9.0 the candidates are the mma.sync tiles (generic and
conv3x3_patch) AND the wgmma tiles; elsewhere the mma.sync ones. The result
is the table `kernels/tuned_plans/<model>.json` that `KernelLibrary.plan` consults
before falling back to `planner.untuned_plan` (conv3x3_patch_wgmma or the cost model, other input
sizes): per plan key the overall winner (with its family: the mixed path's
plan) and each family's own winner (the paths forced by
a forced mma or wgmma conv path). The table is for the GPU model it was
measured on (`device`).
"""

from __future__ import annotations

import math
import statistics

import cupy as cp

from .geometry import BK
from .launch import conv_out_size
from .planner import ConvPlan, make_plan, plan_key, untuned_plan
from .tiles import (
    CLUSTER_SPLITK_MAX,
    CONV_TILES,
    PATCH_TILES,
    PATCH_WGMMA_TILES,
    WGMMA_CONV_TILES,
    patch_applies,
    patch_wgmma_applies,
    reduces_in_cluster,
    runs_persistent,
    shortcut_applies,
    tile_family,
)

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


def candidates(m: int, k: int, k_tiles: int, sms: int, patch=None, families=("mma",), shortcut: bool = False):
    """Every (tile, split-K) worth timing; `patch` = (n, p, q, c, r, stride, pad) adds the patch kernels
    (conv3x3_patch, and conv3x3_patch_wgmma with the wgmma family); `shortcut`: only the tiles with the
    fused shortcut (`shortcut_applies`).

    Split-K only where the tiles alone fill fewer than two waves, with >= 2
    k-tiles per split and at most 4 waves of blocks (beyond that the fp32
    partials cost more than the idle SMs they fill). The "wc" tiles (split-K
    reduced in a cluster) only split, 2 .. CLUSTER_SPLITK_MAX ways.
    """
    if patch is not None:
        n, p, q, c, r, stride, pad = patch
        for tile in PATCH_TILES if "mma" in families else ():
            if patch_applies(tile, c, k, r, stride, pad):
                yield make_plan(tile, 1, m, k, k_tiles, n, p, q)
        for tile in PATCH_WGMMA_TILES if "wgmma" in families else ():
            if patch_wgmma_applies(tile, c, k, r, stride, pad, q):   # stride 1: input width = q
                yield make_plan(tile, 1, m, k, k_tiles, n, p, q)
    tiles = (CONV_TILES if "mma" in families else ()) + (WGMMA_CONV_TILES if "wgmma" in families else ())
    for tile in tiles if not shortcut else filter(shortcut_applies, tiles):
        if runs_persistent(tile):   # "wp": whole tiles only
            yield make_plan(tile, 1, m, k, k_tiles)
            continue
        tiles_mn = math.ceil(m / tile.bm) * math.ceil(k / tile.bn)
        cluster = reduces_in_cluster(tile)   # "wc": 2 .. CLUSTER_SPLITK_MAX slices only
        seen = set()
        for splits in SPLITS:
            per = math.ceil(k_tiles / splits)
            real = math.ceil(k_tiles / per)
            if cluster and not 1 < real <= CLUSTER_SPLITK_MAX:
                continue
            if real in seen or (real > 1 and (per < 2 or tiles_mn >= 2 * sms
                                              or tiles_mn * real > 4 * sms * tile.blocks_per_sm)):
                continue
            seen.add(real)
            yield ConvPlan(tile, real, per, (math.ceil(m / tile.bm), math.ceil(k / tile.bn), real))


def tune_conv(lib, families, n, h, w, c, k, r, stride, pad, relu=True, residual=False, shortcut=None):
    """[(ms, plan)] fastest first, and the ms of the untuned default plan of `lib.path`; plain launches.
    `shortcut`: (Hs, Ws, Cs, stride) of a fused shortcut's input (`KernelLibrary.conv_shortcut`; the
    implicit-GEMM tiles only).

    Not with programmatic dependent launch, even for the batches the engine launches that way: a graph
    of REPS copies of one convolution lets each copy's blocks start under the previous copy's tail, an
    overlap with itself that the network does not give it. Measured (NOTES.md, outcome 16): the table
    tuned that way for batches <= 32 made the network 3-8% slower at batch 8 and 32 than plans tuned
    with plain launches.
    """
    with lib.launch_mode(False):
        return _time_candidates(lib, families, n, h, w, c, k, r, stride, pad, relu, residual, shortcut)


def tune_shared_key(lib, families, n, h, w, c, k, r, stride, pad, uses: dict):
    """`tune_conv` for every convolution that shares one plan key (`plan_key`: the shape, not the epilogue),
    as [(ms, plan)] fastest first and the untuned default's ms, each the mean over the convolutions.

    `uses` maps (relu, residual, shortcut) to how many of the network's convolutions with this key have
    that epilogue: a stage's conv1 and conv2 have the same shape, and only conv2 adds the residual, which
    changes what is fastest (layer1 at batch 128 on the H100: the fastest plan without the residual is not
    the fastest with it; the runs that showed it are in docs/HISTORY.md). Only candidates timed for every
    epilogue are ranked.
    """
    total = sum(uses.values())
    mean, plans, timed = {}, {}, {}
    model_ms = 0.0
    for (relu, residual, shortcut), count in uses.items():
        rows, default_ms = tune_conv(lib, families, n, h, w, c, k, r, stride, pad, relu, residual, shortcut)
        model_ms += default_ms * count / total
        for ms, plan in rows:
            label = (plan.tile.label, plan.splits)
            mean[label] = mean.get(label, 0.0) + ms * count / total
            plans.setdefault(label, plan)
            timed[label] = timed.get(label, 0) + 1
    ranked = [(ms, plans[label]) for label, ms in mean.items() if timed[label] == len(uses)]
    return sorted(ranked, key=lambda t: t[0]), model_ms


def _time_candidates(lib, families, n, h, w, c, k, r, stride, pad, relu, residual, shortcut):
    p, q = conv_out_size(h, r, stride, pad), conv_out_size(w, r, stride, pad)
    shortcut_c = shortcut[2] if shortcut else 0
    m, k_tiles = n * p * q, (r * r * c + shortcut_c) // BK
    x = cp.random.standard_normal((n, h, w, c), dtype=cp.float32).astype(cp.float16)
    bias = cp.zeros(k, dtype=cp.float32)
    y = cp.empty((n, p, q, k), dtype=cp.float16)
    if shortcut:
        hs, ws, cs, shortcut_stride = shortcut
        xs = cp.random.standard_normal((n, hs, ws, cs), dtype=cp.float32).astype(cp.float16)
        weight = (cp.random.standard_normal((k, r * r * c + cs), dtype=cp.float32) * 0.05).astype(cp.float16)

        def run(plan, workspace):
            lib.conv_shortcut(x, weight, bias, y, xs, shortcut_stride=shortcut_stride, relu=relu, plan=plan,
                              workspace=workspace)
    else:
        weight = (cp.random.standard_normal((k, r, r, c), dtype=cp.float32) * 0.05).astype(cp.float16)
        res = cp.ones_like(y) if residual else None

        def run(plan, workspace):
            lib.conv(x, weight, bias, y, stride=stride, pad=pad, relu=relu, residual=res, plan=plan,
                     workspace=workspace)
    plans = list(candidates(m, k, k_tiles, lib.sms, None if shortcut else (n, p, q, c, r, stride, pad), families,
                            shortcut=bool(shortcut)))
    workspace = cp.empty(max(pl.splits for pl in plans) * y.size, dtype=cp.float32)
    rows = []
    for plan in plans:
        try:
            ms = time_graph(lambda: run(plan, workspace))
        except Exception:   # a launch or kernel fault: say which candidate before the context is gone
            print(f"tune: FAILED on {plan_key(n, h, w, c, k, r, stride, shortcut_c)} {plan.tile.label}/k{plan.splits} "
                  f"grid {plan.grid}", flush=True)
            raise
        rows.append((ms, plan))
    rows.sort(key=lambda t: t[0])
    model = untuned_plan(n, h, w, c, k, r, stride, pad, lib.sms, lib.path, shortcut_c)
    model_ms = next((ms for ms, pl in rows if pl.tile == model.tile and pl.splits == model.splits), None)
    if model_ms is None:   # a default plan outside the candidates (e.g. more splits): time it too
        if model.splits * y.size > workspace.size:
            workspace = cp.empty(model.splits * y.size, dtype=cp.float32)
        model_ms = time_graph(lambda: run(model, workspace))
    return rows, model_ms


def entry(ms, plan) -> dict:
    """One tuned-table entry: tile label, split-K, family, milliseconds."""
    return {"tile": plan.tile.label, "splits": plan.splits, "family": tile_family(plan.tile), "ms": round(ms, 5)}
