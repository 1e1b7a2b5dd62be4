"""Classify image files with either ResNet-18 model over gRPC (default) or HTTP.

    python -m fusedresnet.client.classify photo.jpg other.png --model resnet18_cudnn --top-k 5
    python -m fusedresnet.client.classify client/samples/* --protocol http --batch-size 2 --input fp32

Images are resized and centre-cropped as torchvision does; with `--input uint8`
(default) the server normalises, with `--input fp32` the client does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from fusedresnet.backend.spec import MODEL_CUSTOM, MODELS
from fusedresnet.client.preprocess import normalize, preprocess_files
from fusedresnet.client.resnet_client import DEFAULT_URLS, PROTOCOLS, ResNetClient


def add_connection_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--url", help=f"server address (default {DEFAULT_URLS['grpc']} for gRPC, "
                                      f"{DEFAULT_URLS['http']} for HTTP)")


def classify_files(client: ResNetClient, paths: list[Path], top_k: int, batch_size: int, input_format: str):
    """Yields (paths of one request, InferResult) per request."""
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        images = preprocess_files(chunk)
        if input_format == "fp32":
            images = np.stack([normalize(image) for image in images])
        yield chunk, client.classify(images, top_k)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    parser.add_argument("--model", choices=MODELS, default=MODEL_CUSTOM)
    add_connection_arguments(parser)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8, help="images per request")
    parser.add_argument("--input", choices=("uint8", "fp32"), default="uint8", dest="input_format")
    args = parser.parse_args(argv)
    try:
        with ResNetClient(args.model, args.protocol, args.url) as client:
            for chunk, result in classify_files(client, args.images, args.top_k, args.batch_size,
                                                args.input_format):
                print(f"-- request of {len(chunk)} image(s): {result.latency_ms:.1f} ms, engine {result.engine}")
                for path, top in zip(chunk, result.top):
                    labels = ", ".join(f"{label} ({score:.2f})" for score, _, label in top)
                    print(f"{path.name}: {labels}")
    except InferenceServerException as error:
        print(f"error from {args.model} over {args.protocol}: {error.message()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"cannot read image: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
