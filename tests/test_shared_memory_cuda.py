"""CUDA shared memory (GPU host only): inputs and LOGITS in GPU memory shared with the server through CUDA IPC.

Needs a GPU and cuda-python (`cuda.bindings`, carried to the GPU host as a wheel); the same checks as the
system shared-memory tests: the plain path's logits, regions unregistered on exit, also after an error.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from fusedresnet.backend.spec import MODELS
from fusedresnet.client.preprocess import normalize
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.client.shared_memory import shared_memory_status

pytestmark = pytest.mark.gpu


def cuda_regions(server, protocol: str, token: str) -> dict:
    lib = grpcclient if protocol == "grpc" else httpclient
    with lib.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url) as triton:
        return shared_memory_status(triton, protocol, "cuda", token)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", ("grpc", "http"))
def test_cuda_shared_memory_gives_the_plain_paths_logits_and_frees_its_regions(
        triton_server, admin_token, varied_images, model, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    images = varied_images[[0, 7, 30]]
    normalized = np.stack([normalize(image) for image in images])
    with ResNetClient(model, protocol, url) as plain:
        expected, expected_normalized = plain.infer(images), plain.infer(normalized)
    with ResNetClient(model, protocol, url, shared_memory="cuda", admin_token=admin_token) as client:
        result = client.infer(images)
        names = {client._regions.input.name, client._regions.logits.name}
        assert names <= set(cuda_regions(triton_server, protocol, admin_token))
        from_normalized = client.infer(normalized)
        names |= {client._regions.input.name, client._regions.logits.name}
    np.testing.assert_array_equal(result.logits, expected.logits)
    np.testing.assert_array_equal(from_normalized.logits, expected_normalized.logits)
    assert result.engine == expected.engine
    assert not names & set(cuda_regions(triton_server, protocol, admin_token))


def test_cuda_regions_are_freed_after_a_failed_request(triton_server, admin_token, varied_images):
    with pytest.raises(Exception, match="IMAGE_NORMALIZED"):
        with ResNetClient(MODELS[0], "grpc", triton_server.grpc_url, shared_memory="cuda",
                          admin_token=admin_token) as client:
            client.infer(varied_images[:1])
            names = {client._regions.input.name, client._regions.logits.name}
            client.infer(np.full((1, 3, 224, 224), np.nan, np.float32))
    assert not names & set(cuda_regions(triton_server, "grpc", admin_token))


def test_grpc_flood_with_cuda_shared_memory_is_counted_by_triton(triton_server, admin_token, tmp_path):
    from fusedresnet.loadtest.grpc_flood import run_step
    from fusedresnet.loadtest.image_pool import build_image_pool, save_image_pool

    pool = save_image_pool(build_image_pool(16), tmp_path / "pool.npy")
    step = run_step(MODELS[0], triton_server.grpc_url, triton_server.metrics_url, concurrency=8, processes=2,
                    warmup_s=0.5, measure_s=2.0, image_pool=pool, shared_memory="cuda", admin_token=admin_token)
    assert step["problems"] == [] and step["failures"] == 0, step["error_examples"]
    assert step["sent"] == step["triton_success_run"]
    assert not [name for name in cuda_regions(triton_server, "grpc", admin_token) if name.startswith("fusedresnet-")]
