"""`FusedResNet18`: the custom engine as a ``torch.nn.Module``, for use inside a PyTorch program.

    import torch, torchvision
    from fusedresnet.backend.engines.fused_module import FusedResNet18

    model = FusedResNet18.from_torchvision(torchvision.models.resnet18(weights="DEFAULT"))  # cuda:0
    with torch.inference_mode():
        logits = model(pixels)                    # uint8 [N,H,W,3] RGB pixels on cuda:0 -> fp32 [N,1000]
        logits = model(normalized)                # float [N,3,H,W] ImageNet-normalised -> fp32 [N,1000]
        features = model(pixels, features=True)   # fp32 [N,512,H/32,W/32], before pooling and the head

Built from a torchvision ResNet-18 (`from_torchvision`: a module, a checkpoint
.pth, or an ONNX file), or from the parameter file `prepare` writes
(`from_prepared`). BatchNorm is folded once, at construction.

On a CUDA device it runs `FusedCudaEngine`, the very engine the Triton model
`resnet18_custom` runs on a GPU: the same kernels, one CUDA graph per batch
bucket and input shape, any H, W >= 32. `device="cpu"` runs the folded graph on
PyTorch ops (`TorchFoldedEngine`, what the server runs without a GPU), for
development on hosts without one.

Synchronisation. The engine runs on a CUDA stream of its own. Inputs may be
produced on the caller's current stream (``torch.cuda.current_stream()``): the
engine's stream waits for that stream before reading them. ``forward`` returns
when the outputs are complete (the engine synchronises its stream), so they
can be used at once, on any stream; the host blocks for the duration of the
forward pass. The outputs are new tensors, not views of the engine's buffers.
Calls may come from several threads: the fused engine serialises them on its
lock, the folded graph shares no state between calls.

Inference only: BatchNorm is folded and the kernels have no backward pass, so
the outputs do not require grad, an input that requires grad (with grad mode
on) is refused, and ``train()`` changes nothing. The module has no parameters;
``.to()`` to another device or dtype is refused (build a new one there).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..resnet.architecture import ResNet18
from ..resnet.folding import fold_resnet18, load_folded
from ..resnet.weights import build_resnet18
from ..spec import CHANNELS, FOLDED_PARAMS_FILE, MIN_INPUT_SIZE, MODEL_CUSTOM, MODEL_REPOSITORY
from .config import environment_engine_arguments
from .serving import create_custom_engine

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class FusedResNet18(nn.Module):
    """ResNet-18 inference on the custom engine; see the module doc for inputs, outputs and streams."""

    def __init__(self, params, device: str | torch.device = "cuda", engine: str | None = None):
        """`params`: the folded parameters (a dict from `fold_resnet18`, or the path of a prepared file).

        `engine`: "cuda" (the fused kernels; the default on a CUDA device, fails if they cannot run),
        "torch" (the folded graph on PyTorch ops; the default on the CPU) or "auto".
        """
        super().__init__()
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        params = params if isinstance(params, dict) else load_folded(params)
        self.source = params.get("source", "")
        choice = engine or ("cuda" if device.type == "cuda" else "torch")
        # the developer overrides (FUSEDRESNET_CONV_PATH, FUSEDRESNET_PDL) as for the served model
        self.engine, _ = create_custom_engine(params, str(device), choice, **environment_engine_arguments())

    @classmethod
    def from_torchvision(cls, model_or_checkpoint, device: str | torch.device = "cuda",
                         engine: str | None = None) -> FusedResNet18:
        """From a torchvision ResNet-18: an nn.Module, or the path of a checkpoint (.pth) or ONNX file (.onnx)."""
        if isinstance(model_or_checkpoint, nn.Module):
            network = ResNet18()
            try:
                network.load_state_dict(model_or_checkpoint.state_dict(), strict=True)
            except RuntimeError as error:
                raise ValueError(f"not a torchvision ResNet-18 with 1000 classes: {error}") from error
            source = f"module:{type(model_or_checkpoint).__name__}"
        else:
            network = build_resnet18(str(model_or_checkpoint))
            source = str(Path(model_or_checkpoint).resolve())
        return cls(fold_resnet18(network.eval(), source), device, engine)

    @classmethod
    def from_prepared(cls, path=None, device: str | torch.device = "cuda",
                      engine: str | None = None) -> FusedResNet18:
        """From the parameter file `prepare` writes (default: the model repository's)."""
        return cls(Path(path or MODEL_REPOSITORY / MODEL_CUSTOM / "1" / FOLDED_PARAMS_FILE), device, engine)

    @property
    def engine_name(self) -> str:
        return self.engine.name

    def extra_repr(self) -> str:
        return f"engine={self.engine.name}, device={self.device}, weights={self.source!r}"

    def _apply(self, fn, recurse=True):
        # No parameters to move: the engine owns its device buffers. Allow only no-op conversions.
        probe = fn(torch.zeros(1, device=self.device))
        if probe.device != self.device or probe.dtype != torch.float32:
            raise RuntimeError(f"FusedResNet18 runs on {self.device} in its own precision; to use another device, "
                               f"build a new one with device={str(probe.device)!r}")
        return self

    def check_input(self, images) -> torch.Tensor:
        """The input as the engine takes it, or a ValueError/TypeError naming what was expected."""
        expected = f"uint8 [N,H,W,3] RGB pixels or float32 [N,3,H,W] normalised images on {self.device}"
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor ({expected}), got {type(images).__name__}")
        shape = tuple(images.shape)
        if images.device != self.device:
            raise ValueError(f"expected a tensor on {self.device}, got one on {images.device} "
                             f"(images.to({str(self.device)!r}))")
        if images.dtype != torch.uint8 and images.dtype not in FLOAT_DTYPES:
            raise TypeError(f"expected {expected}; got dtype {images.dtype}")
        if images.dim() != 4:
            raise ValueError(f"expected {expected}; got {images.dim()}-D shape {list(shape)}")
        if images.dtype == torch.uint8:
            if shape[3] != CHANNELS:
                hint = " (this looks NCHW: uint8 pixels go NHWC, images.permute(0, 2, 3, 1))" \
                    if shape[1] == CHANNELS else ""
                raise ValueError(f"expected uint8 pixels as [N,H,W,3] (NHWC), got {list(shape)}{hint}")
            h, w = shape[1], shape[2]
        else:
            if shape[1] != CHANNELS:
                hint = " (this looks NHWC: float images go NCHW, images.permute(0, 3, 1, 2))" \
                    if shape[3] == CHANNELS else ""
                raise ValueError(f"expected float images as [N,3,H,W] (NCHW), got {list(shape)}{hint}")
            h, w = shape[2], shape[3]
            images = images.float()
        if shape[0] == 0:
            raise ValueError("expected at least one image, got an empty batch")
        if h < MIN_INPUT_SIZE or w < MIN_INPUT_SIZE:
            raise ValueError(f"expected H, W >= {MIN_INPUT_SIZE}, got {h}x{w}")
        if images.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("FusedResNet18 is inference-only and has no backward pass: pass images.detach(), "
                               "or call it under torch.inference_mode()")
        return images.contiguous()

    def forward(self, images: torch.Tensor, features: bool = False) -> torch.Tensor:
        """fp32 logits [N,1000], or with features=True the fp32 features [N,512,H/32,W/32] before the head."""
        images = self.check_input(images)
        if features:
            return self.engine.features(images)
        if images.dtype == torch.uint8:
            return self.engine.classify_uint8(images)
        return self.engine.classify_normalized(images)
