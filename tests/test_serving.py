"""End-to-end: both models on the real Triton server, against the in-process PyTorch reference."""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import (
    INPUT_FP32,
    INPUT_SHAPES,
    INPUT_UINT8,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    MODELS,
    OUTPUT_LOGITS,
    SERVED_ENTRIES,
    entry_input,
    load_labels,
    model_config,
    served_model,
)
from fusedresnet.campaigns.serving_sequence import repository_with_instances
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, SET_REL_L2_TOLERANCE, compare_logits
from fusedresnet.client.preprocess import normalize
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.kernels.planner import tuned_plans_path

from robustness_helpers import read_until

# The engine each model must run, by name (README, *Using the service*): on a GPU the custom model runs
# our fused kernels and nothing else; a fallback there is a failure, not another valid answer.
EXPECTED_ENGINE = {
    (MODEL_CUSTOM, "cpu"): "torch-folded-cpu-fp32",
    (MODEL_CUDNN, "gpu"): "torchscript-cudnn-fp16-channels-last-cuda-graphs",
    (MODEL_CUDNN, "cpu"): "torchscript-cpu-fp32",
}


def custom_gpu_engine() -> str:
    """The fused engine's name by the kernel families its plans run on (docs/ENGINE.md, *Kernel families*):
    mma.sync before compute capability 9.0; on 9.0 the wgmma stem and the families of the tuned table's
    plans for this GPU (kernels/tuned_plans/<model>.json), both without a table; one family where
    FUSEDRESNET_CONV_PATH (inherited by the server) forces it."""
    forced = os.environ.get("FUSEDRESNET_CONV_PATH", "").strip().lower()
    if forced in ("mma", "wgmma"):
        return f"fused-cuda-fp16-{forced}"
    if torch.cuda.get_device_capability() != (9, 0):
        return "fused-cuda-fp16-mma"
    table_path = tuned_plans_path(torch.cuda.get_device_name())
    families = {"wgmma", "mma"}
    if table_path.is_file():
        families = {"wgmma"} | {entry["family"] for entry in json.loads(table_path.read_text())["plans"].values()}
    return "fused-cuda-fp16-" + "+".join(f for f in ("wgmma", "mma") if f in families)


def expected_engine(server, model) -> str:
    if model == MODEL_CUSTOM and server.use_gpu:
        return custom_gpu_engine()
    return EXPECTED_ENGINE[model, "gpu" if server.use_gpu else "cpu"]


def client_for(server, model, protocol="grpc"):
    return ResNetClient(model, protocol, server.grpc_url if protocol == "grpc" else server.http_url)


def assert_matches_reference(logits, reference):
    stats = compare_logits(logits, reference)
    assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE, stats
    assert stats["max_row_rel_l2"] <= IMAGE_REL_L2_TOLERANCE, stats
    assert stats["clear_disagreements"] == 0, stats
    return stats


@pytest.mark.parametrize("model", MODELS)
def test_model_logits_match_pytorch_reference_on_varied_images(triton_server, model, varied_images,
                                                               reference_logits):
    reference = reference_logits(varied_images)
    with client_for(triton_server, model) as client:
        logits = np.concatenate([client.infer(varied_images[i:i + 8]).logits
                                 for i in range(0, len(varied_images), 8)])
    assert logits.shape == (len(varied_images), 1000) and logits.dtype == np.float32
    stats = assert_matches_reference(logits, reference)
    assert stats["inputs"] >= 32
    assert stats["top1_agree"] >= stats["inputs"] - stats["near_tie_disagreements"]


def test_fp32_cudnn_baseline_on_cpu_is_exact_to_float_rounding(triton_server, varied_images, reference_logits):
    with client_for(triton_server, MODEL_CUDNN) as client:
        result = client.infer(varied_images[:8])
    if "fp32" not in result.engine:
        pytest.skip(f"baseline runs {result.engine}")
    logits = result.logits
    assert compare_logits(logits, reference_logits(varied_images[:8]))["rel_l2"] < 1e-4


@pytest.mark.parametrize("model", MODELS)
def test_image_normalized_input_gives_the_same_logits_as_image_input(triton_server, model, varied_images):
    images = varied_images[:6]
    with client_for(triton_server, model) as client:
        from_image = client.infer(images).logits
        from_image_normalized = client.infer(np.stack([normalize(image) for image in images])).logits
    assert compare_logits(from_image_normalized, from_image)["rel_l2"] < 1e-3


