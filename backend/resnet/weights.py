"""ResNet-18 with its weights, from wherever they come: a torchvision checkpoint (.pth), an ONNX file
(`onnx_import`) or the seeded default weights of `architecture`.

Apart from `architecture` so that the network's definition imports nothing that imports it back (the ONNX
importer reads its stage widths and folds with `folding`).
"""

from __future__ import annotations

import torch

from .architecture import DEFAULT_SEED, ResNet18, seeded_init_, standardize_head_
from .onnx_import import state_dict_from_onnx


def build_resnet18(weights: str | None = None, seed: int = DEFAULT_SEED) -> ResNet18:
    """ResNet-18 in eval mode: a torchvision checkpoint (.pth) or ONNX file (.onnx) if `weights` is a path,
    else seeded weights."""
    model = ResNet18()
    if weights and str(weights).lower().endswith(".onnx"):
        model.load_state_dict(state_dict_from_onnx(weights), strict=True)
    elif weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    else:
        standardize_head_(seeded_init_(model, seed).eval(), seed)
    return model.eval()
