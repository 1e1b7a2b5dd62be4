"""Overload: more requests than the queue holds are refused at once with an explicit status,
every request gets exactly one answer, and the counts agree with Triton's own metrics.

The queue policy lives in each model's config.pbtxt (`default_queue_policy`): at most
`max_queue_size` requests wait, one more is refused with UNAVAILABLE / HTTP 503
"Exceeds maximum queue size"; a request still queued after its timeout is refused with
"Request timeout expired" (clients may set a shorter per-request timeout).

What Triton 2.51 counts, verified here: successes in nv_inference_request_success; queue
timeouts in nv_inference_request_failure{reason="REJECTED"}; a request refused because the
queue is full is refused before it is queued and appears in NO counter (not in the
statistics API either), so the test accounts for it from the client side:
sent = succeeded + timed out + refused at a full queue, nothing else, nothing missing.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fusedresnet.backend.spec import (
    INPUT_UINT8,
    MODEL_CUSTOM,
    MODELS,
    OUTPUT_LOGITS,
    max_batch_size,
    model_config,
)
from fusedresnet.client.shared_memory import shared_memory_status

from robustness_helpers import (
    CLIENT_TIMEOUT_S,
    assert_correct,
    burst_window,
    client,
    counter_delta_reaching,
    grpc_burst_in_process,
    grpc_shm_burst_in_process,
    infer_image,
    record,
    results_dir,
    settled_counters,
)

QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
SHORT_TIMEOUT_US = 1_000_000     # every 4th request asks for a 1 s queue timeout (allow_timeout_override)
ENOUGH_REFUSALS = 64             # stop sending once the server has clearly refused this many
REFUSAL_BOUND_S = 5.0            # a refusal at a full queue comes back within this (it never waits for compute)
PARALLEL_SENDERS = 4             # processes that burst together when one client cannot outrun the server


def queue_policy(model: str) -> dict:
    """The model's queue policy, read from its config.pbtxt with Triton's own ModelConfig message."""
    config = model_config(model)
    assert config.dynamic_batching.HasField("default_queue_policy"), f"{model}: no default_queue_policy"
    policy = config.dynamic_batching.default_queue_policy
    return {"max_queue_size": policy.max_queue_size,
            "timeout_action": type(policy).TimeoutAction.Name(policy.timeout_action),
            "default_timeout_s": policy.default_timeout_microseconds / 1e6,
            "allow_timeout_override": policy.allow_timeout_override}


def classify(outcome) -> str:
    if isinstance(outcome, np.ndarray):
        return "succeeded"
    text = str(outcome)
    if QUEUE_FULL in text:
        return "refused_queue_full"
    if QUEUE_TIMEOUT in text:
        return "refused_queue_timeout"
    return "other_error"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return results_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def burst_images(varied_images, reference_logits):
    images = varied_images[:8]
    return images, reference_logits(images)


def grpc_burst(server, model, images, max_requests):
    """Fire single-image requests asynchronously over 4 channels until the server has refused
    ENOUGH_REFUSALS of them (or max_requests are out); wait for every answer."""
    answers = grpc_burst_in_process(server.grpc_url, model, images, 0, max_requests, SHORT_TIMEOUT_US,
                                    ENOUGH_REFUSALS, channels=4)
    return sorted(answers), answers  # request indices, answers


def parallel_shm_burst(server, admin_token, model, images, per_sender, senders, images_per_request,
                       stop_after_refusals=ENOUGH_REFUSALS):
    """`senders` spawned processes burst at once, each through its own system shared-memory region of
    max_batch_size() images (grpc_shm_burst_in_process): a request carries no pixels, only a region
    name and offset, so it costs a sender little, while the server copies and computes `images_per_request`
    images for it, so the senders outrun any server (serialising 8 x 150 KB per request over gRPC
    cost four H100-host processes about what the server spent on it: the queue never filled).
    Returns (request indices, answers, the senders' region names)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(senders, mp_context=context) as pool:
        parts = list(pool.map(grpc_shm_burst_in_process, *zip(*[
            (server.grpc_url, admin_token, model, images, i * per_sender, per_sender, SHORT_TIMEOUT_US,
             stop_after_refusals, images_per_request, max_batch_size(model)) for i in range(senders)])))
    answers, regions = {}, []
    for part, region in parts:
        answers.update(part)
        regions.append(region)
    return sorted(answers), answers, regions  # request indices (sender i numbers from i * per_sender)


def assert_regions_gone(server, admin_token, regions):
    """The senders' regions are unregistered from the server and unlinked from /dev/shm."""
    assert len(set(regions)) == len(regions), regions
    with client(server, "grpc") as triton:
        registered = shared_memory_status(triton, "grpc", "system", admin_token)
    assert not set(regions) & set(registered), registered
    assert not [name for name in regions if Path("/dev/shm", name).exists()]


def shared_memory_burst(server, admin_token, model, images, most):
    """Once the model is idle: PARALLEL_SENDERS processes burst requests carrying all `images` from system
    shared memory (`most` images in all); returns (counters before, request indices, answers), after
    checking that every sender's region is gone."""
    before = settled_counters(server, model, CLIENT_TIMEOUT_S)
    sent, answers, regions = parallel_shm_burst(server, admin_token, model, images, most // len(images),
                                                PARALLEL_SENDERS, len(images))
    assert_regions_gone(server, admin_token, regions)
    return before, sent, answers


def http_burst(server, model, images, count):
    """`count` single-image requests at once over HTTP (one connection each); every answer."""
    triton = httpclient.InferenceServerClient(server.http_url, concurrency=count, network_timeout=CLIENT_TIMEOUT_S,
                                              connection_timeout=CLIENT_TIMEOUT_S)
    tensors = []
    for i in range(len(images)):
        tensor = httpclient.InferInput(INPUT_UINT8, [1, *images.shape[1:]], "UINT8")
        tensor.set_data_from_numpy(images[i:i + 1], binary_data=True)
        tensors.append(tensor)
    started = time.monotonic()
    pending = [triton.async_infer(model, [tensors[i % len(images)]],
                                  timeout=SHORT_TIMEOUT_US if i % 4 == 3 else None) for i in range(count)]
    answers = {}
    for index, request in enumerate(pending):
        try:
            answers[index] = [(time.monotonic() - started, request.get_result().as_numpy(OUTPUT_LOGITS))]
        except InferenceServerException as error:
            answers[index] = [(time.monotonic() - started, error)]
    triton.close()
    return count, answers


def check_burst(server, model, protocol, sent, answers, counters_before, images, reference, policy,
                must_overflow=True, images_per_request=1):
    sent = range(sent) if isinstance(sent, int) else sent  # a count, or the indices of the requests sent
    missing = [i for i in sent if i not in answers]
    duplicated = [i for i, a in answers.items() if len(a) != 1]
    assert not missing and not duplicated, f"missing answers {missing[:10]}, duplicated {duplicated[:10]}"
    outcomes = {i: a[0][1] for i, a in answers.items()}  # logits, or the error (object or text)
    latency = {i: a[0][0] for i, a in answers.items()}
    kinds = Counter(classify(o) for o in outcomes.values())
    others = [str(o) for o in outcomes.values() if classify(o) == "other_error"]
    assert not others, f"errors other than an explicit queue refusal: {others[:5]}"
    if must_overflow:
        assert kinds["refused_queue_full"] > 0, f"{len(sent)} requests never filled the queue: {kinds}"
    for index, outcome in outcomes.items():
        if isinstance(outcome, np.ndarray):
            assert_correct(outcome, reference[burst_window(index % len(images), images_per_request, len(images))])
    # Triton's own counters: every success and every queue timeout; queue-full refusals are in none
    counters = counter_delta_reaching(server, model, counters_before, {
        "success": kinds["succeeded"], "failure": kinds["refused_queue_timeout"]})
    assert counters["success"] == kinds["succeeded"], (counters, kinds)
    assert counters["rejected"] == kinds["refused_queue_timeout"], (counters, kinds)
    assert counters["failure"] == kinds["refused_queue_timeout"], (counters, kinds)
    assert len(sent) == kinds["succeeded"] + kinds["refused_queue_timeout"] + kinds["refused_queue_full"]
    refusal_latency = sorted(latency[i] for i, o in outcomes.items() if classify(o) == "refused_queue_full")
    succeeded_latency = sorted(latency[i] for i, o in outcomes.items() if classify(o) == "succeeded")
    if protocol == "grpc" and refusal_latency:  # HTTP answers are collected in order: no per-request times
        assert refusal_latency[-1] <= REFUSAL_BOUND_S, refusal_latency[-5:]
    # the server is still live, ready and right
    with client(server, protocol) as triton:
        assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready(model)
        assert_correct(infer_image(triton, protocol, model, images[:2]), reference[:2])

    def pct(values, q):
        return round(float(np.percentile(values, q)), 3) if values else None
    return {"sent": len(sent), **kinds, "triton_success": counters["success"], "triton_rejected": counters["rejected"],
            "triton_failure": counters["failure"], "policy": policy,
            "refusal_s_p50": pct(refusal_latency, 50), "refusal_s_max": pct(refusal_latency, 100),
            "succeeded_s_p50": pct(succeeded_latency, 50), "succeeded_s_p99": pct(succeeded_latency, 99),
            "succeeded_s_max": pct(succeeded_latency, 100)}


@pytest.mark.parametrize("model", MODELS)
def test_grpc_burst_beyond_the_queue_gets_one_answer_per_request_refusals_are_explicit_and_counted(
        triton_server, admin_token, model, burst_images, results):
    images, reference = burst_images
    policy = queue_policy(model)
    assert policy["timeout_action"] == "REJECT" and policy["allow_timeout_override"]
    before = settled_counters(triton_server, model, CLIENT_TIMEOUT_S)
    # the queue plus one full batch in execution is the most the server holds; send well beyond it
    most = 8 * (policy["max_queue_size"] + max_batch_size())
    sent, answers = grpc_burst(triton_server, model, images, most)
    senders, images_per_request, inputs = 1, 1, "grpc"
    if not any(QUEUE_FULL in str(a[0][1]) for a in answers.values() if a):
        # one Python client did not outrun this server (a fast GPU): burst from several processes at once,
        # inputs in system shared memory (test_shared_memory_burst_from_several_processes_... runs it on any host)
        senders, images_per_request, inputs = PARALLEL_SENDERS, len(images), "system shared memory"
        before, sent, answers = shared_memory_burst(triton_server, admin_token, model, images, most)
    figures = check_burst(triton_server, model, "grpc", sent, answers, before, images, reference, policy,
                          images_per_request=images_per_request)
    record(results, "overload", {f"grpc_{model}": {**figures, "sender_processes": senders,
                                                   "images_per_request": images_per_request, "inputs": inputs}})


@pytest.mark.parametrize("model", MODELS)
def test_shared_memory_burst_from_several_processes_fills_the_queue_with_one_correct_answer_per_request(
        triton_server, admin_token, model, burst_images, results):
    """The GPU host's fallback burst, run here on purpose: PARALLEL_SENDERS processes, each with its own
    registered system shared-memory region, fire requests of the 8 burst images until each has seen
    ENOUGH_REFUSALS refusals. The queue must fill, every request gets exactly one answer (success, queue
    refusal or queue timeout, nothing else), Triton's counters agree, every success has the reference
    logits of its window, and no region is left registered or in /dev/shm."""
    images, reference = burst_images
    policy = queue_policy(model)
    images_per_request = len(images)
    most = 8 * (policy["max_queue_size"] + max_batch_size(model))
    before, sent, answers = shared_memory_burst(triton_server, admin_token, model, images, most)
    figures = check_burst(triton_server, model, "grpc", sent, answers, before, images, reference, policy,
                          images_per_request=images_per_request)
    record(results, "overload", {f"grpc_shm_{model}": {**figures, "sender_processes": PARALLEL_SENDERS,
                                                       "images_per_request": images_per_request,
                                                       "inputs": "system shared memory"}})


def test_http_flood_gets_one_answer_per_request_and_every_refusal_is_an_explicit_503(
        triton_server, burst_images, results):
    """Sending over HTTP is slow enough that this client alone may not fill the queue (the gRPC test
    does); a quarter of the requests ask for a 1 s queue timeout, which an HTTP flood does exceed."""
    images, reference = burst_images
    policy = queue_policy(MODEL_CUSTOM)
    before = settled_counters(triton_server, MODEL_CUSTOM, CLIENT_TIMEOUT_S)
    sent, answers = http_burst(triton_server, MODEL_CUSTOM, images, 160)
    statuses = Counter(str(a[0][1].status()) for a in answers.values() if not isinstance(a[0][1], np.ndarray))
    assert set(statuses) <= {"503"}, statuses
    figures = check_burst(triton_server, MODEL_CUSTOM, "http", sent, answers, before, images, reference, policy,
                          must_overflow=False)
    record(results, "overload", {f"http_{MODEL_CUSTOM}": {**figures, "http_statuses": dict(statuses)}})
