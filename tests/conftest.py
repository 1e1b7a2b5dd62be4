"""Shared fixtures: the real Triton server (started once per session on free ports),
the in-process PyTorch reference of the same weights, and varied test images."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import pytest
import torch

from fusedresnet.backend.images import normalize_uint8, smooth_random_images
from fusedresnet.backend.network import free_ports
from fusedresnet.backend.repository.prepare import prepare
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE, read_weights_source, seed_of
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import ADMIN_TOKEN_HEADER, GRPC_ADMIN_TOKEN_HEADER, MODEL_REPOSITORY
from fusedresnet.backend.triton_server.installation import gpu_present
from fusedresnet.client.preprocess import preprocess_files, sample_photo_paths


def pytest_collection_modifyitems(config, items):
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prepared_repository() -> Path:
    stamp = MODEL_REPOSITORY / STAMP_FILE
    if not stamp.is_file():
        prepare(MODEL_REPOSITORY)
    return MODEL_REPOSITORY


@pytest.fixture(scope="session")
def reference_model(prepared_repository):
    """The unfolded float32 ResNet-18 with the weights the model repository was prepared from."""
    source = read_weights_source(prepared_repository)
    seed = seed_of(source)
    return build_resnet18(None, seed) if seed is not None else build_resnet18(source)


@pytest.fixture(scope="session")
def reference_logits(reference_model):
    """fn(uint8 [N,224,224,3] numpy) -> float32 logits [N,1000] computed in-process (fp32, CPU)."""
    def compute(images: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return reference_model(normalize_uint8(torch.from_numpy(np.ascontiguousarray(images)))).numpy()
    return compute


@pytest.fixture(scope="session")
def varied_images() -> np.ndarray:
    """uint8 [37, 224, 224, 3]: the sample photos, seeded smooth random images and white noise."""
    photos = preprocess_files(sample_photo_paths())
    smooth = smooth_random_images(24, seed=7).numpy()
    noise = np.random.default_rng(11).integers(0, 256, (8, 224, 224, 3), dtype=np.uint8)
    return np.concatenate([photos, smooth, noise])


@pytest.fixture(scope="session")
def admin_token() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def admin_headers(admin_token) -> dict:
    """HTTP headers that unlock Triton's admin APIs."""
    return {ADMIN_TOKEN_HEADER: admin_token}


@pytest.fixture(scope="session")
def grpc_admin_headers(admin_token) -> dict:
    """gRPC metadata that unlocks Triton's admin APIs (the key carries Triton's gRPC prefix)."""
    return {GRPC_ADMIN_TOKEN_HEADER: admin_token}


@pytest.fixture(scope="session")
def triton_server(prepared_repository, admin_token, tmp_path_factory):
    """The real tritonserver with both models, on free loopback ports, for the whole session: through the front end
    that $FUSEDRESNET_FRONT_END asks for (auto: in-process where it loads), with client shared memory allowed (the
    shared-memory tests register regions with it)."""
    log = tmp_path_factory.mktemp("triton") / "server.log"
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(prepared_repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                              admin_token=admin_token, log_file=log, client_shared_memory=True, mps="off")
    with launch(settings) as group:
        yield group.first     # the tests read its process, log file and GPU use