@pytest.mark.parametrize("model", MODELS)
def test_http_and_grpc_return_the_same_logits(triton_server, model, varied_images):
    images = varied_images[:4]
    with client_for(triton_server, model, "grpc") as grpc_client, \
            client_for(triton_server, model, "http") as http_client:
        np.testing.assert_allclose(grpc_client.infer(images).logits, http_client.infer(images).logits,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_classification_extension_returns_reference_top_labels(triton_server, model, protocol, varied_images,
                                                               reference_logits):
    images = varied_images[:5]  # the sample photos
    reference = reference_logits(images)
    labels = load_labels()
    with client_for(triton_server, model, protocol) as client:
        result = client.classify(images, top_k=3)
    for row, top in zip(reference, result.top):
        assert top[0][1] == int(np.argmax(row))
        assert [label for _, _, label in top] == [labels[index] for _, index, _ in top]
        assert top[0][0] == pytest.approx(float(row.max()), rel=1e-2, abs=5e-2)


def inference_counts(server, headers, model) -> tuple[int, int]:
    """(successful requests, executions) from Triton's statistics API, which needs the admin token."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, headers=headers, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats["inference_stats"]["success"].get("count", 0)), int(stats.get("execution_count", 0))


def counts_after(server, headers, model, before, expected_requests, timeout_s=10.0):
    """(requests, executions) since `before`, once all `expected_requests` are counted (read_until)."""
    requests, executions = read_until(lambda: inference_counts(server, headers, model),
                                      lambda counts: counts[0] - before[0] >= expected_requests, timeout_s)
    return requests - before[0], executions - before[1]


# The batching test's server: the shipped models, one instance each and a queue delay long enough that
# every request of a burst arrives while the batcher still waits. With the shipped four instances and
# 100 us, four GPU instances drain single-image requests as fast as a Python client sends them (the
# H100 host saw 24 requests in 24 executions), so whether they meet in a batch depends on the
# device's speed; here it does not, on a CPU or a GPU.
BATCHING_INSTANCES = 1
BATCHING_QUEUE_DELAY_US = 500_000


@pytest.fixture(scope="module")
def batching_server(prepared_repository, admin_token, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batching")
    # the networks' IMAGE entries with BATCHING_INSTANCES instances each, waiting BATCHING_QUEUE_DELAY_US for a batch
    repository = repository_with_instances(prepared_repository, BATCHING_INSTANCES, folder / "model_repository",
                                           queue_delay_us=BATCHING_QUEUE_DELAY_US, entries=MODELS)
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                              admin_token=admin_token, log_file=folder / "server.log", mps="off")
    with launch(settings) as group:
        yield group


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_single_image_requests_are_batched_and_each_gets_its_own_answer(
        batching_server, grpc_admin_headers, model, varied_images, reference_logits):
    images = varied_images[:24]
    reference = reference_logits(images)
    # Connected before the burst, released together: the requests reach the queue within the delay.
    clients = [client_for(batching_server, model) for _ in images]
    start = threading.Barrier(len(images))

    def infer_one(index):
        start.wait()
        return index, clients[index].infer(images[index:index + 1]).logits[0]

    try:
        initial = inference_counts(batching_server, grpc_admin_headers, model)
        for client in clients:
            client.infer(images[:1])   # connection set-up stays out of the burst
        # the last warm-up may be counted only after its answer arrived: the burst counts from after all of them
        counts_after(batching_server, grpc_admin_headers, model, initial, len(clients))
        before = inference_counts(batching_server, grpc_admin_headers, model)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(images)) as pool:
            answers = dict(pool.map(infer_one, range(len(images))))
    finally:
        for client in clients:
            client.close()
    logits = np.stack([answers[i] for i in range(len(images))])
    assert_matches_reference(logits, reference)
    # every row is its own image's: a swapped row would match another image better
    for i, row in enumerate(logits):
        distances = np.linalg.norm(reference - row, axis=1)
        assert int(np.argmin(distances)) == i
    requests, executions = counts_after(batching_server, grpc_admin_headers, model, before, len(images))
    assert requests == len(images)
    assert executions < requests, "dynamic batching never combined requests"


@pytest.mark.parametrize("model", MODELS)
def test_malformed_request_gets_its_own_error_while_batched_good_requests_succeed(
        triton_server, model, varied_images, reference_logits):
    good = varied_images[:8]
    reference = reference_logits(good)
    bad = np.stack([normalize(image) for image in varied_images[8:16]])
    bad[:, 0, 0, 0] = np.nan

    def send(index):
        with client_for(triton_server, model) as client:
            images = good[index // 2:index // 2 + 1] if index % 2 == 0 else bad[index // 2:index // 2 + 1]
            try:
                return index, client.infer(images).logits[0]
            except InferenceServerException as error:
                return index, error

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        results = dict(pool.map(send, range(16)))
    for index, result in results.items():
        if index % 2 == 0:
            assert isinstance(result, np.ndarray), result
            stats = compare_logits(result[None], reference[index // 2:index // 2 + 1])
            assert stats["rel_l2"] < IMAGE_REL_L2_TOLERANCE, stats
        else:
            assert isinstance(result, InferenceServerException)
            assert "NaN or Inf" in result.message()


@pytest.mark.parametrize("model", MODELS)
def test_each_entry_declares_one_required_input_and_the_old_contract_is_refused_naming_what_changed(
        triton_server, model, varied_images):
    """Each network is served as two entries of one required input each (perf_analyzer refuses optional
    inputs); IMAGE_NORMALIZED sent to the network's name, as before 2026-11-26, is refused by Triton with
    the input and the entry named, and the metadata says which input each entry takes."""
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    for input_name in (INPUT_UINT8, INPUT_FP32):
        metadata = client.get_model_metadata(served_model(model, input_name), as_json=True)
        assert [tensor["name"] for tensor in metadata["inputs"]] == [input_name]
        config = client.get_model_config(served_model(model, input_name), as_json=True)["config"]
        assert [(tensor["name"], tensor.get("optional", False)) for tensor in config["input"]] == [(input_name, False)]
    image_normalized = grpcclient.InferInput(INPUT_FP32, [1, 3, 224, 224], "FP32")
    image_normalized.set_data_from_numpy(normalize(varied_images[0])[None])
    with pytest.raises(InferenceServerException) as refused:
        client.infer(model, [image_normalized], outputs=[grpcclient.InferRequestedOutput(OUTPUT_LOGITS)])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"unexpected inference input '{INPUT_FP32}' for model '{model}'" in refused.value.message()
    assert client.is_server_live() and client.is_model_ready(model)
    client.close()
    # The project's client sends each input to the entry that serves it: both give the same classes.
    with client_for(triton_server, model) as resnet:
        from_pixels = resnet.infer(varied_images[:2]).logits
        from_normalized = resnet.infer(np.stack([normalize(image) for image in varied_images[:2]])).logits
    assert compare_logits(from_normalized, from_pixels)["clear_disagreements"] == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_every_response_names_the_engine_that_computed_it(triton_server, model, protocol, varied_images):
    with client_for(triton_server, model, protocol) as client:
        engine = client.infer(varied_images[:3]).engine
        assert client.classify(varied_images[:1], top_k=1).engine == engine
    assert engine == expected_engine(triton_server, model)
    log = triton_server.log_file.read_text(errors="replace")
    assert f"{model}: engine {engine} on" in log


@pytest.mark.gpu
@pytest.mark.parametrize("model", MODELS)
def test_models_run_on_the_gpu_and_match_reference(triton_server, model, varied_images, reference_logits):
    with client_for(triton_server, model) as client:
        result = client.infer(varied_images[:32])
    engine, logits = result.engine, result.logits
    assert engine == expected_engine(triton_server, model)
    assert f"{model}: engine {engine} on cuda:" in triton_server.log_file.read_text(errors="replace")
    assert_matches_reference(logits, reference_logits(varied_images[:32]))


@pytest.mark.parametrize("model", MODELS)
def test_normalized_entry_config_differs_from_its_networks_only_in_input_name_and_instances(model):
    """The *_normalized entry's config.pbtxt is kept by hand beside its network's: anything else that differs
    (batching, queue policy, engine parameters, outputs) is drift."""
    network, normalized = model_config(model), model_config(served_model(model, INPUT_FP32))
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in normalized.input] == \
        [(INPUT_FP32, model_config_pb2.TYPE_FP32, [3, 224, 224], False)]
    assert [(i.name, i.optional) for i in network.input] == [(INPUT_UINT8, False)]
    assert normalized.instance_group[0].count <= network.instance_group[0].count
    for config in (network, normalized):
        del config.input[:]
        config.name = ""
        for group in config.instance_group:
            group.count = 0
    assert text_format.MessageToString(normalized) == text_format.MessageToString(network)


@pytest.mark.parametrize("entry", SERVED_ENTRIES)
def test_every_entry_declares_its_input_with_the_shape_the_contract_gives(entry):
    """backend/spec.INPUT_SHAPES is the one place the inputs' shapes are written for code (the model's checks, the
    load generators, the campaigns); each config.pbtxt must declare the same dims and type, or clients built from
    the contract would be refused."""
    [declared] = model_config(entry).input
    kind = entry_input(entry)
    dtype = model_config_pb2.TYPE_UINT8 if kind == INPUT_UINT8 else model_config_pb2.TYPE_FP32
    assert (declared.name, declared.data_type, tuple(declared.dims)) == (kind, dtype, INPUT_SHAPES[kind])
    assert INPUT_SHAPES == {INPUT_UINT8: (224, 224, 3), INPUT_FP32: (3, 224, 224)}
