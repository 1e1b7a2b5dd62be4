"""Bad input, over gRPC and HTTP, to both models: each malformed request gets a clear error
naming the problem, the server stays live and ready, and valid requests sent right after,
or batched together with bad ones, get the correct answer.

Requests are built at the wire level (KServe v2 protobuf over gRPC, JSON header + binary
body over HTTP), because tritonclient refuses to build most of them. Most checks are
Triton's own (data type, shape, batch size, byte sizes, names); the model adds the ones
Triton cannot make (exactly one input, finite FP32 values; backend/triton_adapter/python_model.py).
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from fusedresnet.backend.spec import INPUT_FP32, INPUT_UINT8, MODELS, served_model
from fusedresnet.client.preprocess import normalize

from bad_requests import BAD_REQUESTS, CHW, assert_clear_refusal, send_bad
from robustness_helpers import PROTOCOLS, assert_correct, client, infer_image, raw_grpc_infer


def bad_cases():
    return [pytest.param(protocol, bad, id=f"{protocol}-{bad.name}")
            for bad in BAD_REQUESTS for protocol in bad.protocols]


@pytest.fixture(scope="module")
def good(varied_images, reference_logits):
    images = varied_images[:6]
    return images, reference_logits(images)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol, bad", bad_cases())
def test_malformed_request_gets_a_clear_error_and_the_next_valid_request_is_answered_correctly(
        triton_server, model, protocol, bad, good):
    images, reference = good
    status, message = send_bad(triton_server, protocol, model, bad)
    assert_clear_refusal(bad, protocol, status, message)
    with client(triton_server, protocol) as triton:
        assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready(model)
        assert_correct(infer_image(triton, protocol, model, images[:1]), reference[:1])


@pytest.mark.parametrize("model", MODELS)
def test_valid_requests_batched_with_malformed_ones_get_their_correct_answers(triton_server, model, good):
    """Good and bad requests at once, so the dynamic batcher puts them into the same execute()
    call (the bad ones that reach the model are IMAGE_NORMALIZED ones, batched with the good IMAGE_NORMALIZED
    requests in the network's *_normalized entry); the bad ones get their own errors, the good ones their logits."""
    images, reference = good
    bad_for_model = [b for b in BAD_REQUESTS if b.reaches_model] * 2
    normalized = np.stack([normalize(image) for image in images])
    jobs = [(f"good-{INPUT_UINT8}", i) for i in range(len(images))] \
        + [(f"good-{INPUT_FP32}", i) for i in range(len(images))] \
        + [("bad", i) for i in range(len(bad_for_model))]

    def run(job):
        kind, index = job
        protocol = PROTOCOLS[index % 2]
        if kind == "bad":
            return job, send_bad(triton_server, protocol, model, bad_for_model[index])
        with client(triton_server, protocol) as triton:
            if kind == f"good-{INPUT_UINT8}":
                return job, infer_image(triton, protocol, model, images[index:index + 1])
            status, answer = raw_grpc_infer(triton_server, served_model(model, INPUT_FP32),
                                            [(INPUT_FP32, "FP32", [1, *CHW])], [normalized[index:index + 1].tobytes()])
            assert status == "OK", answer
            return job, np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(1, -1)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        outcomes = dict(pool.map(run, jobs))
    for (kind, index), outcome in outcomes.items():
        if kind == "bad":
            assert_clear_refusal(bad_for_model[index], PROTOCOLS[index % 2], *outcome)
        else:
            assert_correct(outcome, reference[index:index + 1])
