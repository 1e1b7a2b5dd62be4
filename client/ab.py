"""A/B agreement: the same images through both models, compared logit by logit, with each model's latency.

    python -m fusedresnet.client.ab                               # server on 127.0.0.1:8001 (gRPC)
    python -m fusedresnet.client.ab --protocol http --url 127.0.0.1:8000 --generated 1000 --out build/ab

Image sets: the sample photos (client/samples) and --generated seeded smooth
random images (at least 500 by default). Every request goes to both models,
one after the other, the order alternating from request to request, so both
see the same conditions. Agreement is measured with `client.agreement.compare_logits`
(custom as the candidate, cuDNN as the reference): top-1 and top-5
agreement, max abs and relative L2 logit difference, minimum cosine similarity.

Writes <out>/ab_agreement.json (everything, latencies included), ab_agreement.md
and ab_agreement_latency.png (per-model latency distributions).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

from fusedresnet.backend.report_format import number, table, write_json_and_markdown
from fusedresnet.backend.spec import (
    AB_ROUTER_MODEL,
    BUILD_DIR,
    INPUT_UINT8,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    ZERO_MODEL,
    load_labels,
)
from fusedresnet.client.agreement import compare_logits
from fusedresnet.client.preprocess import INPUT_FORMATS, model_input, preprocess_files, sample_photo_paths
from fusedresnet.client.resnet_client import DEFAULT_URLS, PROTOCOLS, ResNetClient

DEFAULT_GENERATED = 500
GENERATED_SEED = 4242
REPORT_NAME = "ab_agreement"
MODELS_AB = (MODEL_CUSTOM, MODEL_CUDNN)   # candidate, reference
PHOTOS, GENERATED = "sample photos", "generated"

# The same colour for a model in every plot (this command's and the load-test report's)
MODEL_COLORS = {MODEL_CUSTOM: "tab:red", MODEL_CUDNN: "tab:blue", AB_ROUTER_MODEL: "tab:green", ZERO_MODEL: "tab:gray"}


def agreement_image_sets(generated: int = DEFAULT_GENERATED, seed: int = GENERATED_SEED) -> dict:
    """{set name: uint8 [N, 224, 224, 3]}: the sample photos and `generated` smooth random images."""
    sets = {PHOTOS: preprocess_files(sample_photo_paths())}
    if generated:
        from fusedresnet.backend.images import smooth_random_images  # torch, only to generate the images
        sets[GENERATED] = smooth_random_images(generated, seed=seed).numpy()
    return sets


def latency_summary(latencies_ms: list[float]) -> dict:
    values = np.asarray(latencies_ms)
    return {"requests": int(values.size), "mean_ms": float(values.mean()), "min_ms": float(values.min()),
            "p50_ms": float(np.percentile(values, 50)), "p90_ms": float(np.percentile(values, 90)),
            "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max())}


def run_agreement(image_sets: dict, protocol: str = "grpc", url: str | None = None, batch_size: int = 1,
                  input_format: str = INPUT_UINT8) -> dict:
    """Send every image set through both models (alternating order); compare logits and latencies."""
    clients = {model: ResNetClient(model, protocol, url) for model in MODELS_AB}
    latencies = {model: [] for model in MODELS_AB}
    engines, sets, photo_top1 = {}, {}, []
    labels = load_labels()
    request = 0
    try:
        for name, images in image_sets.items():
            logits = {model: [] for model in MODELS_AB}
            for start in range(0, len(images), batch_size):
                batch = model_input(images[start:start + batch_size], input_format)
                order = MODELS_AB if request % 2 == 0 else MODELS_AB[::-1]
                for model in order:
                    result = clients[model].infer(batch)
                    logits[model].append(result.logits)
                    latencies[model].append(result.latency_ms)
                    engines[model] = result.engine
                request += 1
            candidate, reference = (np.concatenate(logits[m]) for m in MODELS_AB)
            sets[name] = compare_logits(candidate, reference)
            if name == PHOTOS:
                photo_top1 = [{"photo": path.name, MODEL_CUSTOM: labels[int(c.argmax())],
                               MODEL_CUDNN: labels[int(r.argmax())]}
                              for path, c, r in zip(sample_photo_paths(), candidate, reference)]
    finally:
        for client in clients.values():
            client.close()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "protocol": protocol, "url": url or DEFAULT_URLS[protocol], "batch_size": batch_size,
            "input_format": input_format, "candidate": MODEL_CUSTOM, "reference": MODEL_CUDNN,
            "engines": engines, "sets": sets, "photo_top1": photo_top1,
            "latency": {model: latency_summary(latencies[model]) for model in MODELS_AB},
            "latencies_ms": latencies}


def agreement_markdown(agreement: dict) -> str:
    lines = [f"# Agreement of {MODEL_CUSTOM} (candidate) with {MODEL_CUDNN} (reference)", "",
             f"- Date: {agreement['date']}; {agreement['protocol']} at {agreement['url']}, "
             f"{agreement['batch_size']} image(s) per request, {agreement['input_format']} input",
             "- Engines: " + ", ".join(f"{m} = {e}" for m, e in agreement["engines"].items()),
             "- Near-tie disagreements: the reference's top-1/top-2 margin is below 3x the largest logit "
             "difference, so rounding alone may flip them.", "",
             *table(["images", "count", "top-1 agree", "near-tie / clear disagreements", "top-5 agree", "max abs diff",
                     "rel. L2 diff", "max row rel. L2", "min cosine"],
                    ([name, s["inputs"], f"{s['top1_agree']}/{s['inputs']}",
                      f"{s['near_tie_disagreements']} / {s['clear_disagreements']}", f"{s['top5_agree']}/{s['inputs']}",
                      f"{s['max_abs']:.3g}", f"{s['rel_l2']:.3g}", f"{s['max_row_rel_l2']:.3g}",
                      f"{s['min_cosine']:.6f}"] for name, s in agreement["sets"].items()), "lrrlrrrrr")]
    lines += ["", "## Latency per request (same requests, alternating order)", "",
              *table(["model", "requests", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms"],
                     ([model, s["requests"], *(number(s[key], 2, grouping=False)
                                               for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"))]
                      for model, s in agreement["latency"].items()), "lrrrrrr")]
    lines += ["", f"![latency distributions]({REPORT_NAME}_latency.png)", ""]
    if agreement["photo_top1"]:
        lines += ["## Top-1 class of each sample photo", "",
                  *table(["photo", MODEL_CUSTOM, MODEL_CUDNN],
                         ([row["photo"], row[MODEL_CUSTOM], row[MODEL_CUDNN]] for row in agreement["photo_top1"]))]
        lines.append("")
    return "\n".join(lines)


def plot_latencies(agreement: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7, 4))
    everything = np.concatenate([np.asarray(v) for v in agreement["latencies_ms"].values()])
    bins = np.geomspace(max(everything.min(), 1e-3), everything.max() * 1.01, 60)
    for model, values in agreement["latencies_ms"].items():
        ax.hist(values, bins=bins, histtype="step", linewidth=1.5, color=MODEL_COLORS[model], label=f"{model} (p50 "
                f"{agreement['latency'][model]['p50_ms']:.2f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel(f"latency per request of {agreement['batch_size']} image(s), ms")
    ax.set_ylabel("requests")
    ax.set_title("Latency distributions on the same images")
    ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_agreement_report(agreement: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{REPORT_NAME}.json", out_dir / f"{REPORT_NAME}.md", out_dir / f"{REPORT_NAME}_latency.png"]
    write_json_and_markdown(paths[0], agreement, agreement_markdown(agreement))
    plot_latencies(agreement, paths[2])
    return paths


def summary(agreement: dict) -> dict:
    """The agreement without the per-request latencies: what the load-test report embeds."""
    return {k: v for k, v in agreement.items() if k != "latencies_ms"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--url", help="host:port (default: the protocol's default port on 127.0.0.1)")
    parser.add_argument("--generated", type=int, default=DEFAULT_GENERATED,
                        help=f"generated images besides the sample photos (default {DEFAULT_GENERATED})")
    parser.add_argument("--batch-size", type=int, default=1, help="images per request (default 1)")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default=INPUT_UINT8)
    parser.add_argument("--out", type=Path, default=BUILD_DIR / "loadtest",
                        help="folder for the report (default build/loadtest; the committed one is results/)")
    args = parser.parse_args(argv)
    agreement = run_agreement(agreement_image_sets(args.generated), args.protocol, args.url, args.batch_size,
                              args.input_format)
    written = write_agreement_report(agreement, args.out)
    for name, s in agreement["sets"].items():
        print(f"{name:14s} {s['inputs']:5d} images: top-1 {s['top1_agree']}/{s['inputs']}, "
              f"top-5 {s['top5_agree']}/{s['inputs']}, max abs {s['max_abs']:.3g}, rel L2 {s['rel_l2']:.3g}, "
              f"min cosine {s['min_cosine']:.6f}")
    for model, s in agreement["latency"].items():
        print(f"{model:16s} p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms over {s['requests']} requests")
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
