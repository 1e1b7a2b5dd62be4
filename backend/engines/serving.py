"""Inference engines behind the two Triton models.

An engine takes a batch on any device and returns fp32 logits [N, 1000]:

    engine.classify_uint8(images)      # [N, H, W, 3] uint8 RGB pixels, not normalised
    engine.classify_normalized(images) # [N, 3, H, W] float32, ImageNet-normalised

`name` says which implementation ran; the Triton models report it in their
load log and in every response, so nobody mistakes one engine for another.

- `TorchScriptEngine`: the cuDNN baseline (traced TorchScript, frozen at load
  in the precision and memory layout asked for).
- `TorchFoldedEngine`: the custom model's folded graph (BatchNorm folded,
  fp16 weights) run by plain PyTorch ops. It is what `resnet18_custom` runs on
  hosts without a GPU, and the in-process reference of the folded parameters.
- The fused CUDA engine (``fusedresnet.backend.engines.fused_cuda``) runs the same
  folded parameters on our own kernels; `create_custom_engine` picks it when a
  GPU and CuPy are present.

Serving interface (`ServingEngine`, what the Triton models use, `backend/triton_adapter/python_model.py`),
the same for every engine so that both models get the same treatment:

    bucket = engine.bucket(count)                  # batch size actually run for `count` images
    buffer = engine.input_buffer(input_name, bucket)   # device tensor the batch is written into
    logits = engine.run_buffer(input_name, bucket, count)  # fp32 [count, 1000] on the device
    engine.describe()                              # what the load log says about the engine

`input_name` is the Triton input the batch came in (`INPUT_UINT8`: uint8
[N,224,224,3] pixels; `INPUT_FP32`: float32 [N,3,224,224] normalised). The work
is queued on `engine.stream` (a torch stream; None on the CPU), which the caller
also uses for its copies. An engine that replays CUDA graphs pads a batch to the
next captured power of two; an eager engine runs exactly `count` images.

Threads: the serving interface has one caller at a time (a Triton model
instance calls execute() serially): the caller writes the buffer that
`input_buffer` returns and then runs it, two steps no lock of the engine's
could join. The library calls (`classify_uint8`, `classify_normalized`, and
the fused engine's `features` / `checkpoint_outputs`) may come from several
threads: the fused engine serialises them on its lock, the PyTorch engines
share no state between calls.

`create_engine` is the one factory: it builds the engine a model's
`EngineConfig` (`backend/engines/config.py`) asks for.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from ..images import normalize_uint8
from ..resnet.folding import (
    LOGITS_CHECKPOINT,
    MAXPOOL_KERNEL,
    MAXPOOL_PADDING,
    MAXPOOL_STRIDE,
    POOL_CHECKPOINT,
    STEM,
    STEM_CHECKPOINT,
    load_folded,
    resnet18_blocks,
)
from ..spec import CHANNELS, FOLDED_PARAMS_FILE, IMAGE_SIZE, INPUT_FP32, INPUT_UINT8, TORCHSCRIPT_FILE
from .batch_buckets import next_power_of_two
from .config import CUSTOM_ENGINES, EngineConfig

# Warm-up and CUDA-graph capture run each bucket a few times first (cuDNN's algorithm
# choice and TorchScript's profiling executor settle in the first runs).
GRAPH_WARMUP_RUNS = 3


def input_shape(input_name: str, batch: int, h: int = IMAGE_SIZE, w: int = IMAGE_SIZE) -> tuple[tuple, torch.dtype]:
    """Shape and dtype of a batch of the given Triton input."""
    if input_name == INPUT_UINT8:
        return (batch, h, w, CHANNELS), torch.uint8
    if input_name == INPUT_FP32:
        return (batch, CHANNELS, h, w), torch.float32
    raise ValueError(f"unknown input {input_name!r}")


@runtime_checkable
class ServingEngine(Protocol):
    """What the Triton models use of an engine (see the module doc); every engine here has it."""

    name: str                              # the ENGINE output and the load log: which implementation ran
    stream: torch.cuda.Stream | None       # where the engine queues its work (None on the CPU)

    def bucket(self, count: int) -> int: ...

    def input_buffer(self, input_name: str, bucket: int) -> torch.Tensor: ...

    def run_buffer(self, input_name: str, bucket: int, count: int) -> torch.Tensor: ...

    def describe(self) -> str:
        """One line for the load log: how the engine runs (precision, graphs, kernel family, launches)."""
        ...


class TorchServing:
    """The serving interface for the engines built on PyTorch ops (eager, or one CUDA graph per bucket)."""

    device: torch.device

    def _init_serving(self, cuda_graphs: bool):
        on_gpu = self.device.type == "cuda"
        self.cuda_graphs = cuda_graphs and on_gpu
        self.stream = torch.cuda.Stream(self.device) if on_gpu else None
        self._buffers: dict[str, torch.Tensor] = {}              # eager: one buffer per input, grown on demand
        self._graphs: dict[tuple[str, int], tuple] = {}          # graphs: (input, bucket) -> (graph, input, output)
        self._graph_pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None

    def _classify(self, input_name: str, images: torch.Tensor) -> torch.Tensor:
        run = self.classify_uint8 if input_name == INPUT_UINT8 else self.classify_normalized
        return run(images)

    def bucket(self, count: int) -> int:
        return next_power_of_two(count) if self.cuda_graphs else count

    def _stream_context(self):
        if self.stream is None:
            return contextlib.nullcontext()
        context = contextlib.ExitStack()     # this engine's device and stream, whatever the caller's current device
        context.enter_context(torch.cuda.device(self.device))
        context.enter_context(torch.cuda.stream(self.stream))
        return context

    def input_buffer(self, input_name: str, bucket: int) -> torch.Tensor:
        if self.cuda_graphs:
            return self._graph(input_name, bucket)[1]
        buffer = self._buffers.get(input_name)
        if buffer is None or buffer.shape[0] < bucket:
            shape, dtype = input_shape(input_name, bucket)
            buffer = self._buffers[input_name] = torch.empty(shape, dtype=dtype, device=self.device)
        return buffer[:bucket]

    @torch.inference_mode()
    def run_buffer(self, input_name: str, bucket: int, count: int) -> torch.Tensor:
        with self._stream_context():
            if self.cuda_graphs:
                graph, _, output = self._graph(input_name, bucket)
                graph.replay()
                return output[:count]
            return self._classify(input_name, self._buffers[input_name][:count])

    @torch.inference_mode()
    def _graph(self, input_name: str, bucket: int):
        entry = self._graphs.get((input_name, bucket))
        if entry is None:
            shape, dtype = input_shape(input_name, bucket)
            static_input = torch.zeros(shape, dtype=dtype, device=self.device)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with self._stream_context():
                for _ in range(GRAPH_WARMUP_RUNS):
                    self._classify(input_name, static_input)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=self._graph_pool, stream=self.stream):
                static_output = self._classify(input_name, static_input)
            entry = self._graphs[(input_name, bucket)] = (graph, static_input, static_output)
        return entry


class TorchScriptEngine(TorchServing):
    """The baseline: torchvision-equivalent ResNet-18 as TorchScript, cuDNN on a GPU.

    With `cuda_graphs` (on a GPU) each serving bucket replays a captured CUDA graph,
    what a careful user deploying cuDNN would do; the name says so.
    """

    @staticmethod
    def effective_precision(device: str, precision: str) -> str:
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be fp32 or fp16, not {precision!r}")
        # fp16 convolutions on the CPU are slow and not what users compare against.
        return precision if str(device).startswith("cuda") else "fp32"

    def __init__(self, path, device: str = "cpu", precision: str = "fp32", cuda_graphs: bool = False):
        precision = self.effective_precision(device, precision)
        self.device = torch.device(device)
        self.precision = precision
        self.dtype = torch.float16 if precision == "fp16" else torch.float32
        module = torch.jit.load(str(path), map_location=self.device).eval()
        # The file holds the traced graph with its parameters; casting and the
        # channels-last layout must happen before freezing, which turns the
        # parameters into constants that no later .half() would touch.
        module = module.to(self.dtype)
        if precision == "fp16":
            module = module.to(memory_format=torch.channels_last)
        self.module = torch.jit.freeze(module)
        self._init_serving(cuda_graphs)
        library = "cudnn" if self.device.type == "cuda" else "cpu"
        self.name = (f"torchscript-{library}-{precision}" + ("-channels-last" if precision == "fp16" else "")
                     + ("-cuda-graphs" if self.cuda_graphs else ""))

    def describe(self) -> str:
        graphs = "a CUDA graph per power-of-two batch bucket" if self.cuda_graphs else "eager"
        return f"{self.precision} TorchScript on {self.device}, {graphs}"

    @torch.inference_mode()
    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, self.dtype, non_blocking=True)
        if self.precision == "fp16":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.module(x).float()

    @torch.inference_mode()
    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify_normalized(normalize_uint8(images.to(self.device, non_blocking=True)))


class TorchFoldedEngine(TorchServing):
    """The folded network (conv + bias [+ residual] [+ ReLU]) on plain PyTorch ops, fp32 compute."""

    def __init__(self, params_or_path, device: str = "cpu"):
        params = load_folded(params_or_path) if not isinstance(params_or_path, dict) else params_or_path
        self.device = torch.device(device)
        self.name = f"torch-folded-{self.device.type}-fp32"
        self._init_serving(cuda_graphs=False)
        self.blocks = resnet18_blocks()
        self.weights = {}
        for name, conv in params["convs"].items():
            weight = conv["weight"].float().permute(0, 3, 1, 2).contiguous()  # KRSC -> KCRS
            self.weights[name] = (weight.to(self.device), conv["bias"].float().to(self.device))
        self.fc_weight = params["fc"]["weight"].float().to(self.device)
        self.fc_bias = params["fc"]["bias"].float().to(self.device)

    def describe(self) -> str:
        return f"folded graph on PyTorch ops on {self.device}, fp32, eager (not our fused kernels)"

    def _conv(self, spec, x, residual=None):
        weight, bias = self.weights[spec.name]
        y = F.conv2d(x, weight, bias, stride=spec.stride, padding=spec.padding)
        if residual is not None:
            y = y + residual
        return F.relu(y) if spec.relu else y

    @torch.inference_mode()
    def checkpoints(self, images: torch.Tensor):
        """The forward pass as a walk: yields (checkpoint name, activation) in execution order
        (`folding.checkpoint_names`); `images` are ImageNet-normalised float [N, 3, H, W].
        Lazy: a caller that stops early computes no further."""
        x = self._conv(STEM, images.to(self.device, torch.float32))
        x = F.max_pool2d(x, MAXPOOL_KERNEL, MAXPOOL_STRIDE, MAXPOOL_PADDING)
        yield STEM_CHECKPOINT, x
        for block in self.blocks:
            identity = x if block.downsample is None else self._conv(block.downsample, x)
            x = self._conv(block.conv2, self._conv(block.conv1, x), residual=identity)
            yield block.name, x
        pooled = x.mean(dim=(2, 3))
        yield POOL_CHECKPOINT, pooled
        yield LOGITS_CHECKPOINT, F.linear(pooled, self.fc_weight, self.fc_bias)

    @torch.inference_mode()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """fp32 [N, 512, H/32, W/32]: the last block's output, before pooling and the head."""
        last_block = self.blocks[-1].name
        return next(x for name, x in self.checkpoints(images) if name == last_block)

    @torch.inference_mode()
    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        return next(x for name, x in self.checkpoints(images) if name == LOGITS_CHECKPOINT)

    @torch.inference_mode()
    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify_normalized(normalize_uint8(images.to(self.device)))


