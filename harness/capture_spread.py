"""The network graph's time over fresh captures: how much one capture's figure can differ from another's.

    python -m fusedresnet.harness.capture_spread [--batches 1,8,32] [--captures 12] [--with-others]

For each batch: the engine's CUDA graph captured afresh `--captures` times (buffers freed in between),
each timed as the bench times it (`bench.bench_custom`), with programmatic dependent launch as the
engine uses it and with plain launches. `--with-others` then builds what else the bench holds (the
engines forced to mma.sync and to wgmma, the torch model) and measures again with the forced engines'
graphs run before each capture, as the bench alternates them: kernels/NOTES.md outcome 17 (the bench's
default engine slower at batch 1 than in a process of its own).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import cupy as cp

from ..backend.engines.config import environment_engine_arguments
from ..backend.engines.fused_cuda import FusedCudaEngine
from ..backend.resnet.architecture import DEFAULT_SEED
from ..backend.resnet.folding import fold_resnet18
from ..backend.resnet.weights import build_resnet18
from .bench import bench_custom


def new_engine(**kwargs) -> FusedCudaEngine:
    return FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0", **kwargs)


def spread(engine: FusedCudaEngine, batch: int, captures: int, between=()) -> list[float]:
    """Milliseconds of `captures` fresh captures of the engine's graph at `batch`; before each, one
    timed run of every engine in `between` at the same batch (as the bench alternates its engines)."""
    times = []
    for _ in range(captures):
        for other in between:
            bench_custom(other, batch)
        engine.drop_graphs()
        cp.get_default_memory_pool().free_all_blocks()
        times.append(bench_custom(engine, batch))
    return times


def report(label: str, engines: dict, batches, captures: int, between=()):
    for batch in batches:
        for name, engine in engines.items():
            t = [ms * 1000 for ms in spread(engine, batch, captures, between)]
            print(f"{label} N={batch} {name}: median {statistics.median(t):.1f} us, min {min(t):.1f}, max {max(t):.1f} "
                  f"({' '.join(f'{v:.1f}' for v in t)})", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--captures", type=int, default=12)
    parser.add_argument("--with-others", action="store_true")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    environment = environment_engine_arguments()
    engines = {"default": new_engine(**environment), "plain launches": new_engine(**{**environment, "pdl": False})}
    print(f"{len(engines['default'].lib.tuned)} tuned plans, path {engines['default'].lib.path}", flush=True)
    report("alone", engines, batches, args.captures)
    if args.with_others:
        torch_model = build_resnet18(None, DEFAULT_SEED).cuda().eval()   # the bench's, resident on the GPU
        others = [new_engine(**{**environment, "conv_path": family}) for family in ("mma", "wgmma")]
        report(f"beside the forced engines and the torch {type(torch_model).__name__}", engines, batches,
               args.captures, between=others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
