"""Property-based fuzzing of both protocols and both models (hypothesis, bounded and derandomized).

Whatever names, data types, shapes, declared sizes and bytes a request carries, the server
answers it (no hang: client timeouts are set), either with well-formed logits or with an
error that says something; it stays live and ready, and valid requests afterwards are
answered correctly.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusedresnet.backend.spec import (
    FP32_INPUT_ABS_LIMIT,
    INPUT_FP32,
    INPUT_UINT8,
    INPUTS,
    MODEL_ENTRIES,
    MODELS,
    NUM_CLASSES,
    OUTPUT_ENGINE,
    OUTPUT_LOGITS,
    entry_input,
    served_model,
)

from robustness_helpers import PROTOCOLS, assert_correct, client, infer_image, raw_grpc_infer, raw_http_infer

FUZZ_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DTYPES = {"UINT8": 1, "INT8": 1, "BOOL": 1, "FP16": 2, "INT16": 2, "FP32": 4, "INT32": 4, "UINT32": 4,
          "FP64": 8, "INT64": 8, "BYTES": 1}
MAX_PAYLOAD = 8 * 224 * 224 * 3 * 4   # at most 8 FP32 images: bigger requests are the overload tests' business
HTTP_REFUSALS = {400, 404, 413}
GRPC_REFUSALS = {"INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"}

dims = st.one_of(st.sampled_from([0, 1, 2, 3, 224, 129]), st.integers(-2, 300))
shapes = st.one_of(st.lists(dims, min_size=0, max_size=5),
                   st.sampled_from([[1, 224, 224, 3], [2, 224, 224, 3], [1, 3, 224, 224], [3, 3, 224, 224]]))


@st.composite
def tensors(draw):
    name = draw(st.one_of(st.sampled_from([INPUT_UINT8, INPUT_FP32]),
                          st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12)))
    datatype = draw(st.one_of(st.sampled_from(list(DTYPES)).filter(lambda d: d != "BYTES"),
                              st.sampled_from(["BYTES", "UINT3", "fp32", ""])))
    shape = draw(shapes)
    exact = int(np.prod(shape, dtype=np.int64)) * DTYPES.get(datatype, 1) if all(d >= 0 for d in shape) else -1
    how = draw(st.sampled_from(["exact", "exact", "short", "long", "random"]))
    if how == "exact" and 0 <= exact <= MAX_PAYLOAD:
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        if datatype == "FP32" and draw(st.booleans()):  # plausible normalised pixels, sometimes poisoned
            values = rng.normal(0, 1, exact // 4).astype(np.float32)
            if values.size and draw(st.booleans()):
                values[draw(st.integers(0, values.size - 1))] = draw(
                    st.sampled_from([np.nan, np.inf, -np.inf, 255.0, -1e30]))
            payload = values.tobytes()
        else:
            payload = rng.integers(0, 256, exact, dtype=np.uint8).tobytes()
    elif how in ("short", "long") and 0 < exact <= MAX_PAYLOAD:
        delta = draw(st.integers(1, 4096))
        payload = bytes(max(0, exact - delta) if how == "short" else exact + delta)
    else:
        payload = draw(st.binary(max_size=2048))
    return name, datatype, shape, payload


@st.composite
def fully_random_requests(draw):
    return {"protocol": draw(st.sampled_from(PROTOCOLS)),
            "model": draw(st.sampled_from([*MODEL_ENTRIES, *MODELS, "resnet18", ""])),
            "inputs": draw(st.lists(tensors(), min_size=0, max_size=3)),
            "outputs": draw(st.sampled_from([(OUTPUT_LOGITS,), (OUTPUT_LOGITS, OUTPUT_ENGINE), ("SCORES",), ()])),
            "lie_about_size": draw(st.sampled_from([None, None, None, -7, 1, 10**6]))}


MUTATIONS = ("name", "dtype", "dim", "rank", "payload", "poison", "extra input", "no input", "model", "outputs",
             "declared size", "other entry")


@st.composite
def mutated_requests(draw):
    """A valid request (1-4 images, either input, to the entry serving it) with up to two things wrong with it."""
    name = draw(st.sampled_from([INPUT_UINT8, INPUT_FP32]))
    network = draw(st.sampled_from(MODELS))
    batch = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if name == INPUT_UINT8:
        datatype, shape = "UINT8", [batch, 224, 224, 3]
        payload = rng.integers(0, 256, batch * 224 * 224 * 3, dtype=np.uint8).tobytes()
    else:
        datatype, shape = "FP32", [batch, 3, 224, 224]
        payload = rng.normal(0, 1, batch * 3 * 224 * 224).astype(np.float32).tobytes()
    request = {"protocol": draw(st.sampled_from(PROTOCOLS)), "model": served_model(network, name),
               "inputs": None, "outputs": (OUTPUT_LOGITS,), "lie_about_size": None}
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)):
        if mutation == "name":
            name = draw(st.one_of(st.sampled_from([INPUT_UINT8, INPUT_FP32]), st.text("XYZ_", min_size=1)))
        elif mutation == "dtype":
            datatype = draw(st.sampled_from(list(DTYPES) + ["UINT3"]))
        elif mutation == "dim":
            shape = list(shape)
            shape[draw(st.integers(0, len(shape) - 1))] = draw(dims)
        elif mutation == "rank":
            shape = draw(st.sampled_from([shape[1:], [*shape, 1], [1, *shape]]))
        elif mutation == "payload":
            payload = draw(st.sampled_from([payload[:-1], payload + b"\0", payload[: len(payload) // 2], b""]))
        elif mutation == "poison" and datatype == "FP32" and len(payload) >= 4:
            values = np.frombuffer(payload, np.float32).copy()
            values[draw(st.integers(0, values.size - 1))] = draw(
                st.sampled_from([np.nan, np.inf, -np.inf, 255.0, -1e30]))
            payload = values.tobytes()
        elif mutation == "extra input":
            request["inputs"] = [draw(tensors())]
        elif mutation == "no input":
            request["inputs"] = []
        elif mutation == "model":
            request["model"] = draw(st.sampled_from(["resnet18", "RESNET18_CUSTOM", "resnet18_custom/1", ""]))
        elif mutation == "outputs":
            request["outputs"] = draw(st.sampled_from([("SCORES",), (OUTPUT_LOGITS, "SCORES"), (OUTPUT_ENGINE,)]))
        elif mutation == "other entry":   # the contract before 2026-11-26: either input to the network's name
            request["model"] = served_model(network, next(other for other in INPUTS if other != name))
        elif mutation == "declared size":
            request["lie_about_size"] = draw(st.sampled_from([-7, 1, 10**6]))
    if request["inputs"] is None:
        request["inputs"] = [(name, datatype, shape, payload)]
    elif request["inputs"]:
        request["inputs"].insert(0, (name, datatype, shape, payload))
    return request


def requests():
    return st.one_of(mutated_requests(), mutated_requests(), mutated_requests(), fully_random_requests())


def send(server, request):
    """(succeeded: bool, status, detail, logits or None)."""
    model, inputs, outputs = request["model"], request["inputs"], request["outputs"]
    if request["protocol"] == "grpc":
        status, answer = raw_grpc_infer(server, model, [(n, d, s) for n, d, s, _ in inputs],
                                        [p for *_, p in inputs], outputs=outputs, timeout_s=60)
        if status != "OK":
            return False, status, answer, None
        names = [o.name for o in answer.outputs]
        index = names.index(OUTPUT_LOGITS) if OUTPUT_LOGITS in names else None
        logits = None if index is None else np.frombuffer(answer.raw_output_contents[index], np.float32)
        return True, status, names, logits
    sizes = [len(p) for *_, p in inputs]
    if request["lie_about_size"] is not None and sizes:
        sizes[0] = max(0, sizes[0] + request["lie_about_size"])
    header = {"inputs": [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": size}}
                         for (n, d, s, _), size in zip(inputs, sizes)],
              "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}
    status, text = raw_http_infer(server, model or "_", header, b"".join(p for *_, p in inputs), timeout_s=60)
    if status != 200:
        try:
            return False, status, json.loads(text)["error"], None
        except (ValueError, KeyError):
            return False, status, text, None
    return True, status, text, "binary"


def is_valid(request) -> bool:
    """Does this request follow the models' interface (so it must succeed)?"""
    if request["model"] not in MODEL_ENTRIES or len(request["inputs"]) != 1 or request["lie_about_size"] is not None \
            and request["protocol"] == "http" or set(request["outputs"]) - {OUTPUT_LOGITS, OUTPUT_ENGINE}:
        return False
    name, datatype, shape, payload = request["inputs"][0]
    if name != entry_input(request["model"]):
        return False
    expected = {INPUT_UINT8: ("UINT8", [224, 224, 3]), INPUT_FP32: ("FP32", [3, 224, 224])}.get(name)
    if expected is None or datatype != expected[0] or len(shape) != 4 or list(shape[1:]) != expected[1] \
            or not 1 <= shape[0] <= 128 or len(payload) != int(np.prod(shape)) * DTYPES[datatype]:
        return False
    if name == INPUT_UINT8:
        return True
    with np.errstate(invalid="ignore"):
        peak = np.abs(np.frombuffer(payload, np.float32)).max()
    return bool(np.isfinite(peak) and peak <= FP32_INPUT_ABS_LIMIT)


