"""Tune the whole network: every ResNet-18 convolution at every batch bucket of the engine.

    python -m fusedresnet.harness.tune [--out tuned_plans.json] [--batches 1,2,...,256]

Runs `fusedresnet.kernels.tune.tune_conv` (every tile x split-K of both kernel
families, CUDA-graph timed) for each convolution shape of ResNet-18 at 224x224
and each batch bucket the engine captures graphs for (a shape that both a
stage's conv1 and its residual-adding conv2 have: timed with each epilogue and
ranked by the mean, `tune_shared_key`), and writes the table that
`KernelLibrary.plan` consults (kernels/tuned_plans/<model>.json): per plan key the
overall winner (the mixed path's plan) and each family's own winner (the paths
forced by FUSEDRESNET_CONV_PATH=mma|wgmma). The overall winners are then
refined in the network itself (`refine_in_network`: the engine's CUDA graph at
that batch, each convolution's next-fastest candidates tried in turn), because
alone, the fastest candidates are often near-ties that the network orders
differently. It prints, per batch, the sums of the chosen, each family's best
and the untuned default plans, the graph before and after the refinement, and
what it chose (* = changed by the refinement).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import cupy as cp

from ..backend.engines.config import environment_engine_arguments
from ..backend.engines.fused_cuda import BATCH_BUCKETS, FusedCudaEngine
from ..backend.resnet.architecture import DEFAULT_SEED
from ..backend.resnet.folding import fold_resnet18
from ..backend.resnet.weights import build_resnet18
from ..kernels.build import WGMMA_ARCH
from ..kernels.launch import library
from ..kernels.launch_choices import CONV_PATHS, MIXED, path_arch
from ..kernels.planner import plan_key
from ..kernels.tiles import tile_family
from ..kernels.tune import entry, tune_shared_key
from .bench import bench_custom
from .check import layer_shapes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tuned_plans.json")
    parser.add_argument("--batches", default=",".join(str(b) for b in BATCH_BUCKETS))
    args = parser.parse_args(argv)
    environment = environment_engine_arguments()
    lib = library(0, environment["conv_path"], environment["pdl"])
    lib.load_candidates()   # every candidate, compiled in parallel before the timing starts
    lib.tuned = {}   # measure the candidates themselves, not an older table
    # Both families wherever the sm_90a module (which holds both) is loaded.
    families = CONV_PATHS if path_arch(lib.path) == WGMMA_ARCH else ("mma",)
    if lib.path == "wgmma":
        raise SystemExit("tune: run with FUSEDRESNET_CONV_PATH unset (or auto): the table records both families "
                         "and the forced paths take their own family's best from it")
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    # The network as the engine serves it (its CUDA graph, launched as it launches each batch): where the
    # plans are refined (refine_in_network). It shares `lib` (library(0)), whose table the refinement sets.
    engine = FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0", **environment)
    print(f"tune on {device} ({lib.sms} SMs), path {lib.path}, families {'+'.join(families)}", flush=True)
    table = {}
    started = time.time()
    timed = 0
    for n in [int(b) for b in args.batches.split(",")]:
        sums = dict.fromkeys(("best", "default", *families), 0.0)
        chosen = []
        shortlist, first_layer = {}, {}
        # The network's convolutions by plan key (first use first), each key with the epilogues of its uses.
        uses_by_key = {}
        for spec, h, w, shortcut_hw in layer_shapes(batch=n):
            shortcut = (*shortcut_hw, spec.shortcut.in_channels, spec.shortcut.stride) if shortcut_hw else None
            key = plan_key(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.stride,
                           shortcut[2] if shortcut else 0)
            uses = uses_by_key.setdefault(key, ((spec, h, w), collections.Counter()))[1]
            uses[spec.relu, spec.adds_residual, shortcut] += 1
        for key, ((spec, h, w), uses) in uses_by_key.items():
            rows, model_ms = tune_shared_key(lib, families, n, h, w, spec.in_channels, spec.out_channels,
                                             spec.kernel, spec.stride, spec.padding, uses)
            timed += len(rows) * len(uses)
            best_ms, best = rows[0]
            by_family = {}
            for family in families:
                ms, plan = next((ms, pl) for ms, pl in rows if tile_family(pl.tile) == family)
                by_family[family] = entry(ms, plan)
                sums[family] += ms
            table[key] = {**entry(best_ms, best), "model_ms": round(model_ms, 5), "by_family": by_family,
                          "runner_up": [f"{pl.tile.label}/k{pl.splits}:{ms:.4f}" for ms, pl in rows[1:4]]}
            shortlist[key], first_layer[key] = rows[:SHORTLIST], spec.name
            sums["best"] += best_ms
            sums["default"] += model_ms
        others = ", ".join(f"{f}-only {sums[f]:.3f}" for f in families)
        print(f"batch {n:>3}: tuned sum {sums['best']:.3f} ms ({others}, untuned {lib.path} default "
              f"{sums['default']:.3f}) after {time.time() - started:.0f}s", flush=True)
        picked, isolated_ms, network_ms = refine_in_network(engine, n, shortlist)
        for key, (ms, plan) in picked.items():
            if plan is not shortlist[key][0][1]:
                table[key].update(entry(ms, plan), network_refined=True)
        for key, name in first_layer.items():
            plan = picked[key][1]
            chosen.append(f"{name.removesuffix('.conv1').replace('downsample', 'ds')}="
                          f"{plan.tile.label}/k{plan.splits}" + ("*" if table[key].get("network_refined") else ""))
        changed = sum(bool(table[k].get("network_refined")) for k in picked)
        print(f"    network graph: {isolated_ms:.4f} ms with each conv's fastest alone, {network_ms:.4f} ms after "
              f"refinement ({changed} plans changed, *)\n    " + " ".join(chosen), flush=True)
    result = {"device": device, "families": list(families), "conv_path": MIXED if len(families) > 1 else "mma",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plans": table}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"tune: {timed} candidates timed in {time.time() - started:.0f}s, {len(table)} plans -> {args.out}",
          flush=True)
    return 0



SHORTLIST = 3          # candidates per convolution tried in the network graph
MIN_GAIN = 0.01        # a swap must make the network graph this much faster (the replay-to-replay noise ~0.5%)


def refine_in_network(engine, n: int, shortlist: dict) -> tuple[dict, float, float]:
    """The plans of batch n, refined where the network graph says otherwise than the convolutions alone.

    Each convolution was timed alone (a graph of REPS copies of it); in the network its neighbours
    differ, and at small batches a kernel boundary (~1 us, NOTES.md outcome 12) and how a grid drains
    into the next one weigh as much as the near-ties between the fastest candidates. So: start from
    each convolution's fastest alone, then one pass over the convolutions in order, timing the engine's
    whole CUDA graph at batch n (`bench.bench_custom`, launched as the engine launches batch n) with each
    of the convolution's next-fastest candidates in turn, keeping a swap that makes the graph at least
    MIN_GAIN faster. Returns ({key: (ms alone, plan)}, graph ms before, graph ms after).
    """
    picked = {key: rows[0] for key, rows in shortlist.items()}

    def network_ms(choice: dict) -> float:
        engine.lib.tuned = {key: (plan.tile, plan.splits) for key, (_, plan) in choice.items()}
        engine.drop_graphs()   # recapture the graph with these plans
        cp.get_default_memory_pool().free_all_blocks()
        return bench_custom(engine, n)

    start = best = network_ms(picked)
    for key, rows in shortlist.items():
        for candidate in rows[1:]:
            trial = {**picked, key: candidate}
            ms = network_ms(trial)
            if ms < best * (1 - MIN_GAIN):
                picked, best = trial, ms
    engine.lib.tuned = {}
    engine.drop_graphs()
    return picked, start, best


if __name__ == "__main__":
    sys.exit(main())
