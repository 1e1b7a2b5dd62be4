"""Benchmark: the fused engine against the cuDNN baselines, and a per-layer table.

    python -m fusedresnet.kernels.bench [--batches 1,8,32,64,128,256] [--compile]
                                        [--accuracy check.json] [--out results/]

(a) Whole network, 224x224, median milliseconds per batch over CUDA-event-timed
    repetitions: our engine (its captured CUDA graph, uint8 input already on the
    device, normalisation included) against the same ResNet-18 as TorchScript
    fp32, TorchScript fp16 channels-last, and fp16 channels-last replayed from a
    CUDA graph (fp16 normalised input already on the device); with --compile also
    torch.compile(mode="max-autotune") fp16 channels-last (minutes of compiling).
(b) Per-layer table: each convolution of ResNet-18 run alone with the tile
    shape and split-K the engine uses (split-K reduction included), timed from
    replays of a CUDA graph of 10 launches (no launch gaps), ms,
    TFLOP/s and % of the tensor-core peak measured here with a large fp16
    matrix product (cuBLAS), written as CSV.
(c) A bar plot of latency and throughput, custom against the baselines.

On compute capability 9.0 (the mixed path: each conv on the family its plan
names) (a) and (b) are also measured with the engine forced to one family
(FUSEDRESNET_CONV_PATH=mma, =wgmma) in the same process: `custom_mma_ms`,
`custom_wgmma_ms` per batch and the per-layer rows with path "mma" and
"wgmma", so the paths are compared on one GPU and one run (--no-compare-mma
skips them).

Writes kernels_bench.json, kernels_layers.csv, kernels_bench.png and
kernels_bench.md into --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import cupy as cp
import torch

# Dependency direction: the kernel library itself (configs, launch, nvrtc_build, the .cu files) imports
# nothing from fusedresnet.backend. This harness times the kernels in the network they serve: it
# needs ResNet-18's layer shapes and folded weights (backend.folding, backend.resnet) and, for the
# whole-network timings, the engine that strings the kernels together (backend.engine_cuda), so it
# depends on the backend as a test of it would; the backend never imports the harness.
from ..backend.engine_cuda import FusedCudaEngine
from ..backend.folding import STEM, fold_resnet18
from ..backend.resnet import DEFAULT_SEED, build_resnet18
from ..backend.spec import INPUT_UINT8
from .check import layer_shapes
from .launch import conv_out_size
from .tune import time_graph

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


def reps_for(batch: int) -> int:
    return 50 if batch <= 32 else 30


def bench_custom(engine: FusedCudaEngine, batch: int) -> float:
    plan = engine.plan(batch, INPUT_UINT8, 224, 224)
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


def bench_torch(model_fp32, batch: int, which: str) -> float:
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    with torch.inference_mode():
        if which == "ts_fp32":
            module = torch.jit.freeze(torch.jit.trace(model_fp32, x).eval())
            return time_ms(lambda: module(x), reps_for(batch))
        x16 = x.half().contiguous(memory_format=torch.channels_last)
        model16 = model_fp32.half().to(memory_format=torch.channels_last)
        try:
            if which == "ts_fp16":
                module = torch.jit.freeze(torch.jit.trace(model16, x16).eval())
                return time_ms(lambda: module(x16), reps_for(batch))
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
                return time_ms(graph.replay, reps_for(batch))
            if which == "compile_max_autotune":
                compiled = torch.compile(model16, mode="max-autotune")
                for _ in range(3):
                    compiled(x16)
                return time_ms(lambda: compiled(x16), reps_for(batch))
        finally:
            model_fp32.float().to(memory_format=torch.contiguous_format)
    raise ValueError(which)


def tensor_core_peak_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    ms = time_ms(lambda: a @ b, 20)
    return 2 * 8192 ** 3 / ms / 1e9


def layer_table(engine: FusedCudaEngine, batches, peak: float) -> list[dict]:
    lib = engine.lib
    rows = []
    for n in batches:
        specs = [(STEM, 224, 224)] + layer_shapes()
        for spec, h, w in specs:
            p = conv_out_size(h, spec.kernel, spec.stride, spec.padding)
            q = conv_out_size(w, spec.kernel, spec.stride, spec.padding)
            y = cp.empty((n, p, q, spec.out_channels), dtype=cp.float16)
            flops = 2.0 * n * p * q * spec.out_channels * spec.kernel * spec.kernel * spec.in_channels
            if spec is STEM:
                x = cp.random.randint(0, 256, (n, h, w, 3), dtype=cp.int32).astype(cp.uint8)
                pooled = cp.empty((n, conv_out_size(p, 3, 2, 1), conv_out_size(q, 3, 2, 1), 64), dtype=cp.float16)
                run = lambda: lib.stem_pool(x, engine.stem_weight, engine.stem_bias, pooled,   # noqa: E731
                                            kind="uint8", in_scale=engine.in_scale, in_shift=engine.in_shift)
                label, splits = "stem+maxpool fused", 1
            else:
                x = cp.random.standard_normal((n, h, w, spec.in_channels), dtype=cp.float32).astype(cp.float16)
                weight, bias = engine.weights[spec.name]
                residual = cp.ones_like(y) if spec.adds_residual else None
                plan = lib.plan(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.kernel,
                                spec.stride, spec.padding)
                ws = cp.empty(plan.splits * y.size + 1, dtype=cp.float32) if plan.splits > 1 else None
                run = lambda: lib.conv(x, weight, bias, y, stride=spec.stride, pad=spec.padding,   # noqa: E731
                                       relu=spec.relu, residual=residual, plan=plan, workspace=ws)
                label, splits = plan.tile.label, plan.splits
            ms = time_graph(run)
            tflops = flops / ms / 1e9
            rows.append({"path": lib.path, "layer": spec.name, "N": n, "H": h, "W": w, "C": spec.in_channels,
                         "K": spec.out_channels, "R": spec.kernel, "S": spec.kernel, "stride": spec.stride,
                         "tile": label, "splitk": splits,
                         "ms": round(ms, 5), "TFLOP/s": round(tflops, 1), "pct_peak": round(100 * tflops / peak, 1)})
    return rows


def plot(rows, path: Path, device: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = [("custom_ms", "fused CUDA (ours)"), ("custom_mma_ms", "fused CUDA, mma.sync path"),
            ("custom_wgmma_ms", "fused CUDA, wgmma path"),
            ("graph_fp16_ms", "cuDNN fp16 CL + graph"),
            ("ts_fp16_ms", "TorchScript fp16 CL"), ("ts_fp32_ms", "TorchScript fp32"),
            ("compile_max_autotune_ms", "torch.compile max-autotune")]
    keys = [(k, n) for k, n in keys if any(r.get(k) for r in rows)]
    batches = [r["batch"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(keys)
    for i, (key, name) in enumerate(keys):
        xs = [j + i * width for j in range(len(batches))]
        axes[0].bar(xs, [r.get(key) or 0 for r in rows], width, label=name)
        axes[1].bar(xs, [(r["batch"] * 1000 / r[key]) if r.get(key) else 0 for r in rows], width, label=name)
    for ax, title in zip(axes, ("latency per batch (ms, lower is better)", "throughput (img/s, higher is better)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))])
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"ResNet-18 224x224 on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result: dict) -> str:
    lines = ["# Fused CUDA engine benchmark", "",
             f"- device: {result['device']}", f"- date: {result['date']}", f"- command: `{result['command']}`",
             f"- measured tensor-core peak (cuBLAS fp16 8192^3): {result['peak_tflops']:.0f} TFLOP/s",
             f"- convolution path: {result.get('conv_path', 'mma')}, {result.get('tuned_plans', 0)} tuned plans for "
             "this GPU (custom mma.sync / wgmma ms: the same engine forced to one kernel family)", "",
             "| batch | custom ms (img/s) | custom mma.sync ms | custom wgmma ms | TS fp32 ms | TS fp16 CL ms "
             "| fp16 CL + graph ms | compile max-autotune ms | custom vs graph |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["whole_network"]:
        fmt = lambda k: f"{r[k]:.3f}" if r.get(k) else "-"   # noqa: E731
        lines.append(f"| {r['batch']} | {r['custom_ms']:.3f} ({r['custom_img_s']:,.0f}) | {fmt('custom_mma_ms')} | "
                     f"{fmt('custom_wgmma_ms')} | "
                     f"{fmt('ts_fp32_ms')} | {fmt('ts_fp16_ms')} | {fmt('graph_fp16_ms')} | "
                     f"{fmt('compile_max_autotune_ms')} | {r['graph_fp16_ms'] / r['custom_ms']:.2f}x |")
    if not any(r.get("compile_max_autotune_ms") for r in result["whole_network"]):
        lines += ["", "torch.compile(mode=\"max-autotune\") fp16 channels-last was not run here (`--compile`; minutes "
                      "of compiling per batch size). The issue's figures, same GPU model and day: 0.289 ms at batch 1, "
                      "0.420 ms at batch 8, 1.954 ms at batch 128 (65.5k img/s)."]
    acc = result.get("accuracy")
    if acc:
        lines += ["", f"Accuracy (whole network vs float32 PyTorch, {acc['inputs']} inputs): top-1 agreement "
                      f"{acc['top1_agree']}/{acc['inputs']}, near-tie disagreements {acc['near_tie_disagreements']}, "
                      f"clear disagreements {acc.get('clear_disagreements')}, relative L2 {acc['rel_l2']:.2e}, "
                      f"max abs {acc.get('max_abs', float('nan')):.3g}."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32,64,128,256")
    parser.add_argument("--layer-batches", default="1,32,128")
    parser.add_argument("--compile", action="store_true", help="also torch.compile max-autotune (slow)")
    parser.add_argument("--accuracy", help="JSON written by `python -m fusedresnet.kernels.check --json`")
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
    engine = FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0")
    # On cc 9.0 the engine forced to each kernel family, for comparison.
    forced = {}
    if engine.lib.path != "mma" and not args.no_compare_mma:
        for family in ("mma", "wgmma"):
            if family != engine.lib.path:
                forced[family] = FusedCudaEngine(fold_resnet18(build_resnet18(None, DEFAULT_SEED)), "cuda:0",
                                                 conv_path=family)
    print(f"conv path {engine.lib.path}, {len(engine.lib.tuned)} tuned plans"
          + (f" (and forced {', '.join(forced)} for comparison)" if forced else ""), flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        row = {"batch": batch, "custom_ms": round(bench_custom(engine, batch), 4)}
        for family, forced_engine in forced.items():
            row[f"custom_{family}_ms"] = round(bench_custom(forced_engine, batch), 4)
        which = [] if args.skip_baselines else ["ts_fp32", "ts_fp16", "graph_fp16"]
        if args.compile:
            which.append("compile_max_autotune")
        for w in which:
            row[f"{w}_ms"] = round(bench_torch(model, batch, w), 4)
        row["custom_img_s"] = round(batch * 1000 / row["custom_ms"], 1)
        row["custom_tflops"] = round(batch * GFLOP_PER_IMAGE / row["custom_ms"], 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    peak = tensor_core_peak_tflops()
    layers = layer_table(engine, [int(b) for b in args.layer_batches.split(",")], peak)
    for forced_engine in forced.values():
        layers += layer_table(forced_engine, [int(b) for b in args.layer_batches.split(",")], peak)
    with open(out / "kernels_layers.csv", "w") as f:
        f.write(",".join(layers[0].keys()) + "\n")
        for r in layers:
            f.write(",".join(str(v) for v in r.values()) + "\n")
    result = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": os.environ.get("FUSEDRESNET_BENCH_COMMAND") or
              "python -m fusedresnet.kernels.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
              "conv_path": engine.lib.path, "tuned_plans": len(engine.lib.tuned), "peak_tflops": round(peak, 1),
              "whole_network": rows}
    if args.accuracy and Path(args.accuracy).is_file():
        acc = json.loads(Path(args.accuracy).read_text())["network"]
        result["accuracy"] = acc
    (out / "kernels_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    if all(r.get("graph_fp16_ms") for r in rows):
        plot(rows, out / "kernels_bench.png", device)
        (out / "kernels_bench.md").write_text(markdown(result))
    print(f"{'batch':>5} {'custom':>8} {'mma':>8} {'wgmma':>8} {'ts32':>8} {'ts16':>8} {'graph16':>8} {'img/s':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['custom_ms']:>8.3f} {r.get('custom_mma_ms', math.nan):>8.3f} "
              f"{r.get('custom_wgmma_ms', math.nan):>8.3f} "
              f"{r.get('ts_fp32_ms', math.nan):>8.3f} "
              f"{r.get('ts_fp16_ms', math.nan):>8.3f} {r.get('graph_fp16_ms', math.nan):>8.3f} "
              f"{r['custom_img_s']:>9.0f}")
    for n in sorted({r["N"] for r in layers}):   # kernels alone, summed over the network's layers
        sums = {}
        for r in layers:
            if r["N"] == n:
                sums[r["path"]] = sums.get(r["path"], 0.0) + r["ms"]
        print(f"layers N={n}: " + ", ".join(f"{path} {ms:.3f} ms" for path, ms in sums.items()))
    for r in layers:   # the target: batch-128 3x3 convs at >= 50% of the measured peak
        if r["N"] == 128 and r["R"] == 3 and r["path"] == engine.lib.path:
            print(f"3x3 N=128 {r['path']:>5} {r['layer']:<16} {r['tile']:<22} {r['ms']:.4f} ms "
                  f"{r['TFLOP/s']:6.1f} TFLOP/s {r['pct_peak']:5.1f}% of peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
