"""Pre-serialised ModelInfer requests: one request costs its sender almost nothing, so a load generator in
C (h2load) or one asyncio process keeps hundreds in flight."""

from __future__ import annotations

import numpy as np

from fusedresnet.backend.spec import INPUT_UINT8, OUTPUT_LOGITS

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def infer_request(model: str, images: np.ndarray, queue_timeout_us: int | None = None) -> bytes:
    """A serialised ModelInfer request for uint8 images [N,224,224,3], asking for LOGITS only."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = INPUT_UINT8, "UINT8"
    tensor.shape.extend(images.shape)
    request.outputs.add().name = OUTPUT_LOGITS
    if queue_timeout_us is not None:
        request.parameters["timeout"].int64_param = queue_timeout_us
    request.raw_input_contents.append(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    return request.SerializeToString()


def grpc_frame(request: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed), as the body of an HTTP/2 POST."""
    return b"\x00" + len(request).to_bytes(4, "big") + request
