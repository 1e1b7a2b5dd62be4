"""Client preprocessing: torchvision's Resize(256) + CenterCrop(224) + Normalize, and agreement with the server."""

import numpy as np
import pytest
import torch
from PIL import Image

from fusedresnet.backend.images import normalize_uint8
from fusedresnet.client.preprocess import (
    center_crop_uint8,
    normalize,
    preprocess_files,
    resized_size,
    sample_photo_paths,
)


@pytest.mark.parametrize("size, expected", [
    ((500, 375), (341, 256)),   # landscape: int(256 * 500 / 375)
    ((375, 500), (256, 341)),   # portrait
    ((256, 256), (256, 256)),
    ((1000, 872), (293, 256)),
    ((224, 100), (573, 256)),   # upscaling
])
def test_resize_keeps_aspect_ratio_like_torchvision(size, expected):
    assert resized_size(*size) == expected


def test_center_crop_of_256_image_is_the_middle_224_window():
    pixels = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    crop = center_crop_uint8(Image.fromarray(pixels))
    assert crop.dtype == np.uint8 and crop.shape == (224, 224, 3)
    np.testing.assert_array_equal(crop, pixels[16:240, 16:240])


def test_center_crop_offsets_round_like_torchvision():
    # 256 x 259 after resize: top offset round(35 / 2) = 18 (Python rounds half to even), left 16
    pixels = np.random.default_rng(1).integers(0, 256, (259, 256, 3), dtype=np.uint8)
    crop = center_crop_uint8(Image.fromarray(pixels))
    np.testing.assert_array_equal(crop, pixels[18:242, 16:240])


def test_client_normalisation_matches_server_normalisation():
    crop = np.random.default_rng(2).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    server = normalize_uint8(torch.from_numpy(crop[None])).numpy()[0]
    np.testing.assert_allclose(normalize(crop), server, rtol=1e-6, atol=1e-6)
    assert normalize(crop).dtype == np.float32 and normalize(crop).flags.c_contiguous


def test_sample_photos_preprocess_to_model_input():
    images = preprocess_files(sample_photo_paths())
    assert images.shape == (5, 224, 224, 3) and images.dtype == np.uint8
    assert images.std() > 20  # real pictures, not blank
