"""A thin client for both ResNet-18 models over gRPC or HTTP (tritonclient).

    client = ResNetClient("resnet18_custom", protocol="grpc", url="127.0.0.1:8001")
    result = client.infer(images_uint8)              # logits, engine name, latency
    top = client.classify(images_uint8, top_k=5)     # Triton's classification extension

`images` is either uint8 [N, 224, 224, 3] (sent as IMAGE, normalised on the
server) or float32 [N, 3, 224, 224] (sent as IMAGE_NORMALIZED).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from fusedresnet.backend.spec import (DEFAULT_GRPC_PORT, DEFAULT_HOST, DEFAULT_HTTP_PORT, INPUT_FP32, INPUT_UINT8,
                                      OUTPUT_ENGINE, OUTPUT_LOGITS)

PROTOCOLS = ("grpc", "http")
DEFAULT_URLS = {"grpc": f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}", "http": f"{DEFAULT_HOST}:{DEFAULT_HTTP_PORT}"}


@dataclass
class InferResult:
    logits: np.ndarray | None         # float32 [N, 1000] (None when classifying)
    top: list[list[tuple[float, int, str]]] | None  # per image: (score, class index, label)
    engine: str                       # the engine that computed the answer (output ENGINE)
    latency_ms: float


def input_name_for(images: np.ndarray) -> str:
    if images.dtype == np.uint8:
        return INPUT_UINT8
    if images.dtype == np.float32:
        return INPUT_FP32
    raise TypeError(f"images must be uint8 [N,224,224,3] or float32 [N,3,224,224], not {images.dtype}")


def parse_classification(entries) -> list[tuple[float, int, str]]:
    """Triton's classification strings "score:index:label" -> tuples."""
    top = []
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        score, index, label = text.split(":", 2)
        top.append((float(score), int(index), label))
    return top


class ResNetClient:
    def __init__(self, model: str, protocol: str = "grpc", url: str | None = None, timeout_s: float = 60.0,
                 headers: dict | None = None):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
        self.model, self.protocol = model, protocol
        self.url = url or DEFAULT_URLS[protocol]
        self.timeout_s, self.headers = timeout_s, headers
        self.lib = grpcclient if protocol == "grpc" else httpclient
        if protocol == "grpc":
            self.client = grpcclient.InferenceServerClient(self.url)
        else:
            self.client = httpclient.InferenceServerClient(self.url, network_timeout=timeout_s,
                                                           connection_timeout=timeout_s)

    def close(self):
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _request(self, images: np.ndarray, class_count: int):
        name = input_name_for(images)
        tensor = self.lib.InferInput(name, list(images.shape), "UINT8" if name == INPUT_UINT8 else "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(images))
        if self.protocol == "grpc":
            outputs = [grpcclient.InferRequestedOutput(OUTPUT_LOGITS, class_count=class_count),
                       grpcclient.InferRequestedOutput(OUTPUT_ENGINE)]
            kwargs = {"client_timeout": self.timeout_s}
        else:
            outputs = [httpclient.InferRequestedOutput(OUTPUT_LOGITS, binary_data=True, class_count=class_count),
                       httpclient.InferRequestedOutput(OUTPUT_ENGINE, binary_data=True)]
            kwargs = {}
        started = time.perf_counter()
        result = self.client.infer(self.model, [tensor], outputs=outputs, headers=self.headers, **kwargs)
        latency_ms = (time.perf_counter() - started) * 1e3
        return result, latency_ms

    @staticmethod
    def _engine(result) -> str:
        return result.as_numpy(OUTPUT_ENGINE)[0].tobytes().decode()

    def infer(self, images: np.ndarray) -> InferResult:
        result, latency_ms = self._request(images, class_count=0)
        return InferResult(result.as_numpy(OUTPUT_LOGITS), None, self._engine(result), latency_ms)

    def classify(self, images: np.ndarray, top_k: int = 5) -> InferResult:
        result, latency_ms = self._request(images, class_count=top_k)
        entries = result.as_numpy(OUTPUT_LOGITS).reshape(images.shape[0], top_k)
        return InferResult(None, [parse_classification(row) for row in entries], self._engine(result), latency_ms)
