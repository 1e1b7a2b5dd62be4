"""A pool of distinct preprocessed images for load tests.

Every request takes a different contiguous window of the pool, so no two
consecutive requests carry the same bytes: a response cache (or any
content-keyed shortcut) cannot answer them. The pool holds the sample photos
followed by seeded smooth random images (`backend.images.smooth_random_images`).

The sweep builds the pool once and saves it as .npy, already as the model input
of the step (IMAGE: uint8 crops, or IMAGE_NORMALIZED: normalised float32); every
locust process maps that file into memory instead of generating or converting the
images again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusedresnet.client.preprocess import preprocess_files, sample_photo_paths

DEFAULT_POOL_SIZE = 256
DEFAULT_POOL_SEED = 2024


def build_image_pool(size: int = DEFAULT_POOL_SIZE, seed: int = DEFAULT_POOL_SEED) -> np.ndarray:
    """uint8 [size, 224, 224, 3]: the sample photos, then seeded smooth random images."""
    from fusedresnet.backend.images import smooth_random_images  # torch: only needed when building

    photos = preprocess_files(sample_photo_paths())[:size]
    generated = smooth_random_images(size - len(photos), seed=seed).numpy()
    return np.ascontiguousarray(np.concatenate([photos, generated]))


def save_image_pool(pool: np.ndarray, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, pool)
    return path


def load_image_pool(path: Path | None, size: int = DEFAULT_POOL_SIZE) -> np.ndarray:
    """The saved pool at `path` (memory-mapped, shared by all processes), or a freshly built one."""
    return np.load(path, mmap_mode="r") if path else build_image_pool(size)


class RequestWindows:
    """Consecutive batches of `images_per_request` from the pool, each a contiguous view (no copy).

    Window i starts at image (offset + i) mod (pool size - images_per_request + 1): successive
    requests of one user differ, and users given different offsets send different batches.
    """

    def __init__(self, inputs: np.ndarray, images_per_request: int, offset: int = 0):
        if not 1 <= images_per_request <= len(inputs):
            raise ValueError(f"images per request must be 1..{len(inputs)} (the pool size), "
                             f"not {images_per_request}")
        self.inputs, self.images_per_request = inputs, images_per_request
        self.starts = len(inputs) - images_per_request + 1
        self.next_start = offset % self.starts

    def next(self) -> np.ndarray:
        start = self.next_start
        self.next_start = (start + 1) % self.starts
        return self.inputs[start:start + self.images_per_request]
