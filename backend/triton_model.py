"""Adapter between Triton's Python backend and an engine of `fusedresnet.backend.engines`.

Both `model_repository/*/1/model.py` files are thin subclasses of
`ResNetTritonModel`; everything they share lives here:

- placement: the instance kind and device id Triton gives (`KIND_AUTO`
  becomes GPU on a GPU host, CPU elsewhere);
- batching: with dynamic batching `execute()` receives several requests. Each
  is validated on its own; the valid ones are concatenated (one batch per
  input kind), run once, and the logits split back in order. A malformed
  request gets its own INVALID_ARG error; the others still get their answers.
- the engine in use: this Python backend (Triton 2.51) has no response
  parameters and keeps auto-completed config parameters out of the model
  configuration, so every response carries the engine's name in the output
  ENGINE (UTF-8 bytes as UINT8; only sent when asked for, or when a client
  asks for no output in particular), and the load log names it too.
- tensors cross the boundary only through DLPack: with NumPy 2 in the stub's
  environment `as_numpy()` and `pb_utils.Tensor(name, ndarray)` silently
  return zeros / empty outputs on this Triton build.
"""

from __future__ import annotations

import json
import math
import time

import torch
import triton_python_backend_utils as pb_utils

from .images import normalize_uint8
from .spec import (CHANNELS, FP32_INPUT_ABS_LIMIT, IMAGE_SIZE, INPUT_FP32, INPUT_UINT8,
                   OUTPUT_ENGINE, OUTPUT_LOGITS, power_of_two_buckets)

# Warm-up at load runs each batch size once, so that no first request pays for
# kernel compilation, CUDA-graph capture or cuDNN's algorithm choice. On a GPU
# every power of two up to the config's max_batch_size (the fused engine's graph buckets).
CPU_WARMUP_BATCH_SIZES = (1, 8)


class RequestError(ValueError):
    """A request that cannot be answered as sent; its message goes back to the client."""


def config_parameter(model_config: dict, key: str, default: str) -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def read_request(request, max_batch: int) -> tuple[str, torch.Tensor]:
    """(input kind, tensor) of one request, or RequestError naming what is wrong."""
    tensors = {name: pb_utils.get_input_tensor_by_name(request, name) for name in (INPUT_UINT8, INPUT_FP32)}
    present = [name for name, tensor in tensors.items() if tensor is not None]
    if len(present) != 1:
        raise RequestError(f"send exactly one of the inputs {INPUT_UINT8} (UINT8 [N,{IMAGE_SIZE},{IMAGE_SIZE},"
                           f"{CHANNELS}]) or {INPUT_FP32} (FP32 [N,{CHANNELS},{IMAGE_SIZE},{IMAGE_SIZE}]); "
                           f"got {present or 'none'}")
    name = present[0]
    tensor = torch.from_dlpack(tensors[name].to_dlpack())
    if name == INPUT_UINT8:
        expected_dtype, expected_shape = torch.uint8, (IMAGE_SIZE, IMAGE_SIZE, CHANNELS)
    else:
        expected_dtype, expected_shape = torch.float32, (CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    if tensor.dtype != expected_dtype:
        raise RequestError(f"input {name} must be {expected_dtype}, got {tensor.dtype}")
    if tensor.dim() != 4 or tuple(tensor.shape[1:]) != expected_shape:
        raise RequestError(f"input {name} must have shape [N,{','.join(map(str, expected_shape))}], "
                           f"got {list(tensor.shape)}")
    if not 1 <= tensor.shape[0] <= max_batch:
        raise RequestError(f"input {name}: batch size must be 1..{max_batch}, got {tensor.shape[0]}")
    if name == INPUT_FP32:
        peak = float(tensor.abs().amax())  # NaN propagates
        if not math.isfinite(peak):
            raise RequestError(f"input {name} contains NaN or Inf values")
        if peak > FP32_INPUT_ABS_LIMIT:
            raise RequestError(f"input {name} has values up to {peak:.3g}: send ImageNet-normalised pixels "
                               f"(about -2.2..2.7; at most {FP32_INPUT_ABS_LIMIT:g} in magnitude)")
    return name, tensor


class ResNetTritonModel:
    """Base of both models' `TritonPythonModel`; a subclass implements `create_engine`."""

    def create_engine(self, model_dir: str, device: str, model_config: dict):
        """Return (engine, reason the engine was chosen)."""
        raise NotImplementedError

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.max_batch_size = int(self.model_config["max_batch_size"])
        outputs = {o["name"] for o in self.model_config["output"]}
        if not {OUTPUT_LOGITS, OUTPUT_ENGINE} <= outputs:
            raise pb_utils.TritonModelException(
                f"{self.model_name}: config must declare outputs {OUTPUT_LOGITS} and {OUTPUT_ENGINE}")
        if args["model_instance_kind"] == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
            torch.cuda.set_device(device)
        else:
            device = "cpu"
        model_dir = f"{args['model_repository']}/{args['model_version']}"
        started = time.perf_counter()
        self.engine, reason = self.create_engine(model_dir, device, self.model_config)
        self.device = device
        self.engine_name_bytes = torch.frombuffer(bytearray(self.engine.name.encode()), dtype=torch.uint8)
        self._warm_up()
        pb_utils.Logger.log_info(
            f"{self.model_name}: engine {self.engine.name} on {device} ({reason}); "
            f"loaded and warmed up in {time.perf_counter() - started:.1f} s")

    def _warm_up(self):
        generator = torch.Generator().manual_seed(0)
        sizes = power_of_two_buckets(self.max_batch_size) if self.device.startswith("cuda") else CPU_WARMUP_BATCH_SIZES
        for batch in sizes:
            images = torch.randint(0, 256, (batch, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), dtype=torch.uint8,
                                   generator=generator)
            for logits in (self.engine.classify_uint8(images),
                           self.engine.classify_normalized(normalize_uint8(images))):
                if not bool(torch.isfinite(logits).all()):
                    raise pb_utils.TritonModelException(f"{self.model_name}: warm-up produced non-finite logits")

    def _run(self, kind: str, batch: torch.Tensor) -> torch.Tensor:
        run = self.engine.classify_uint8 if kind == INPUT_UINT8 else self.engine.classify_normalized
        return run(batch).float().cpu().contiguous()

    def _respond(self, logits: torch.Tensor):
        engine = self.engine_name_bytes.expand(logits.shape[0], -1).contiguous()
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor.from_dlpack(OUTPUT_LOGITS, logits),
                                                          pb_utils.Tensor.from_dlpack(OUTPUT_ENGINE, engine)])

    def execute(self, requests):
        responses = [None] * len(requests)
        groups: dict[str, list[tuple[int, torch.Tensor]]] = {INPUT_UINT8: [], INPUT_FP32: []}
        for index, request in enumerate(requests):
            try:
                kind, tensor = read_request(request, self.max_batch_size)
                groups[kind].append((index, tensor))
            except RequestError as error:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        for kind, items in groups.items():
            if not items:
                continue
            try:
                logits = self._run(kind, torch.cat([tensor for _, tensor in items]))
            except Exception as error:  # an engine failure fails this batch, not the model
                for index, _ in items:
                    responses[index] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"{self.model_name}: inference failed: {error}"))
                continue
            start = 0
            for index, tensor in items:
                count = tensor.shape[0]
                responses[index] = self._respond(logits[start:start + count])
                start += count
        return responses

    def finalize(self):
        self.engine = None
