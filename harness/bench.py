"""Benchmark: the fused engine against the cuDNN baselines, and a per-layer table.

    python -m fusedresnet.harness.bench [--batches 1,8,32,64,128,256] [--compile]
                                        [--features-batches 1,32,128,512]
                                        [--accuracy check.json] [--out results/]

(a) Whole network, 224x224, milliseconds per batch, each engine timed two ways,
    as its users run it: back-to-back (`_b2b_ms`: about 100 ms of calls queued
    between two CUDA events, no sync in between, median of 3 such runs: the
    throughput of a loop that keeps the GPU fed; img/s come from it) and one
    call at a time (`_ms`: CUDA events around a single call, then a sync, median
    over repetitions: the latency of one request on an idle GPU, host launch
    overhead included). Our engine (its captured CUDA graph, uint8 input already on the
    device, normalisation included) against the same ResNet-18 as TorchScript
    fp32, TorchScript fp16 channels-last, and fp16 channels-last replayed from a
    CUDA graph (fp16 normalised input already on the device); with --compile also
    torch.compile(mode="max-autotune") fp16 channels-last (minutes of compiling per
    batch size: timed last, after (b) and (c), the files rewritten after each).
(b) Per-layer table: each convolution of ResNet-18 run alone with the tile
    shape and split-K the engine uses (split-K reduction included), timed from
    replays of a CUDA graph of 10 launches (no launch gaps), ms,
    TFLOP/s and % of the tensor-core peak measured here with a large fp16
    matrix product (cuBLAS), and its roofline (harness/roofline.py): the
    bytes it must move, GB/s, the memory's bandwidth measured by a copy, the
    bound (compute or memory), % of its roof and its share of the layers'
    time at its batch, written as CSV.
    From batch SHORTCUT_FUSION_MIN_BATCH up a downsampling block's conv2 runs
    with the block's 1x1 projection fused into its reduction (layer
    "...conv2+downsample"; its FLOPs include the projection's), below it the
    downsample is its own row; the table "Fused shortcut" compares the fused
    conv2 with the same conv2 adding a residual (the identity blocks' conv2).
(c) The seed workload: 64x64 inputs to the features (N,512,2,2) at
    --features-batches, our engine (its graph, head included) against
    TorchScript fp32, fp16 channels-last and fp16 channels-last + CUDA graph.
(d) A bar plot of latency and throughput, custom against the baselines.

The tensor-core peak is measured after (a) and again after (b), with the
GPU's clocks, power and throttle reasons at each point (nvidia-smi): a GPU
that another process shares or that throttles shows up as two peaks apart.
Not before (a): timed right after the cuBLAS products, batch 1 read 7-10%
slower (kernels/NOTES.md outcome 17).

On compute capability 9.0 (the mixed path: each conv on the family its plan
names) (a) and (b) are also measured with the engine forced to one family
(conv_path mma, wgmma) in the same process: `custom_mma_ms`,
`custom_wgmma_ms` per batch and the per-layer rows with path "mma" and
"wgmma", so the paths are compared on one GPU and one run (--no-compare-mma
skips them). Where the engine uses programmatic dependent launch (cc >= 9.0,
kernels/launch.py), (a) also times the same engine launched plainly:
`custom_no_pdl_ms`.

Writes kernels_bench.json, kernels_layers.csv, kernels_bench.png and
kernels_bench.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cupy as cp
import torch

from ..backend.engines.config import environment_engine_arguments
from ..backend.engines.fused_cuda import FusedCudaEngine
from ..backend.provenance import git_commit
from ..backend.resnet.architecture import DEFAULT_SEED
from ..backend.resnet.folding import STEM, fold_resnet18
from ..backend.resnet.weights import build_resnet18
from ..backend.spec import INPUT_UINT8
from ..kernels.launch import conv_out_size
from ..kernels.launch_choices import SHORTCUT_FUSION_MIN_BATCH
from ..kernels.tune import time_graph
from .bench_report import record, summary_table, write_result
from .check import layer_shapes
from .roofline import conv_bytes, memory_bandwidth_gbs, roofline, stem_bytes, time_shares

GFLOP_PER_IMAGE = 3.63


def time_ms(fn, reps: int, warmup: int = 5, stream=None) -> float:
    """Median of `reps` CUDA-event timings of fn() on torch's current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# Back-to-back: each run queues about this many ms of calls (at least BACK_TO_BACK_MIN_CALLS).
