"""BatchNorm folding and the parameter file of the custom engine.

Inference-mode BatchNorm after a bias-free convolution is an affine map per
output channel, so it folds into the convolution:

    scale = gamma / sqrt(running_var + eps)
    W'    = W * scale            (per output channel k)
    b'    = beta - running_mean * scale

The folded network is a list of convolutions with a bias, an optional
residual add and an optional ReLU: exactly what one implicit-GEMM kernel with
a fused epilogue computes. The parameter file stores, per convolution, the
weight as fp16 in KRSC order (output channel, kernel row, kernel column, input
channel: the filter layout of NHWC convolution) and the bias as fp32.

The first convolution stays in normalised space: an engine that reads UINT8
pixels folds the ImageNet normalisation in itself (`engines.fused_cuda`, exact at the border).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from .architecture import STAGE_CHANNELS, ResNet18

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ConvSpec:
    """One folded convolution: conv + bias, then optional residual add, then optional ReLU."""

    name: str
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    relu: bool
    adds_residual: bool = False
    # The block's 1x1 projection summed into this convolution's reduction (`with_shortcut`), or None.
    shortcut: ConvSpec | None = None

    @property
    def shortcut_channels(self) -> int:
        """The input channels of the fused shortcut's extra k-tiles, 0 without one."""
        return self.shortcut.in_channels if self.shortcut is not None else 0

    @property
    def filter_name(self) -> str:
        """The folded convolution whose filter this is: the name without a fused shortcut's suffix."""
        return self.name.split("+")[0]


@dataclass(frozen=True)
class BlockSpec:
    conv1: ConvSpec
    conv2: ConvSpec           # adds the residual, then ReLU
    downsample: ConvSpec | None

    @property
    def name(self) -> str:
        """torchvision's module name of the BasicBlock: layer1.0 ... layer4.1."""
        return self.conv1.name.rsplit(".", 1)[0]


STEM = ConvSpec("conv1", 3, 64, 7, 2, 3, relu=True)
MAXPOOL_KERNEL, MAXPOOL_STRIDE, MAXPOOL_PADDING = 3, 2, 1

# Where the forward pass is observed (the layer-by-layer diff): after the stem + max-pool,
# after each BasicBlock (by its name), after the average pool, and the logits.
STEM_CHECKPOINT, POOL_CHECKPOINT, LOGITS_CHECKPOINT = "stem+maxpool", "avgpool", "logits"


def resnet18_blocks() -> list[BlockSpec]:
    """The eight BasicBlocks of ResNet-18 as folded convolutions, in execution order."""
    blocks, in_channels = [], 64
    for stage, channels in enumerate(STAGE_CHANNELS, start=1):
        for index in range(2):
            stride = 2 if (stage > 1 and index == 0) else 1
            prefix = f"layer{stage}.{index}"
            downsample = None
            if stride != 1 or in_channels != channels:
                downsample = ConvSpec(f"{prefix}.downsample", in_channels, channels, 1, stride, 0, relu=False)
            blocks.append(BlockSpec(
                ConvSpec(f"{prefix}.conv1", in_channels, channels, 3, stride, 1, relu=True),
                ConvSpec(f"{prefix}.conv2", channels, channels, 3, 1, 1, relu=True, adds_residual=True),
                downsample,
            ))
            in_channels = channels
    return blocks


def with_shortcut(block: BlockSpec) -> ConvSpec:
    """A downsampling block's conv2 with its downsample fused in, as the fused engine runs it
    (kernels/loaders.cuh): relu(conv3x3(t) + b2 + conv1x1/stride(x) + b_ds), one convolution whose
    reduction is conv2's 9*C values followed by the downsample's input channels."""
    return replace(block.conv2, name=f"{block.conv2.name}+{block.downsample.name.rsplit('.', 1)[1]}",
                   adds_residual=False, shortcut=block.downsample)


def engine_convs(block: BlockSpec, fuse_shortcut: bool = True) -> list[ConvSpec]:
    """The convolutions the fused engine launches for a block, in order: conv1, then conv2 with its
    residual; in a downsampling block either conv2 with the downsample fused in (`with_shortcut`) or,
    without `fuse_shortcut`, the downsample first (it runs beside conv1) and conv2 adding its output."""
    if block.downsample is None:
        return [block.conv1, block.conv2]
    return [block.conv1, with_shortcut(block)] if fuse_shortcut else [block.downsample, block.conv1, block.conv2]


def shortcut_params(convs: dict, spec: ConvSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [K, 9*C + Cs] fp16, bias [K] fp32) of a `with_shortcut` convolution from the folded ones:
    per output channel the 3x3 filter (KRSC) and then the projection's, and the sum of their biases."""
    main, shortcut = convs[spec.filter_name], convs[spec.shortcut.name]
    k = spec.out_channels
    weight = torch.cat([main["weight"].reshape(k, -1), shortcut["weight"].reshape(k, -1)], dim=1).contiguous()
    return weight, (main["bias"].double() + shortcut["bias"].double()).float()


def checkpoint_names() -> list[str]:
    """The forward pass's checkpoints in execution order."""
    return [STEM_CHECKPOINT] + [block.name for block in resnet18_blocks()] + [POOL_CHECKPOINT, LOGITS_CHECKPOINT]


def all_convs() -> list[ConvSpec]:
    convs = [STEM]
    for block in resnet18_blocks():
        convs += [c for c in (block.downsample, block.conv1, block.conv2) if c is not None]
    return convs


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Folded (weight KCRS, bias K) in float64 for a bias-free conv followed by eval-mode BatchNorm."""
    scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    weight = conv.weight.double() * scale[:, None, None, None]
    bias = bn.bias.double() - bn.running_mean.double() * scale
    return weight, bias


def conv_and_batchnorm(model: ResNet18, name: str) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    if name == STEM.name:
        return model.conv1, model.bn1
    block_name, conv_name = name.rsplit(".", 1)
    block = model.get_submodule(block_name)
    if conv_name == "downsample":
        return block.downsample[0], block.downsample[1]
    return getattr(block, conv_name), getattr(block, conv_name.replace("conv", "bn"))


def fold_resnet18(model: ResNet18, source: str = "") -> dict:
    """The custom engine's parameters: folded, NHWC (KRSC) fp16 weights and fp32 biases."""
    convs = {}
    with torch.no_grad():
        for spec in all_convs():
            weight, bias = fold_batchnorm(*conv_and_batchnorm(model, spec.name))
            convs[spec.name] = {
                "weight": weight.permute(0, 2, 3, 1).contiguous().half(),  # KCRS -> KRSC
                "bias": bias.float(),
            }
        fc = {"weight": model.fc.weight.detach().half().contiguous(), "bias": model.fc.bias.detach().float()}
    return {"format_version": FORMAT_VERSION, "source": source, "convs": convs, "fc": fc}


def load_folded(path) -> dict:
    params = torch.load(path, map_location="cpu", weights_only=True)
    if params.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: parameter format {params.get('format_version')!r}, expected {FORMAT_VERSION}; "
                         "run `make prepare` again")
    return params
