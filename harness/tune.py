"""Tune the whole network: every ResNet-18 convolution at every batch bucket of the engine.

    python -m fusedresnet.harness.tune [--out tuned_plans.json] [--batches 1,2,...,256]

Runs `fusedresnet.kernels.tune.tune_conv` (every tile x split-K of both kernel
families, CUDA-graph timed) for each convolution shape of ResNet-18 at 224x224
and each batch bucket the engine captures graphs for, and writes the table that
`KernelLibrary.plan` consults (kernels/tuned_plans.json): per plan key the
overall winner (the mixed path's plan) and each family's own winner (the paths
forced by FUSEDRESNET_CONV_PATH=mma|wgmma). It prints, per batch, what it chose
and the sums of the chosen, each family's best and the untuned default plans.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import cupy as cp

from ..backend.engine_cuda import BATCH_BUCKETS
from ..kernels.configs import CONV_PATHS, MIXED, WGMMA_ARCH, path_arch, plan_key, tile_family
from ..kernels.launch import library
from ..kernels.tune import entry, tune_conv
from .check import layer_shapes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tuned_plans.json")
    parser.add_argument("--batches", default=",".join(str(b) for b in BATCH_BUCKETS))
    args = parser.parse_args(argv)
    lib = library(0)
    lib.tuned = {}   # measure the candidates themselves, not an older table
    # Both families wherever the sm_90a module (which holds both) is loaded.
    families = CONV_PATHS if path_arch(lib.path) == WGMMA_ARCH else ("mma",)
    if lib.path == "wgmma":
        raise SystemExit("tune: run with FUSEDRESNET_CONV_PATH unset (or auto): the table records both families "
                         "and the forced paths take their own family's best from it")
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"tune on {device} ({lib.sms} SMs), path {lib.path}, families {'+'.join(families)}", flush=True)
    table = {}
    started = time.time()
    timed = 0
    for n in [int(b) for b in args.batches.split(",")]:
        sums = dict.fromkeys(("best", "default", *families), 0.0)
        chosen = []
        seen = set()
        for spec, h, w in layer_shapes():
            key = plan_key(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.stride)
            if key in seen:
                continue
            seen.add(key)
            rows, model_ms = tune_conv(lib, families, n, h, w, spec.in_channels, spec.out_channels, spec.kernel,
                                       spec.stride, spec.padding, spec.relu, spec.adds_residual)
            timed += len(rows)
            best_ms, best = rows[0]
            by_family = {}
            for family in families:
                ms, plan = next((ms, pl) for ms, pl in rows if tile_family(pl.tile) == family)
                by_family[family] = entry(ms, plan)
                sums[family] += ms
            table[key] = {**entry(best_ms, best), "model_ms": round(model_ms, 5), "by_family": by_family,
                          "runner_up": [f"{pl.tile.label}/k{pl.splits}:{ms:.4f}" for ms, pl in rows[1:4]]}
            sums["best"] += best_ms
            sums["default"] += model_ms
            chosen.append(f"{spec.name.removesuffix('.conv1').replace('.downsample', '.ds')}="
                          f"{best.tile.label}/k{best.splits}")
        others = ", ".join(f"{f}-only {sums[f]:.3f}" for f in families)
        print(f"batch {n:>3}: tuned sum {sums['best']:.3f} ms ({others}, untuned {lib.path} default "
              f"{sums['default']:.3f}) after {time.time() - started:.0f}s\n    " + " ".join(chosen), flush=True)
    result = {"device": device, "families": list(families), "conv_path": MIXED if len(families) > 1 else "mma",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plans": table}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"tune: {timed} candidates timed in {time.time() - started:.0f}s, {len(table)} plans -> {args.out}",
          flush=True)
    return 0



if __name__ == "__main__":
    sys.exit(main())
