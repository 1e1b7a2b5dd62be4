"""zeros: reads each request's IMAGE and answers LOGITS of zeros (one response per request, in order).

Through DLPack and torch, as the project's models do: with NumPy 2 in the stub, as_numpy() and
pb_utils.Tensor(name, array) are wrong in this Triton build, and from_dlpack takes no NumPy array
(../shared/gpu-host/README.md)."""

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "IMAGE").to_dlpack())
            logits = torch.zeros((image.shape[0], 1000), dtype=torch.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("LOGITS", logits)]))
        return responses
