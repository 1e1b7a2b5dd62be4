"""The main job: start Triton with both models, classify the sample photos through each over gRPC.

    python -m fusedresnet.client.demo            # starts (and stops) its own server (the `server` extra)
    python -m fusedresnet.client.demo --url 127.0.0.1:8001   # uses a running server (the `client` extra is enough)

Prints, per model, the engine it runs, the top-3 labels of every photo, the
latency of one batched request and of single-image requests, and how closely
the two models' logits agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from fusedresnet.backend.network import free_ports, port_is_free
from fusedresnet.backend.repository.prepared_stamp import read_weights_source, seed_of
from fusedresnet.backend.resnet.pretrained import WEIGHTS_TORCHVISION
from fusedresnet.backend.spec import (
    BUILD_DIR,
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    MODEL_REPOSITORY,
    MODELS,
)
from fusedresnet.client.agreement import compare_logits
from fusedresnet.client.preprocess import preprocess_files, sample_photo_paths
from fusedresnet.client.resnet_client import ResNetClient

TIMED_REPEATS = 5


def describe_weights() -> str:
    source = read_weights_source(MODEL_REPOSITORY)
    if source is None:
        return "unknown (the model repository is not prepared)"
    if seed_of(source) is not None:
        return (f"{source}: untrained seeded weights, so the labels are arbitrary; for real labels, "
                f"`make prepare WEIGHTS={WEIGHTS_TORCHVISION}` downloads torchvision's ImageNet-trained "
                "ResNet-18 (SHA-256 checked), then run the demo again")
    return source


def run_demo(grpc_url: str) -> int:
    print(f"weights: {describe_weights()}")
    paths = sample_photo_paths()
    images = preprocess_files(paths)
    logits = {}
    for model in MODELS:
        with ResNetClient(model, "grpc", grpc_url) as client:
            client.infer(images[:1])  # connection set-up stays out of the timings
            batched = [client.infer(images).latency_ms for _ in range(TIMED_REPEATS)]
            single = [client.infer(images[i:i + 1]).latency_ms for _ in range(TIMED_REPEATS)
                      for i in range(len(images))]
            result = client.classify(images, top_k=3)
            logits[model] = client.infer(images).logits
        print(f"\n== {model} (engine {result.engine}) over gRPC {grpc_url}")
        if result.engine.startswith("torch-folded-cuda"):   # docs/CONFIGURATION.md: no silent fallback on a GPU
            print("  note: the PyTorch graph on the GPU, not the fused kernels (its config says engine: torch)")
        for path, top in zip(paths, result.top):
            print(f"  {path.name:24s} " + ", ".join(f"{label} ({score:.2f})" for score, _, label in top))
        print(f"  median latency: {statistics.median(batched):.1f} ms per request of {len(images)} images, "
              f"{statistics.median(single):.1f} ms per single-image request")
    stats = compare_logits(logits[MODELS[0]], logits[MODELS[1]])
    print(f"\n== agreement {MODELS[0]} vs {MODELS[1]} on {stats['inputs']} photos: "
          f"top-1 {stats['top1_agree']}/{stats['inputs']}, top-5 sets {stats['top5_agree']}/{stats['inputs']}, "
          f"max |diff| {stats['max_abs']:.3g}, relative L2 {stats['rel_l2']:.2e}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="gRPC address of a running server; default: start one")
    args = parser.parse_args(argv)
    if args.url:
        return run_demo(args.url)
    try:   # the launcher, only where the demo starts its own server: it needs the `server` extra (psutil, Triton)
        from fusedresnet.backend.serve import ServerError, ServerSettings, launch
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("fusedresnet"):
            raise
        print(f"demo: starting a server needs the server side ({error}): pip install 'fusedresnet[server]', "
              "or pass --url with the gRPC address of a running server", file=sys.stderr)
        return 1
    ports = [DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT]
    if not all(port_is_free(p) for p in ports):
        ports = free_ports(3)
    log_file = BUILD_DIR / "demo-server.log"
    settings = ServerSettings(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], processes_per_gpu=1,
                              log_file=log_file, mps="off")
    print(f"starting Triton with both models; server log in {log_file} ...", flush=True)
    try:
        with launch(settings) as server:
            print(f"ready: gRPC {server.grpc_url}, HTTP {server.http_url} "
                  f"({'GPU' if server.first.use_gpu else 'CPU only'})")
            return run_demo(server.grpc_url)
    except ServerError as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
