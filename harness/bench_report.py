"""The benchmark's tables and plot (`harness/bench.py`), apart from the GPU code so that they are tested on any host.

Every engine of the whole-network table has two timings (see bench.py's (a)): `<engine>_ms`, one call at a
time, and `<engine>_b2b_ms`, back-to-back; the tables write them "back-to-back / one at a time", the
speed-ups likewise, and img/s come from back-to-back.
"""

from __future__ import annotations

import json
from pathlib import Path

from fusedresnet.backend.report_format import number, table

# The engines of the whole-network table: (key prefix, column title).
ENGINES = (("custom", "custom"), ("custom_no_pdl", "custom without PDL"), ("custom_mma", "custom mma.sync"),
           ("custom_wgmma", "custom wgmma"), ("ts_fp32", "TS fp32"), ("ts_fp16", "TS fp16 CL"),
           ("graph_fp16", "fp16 CL + graph"), ("compile_max_autotune", "compile max-autotune"))
# The committed benchmark: a report made without `--compile` quotes torch.compile's timings from it.
COMMITTED_BENCHMARK = Path(__file__).resolve().parent.parent / "results" / "kernels_bench.json"


def compile_reference(path: Path = COMMITTED_BENCHMARK) -> str:
    """A sentence quoting torch.compile's timings from the committed benchmark (device, date and file named), for a
    report that did not compile; empty when that file is absent or has no compile timings."""
    try:
        bench = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    rows = [r for r in bench.get("whole_network", []) if r.get("compile_max_autotune_ms")]
    if not rows:
        return ""
    return (f" Measured on the {bench.get('device', '?')} on {bench.get('date', '?')} ({path.parent.name}/{path.name}),"
            " back-to-back / one at a time: "
            + ", ".join(f"{both(r, 'compile_max_autotune')} ms at batch {r['batch']}" for r in rows) + ".")