BACK_TO_BACK_TARGET_MS = 100.0
BACK_TO_BACK_MIN_CALLS, BACK_TO_BACK_MAX_CALLS = 20, 500
BACK_TO_BACK_RUNS = 3


def back_to_back_ms(fn, one_call_ms: float, stream=None) -> float:
    """ms per call of fn() called back-to-back (no sync between calls) between two CUDA events on `stream`
    (a torch stream; default the current one): median of BACK_TO_BACK_RUNS runs. `one_call_ms` (the call
    timed alone) sets how many calls make a run of about BACK_TO_BACK_TARGET_MS."""
    calls = max(BACK_TO_BACK_MIN_CALLS, min(BACK_TO_BACK_MAX_CALLS, round(BACK_TO_BACK_TARGET_MS / one_call_ms)))
    stream = stream if stream is not None else torch.cuda.current_stream()
    runs = []
    for _ in range(BACK_TO_BACK_RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        end.synchronize()
        runs.append(start.elapsed_time(end) / calls)
    return statistics.median(runs)


def both_timings(fn, reps: int, stream=None) -> tuple[float, float]:
    """(one call at a time ms, back-to-back ms) of fn() on torch's current stream."""
    one = time_ms(fn, reps)
    return one, back_to_back_ms(fn, one, stream)


def reps_for(batch: int) -> int:
    return 50 if batch <= 32 else 30


def bench_custom(engine: FusedCudaEngine, batch: int, size: int = 224) -> float:
    plan = engine.plan(batch, INPUT_UINT8, size, size)
    plan.input[...] = cp.random.randint(0, 256, plan.input.shape, dtype=cp.int32).astype(cp.uint8)
    stream = engine.cupy_stream
    times = []
    with cp.cuda.Device(engine.device_id):
        for i in range(5 + reps_for(batch)):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            plan.graph.launch(stream)
            end.record(stream)
            end.synchronize()
            if i >= 5:
                times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def custom_timings(engine: FusedCudaEngine, batch: int, size: int = 224) -> tuple[float, float]:
    """(one replay at a time ms, back-to-back ms) of the engine's graph for `batch` (see `bench_custom`)."""
    one = bench_custom(engine, batch, size)
    plan = engine.plan(batch, INPUT_UINT8, size, size)
    with cp.cuda.Device(engine.device_id):
        return one, back_to_back_ms(lambda: plan.graph.launch(engine.cupy_stream), one, engine.stream)


class FeaturesOnly(torch.nn.Module):
    """The network up to its features (N,512,H/32,W/32): the seed workload's output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model.features(x)


def bench_torch(model_fp32, batch: int, which: str, size: int = 224,
                features: bool = False) -> tuple[float, float]:
    """(one call at a time ms, back-to-back ms) of the baseline `which` at `batch`."""
    x = torch.randn(batch, 3, size, size, device="cuda")
    if features:
        model_fp32 = FeaturesOnly(model_fp32)
    with torch.inference_mode():
        if which == "ts_fp32":
            module = torch.jit.freeze(torch.jit.trace(model_fp32, x).eval())
            return both_timings(lambda: module(x), reps_for(batch))
        x16 = x.half().contiguous(memory_format=torch.channels_last)
        model16 = model_fp32.half().to(memory_format=torch.channels_last)
        try:
            if which == "ts_fp16":
                module = torch.jit.freeze(torch.jit.trace(model16, x16).eval())
                return both_timings(lambda: module(x16), reps_for(batch))
            if which == "graph_fp16":
                module = torch.jit.freeze(torch.jit.trace(model16, x16).eval())
                static = x16.clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        module(static)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    module(static)
                return both_timings(graph.replay, reps_for(batch))
            if which == "compile_max_autotune":
                # A fresh, static-shape compile per batch size: without the reset, Dynamo's automatic
                # dynamic shapes would serve every batch size after the first from one dynamic-shape
                # graph tuned for another batch.
                torch._dynamo.reset()
                compiled = torch.compile(model16, mode="max-autotune", dynamic=False)
                for _ in range(3):
                    compiled(x16)
                return both_timings(lambda: compiled(x16), reps_for(batch))
        finally:
            model_fp32.float().to(memory_format=torch.contiguous_format)
    raise ValueError(which)


def tensor_core_peak_tflops(trials: int = 3) -> float:
    """Best of `trials` medians of a cuBLAS fp16 8192^3 product, after ~0.3 s of them (clocks up from idle)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(200):
        a @ b
    return max(2 * 8192 ** 3 / time_ms(lambda: a @ b, 20) / 1e9 for _ in range(trials))


GPU_STATE_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


def gpu_state() -> dict:
    """Clocks, power, temperature, throttle reasons and the compute processes on GPU 0 (nvidia-smi), now."""
    try:
        index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        gpu = subprocess.run(["nvidia-smi", "-i", index, f"--query-gpu={','.join(GPU_STATE_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        apps = subprocess.run(["nvidia-smi", "-i", index, "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    if gpu.returncode != 0 or apps.returncode != 0:
        return {"error": (gpu.stderr or gpu.stdout or apps.stderr or apps.stdout).strip()[:200]}
    state = dict(zip(GPU_STATE_FIELDS, gpu.stdout.strip().split(", ")))
    state["compute_processes"] = sum(line.strip().isdigit() for line in apps.stdout.splitlines())
    return state


def conv_runner(engine: FusedCudaEngine, spec, n: int, h: int, w: int, shortcut_hw=None):
    """(run, tile label, split-K, flops, compulsory bytes) for one convolution of the network alone, at batch n and
    input h x w (`shortcut_hw`: the input size of a fused shortcut, `check.layer_shapes`; bytes: harness/roofline)."""
    lib = engine.lib
    p = conv_out_size(h, spec.kernel, spec.stride, spec.padding)
    q = conv_out_size(w, spec.kernel, spec.stride, spec.padding)
    y = cp.empty((n, p, q, spec.out_channels), dtype=cp.float16)
    shortcut_c = spec.shortcut_channels
    flops = 2.0 * n * p * q * spec.out_channels * (spec.kernel * spec.kernel * spec.in_channels + shortcut_c)
    if spec is STEM:
        x = cp.random.randint(0, 256, (n, h, w, 3), dtype=cp.int32).astype(cp.uint8)
        pooled = cp.empty((n, conv_out_size(p, 3, 2, 1), conv_out_size(q, 3, 2, 1), 64), dtype=cp.float16)
        return (lambda: lib.stem_pool(x, engine.stem_weight, engine.stem_bias, pooled, kind="uint8",
                                      in_scale=engine.in_scale, in_shift=engine.in_shift),
                f"stem+maxpool fused ({'wgmma' if lib.wgmma_module else 'mma.sync'})", 1, flops,
                stem_bytes(n, h, w, pooled.shape[1], pooled.shape[2]))
    moved = conv_bytes(n, h, w, p, q, spec.in_channels, spec.out_channels, spec.kernel,
                       adds_residual=spec.adds_residual, shortcut_channels=shortcut_c, shortcut_hw=shortcut_hw,
                       shortcut_stride=spec.shortcut.stride if spec.shortcut is not None else 1)
    x = cp.random.standard_normal((n, h, w, spec.in_channels), dtype=cp.float32).astype(cp.float16)
    weight, bias = engine.weights[spec.name]
    residual = cp.ones_like(y) if spec.adds_residual else None
    plan = lib.plan(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.kernel, spec.stride, spec.padding,
                    shortcut_c=shortcut_c)
    ws = cp.empty(plan.splits * y.size + 1, dtype=cp.float32) if plan.splits > 1 else None
    if spec.shortcut is not None:
        xs = cp.random.standard_normal((n, *shortcut_hw, shortcut_c), dtype=cp.float32).astype(cp.float16)
        return (lambda: lib.conv_shortcut(x, weight, bias, y, xs, shortcut_stride=spec.shortcut.stride,
                                          relu=spec.relu, plan=plan, workspace=ws),
                plan.tile.label, plan.splits, flops, moved)
    return (lambda: lib.conv(x, weight, bias, y, stride=spec.stride, pad=spec.padding, relu=spec.relu,
                             residual=residual, plan=plan, workspace=ws),
            plan.tile.label, plan.splits, flops, moved)


def layer_table(engine: FusedCudaEngine, batches) -> list[dict]:
    """Each convolution alone at each batch: ms, GFLOP, compulsory bytes and TFLOP/s (the share of the peak and the
    roofline are added by the caller)."""
    rows = []
    for n in batches:
        for spec, h, w, shortcut_hw in [(STEM, 224, 224, None)] + layer_shapes(batch=n):
            run, label, splits, flops, moved = conv_runner(engine, spec, n, h, w, shortcut_hw)
            with engine.lib.launch_mode(n <= engine.pdl_max_batch):   # launched as the engine launches batch n
                ms = time_graph(run)
            tflops = flops / ms / 1e9
            rows.append({"path": engine.lib.path, "layer": spec.name, "N": n, "H": h, "W": w,
                         "C": spec.in_channels, "K": spec.out_channels, "R": spec.kernel, "S": spec.kernel,
                         "stride": spec.stride, "tile": label, "splitk": splits,
                         "ms": round(ms, 5), "TFLOP/s": round(tflops, 1), "GFLOP": round(flops / 1e9, 4),
                         "bytes": moved})
    return rows


def shortcut_fusion(engine: FusedCudaEngine, batches) -> list[dict]:
    """Per downsampling block: its conv2 with the projection fused in (as the engine runs it) against the
    same conv2 with a plain residual add, each alone and launched as the engine launches batch n. The
    difference is what the fused projection costs; as its own kernel it cost more (NOTES.md, outcome 22)."""
    rows = []
    for n in batches:
        for spec, h, w, shortcut_hw in layer_shapes(batch=max(n, SHORTCUT_FUSION_MIN_BATCH)):
            if spec.shortcut is None:
                continue
            plain = next(b.conv2 for b in engine.blocks if b.conv2.name == spec.filter_name)
            with engine.lib.launch_mode(n <= engine.pdl_max_batch):
                fused_ms = time_graph(conv_runner(engine, spec, n, h, w, shortcut_hw)[0])
                plain_ms = time_graph(conv_runner(engine, plain, n, h, w)[0])
            rows.append({"block": spec.name.rsplit(".", 1)[0], "N": n, "conv2_residual_ms": round(plain_ms, 5),
                         "conv2_fused_shortcut_ms": round(fused_ms, 5),
                         "fused_shortcut_cost_ms": round(fused_ms - plain_ms, 5)})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32,64,128,256")
    parser.add_argument("--layer-batches", default="1,32,128")
    parser.add_argument("--features-batches", default="1,32,128,512",
                        help="the seed workload: 64x64 inputs to the features (empty: skip)")
    parser.add_argument("--compile", action="store_true", help="also torch.compile max-autotune (slow)")
    parser.add_argument("--accuracy", help="JSON written by `python -m fusedresnet.harness.check --json`")
    parser.add_argument("--out", default="results")
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--no-compare-mma", action="store_true",
                        help="on cc 9.0, do not also time the engine forced to each kernel family")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    device = torch.cuda.get_device_name(0)
    model = build_resnet18(None, DEFAULT_SEED).cuda().eval()
    environment = environment_engine_arguments()
    engine = FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0", **environment)
    # On cc 9.0 the engine forced to each kernel family, for comparison.
    forced = {}
    if engine.lib.path != "mma" and not args.no_compare_mma:
        for family in ("mma", "wgmma"):
            if family != engine.lib.path:
                forced[family] = FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0",
                                                 **{**environment, "conv_path": family})
    # The same engine launched plainly (no programmatic dependent launch), for comparison.
    plain = (FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0",
                             **{**environment, "pdl": False}) if engine.lib.pdl else None)
    print(f"programmatic dependent launch: {engine.lib.pdl} ({engine.lib.pdl_reason})", flush=True)
    print(f"conv path {engine.lib.path}, {len(engine.lib.tuned)} tuned plans"
          + (f" (and forced {', '.join(forced)} for comparison)" if forced else ""), flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    states = {"start": gpu_state()}
    rows = []
    # One untimed pass of each engine at the first batch: in one run the first graph timed in the process
    # (batch 1, right after the cuBLAS peak) came out 14% slower than twelve fresh captures of the same
    # graph on the next host (kernels/NOTES.md, outcome 17).
    for warm in [engine, *forced.values(), *([plain] if plain is not None else [])]:
        bench_custom(warm, batches[0])
    for batch in batches:
        row = {"batch": batch}
        record(row, "custom", custom_timings(engine, batch))
        for family, forced_engine in forced.items():
            record(row, f"custom_{family}", custom_timings(forced_engine, batch))
        if plain is not None:
            record(row, "custom_no_pdl", custom_timings(plain, batch))
        for w in [] if args.skip_baselines else ["ts_fp32", "ts_fp16", "graph_fp16"]:
            record(row, w, bench_torch(model, batch, w))
        row["custom_img_s"] = round(batch * 1000 / row["custom_b2b_ms"], 1)     # throughput: back-to-back
        row["custom_tflops"] = round(batch * GFLOP_PER_IMAGE / row["custom_b2b_ms"], 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    states["after_whole_network"] = gpu_state()
    # The cuBLAS peak after the whole-network timings, not before: timed right after it, batch 1 read
    # 0.158-0.162 ms where the same table read 0.146-0.147 with the peak after (kernels/NOTES.md outcome 17).
    peaks = [tensor_core_peak_tflops()]
    features = []
    which = [] if args.skip_baselines else ["ts_fp32", "ts_fp16", "graph_fp16"]
    for batch in [int(b) for b in args.features_batches.split(",") if b]:
        row = {"batch": batch}
        record(row, "custom", custom_timings(engine, batch, 64))
        for w in which:
            record(row, w, bench_torch(model, batch, w, 64, features=True))
        print("features 64x64", json.dumps(row), flush=True)
        features.append(row)
        torch.cuda.empty_cache()
    layer_batches = [int(b) for b in args.layer_batches.split(",")]
    # The peak again after the per-layer timings: the better of the two scales the table (both are in the JSON).
    layer_rows = {name: layer_table(e, layer_batches) for name, e in {"main": engine, **forced}.items()}
    fusion = shortcut_fusion(engine, layer_batches)
    states["after_layers"] = gpu_state()
    peaks.append(tensor_core_peak_tflops())
    peak = max(peaks)
    bandwidth = memory_bandwidth_gbs()
    l2_bytes = cp.cuda.Device().attributes["L2CacheSize"]
    layers = time_shares([dict(r, pct_peak=round(100 * r["TFLOP/s"] / peak, 1),
                               **roofline(r["GFLOP"] * 1e9, r["bytes"], r["ms"], peak, bandwidth, l2_bytes))
                          for rows_ in layer_rows.values() for r in rows_])
    if min(peaks) < 0.85 * peak:
        print(f"WARNING: tensor-core peak {min(peaks):.0f} vs {peak:.0f} TFLOP/s in one run: the GPU was shared "
              f"or throttled (gpu_state in the JSON)", flush=True)
    with open(out / "kernels_layers.csv", "w") as f:
        f.write(",".join(layers[0].keys()) + "\n")
        for r in layers:
            f.write(",".join(str(v) for v in r.values()) + "\n")
    result = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": os.environ.get("FUSEDRESNET_BENCH_COMMAND") or
              "python -m fusedresnet.harness.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
              "conv_path": engine.lib.path, "engine": engine.name, "tuned_plans": len(engine.lib.tuned),
              "pdl": engine.lib.pdl, "pdl_reason": engine.lib.pdl_reason, "pdl_max_batch": engine.pdl_max_batch,
              "peak_tflops": round(peak, 1), "peak_tflops_runs": [round(v, 1) for v in peaks],
              "memory_bandwidth_gbs": round(bandwidth, 1), "l2_bytes": l2_bytes, "gpu_state": states,
              "whole_network": rows, "features_64": features, "shortcut_fusion": fusion, "layers": layers}
    commit = git_commit()
    if commit:
        result["git_commit"] = commit
    if args.accuracy and Path(args.accuracy).is_file():
        acc = json.loads(Path(args.accuracy).read_text())["network"]
        result["accuracy"] = acc
    write_result(result, out)
    if args.compile:
        # Last, one batch size at a time, the files rewritten after each: minutes of compiling per batch
        # size must not cost the rest of the run if the machine is taken back. Same process, same inputs
        # as the custom column of the row.
        for row in rows:
            record(row, "compile_max_autotune", bench_torch(model, row["batch"], "compile_max_autotune"))
            print(f"compile max-autotune batch {row['batch']}: {row['compile_max_autotune_b2b_ms']} ms back-to-back, "
                  f"{row['compile_max_autotune_ms']} ms one at a time (custom {row['custom_b2b_ms']} / "
                  f"{row['custom_ms']} ms)", flush=True)
            states["after_compile"] = gpu_state()
            write_result(result, out)
    for n in sorted({r["N"] for r in layers}):   # kernels alone, summed over the network's layers
        sums = {}
        for r in layers:
            if r["N"] == n:
                sums[r["path"]] = sums.get(r["path"], 0.0) + r["ms"]
        print(f"layers N={n}: " + ", ".join(f"{path} {ms:.3f} ms" for path, ms in sums.items()))
    for r in fusion:
        print(f"fused shortcut {r['block']} N={r['N']}: conv2 + residual {r['conv2_residual_ms']:.4f} ms, "
              f"+ fused projection {r['conv2_fused_shortcut_ms']:.4f} (+{r['fused_shortcut_cost_ms']:.4f})")
    print(f"peak TFLOP/s after the network / the layers: {', '.join(f'{v:.0f}' for v in peaks)}; "
          f"gpu state: {json.dumps(states)}")
    print(f"roofline: tensor cores {peak:.0f} TFLOP/s, memory {bandwidth:.0f} GB/s (a copy)")
    for r in layers:   # where the time goes: each layer's share, its bound and how close it runs to its roof
        if r["N"] in (32, 128) and r["path"] == engine.lib.path:
            print(f"N={r['N']:<3} {r['layer']:<26} {r['tile']:<22} {r['ms']:.4f} ms {r['time_share']:5.1f}% of the "
                  f"layers' time, {r['TFLOP/s']:6.1f} TFLOP/s ({r['pct_peak']:5.1f}% of peak), {r['GB/s']:7.1f} GB/s, "
                  f"{r['bound']}-bound, {r['pct_roof']:5.1f}% of its roof" + (" (fits in L2)" if r["fits_l2"] else ""))
    # Last, so that the tail of the log (kernels/gpu_check.sh prints it) holds the whole-network table.
    print(summary_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