@pytest.fixture(scope="module")
def check_after(triton_server, varied_images, reference_logits):
    images = varied_images[:2]
    reference = reference_logits(images)

    def check():
        for protocol in PROTOCOLS:
            with client(triton_server, protocol) as triton:
                assert triton.is_server_live() and triton.is_server_ready()
                for model in MODELS:
                    assert_correct(infer_image(triton, protocol, model, images), reference)
    return check


@settings(max_examples=120, **FUZZ_SETTINGS)
@given(request=requests())
def test_random_requests_get_an_answer_or_a_clear_refusal_and_the_server_stays_ready(triton_server, request,
                                                                                       reference_logits):
    succeeded, status, detail, logits = send(triton_server, request)
    if succeeded:
        assert is_valid(request), (request["inputs"][0][:3], detail)
        if isinstance(logits, np.ndarray):
            name, _, shape, payload = request["inputs"][0]
            assert logits.size == shape[0] * NUM_CLASSES
            if name == INPUT_UINT8:
                images = np.frombuffer(payload, np.uint8).reshape(shape).copy()
                assert_correct(logits.reshape(shape[0], NUM_CLASSES), reference_logits(images))
    else:
        assert not is_valid(request), (status, detail)
        assert (status in HTTP_REFUSALS or status == 500 and "parse" in str(detail)) \
            if request["protocol"] == "http" else status in GRPC_REFUSALS, (status, detail)
        # a clear refusal: the error's text, or for a model name that is no route ("resnet18_custom/1" makes
        # /v2/models/resnet18_custom/1/infer) the HTTP server's own 404 "Not Found"
        assert isinstance(detail, str) and (len(detail) > 10 or status == 404 and detail.strip() == "Not Found" and
                                            request["protocol"] == "http" and "/" in request["model"]), detail
    with client(triton_server, "http") as triton:
        assert triton.is_server_live()


@settings(max_examples=40, **FUZZ_SETTINGS)
@given(body=st.binary(max_size=4096), header_length=st.one_of(st.none(), st.integers(-5, 5000)),
       protocol=st.sampled_from(PROTOCOLS))
def test_garbage_bodies_are_refused_and_the_server_stays_live(triton_server, body, header_length, protocol):
    if protocol == "http":
        import urllib.error
        import urllib.request
        headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
        http_request = urllib.request.Request(f"http://{triton_server.http_url}/v2/models/{MODELS[0]}/infer",
                                              data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(http_request, timeout=60) as response:
                status, text = response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode(errors="replace")
        assert status in (400, 500) and "error" in text, (status, text)
    else:
        with grpc.insecure_channel(triton_server.grpc_url) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # raw bytes in and out
            with pytest.raises(grpc.RpcError) as refused:
                call(body, timeout=60)
            assert refused.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED
            assert refused.value.details()
    with client(triton_server, "grpc") as triton:
        assert triton.is_server_live() and triton.is_server_ready()


def test_after_fuzzing_both_models_answer_correctly_on_both_protocols(check_after):
    check_after()