def plot(rows, path: Path, device: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = [(f"{key}_ms", title) for key, title in ENGINES]
    keys = [(k, n) for k, n in keys if any(r.get(k) for r in rows)]
    batches = [r["batch"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(keys)
    for i, (key, name) in enumerate(keys):
        xs = [j + i * width for j in range(len(batches))]
        b2b = key.replace("_ms", "_b2b_ms")
        axes[0].bar(xs, [r.get(key) or 0 for r in rows], width, label=name)
        axes[1].bar(xs, [(r["batch"] * 1000 / r[b2b]) if r.get(b2b) else 0 for r in rows], width, label=name)
    for ax, title in zip(axes, ("latency per batch, one call at a time (ms, lower is better)",
                                "throughput, calls back-to-back (img/s, higher is better)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))])
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"ResNet-18 224x224 on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def record(row: dict, engine: str, timings: tuple[float, float]):
    """Both timings of `engine` into `row`: `<engine>_ms` one call at a time, `<engine>_b2b_ms` back-to-back."""
    one, b2b = timings
    row[f"{engine}_ms"], row[f"{engine}_b2b_ms"] = round(one, 4), round(b2b, 4)


def both(row: dict, engine: str) -> str:
    """'back-to-back / one at a time' ms of `engine` in `row`, or '-' where it was not timed."""
    if not row.get(f"{engine}_ms"):
        return "-"
    b2b = row.get(f"{engine}_b2b_ms")
    return f"{b2b:.3f} / {row[f'{engine}_ms']:.3f}" if b2b else f"- / {row[f'{engine}_ms']:.3f}"


def ratio(row: dict, baseline: str) -> str:
    """How many times faster the custom engine is than `baseline`: back-to-back / one at a time."""
    parts = []
    for suffix in ("_b2b_ms", "_ms"):
        ours, theirs = row.get("custom" + suffix), row.get(baseline + suffix)
        parts.append(f"{theirs / ours:.2f}x" if ours and theirs else "-")
    return " / ".join(parts)


def summary_table(rows) -> str:
    """The whole-network table as plain text: every engine timed, ms back-to-back / one at a time."""
    engines = [(key, title) for key, title in ENGINES if any(r.get(f"{key}_ms") for r in rows)]
    lines = ["whole network, ms per batch, back-to-back / one at a time (img/s from back-to-back):",
             " | ".join(["batch"] + [title for _, title in engines] + ["custom img/s"])]
    lines += [" | ".join([str(r["batch"])] + [both(r, key) for key, _ in engines] + [f"{r['custom_img_s']:.0f}"])
              for r in rows]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    lines = ["# Fused CUDA engine benchmark", "",
             f"- device: {result['device']}", f"- date: {result['date']}", f"- command: `{result['command']}`",
             "- measured tensor-core peak (cuBLAS fp16 8192^3, best of the runs after the whole-network and the "
             f"per-layer timings: "
             f"{', '.join(f'{v:.0f}' for v in result.get('peak_tflops_runs', []))}): "
             f"{result['peak_tflops']:.0f} TFLOP/s",
             "- GPU state (nvidia-smi: SM clock MHz, max, power W, temperature C, throttle reasons, compute "
             "processes): " + "; ".join(f"{when}: {' '.join(str(v) for v in state.values())}"
                                        for when, state in result.get("gpu_state", {}).items()),
             f"- convolution path: {result.get('conv_path', 'mma')}, {result.get('tuned_plans', 0)} tuned plans for "
             "this GPU (custom mma.sync / wgmma ms: the same engine forced to one kernel family)",
             f"- programmatic dependent launch: {result.get('pdl', False)} "
             f"({result.get('pdl_reason', 'not recorded')}, batches <= {result.get('pdl_max_batch', 'all')}; "
             "custom without PDL ms: the same engine launched "
             "plainly)", "",
             "Whole network, ms per batch: back-to-back (calls queued without a sync: throughput; img/s "
             "from it) / one call at a time (each call timed alone, then a sync: latency).", "",
             *table(["batch", *(f"{title} ms" for _, title in ENGINES), "custom img/s", "custom vs graph",
                     "custom vs compile"],
                    ([r["batch"], *(both(r, key) for key, _ in ENGINES), number(r["custom_img_s"], 0),
                      ratio(r, "graph_fp16"), ratio(r, "compile_max_autotune")] for r in result["whole_network"]))]
    if not any(r.get("compile_max_autotune_ms") for r in result["whole_network"]):
        lines += ["", "torch.compile(mode=\"max-autotune\") fp16 channels-last was not run here (`--compile`; minutes "
                      "of compiling per batch size)." + compile_reference()]
    if result.get("shortcut_fusion"):
        lines += ["", "## Fused shortcut", "",
                  "A downsampling block's conv2 with the block's 1x1 projection fused into its reduction (as the "
                  "engine runs it) against the same conv2 with a plain residual add, each alone: the difference "
                  "is what the fused projection costs (it has no kernel of its own).", "",
                  *table(["block", "N", "conv2 + residual ms", "conv2 + fused projection ms",
                          "cost of the projection ms"],
                         ([r["block"], r["N"], *(f"{r[key]:.4f}" for key in (
                             "conv2_residual_ms", "conv2_fused_shortcut_ms", "fused_shortcut_cost_ms"))]
                          for r in result["shortcut_fusion"]))]
    if result.get("features_64"):
        lines += ["", "## Seed workload: 64x64 inputs to features (N,512,2,2)", "",
                  "Our engine's graph includes the head (avgpool + fc) beyond the features; the baselines stop "
                  "at the features.", "",
                  "Back-to-back / one at a time, as in the whole-network table.", "",
                  *table(["N", "custom ms", "TS fp32 ms", "TS fp16 CL ms", "fp16 CL + graph ms", "custom vs graph"],
                         ([r["batch"], *(both(r, key) for key in ("custom", "ts_fp32", "ts_fp16", "graph_fp16")),
                           ratio(r, "graph_fp16")] for r in result["features_64"]))]
    lines += roofline_markdown(result)
    acc = result.get("accuracy")
    if acc:
        lines += ["", f"Accuracy (whole network vs float32 PyTorch, {acc['inputs']} inputs): top-1 agreement "
                      f"{acc['top1_agree']}/{acc['inputs']}, near-tie disagreements {acc['near_tie_disagreements']}, "
                      f"clear disagreements {acc.get('clear_disagreements')}, relative L2 {acc['rel_l2']:.2e}, "
                      f"max abs {acc.get('max_abs', float('nan')):.3g}."]
    return "\n".join(lines) + "\n"


def roofline_markdown(result: dict, batches=(32, 128, 256)) -> list[str]:
    """The per-layer roofline (harness/roofline.py's columns of bench.py's layer rows) at `batches`, on the path the
    engine serves: each layer alone, its TFLOP/s against the measured peak, its bytes against the memory's
    bandwidth, which roof binds, and its share of the layers' time; then where the whole network's time goes beyond
    its layers (the layers timed alone, summed, against the whole network back-to-back)."""
    path = result.get("conv_path", "mma")
    layers = [r for r in result.get("layers", []) if r.get("path", path) == path and r["N"] in batches]
    if not layers:
        return []
    network = {r["batch"]: r.get("custom_b2b_ms") for r in result["whole_network"]}
    lines = ["", "## Per-layer roofline", "",
             f"Each layer timed alone (CUDA graph of one kernel, {path} path), against the measured tensor-core peak "
             f"({result['peak_tflops']:.0f} TFLOP/s) and the memory's bandwidth "
             f"({number(result.get('memory_bandwidth_gbs'), 0)} GB/s): % of roof is its time's share of the time its "
             "binding roof allows; a layer whose bytes fit in L2 can pass the memory's bandwidth.", ""]
    for batch in batches:
        rows = [r for r in layers if r["N"] == batch]
        if not rows:
            continue
        layer_ms = sum(r["ms"] for r in rows)
        flop = sum(r["GFLOP"] for r in rows) * 1e9
        whole = network.get(batch)
        lines += [f"Batch {batch}: the layers {layer_ms:.3f} ms, {flop / layer_ms / 1e9:.0f} TFLOP/s "
                  f"({flop / layer_ms / 1e9 / result['peak_tflops']:.0%} of the peak)"
                  + (f"; the whole network {whole:.3f} ms back-to-back, {flop / whole / 1e9:.0f} TFLOP/s "
                     f"({flop / whole / 1e9 / result['peak_tflops']:.0%}): {whole - layer_ms:+.3f} ms between and "
                     "around the layers (launches, the head, overlap)" if whole else "") + ".", "",
                  *table(["layer", "tile", "ms", "share", "TFLOP/s", "% of peak", "GB/s", "bound", "% of roof",
                          "fits L2"],
                         ([r["layer"], r["tile"], f"{r['ms']:.4f}", f"{r['time_share']:.1f}%", r["TFLOP/s"],
                           f"{r['pct_peak']:.1f}", r["GB/s"], r["bound"], f"{r['pct_roof']:.1f}",
                           "yes" if r.get("fits_l2") else "-"] for r in rows), "llrrrrrlrl"), ""]
    return lines[:-1]


def write_result(result: dict, out: Path):
    (out / "kernels_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = result["whole_network"]
    if all(r.get("graph_fp16_ms") for r in rows):
        plot(rows, out / "kernels_bench.png", result["device"])
        (out / "kernels_bench.md").write_text(markdown(result))
