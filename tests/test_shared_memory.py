"""Same-host zero-copy requests through system shared memory (CUDA shared memory: test_shared_memory_cuda.py).

Against the session's real server, over gRPC and HTTP, for both models: the logits that come back through
shared-memory regions equal the plain path's; the client's regions are unregistered and gone from /dev/shm
after it closes, also after a failed request or an exception; Triton's own errors name an unknown or too small
region; registering without the admin token is refused with a message that says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fusedresnet.backend.spec import INPUT_UINT8, MODELS
from fusedresnet.client import classify
from fusedresnet.client.preprocess import normalize, sample_photo_paths
from fusedresnet.client.resnet_client import ResNetClient, SharedMemorySlot, build_request
from fusedresnet.client.shared_memory import SharedMemoryError, registered_region, shared_memory_status

PROTOCOLS = ("grpc", "http")


def url_of(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def raw_client(server, protocol: str):
    lib = grpcclient if protocol == "grpc" else httpclient
    return lib.InferenceServerClient(url_of(server, protocol))


def registered_regions(server, protocol: str, token: str) -> dict:
    with raw_client(server, protocol) as triton:
        return shared_memory_status(triton, protocol, "system", token)


def assert_gone(server, token: str, names):
    """Unregistered from the server (its status API, over both protocols) and unlinked from /dev/shm."""
    for protocol in PROTOCOLS:
        assert not set(names) & set(registered_regions(server, protocol, token))
    assert not [name for name in names if Path("/dev/shm", name).exists()]


def region_names(client: ResNetClient) -> list[str]:
    return [client._regions.input.name, client._regions.logits.name]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_system_shared_memory_gives_the_plain_paths_logits_and_frees_its_regions(
        triton_server, admin_token, varied_images, model, protocol):
    images = varied_images[[0, 7, 30]]      # a photo, a smooth random image, white noise
    with ResNetClient(model, protocol, url_of(triton_server, protocol)) as plain:
        expected = plain.infer(images)
        expected_normalized = plain.infer(np.stack([normalize(image) for image in images[:2]]))
        expected_top = plain.classify(images, top_k=3)
    with ResNetClient(model, protocol, url_of(triton_server, protocol), shared_memory="system",
                      admin_token=admin_token) as client:
        result = client.infer(images)
        names = region_names(client)
        assert set(names) <= set(registered_regions(triton_server, protocol, admin_token))
        normalized = client.infer(np.stack([normalize(image) for image in images[:2]]))   # 4x the bytes: regions grow
        assert not set(names) & set(registered_regions(triton_server, protocol, admin_token))
        names += region_names(client)
        top = client.classify(images, top_k=3)
    np.testing.assert_array_equal(result.logits, expected.logits)
    np.testing.assert_array_equal(normalized.logits, expected_normalized.logits)
    assert result.engine == expected.engine and top.top == expected_top.top
    assert_gone(triton_server, admin_token, names)


def test_regions_are_freed_after_a_failed_request_and_after_an_exception(triton_server, admin_token, varied_images):
    with pytest.raises(InferenceServerException, match="IMAGE_NORMALIZED"):
        with ResNetClient(MODELS[0], "grpc", triton_server.grpc_url, shared_memory="system",
                          admin_token=admin_token) as client:
            client.infer(varied_images[:1])
            names = region_names(client)
            client.infer(np.full((1, 3, 224, 224), np.nan, np.float32))   # refused by the model: NaN input
    assert_gone(triton_server, admin_token, names)

    with pytest.raises(KeyError):
        with ResNetClient(MODELS[1], "http", triton_server.http_url, shared_memory="system",
                          admin_token=admin_token) as client:
            client.infer(varied_images[:2])
            names = region_names(client)
            raise KeyError("the caller's own error")
    assert_gone(triton_server, admin_token, names)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_naming_an_unknown_region_gets_the_servers_error_naming_it(triton_server, varied_images,
                                                                             protocol):
    inputs, outputs = build_request(protocol, varied_images[:1],
                                    shared_memory=SharedMemorySlot("fusedresnet-no-such-region", "no-logits"))
    with raw_client(triton_server, protocol) as triton, pytest.raises(InferenceServerException) as error:
        triton.infer(MODELS[0], inputs, outputs=outputs)
    assert "Unable to find shared memory region: 'fusedresnet-no-such-region'" in error.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_too_small_for_the_input_or_the_logits_gets_the_servers_error_naming_it(
        triton_server, admin_token, varied_images, protocol):
    images = varied_images[:2]
    with raw_client(triton_server, protocol) as triton, \
            registered_region(triton, protocol, "system", images.nbytes, admin_token, "input") as big_enough, \
            registered_region(triton, protocol, "system", 1000, admin_token, "small") as small:
        big_enough.write(images)
        for slot, small_one in ((SharedMemorySlot(small.name, big_enough.name), "input"),
                                (SharedMemorySlot(big_enough.name, small.name), "logits")):
            inputs, outputs = build_request(protocol, images, shared_memory=slot)
            with pytest.raises(InferenceServerException) as error:
                triton.infer(MODELS[0], inputs, outputs=outputs)
            assert f"Invalid offset + byte size for shared memory region: '{small.name}'" in error.value.message(), \
                small_one


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_registering_without_the_admin_token_is_refused_with_a_clear_message(triton_server, admin_token,
                                                                            varied_images, protocol):
    before = set(Path("/dev/shm").iterdir())
    for token, expected in (("", "give the admin token"), ("wrong-token", "restricted")):
        with ResNetClient(MODELS[0], protocol, url_of(triton_server, protocol), shared_memory="system",
                          admin_token=token) as client, pytest.raises(SharedMemoryError) as error:
            client.infer(varied_images[:1])
        message = error.value.message()
        assert "refused to register system shared-memory region" in message and expected in message
        assert "restricted" in message     # Triton's own words
    assert set(Path("/dev/shm").iterdir()) <= before      # the local region was freed too
    assert not [name for name in registered_regions(triton_server, protocol, admin_token)
                if name.startswith("fusedresnet-")]


def test_classify_cli_with_shared_memory_prints_what_the_plain_path_prints(triton_server, admin_token, tmp_path,
                                                                          capsys):
    token_file = tmp_path / "token"
    token_file.write_text(admin_token + "\n")
    photos = [str(path) for path in sample_photo_paths()[:3]]
    common = ["--url", triton_server.grpc_url, "--batch-size", "2", "--top-k", "3"]

    def labels(argv) -> list[str]:
        assert classify.main(photos + common + argv) == 0
        return [line for line in capsys.readouterr().out.splitlines() if not line.startswith("-- request")]

    assert labels(["--shared-memory", "system", "--admin-token-file", str(token_file)]) == labels([])
    normalized = labels(["--input", "IMAGE_NORMALIZED", "--shared-memory", "system", "--admin-token-file",
                         str(token_file)])
    assert [line.split(":")[0] for line in normalized] == [Path(photo).name for photo in photos]
    token_file.write_text("not-the-token\n")
    assert classify.main(photos + common + ["--shared-memory", "system", "--admin-token-file", str(token_file)]) == 1
    assert "refused to register system shared-memory region" in capsys.readouterr().err


def test_locust_users_with_system_shared_memory_are_counted_by_triton_and_free_their_regions(
        triton_server, admin_token, tmp_path):
    """One real locust step of the sweep (two locust processes), its users on system shared memory."""
    from fusedresnet.loadtest import step as load_step
    from fusedresnet.loadtest.image_pool import build_image_pool, save_image_pool

    pool = save_image_pool(build_image_pool(8), tmp_path / "pool.npy")
    endpoints = load_step.Endpoints(triton_server.grpc_url, triton_server.http_url, triton_server.metrics_url)
    settings = load_step.SweepSettings(1.0, 2.0, 2, {INPUT_UINT8: pool}, tmp_path, admin_token)
    series = load_step.Series.parse("grpc/2/system@2")
    result = load_step.run_locust_step(load_step.Step(0, MODELS[0], series, 2, 0), endpoints, settings,
                                       tmp_path / "step")
    assert result["problems"] == [] and result["failures"] == 0
    assert result["sent"] == result["triton_success_run"] > 0
    locust_names = {entry["name"] for entry in json.loads((tmp_path / "step" / "locust.json").read_text())}
    assert locust_names and all("system-shm" in name for name in locust_names)
    logs = [np.load(path) for path in (tmp_path / "step").glob("requests-*.npz")]
    assert len(logs) == 2 and all(float(log["cpu_s"]) > 0 for log in logs)
    assert not [name for name in registered_regions(triton_server, "grpc", admin_token)
                if name.startswith("fusedresnet-")]