# What installs the fused engine's dependencies (CuPy, NVRTC, cuda.bindings: pyproject's gpu extra).
GPU_INSTALL_COMMAND = (".venv/bin/python -m pip install -e '.[gpu]' "
                       "(installed from a wheel: pip install 'fusedresnet[gpu]')")


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run on this instance; the message names what is missing and the fix."""


def custom_engine_plan(device: str, choice: str = "auto") -> tuple[str, str]:
    """(engine kind, reason): "cuda" (our fused kernels) or "torch" (folded PyTorch graph).

    `choice` is "auto", "cuda" or "torch". No silent fallback on a GPU: a GPU
    instance runs the fused kernels unless the config says `engine: torch`;
    if they cannot load (CuPy or another dependency missing) the instance
    refuses to load (EngineUnavailable), naming the missing module and the
    command that installs it. Serving the PyTorch graph on a GPU is slower and
    not what this model is for, so it is an explicit opt-in, never a quiet
    substitute that only the ENGINE output would reveal. A CPU instance with
    `auto` runs the folded graph: there is no GPU to run the kernels on.
    """
    if choice not in CUSTOM_ENGINES:
        raise ValueError(f"engine must be one of {', '.join(CUSTOM_ENGINES)}, not {choice!r}")
    on_gpu = str(device).startswith("cuda")
    if choice == "torch":
        return "torch", "config engine torch"
    if not on_gpu:
        if choice == "cuda":
            raise EngineUnavailable("config engine cuda asks for the fused CUDA kernels, but this instance has no "
                                    "GPU (engine auto runs the PyTorch graph on a CPU instance)")
        return "torch", "no GPU for this instance"
    try:
        from . import fused_cuda  # noqa: F401
    except ImportError as error:
        missing = error.name or "a dependency"
        raise EngineUnavailable(
            f"the fused CUDA engine cannot load on {device}: {missing} is missing ({error}). Install it with "
            f"`{GPU_INSTALL_COMMAND}` and restart the server; or set parameter engine to torch in this model's "
            f"config.pbtxt to serve the (slower) PyTorch graph on the GPU instead") from error
    return "cuda", f"GPU instance, config engine {choice}"


def create_custom_engine(params_path, device: str = "cpu", choice: str = "auto", conv_path: str | None = None,
                         pdl: bool | None = None):
    """The custom model's engine and why it was chosen: fused CUDA kernels on a GPU, else the folded graph.
    `conv_path`, `pdl`: the fused engine's kernel family and launch mode (None: its defaults)."""
    kind, reason = custom_engine_plan(device, choice)
    if kind == "torch":
        return TorchFoldedEngine(params_path, device), reason
    from .fused_cuda import FusedCudaEngine
    return FusedCudaEngine(params_path, device, conv_path=conv_path, pdl=pdl), reason


def create_engine(model_dir, device: str, config: EngineConfig) -> tuple[ServingEngine, str]:
    """The engine `config` asks for, on `device`, from the files `prepare` wrote into `model_dir`
    (a model's version folder), and why: (engine, reason)."""
    if config.engine == "torchscript":
        engine = TorchScriptEngine(f"{model_dir}/{TORCHSCRIPT_FILE}", device, config.precision, config.cuda_graphs)
        reason = (f"config precision {config.precision}" if engine.precision == config.precision
                  else f"{config.precision} needs a GPU")
        return engine, reason
    conv_path, conv_path_source = config.conv_path_request()
    pdl, pdl_source = config.pdl_request()
    engine, reason = create_custom_engine(f"{model_dir}/{FOLDED_PARAMS_FILE}", device, config.engine,
                                          conv_path=conv_path, pdl=pdl)
    if not isinstance(engine, TorchFoldedEngine):
        reason += f"; {conv_path_source}, {pdl_source}"
    return engine, reason
