"""Classify image files with either ResNet-18 model over gRPC (default) or HTTP.

    python -m fusedresnet.client.classify photo.jpg other.png --model resnet18_cudnn --top-k 5
    python -m fusedresnet.client.classify client/samples/* --protocol http --batch-size 2 --input IMAGE_NORMALIZED
    python -m fusedresnet.client.classify photo.jpg --shared-memory system --admin-token-file build/admin-token
    python -m fusedresnet.client.classify client/samples/* --batch-size 1 --url 10.0.0.1:8001,10.0.0.2:8001

Images are resized and centre-cropped as torchvision does; with `--input IMAGE`
(default) the server normalises, with `--input IMAGE_NORMALIZED` the client does.
`--shared-memory system|cuda` (same host as the server) passes the images through a
shared-memory region registered with the admin token (default $FUSEDRESNET_ADMIN_TOKEN,
else build/admin-token); the region is unregistered and freed on exit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonclient.utils import InferenceServerException

from fusedresnet.backend.spec import INPUT_UINT8, MODEL_CUSTOM, MODELS
from fusedresnet.client.preprocess import INPUT_FORMATS, model_input, preprocess_files
from fusedresnet.client.resnet_client import DEFAULT_URLS, PROTOCOLS, ResNetClient, check_endpoints
from fusedresnet.client.shared_memory import SHARED_MEMORY_KINDS


def add_connection_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--url", help=f"server address (default {DEFAULT_URLS['grpc']} for gRPC, "
                                      f"{DEFAULT_URLS['http']} for HTTP); over gRPC several servers, "
                                      "host:port,host:port or dns:///name:port, take the requests in turn")


def classify_files(client: ResNetClient, paths: list[Path], top_k: int, batch_size: int, input_format: str):
    """Yields (paths of one request, InferResult) per request."""
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        yield chunk, client.classify(model_input(preprocess_files(chunk), input_format), top_k)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    parser.add_argument("--model", choices=MODELS, default=MODEL_CUSTOM)
    add_connection_arguments(parser)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8, help="images per request")
    parser.add_argument("--input", choices=INPUT_FORMATS, default=INPUT_UINT8, dest="input_format",
                        help="the model input the images are sent as: IMAGE (the server normalises, default) "
                             "or IMAGE_NORMALIZED (normalised here)")
    parser.add_argument("--shared-memory", choices=SHARED_MEMORY_KINDS, default="none",
                        help="pass the images through system or CUDA shared memory (client on the server's host)")
    parser.add_argument("--admin-token-file", type=Path,
                        help="file holding the admin token that registering shared memory needs "
                             "(default: $FUSEDRESNET_ADMIN_TOKEN, else build/admin-token)")
    args = parser.parse_args(argv)
    try:
        check_endpoints(args.protocol, args.url or DEFAULT_URLS[args.protocol], args.shared_memory)
    except ValueError as error:
        parser.error(str(error))
    try:
        with ResNetClient(args.model, args.protocol, args.url, shared_memory=args.shared_memory,
                          admin_token_file=args.admin_token_file) as client:
            for chunk, result in classify_files(client, args.images, args.top_k, args.batch_size,
                                                args.input_format):
                print(f"-- request of {len(chunk)} image(s): {result.latency_ms:.1f} ms, engine {result.engine}")
                for path, top in zip(chunk, result.top, strict=True):
                    labels = ", ".join(f"{label} ({score:.2f})" for score, _, label in top)
                    print(f"{path.name}: {labels}")
    except InferenceServerException as error:
        print(f"error from {args.model} over {args.protocol}: {error.message()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"cannot read {error.filename}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
