"""Image tensors on the server side: normalisation and seeded synthetic images."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .spec import CHANNELS, IMAGE_SIZE, IMAGENET_MEAN, IMAGENET_STD


@functools.cache
def _mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: a host-to-device copy per call would stall the stream
    # and cannot happen inside a CUDA-graph capture.
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    return mean, std


def normalize_uint8(images: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[N, H, W, 3] uint8 -> [N, 3, H, W] ImageNet-normalised, as torchvision's ToTensor + Normalize."""
    x = images.permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    mean, std = _mean_std(x.device)
    return x.sub_(mean).div_(std).to(dtype)


def smooth_random_images(count: int, seed: int, size: int = IMAGE_SIZE, cells: int = 7) -> torch.Tensor:
    """uint8 [count, size, size, 3]: seeded low-frequency random images (bicubic upsampled noise).

    Unlike white noise they have the smooth regions and edges of photographs,
    so a network's features vary from image to image.
    """
    generator = torch.Generator().manual_seed(seed)
    low = torch.rand(count, CHANNELS, cells, cells, generator=generator)
    images = F.interpolate(low, size=(size, size), mode="bicubic", align_corners=False)
    return images.clamp_(0, 1).mul_(255).round_().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
