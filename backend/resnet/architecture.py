"""ResNet-18 with torchvision's module names, and its default weights.

The ``state_dict`` keys are torchvision's (``conv1.weight``, ``bn1.running_mean``,
``layer1.0.conv1.weight``, ``layer2.0.downsample.0.weight``, ``fc.bias``, ...),
so a torchvision checkpoint such as ``resnet18-f37072fd.pth`` loads as is.

Default weights (no checkpoint given): a deterministic, seeded initialisation.
Convolutions use He (Kaiming) normal init; every BatchNorm gets random
gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1), running mean ~ N(0, 0.1) and
running var ~ U(0.5, 2.0), so folding BatchNorm into the convolutions is a
real transformation and a bug in it shows. An untrained network's pooled
features share a large common component, which would make one class win for
every input; so the classifier is then standardised on the features of 64
seeded smooth random images: fc.weight /= (feature std + mean std) / 4 and
fc.bias = -fc.weight @ feature mean. Different images then get different
classes. These weights are not trained: their "predictions" are arbitrary
ImageNet classes, but they are the same on every machine, which is what
tests and benchmarks need.
"""

from __future__ import annotations

import torch
from torch import nn

from ..images import normalize_uint8, smooth_random_images
from ..spec import NUM_CLASSES

DEFAULT_SEED = 20261122
STAGE_CHANNELS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        in_channels = 64
        for index, channels in enumerate(STAGE_CHANNELS, start=1):
            stride = 1 if index == 1 else 2
            stage = nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1))
            setattr(self, f"layer{index}", stage)
            in_channels = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def features(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))


def seeded_init_(model: ResNet18, seed: int = DEFAULT_SEED) -> ResNet18:
    """Fill every parameter and BatchNorm buffer deterministically (see module doc)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                fan_in = module.in_channels * module.kernel_size[0] * module.kernel_size[1]
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
            elif isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                module.bias.copy_(torch.randn(n, generator=gen) * 0.1)
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
            elif isinstance(module, nn.Linear):
                bound = 1.0 / module.in_features ** 0.5
                module.weight.copy_((torch.rand(module.weight.shape, generator=gen) * 2 - 1) * bound)
                module.bias.copy_((torch.rand(module.bias.shape, generator=gen) * 2 - 1) * bound)
    return model


def standardize_head_(model: ResNet18, seed: int = DEFAULT_SEED, count: int = 64) -> ResNet18:
    """Centre and scale the classifier on the pooled features of seeded images (see module doc)."""
    with torch.no_grad():
        images = normalize_uint8(smooth_random_images(count, seed))
        features = torch.flatten(model.avgpool(model.features(images)), 1)
        mean, std = features.mean(0), features.std(0)
        weight = model.fc.weight / (std + std.mean()) * 4.0
        model.fc.weight.copy_(weight)
        model.fc.bias.copy_(-(weight @ mean))
    return model
