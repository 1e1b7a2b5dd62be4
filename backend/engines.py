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
- The fused CUDA engine (``fusedresnet.backend.engine_cuda``) runs the same
  folded parameters on our own kernels; `create_custom_engine` picks it when a
  GPU and CuPy are present.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .folding import MAXPOOL_KERNEL, MAXPOOL_PADDING, MAXPOOL_STRIDE, STEM, load_folded, resnet18_blocks
from .images import normalize_uint8


class TorchScriptEngine:
    """The baseline: torchvision-equivalent ResNet-18 as TorchScript, cuDNN on a GPU."""

    @staticmethod
    def effective_precision(device: str, precision: str) -> str:
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be fp32 or fp16, not {precision!r}")
        # fp16 convolutions on the CPU are slow and not what users compare against.
        return precision if str(device).startswith("cuda") else "fp32"

    @classmethod
    def describe(cls, device: str, precision: str) -> str:
        """The engine name for this device and requested precision, without building it."""
        precision = cls.effective_precision(device, precision)
        library = "cudnn" if str(device).startswith("cuda") else "cpu"
        return f"torchscript-{library}-{precision}" + ("-channels-last" if precision == "fp16" else "")

    def __init__(self, path, device: str = "cpu", precision: str = "fp32"):
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
        self.name = self.describe(device, precision)

    @torch.inference_mode()
    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, self.dtype, non_blocking=True)
        if self.precision == "fp16":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.module(x).float()

    @torch.inference_mode()
    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify_normalized(normalize_uint8(images.to(self.device, non_blocking=True)))


class TorchFoldedEngine:
    """The folded network (conv + bias [+ residual] [+ ReLU]) on plain PyTorch ops, fp32 compute."""

    @staticmethod
    def describe(device: str) -> str:
        return f"torch-folded-{torch.device(device).type}-fp32"

    def __init__(self, params_or_path, device: str = "cpu"):
        params = load_folded(params_or_path) if not isinstance(params_or_path, dict) else params_or_path
        self.device = torch.device(device)
        self.name = self.describe(device)
        self.blocks = resnet18_blocks()
        self.weights = {}
        for name, conv in params["convs"].items():
            weight = conv["weight"].float().permute(0, 3, 1, 2).contiguous()  # KRSC -> KCRS
            self.weights[name] = (weight.to(self.device), conv["bias"].float().to(self.device))
        self.fc_weight = params["fc"]["weight"].float().to(self.device)
        self.fc_bias = params["fc"]["bias"].float().to(self.device)

    def _conv(self, spec, x, residual=None):
        weight, bias = self.weights[spec.name]
        y = F.conv2d(x, weight, bias, stride=spec.stride, padding=spec.padding)
        if residual is not None:
            y = y + residual
        return F.relu(y) if spec.relu else y

    @torch.inference_mode()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = self._conv(STEM, images.to(self.device, torch.float32))
        x = F.max_pool2d(x, MAXPOOL_KERNEL, MAXPOOL_STRIDE, MAXPOOL_PADDING)
        for block in self.blocks:
            identity = x if block.downsample is None else self._conv(block.downsample, x)
            x = self._conv(block.conv2, self._conv(block.conv1, x), residual=identity)
        return x

    @torch.inference_mode()
    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        pooled = self.features(images).mean(dim=(2, 3))
        return F.linear(pooled, self.fc_weight, self.fc_bias)

    @torch.inference_mode()
    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify_normalized(normalize_uint8(images.to(self.device)))


def custom_engine_plan(device: str, choice: str = "auto") -> tuple[str, str]:
    """(engine kind, reason): "cuda" (our fused kernels) or "torch" (folded PyTorch graph).

    `choice` is "auto", "cuda" (fail if the kernels cannot run) or "torch".
    """
    if choice not in ("auto", "cuda", "torch"):
        raise ValueError(f"engine must be auto, cuda or torch, not {choice!r}")
    on_gpu = str(device).startswith("cuda")
    if choice == "torch":
        return "torch", "asked for in the config"
    if not on_gpu:
        if choice == "cuda":
            raise ValueError("engine cuda asked for, but this instance has no GPU")
        return "torch", "no GPU for this instance"
    try:
        from . import engine_cuda  # noqa: F401
    except ImportError as error:
        if choice == "cuda":
            raise
        return "torch", f"fused CUDA engine unavailable ({error})"
    return "cuda", "GPU present"


def describe_custom_engine(device: str, choice: str = "auto") -> str:
    kind, _ = custom_engine_plan(device, choice)
    if kind == "torch":
        return TorchFoldedEngine.describe(device)
    from .engine_cuda import FusedCudaEngine
    return FusedCudaEngine.describe(device)


def create_custom_engine(params_path, device: str = "cpu", choice: str = "auto"):
    """The custom model's engine and why it was chosen: fused CUDA kernels on a GPU, else the folded graph."""
    kind, reason = custom_engine_plan(device, choice)
    if kind == "torch":
        return TorchFoldedEngine(params_path, device), reason
    from .engine_cuda import FusedCudaEngine
    return FusedCudaEngine(params_path, device), reason
