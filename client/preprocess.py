"""ImageNet preprocessing, exactly as torchvision's reference evaluation transforms.

    Resize(256)       shorter side to 256, bilinear with antialiasing (PIL),
                      the longer side int(256 * long / short)
    CenterCrop(224)   offsets int(round((size - 224) / 2))
    ToTensor + Normalize(mean, std)   only for the IMAGE_NORMALIZED input; for
                      the IMAGE input the server normalises.

Plain PIL + NumPy: a client needs neither torch nor torchvision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fusedresnet.backend.spec import (
    IMAGE_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    INPUT_UINT8,
    INPUTS,
    RESIZE_SHORTER_SIDE,
    SAMPLES_DIR,
)

# The model's two inputs, one per request, named as the model names them: IMAGE (uint8 crops, the
# server normalises) or IMAGE_NORMALIZED (float32, normalised by the client).
INPUT_FORMATS = INPUTS


def load_rgb(path) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


def resized_size(width: int, height: int, shorter: int = RESIZE_SHORTER_SIDE) -> tuple[int, int]:
    """(width, height) after torchvision's Resize(shorter) on a PIL image."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def center_crop_uint8(image: Image.Image, size: int = IMAGE_SIZE) -> np.ndarray:
    """Resize + centre crop: uint8 [size, size, 3] RGB, the model's IMAGE input."""
    image = image.convert("RGB")
    new_size = resized_size(*image.size)
    if new_size != image.size:
        image = image.resize(new_size, Image.BILINEAR)
    width, height = image.size
    left, top = int(round((width - size) / 2.0)), int(round((height - size) / 2.0))
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.uint8).copy()


def normalize(crop: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W], ImageNet-normalised: the model's IMAGE_NORMALIZED input."""
    x = crop.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(IMAGENET_MEAN, np.float32)) / np.asarray(IMAGENET_STD, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def model_input(crops: np.ndarray, input_format: str) -> np.ndarray:
    """uint8 crops [N, 224, 224, 3] as the model input `input_format` (one of INPUT_FORMATS): IMAGE sends
    them as they are, IMAGE_NORMALIZED as float32 [N, 3, 224, 224], normalised. Crops already normalised
    (float32, e.g. a pool saved converted) are returned as they are."""
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input format must be one of {INPUT_FORMATS}, not {input_format!r}")
    if input_format == INPUT_UINT8 or crops.dtype == np.float32:
        return crops
    return np.ascontiguousarray(np.stack([normalize(crop) for crop in crops]))


def preprocess_files(paths) -> np.ndarray:
    """uint8 [N, 224, 224, 3] for a list of image files."""
    return np.stack([center_crop_uint8(load_rgb(Path(p))) for p in paths])


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def sample_photo_paths() -> list[Path]:
    """The real photographs shipped in client/samples (licences in its README.md)."""
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
