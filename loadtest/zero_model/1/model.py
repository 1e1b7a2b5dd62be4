"""zero_answer: the shipped models' contract, and no network: the Python backend's own ceiling.

It reads each request's IMAGE as the shipped models do (DLPack, also from a client's CUDA shared memory),
and answers LOGITS of zeros [N, 1000] (and ENGINE when asked), so a load test against it measures what
Triton, its Python backend and the load generator cost on this host without any inference. Served beside
the shipped models by the perf_analyzer, multi-GPU and front-door runs, alone (its fast answers make Triton 2.51's
gRPC abandonment crash likeliest) by the abandonment trials and the soak's test (perf_analyzer.zero_model_repository);
never shipped.
"""

import json

import torch
import triton_python_backend_utils as pb_utils

ENGINE_NAME = b"zero-answer"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.classes = int(config["output"][0]["dims"][0])
        self.zeros: dict[int, torch.Tensor] = {}    # batch size -> zero logits of that many rows
        self.engine = torch.frombuffer(bytearray(ENGINE_NAME), dtype=torch.uint8)

    def execute(self, requests):
        responses = []
        for request in requests:
            images = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, self.input_name).to_dlpack())
            count = images.shape[0]
            logits = self.zeros.get(count)
            if logits is None:
                logits = self.zeros[count] = torch.zeros(count, self.classes, dtype=torch.float32)
            outputs = [pb_utils.Tensor.from_dlpack("LOGITS", logits)]
            if "ENGINE" in request.requested_output_names():
                outputs.append(pb_utils.Tensor.from_dlpack("ENGINE", self.engine.expand(count, -1).contiguous()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
