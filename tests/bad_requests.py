"""Malformed requests, built at the wire level, and how each must be refused: shared by the
bad-input tests (test_robustness.py) and the soak (test_soak.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from fusedresnet.backend.spec import (
    CHANNELS,
    IMAGE_SIZE,
    INPUT_FP32,
    INPUT_UINT8,
    INPUTS,
    OUTPUT_LOGITS,
    max_batch_size,
    served_model,
)

from robustness_helpers import PROTOCOLS, raw_grpc_infer, raw_http_infer

HWC = [IMAGE_SIZE, IMAGE_SIZE, CHANNELS]
CHW = [CHANNELS, IMAGE_SIZE, IMAGE_SIZE]
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE * CHANNELS


@dataclass
class BadRequest:
    """One malformed request; `expect` are fragments its error message must contain (any case)."""
    name: str
    inputs: list            # (name, datatype, shape, payload bytes)
    expect: tuple
    model: str | None = None            # None: the entry of the network under test that serves `served_input`
    served_input: str | None = None     # None: the first input's own entry (IMAGE_NORMALIZED: <network>_normalized)
    version: str = ""
    outputs: tuple = (OUTPUT_LOGITS,)
    grpc_code: str = "INVALID_ARGUMENT"
    http_status: int = 400
    http_declared_sizes: list | None = None   # binary_data_size per input, when it must lie
    protocols: tuple = PROTOCOLS
    reaches_model: bool = False         # rejected by the model, not by Triton: can share a batch with good ones
    extras: dict = field(default_factory=dict)


def fp32_images(count=1, poison=None) -> bytes:
    images = np.zeros([count, *CHW], np.float32)
    if poison is not None:
        images[0, 1, 100, 100] = poison
    return images.tobytes()


BAD_REQUESTS = [
    BadRequest("wrong dtype (FP32 sent as IMAGE)", [(INPUT_UINT8, "FP32", [1, *HWC], bytes(4 * IMAGE_BYTES))],
               ("data-type is 'FP32'", "expects 'UINT8'")),
    BadRequest("wrong dtype (INT8 sent as IMAGE)", [(INPUT_UINT8, "INT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("data-type is 'INT8'", "expects 'UINT8'")),
    BadRequest("wrong dtype (FP16 sent as IMAGE_NORMALIZED)",
               [(INPUT_FP32, "FP16", [1, *CHW], bytes(2 * IMAGE_BYTES))], ("data-type is 'FP16'", "expects 'FP32'")),
    BadRequest("unknown dtype", [(INPUT_UINT8, "UINT3", [1, *HWC], bytes(IMAGE_BYTES))],
               ("data-type", "expects 'UINT8'"), protocols=("grpc",)),
    BadRequest("wrong rank (5-d)", [(INPUT_UINT8, "UINT8", [1, *HWC, 1], bytes(IMAGE_BYTES))],
               ("unexpected shape for input 'IMAGE'", "expected [-1,224,224,3]")),
    BadRequest("wrong rank (3-d)", [(INPUT_UINT8, "UINT8", [4, IMAGE_SIZE, CHANNELS], bytes(4 * IMAGE_SIZE * 3))],
               ("unexpected shape for input 'IMAGE'",)),
    BadRequest("wrong image size (200x200)", [(INPUT_UINT8, "UINT8", [1, 200, 200, 3], bytes(200 * 200 * 3))],
               ("unexpected shape for input 'IMAGE'", "got [1,200,200,3]")),
    BadRequest("HWC layout sent as IMAGE_NORMALIZED", [(INPUT_FP32, "FP32", [1, *HWC], bytes(4 * IMAGE_BYTES))],
               ("unexpected shape for input 'IMAGE_NORMALIZED'", "expected [-1,3,224,224]")),
    BadRequest("batch larger than max_batch_size",
               [(INPUT_UINT8, "UINT8", [max_batch_size() + 1, *HWC], bytes((max_batch_size() + 1) * IMAGE_BYTES))],
               (f"batch-size must be <= {max_batch_size()}",)),
    BadRequest("empty batch", [(INPUT_UINT8, "UINT8", [0, *HWC], b"")], ("input byte size mismatch", "'IMAGE'")),
    BadRequest("truncated payload", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES - 100))],
               ("input byte size mismatch", f"expected {IMAGE_BYTES}, got {IMAGE_BYTES - 100}")),
    BadRequest("oversized payload", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES + 100))],
               ("input byte size mismatch", f"expected {IMAGE_BYTES}, got {IMAGE_BYTES + 100}")),
    BadRequest("payload of the wrong batch (2 images declared as 1)",
               [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(2 * IMAGE_BYTES))], ("input byte size mismatch",)),
    BadRequest("declared binary size larger than the body", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unexpected size for input 'IMAGE'", "expecting 100 additional bytes"),
               http_declared_sizes=[IMAGE_BYTES + 100], protocols=("http",)),
    BadRequest("declared binary size smaller than the body", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unexpected additional input data",), http_declared_sizes=[IMAGE_BYTES - 100], protocols=("http",)),
    BadRequest("input declared without any data", [(INPUT_UINT8, "UINT8", [1, *HWC], None)],
               ("unable to find data for input tensor 'IMAGE'",), protocols=("grpc",)),
    BadRequest("NaN in IMAGE_NORMALIZED", [(INPUT_FP32, "FP32", [1, *CHW], fp32_images(1, np.nan))],
               ("IMAGE_NORMALIZED contains NaN or Inf",), reaches_model=True),
    BadRequest("+Inf in IMAGE_NORMALIZED", [(INPUT_FP32, "FP32", [2, *CHW], fp32_images(2, np.inf))],
               ("IMAGE_NORMALIZED contains NaN or Inf",), reaches_model=True),
    BadRequest("-Inf in IMAGE_NORMALIZED", [(INPUT_FP32, "FP32", [1, *CHW], fp32_images(1, -np.inf))],
               ("IMAGE_NORMALIZED contains NaN or Inf",), reaches_model=True),
    BadRequest("unnormalised 0..255 floats in IMAGE_NORMALIZED",
               [(INPUT_FP32, "FP32", [1, *CHW], fp32_images(1, 255.0))],
               ("IMAGE_NORMALIZED has values up to 255", "send ImageNet-normalised pixels"), reaches_model=True),
    BadRequest("huge finite value in IMAGE_NORMALIZED", [(INPUT_FP32, "FP32", [1, *CHW], fp32_images(1, -1e30))],
               ("IMAGE_NORMALIZED has values up to 1e+30", "send ImageNet-normalised pixels"), reaches_model=True),
    # The contract before 2026-11-26 (both inputs optional on each model, one per request): Triton refuses
    # the input the entry does not declare, naming it and the entry.
    BadRequest("IMAGE_NORMALIZED sent to the IMAGE entry (the old contract)",
               [(INPUT_FP32, "FP32", [1, *CHW], fp32_images(1))], ("unexpected inference input 'IMAGE_NORMALIZED'",
                                                                   "for model 'resnet18_"), served_input=INPUT_UINT8),
    BadRequest("IMAGE sent to the IMAGE_NORMALIZED entry", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unexpected inference input 'IMAGE'", "_normalized'"), served_input=INPUT_FP32),
    BadRequest("both inputs at once", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES)),
                                       (INPUT_FP32, "FP32", [1, *CHW], fp32_images(1))],
               ("expected 1 inputs but got 2 inputs",), served_input=INPUT_UINT8),
    BadRequest("no input at all", [], ("expected 1 inputs but got 0 inputs", "missing required input(s) ['IMAGE']")),
    BadRequest("unknown input name", [("PIXELS", "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unexpected inference input 'PIXELS'",)),
    BadRequest("unknown output name", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unexpected inference output 'PROBABILITIES'",), outputs=("PROBABILITIES",)),
    BadRequest("unknown model", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("unknown model", "'resnet50'"), model="resnet50", grpc_code="NOT_FOUND", http_status=404),
    BadRequest("unknown version", [(INPUT_UINT8, "UINT8", [1, *HWC], bytes(IMAGE_BYTES))],
               ("version 7 is not found",), version="7", grpc_code="NOT_FOUND", http_status=404),
]


def send_bad(server, protocol: str, model: str, bad: BadRequest) -> tuple[object, str]:
    """(status: gRPC code name or HTTP status, error message) of one malformed request."""
    first_input = bad.inputs[0][0] if bad.inputs else INPUT_UINT8
    served_input = bad.served_input or (first_input if first_input in INPUTS else INPUT_UINT8)
    target = bad.model or served_model(model, served_input)
    if protocol == "grpc":
        status, answer = raw_grpc_infer(server, target, [(n, d, s) for n, d, s, _ in bad.inputs],
                                        [p for _, _, _, p in bad.inputs if p is not None],
                                        version=bad.version, outputs=bad.outputs)
        return status, (answer if isinstance(answer, str) else "")
    declared = bad.http_declared_sizes or [len(p or b"") for _, _, _, p in bad.inputs]
    header = {"inputs": [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": size}}
                         for (n, d, s, _), size in zip(bad.inputs, declared)],
              "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in bad.outputs]}
    body = b"".join(p or b"" for _, _, _, p in bad.inputs)
    status, text = raw_http_infer(server, target, header, body, version=bad.version)
    try:
        return status, json.loads(text).get("error", text)
    except ValueError:
        return status, text


def assert_clear_refusal(bad: BadRequest, protocol: str, status, message: str):
    expected_status = bad.grpc_code if protocol == "grpc" else bad.http_status
    assert status == expected_status, f"{bad.name} over {protocol}: {status} {message!r}"
    for fragment in bad.expect:
        assert fragment.lower() in message.lower(), f"{bad.name} over {protocol}: {message!r} lacks {fragment!r}"
