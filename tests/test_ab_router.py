"""The A/B router (`resnet18_ab`, the C++ backend backend/ab_router/ab_router_backend/ab_router.cc) against the real
server.

On the session server (the shipped repository, the router in shadow mode, cuDNN primary, custom candidate):
the router answers with the primary's logits and engine, and its metrics count every request, as Triton's own
counters of both arms do.

On a server of its own (model control mode explicit, so the router's config is changed through the admin API
as docs/AB_LIVE.md says), with small test arms written here (`arm`: deterministic logits of the image and the
engine name its config gives; one arm reverses the class order, one sleeps, one fails):
- a 10 % split lands within a binomial bound and is sticky per request id and per `ab_key`;
- a slow canary holds up no request to the primary: with one router instance, a request to the primary is
  answered while an earlier one waits at the slow candidate (the slow arm writes when each execution starts and
  ends: the test sends once the slow request is in the candidate's sleep, and the answer must come before it ends);
- concurrent shadow requests (queued for the router, batched) each get their own answer, and every one is
  compared;
- a slow candidate neither fails nor delays the client's answer (it comes before the candidate's execution ends),
  and its lateness is counted as a timeout at its deadline, before its late answer comes (the candidate's execution
  ends, and Triton's statistics count it, after the timeout was counted; the late answer is not compared);
- a failing candidate does not fail the request, and is counted;
- disagreeing requests are recorded (request id, both top-5) and counted;
- bad parameters are refused with the parameter named: by client.ab_mode before it sends them (the configuration
  before goes on serving), and by the router at load (a server with such entries does not start).
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from fusedresnet.backend.ab_router.config import sticky_share
from fusedresnet.backend.network import free_ports
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import (
    AB_COMPARED_METRIC,
    AB_DISAGREEING_METRIC,
    AB_DISAGREEMENTS_DIR,
    AB_FAILURES_METRIC,
    AB_IMAGES_METRIC,
    AB_LATENCY_METRIC,
    AB_REQUESTS_METRIC,
    AB_ROUTER_MODEL,
    AB_STICKY_PARAMETER,
    AB_TIMEOUTS_METRIC,
    AB_TOP5_OVERLAP_METRIC,
    GRPC_ADMIN_TOKEN_HEADER,
    INPUT_UINT8,
    METRICS_FLUSH_S,
    MODEL_CUDNN,
    MODEL_REPOSITORY,
    OUTPUT_ENGINE,
    OUTPUT_LOGITS,
)
from fusedresnet.backend.triton_server.installation import ServerError
from fusedresnet.client.ab_mode import RouterConfigError, load_router_config, router_config
from fusedresnet.loadtest.triton_metrics import SUCCESS, ab_delta, scrape

from robustness_helpers import read_until

SLOW_ARM_SLEEP_S = 2.0
SHADOW_TIMEOUT_MS = 300.0
METRICS_DEADLINE_S = 10.0
EVENT_DEADLINE_S = 60.0      # for a request to reach an arm, or an arm's execution to end (a busy 2-core host)
EXECUTIONS_FILE = "arm_slow_executions.jsonl"   # next to the test server's repository

# A test arm: the IMAGE contract, logits a fixed function of the image (the class order reversed when its
# config says so), the engine name its config gives; it sleeps or fails when its config says so. With an
# `executions` file it appends the time each execution starts (before its sleep) and ends (before its answers go).
ARM_MODEL = '''
import json, time
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.name = torch.frombuffer(bytearray(parameters["engine"].encode()), dtype=torch.uint8)
        self.reverse = parameters.get("reverse") == "true"
        self.sleep_s = float(parameters.get("sleep_s", "0"))
        self.fail = parameters.get("fail") == "true"
        self.executions = parameters.get("executions")

    def note(self, event):
        if self.executions:
            with open(self.executions, "a") as log:
                log.write(json.dumps({"event": event, "t": time.time()}) + "\\n")

    def execute(self, requests):
        self.note("start")
        time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            if self.fail:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("this arm fails")))
                continue
            image = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "IMAGE").to_dlpack())
            means = image.float().mean(dim=(1, 2, 3), keepdim=False).unsqueeze(1)
            logits = torch.arange(1000, dtype=torch.float32).unsqueeze(0) / 1000 + means
            if self.reverse:
                logits = logits.flip(1).contiguous()
            engine = self.name.expand(image.shape[0], -1).contiguous()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("LOGITS", logits),
                                                         pb_utils.Tensor.from_dlpack("ENGINE", engine)]))
        self.note("end")
        return responses
'''

ARM_CONFIG = '''
backend: "python"
max_batch_size: 128
input [ {{ name: "IMAGE", data_type: TYPE_UINT8, dims: [ 224, 224, 3 ] }} ]
output [ {{ name: "LOGITS", data_type: TYPE_FP32, dims: [ 1000 ] }},
         {{ name: "ENGINE", data_type: TYPE_UINT8, dims: [ -1 ] }} ]
dynamic_batching {{ default_queue_policy {{ allow_timeout_override: true }} }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{parameters}
'''

# name -> parameters of each test arm
ARMS = {"arm_a": {"engine": "engine-a"}, "arm_b": {"engine": "engine-b"},
        "arm_reversed": {"engine": "engine-reversed", "reverse": "true"},
        "arm_slow": {"engine": "engine-slow", "sleep_s": str(SLOW_ARM_SLEEP_S)},
        "arm_failing": {"engine": "engine-failing", "fail": "true"}}


def pbtxt_parameters(parameters: dict) -> str:
    return "\n".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items())


def infer(client, model: str, images: np.ndarray, request_id: str = "", parameters: dict | None = None):
    """(logits, engine name) of one request."""
    tensor = grpcclient.InferInput(INPUT_UINT8, list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    result = client.infer(model, [tensor], request_id=request_id, parameters=parameters,
                          outputs=[grpcclient.InferRequestedOutput(OUTPUT_LOGITS),
                                   grpcclient.InferRequestedOutput(OUTPUT_ENGINE)])
    return result.as_numpy(OUTPUT_LOGITS), bytes(result.as_numpy(OUTPUT_ENGINE)[0]).decode()


def metric(metrics_url: str, name: str, model: str = AB_ROUTER_MODEL, **labels) -> float:
    """A router metric summed over its instances (and over the label sets not named)."""
    return scrape(metrics_url).total(name, model, **labels)


def wait_for_metric(metrics_url: str, name: str, expected: float, **labels) -> float:
    """The metric once it reaches `expected` (the router writes its metrics every half second), or at the deadline."""
    deadline = time.monotonic() + METRICS_DEADLINE_S
    while True:
        value = metric(metrics_url, name, **labels)
        if value >= expected or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def wait_for_increase(metrics_url: str, name: str, before: float, increase: float, **labels) -> float:
    """How much the metric rose from `before`, once it rose by `increase` or at the deadline."""
    return wait_for_metric(metrics_url, name, before + increase, **labels) - before


def executions_file(server) -> Path:
    return Path(server.model_repository).parent / EXECUTIONS_FILE


def slow_executions(server) -> list[dict]:
    """The slow arm's executions so far, in order: {"start": epoch s, "end": epoch s or None while it sleeps}."""
    path = executions_file(server)
    executions = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.endswith("}"):                      # a line being written is read next time
            event = json.loads(line)
            if event["event"] == "start":
                executions.append({"start": event["t"], "end": None})
            else:
                executions[-1]["end"] = event["t"]
    return executions


def wait_for_slow_execution(server, index: int, ended: bool) -> dict:
    """The slow arm's execution number `index` once it has started (or ended, with `ended`)."""
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while True:
        executions = slow_executions(server)
        if len(executions) > index and (not ended or executions[index]["end"] is not None):
            return executions[index]
        assert time.monotonic() < deadline, \
            f"the slow arm's execution {index} has not {'ended' if ended else 'started'} in {EVENT_DEADLINE_S:.0f} s"
        time.sleep(0.02)


def slow_successes(server, admin_token: str) -> int:
    """Requests the slow arm has answered, from Triton's statistics (the admin token's API): Triton counts one
    once its execution has returned."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics("arm_slow", headers={GRPC_ADMIN_TOKEN_HEADER: admin_token},
                                                as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))


# ---------------------------------------------------------------- the shipped router on the session server

def test_shadow_router_answers_with_the_primarys_logits_and_engine(triton_server, varied_images):
    config = router_config(triton_server.http_url)
    assert config["mode"] == "shadow" and config["primary"] == MODEL_CUDNN
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        for images in (varied_images[:1], varied_images[1:4], varied_images[4:12]):
            routed, routed_engine = infer(client, AB_ROUTER_MODEL, images)
            direct, direct_engine = infer(client, MODEL_CUDNN, images)
            assert routed_engine == direct_engine
            np.testing.assert_allclose(routed, direct, rtol=1e-5, atol=1e-5)


def test_router_metrics_count_every_request_as_tritons_counters_do(triton_server, varied_images):
    url = triton_server.metrics_url
    labels = {"mode": "shadow"}
    # Earlier requests' comparisons finish in the background: start once each request Triton answered is compared.
    wait_for_metric(url, AB_COMPARED_METRIC, scrape(url).total(SUCCESS, AB_ROUTER_MODEL))
    before = {name: metric(url, name, **labels) for name in (AB_REQUESTS_METRIC,)}
    before_compared = metric(url, AB_COMPARED_METRIC)
    before_images = metric(url, AB_IMAGES_METRIC)
    before_latency = metric(url, f"{AB_LATENCY_METRIC}_count", arm="primary")
    before_overlap = metric(url, f"{AB_TOP5_OVERLAP_METRIC}_count")
    snapshot = scrape(url)
    before_triton = {m: snapshot.total(SUCCESS, m) for m in (AB_ROUTER_MODEL, "resnet18_cudnn", "resnet18_custom")}
    before_snapshot = scrape(url)
    sizes = (1, 2, 1, 3)
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        start = 0
        for size in sizes:
            infer(client, AB_ROUTER_MODEL, varied_images[start:start + size])
            start += size
    requests, images = len(sizes), sum(sizes)
    assert wait_for_metric(url, AB_COMPARED_METRIC, before_compared + requests) == before_compared + requests
    assert metric(url, AB_IMAGES_METRIC) == before_images + images
    assert metric(url, f"{AB_TOP5_OVERLAP_METRIC}_count") == before_overlap + requests
    assert metric(url, f"{AB_LATENCY_METRIC}_count", arm="primary") == before_latency + requests
    assert metric(url, AB_REQUESTS_METRIC, **labels) == before[AB_REQUESTS_METRIC] + 2 * requests  # both arms
    snapshot = scrape(url)
    counted = ab_delta(before_snapshot, snapshot)   # what the sweep's live A/B section reads
    assert (counted["requests"], counted["images"], counted["modes"]) == (requests, images, ["shadow"])
    assert {arm: counted["arms"][arm]["requests"] for arm in ("primary", "candidate")} == {
        "primary": requests, "candidate": requests}
    # Triton's own counters: the router answered every request, each arm got one call per router batch
    # (requests sent one at a time: one batch each).
    assert {m: snapshot.total(SUCCESS, m) - before_triton[m] for m in before_triton} == dict.fromkeys(
        before_triton, requests)


# ---------------------------------------------------------------- a server with test arms, configs changed live

@pytest.fixture(scope="module")
def ab_server(admin_token, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("ab-router")
    repository = scratch / "models"
    for name, parameters in ARMS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(ARM_MODEL)
        if name == "arm_slow":
            parameters = {**parameters, "executions": str(scratch / EXECUTIONS_FILE)}
        (repository / name / "config.pbtxt").write_text(ARM_CONFIG.format(parameters=pbtxt_parameters(parameters)))
    (repository / AB_ROUTER_MODEL / "1").mkdir(parents=True)     # the router has no model file (a C++ backend)
    shipped = (MODEL_REPOSITORY / AB_ROUTER_MODEL / "config.pbtxt").read_text()
    assert "count: 1," in shipped
    (repository / AB_ROUTER_MODEL / "config.pbtxt").write_text(
        shipped.replace('"resnet18_cudnn"', '"arm_a"').replace('"resnet18_custom"', '"arm_b"'))
    http_port, grpc_port, metrics_port = free_ports(3)
    # A refused reload stays among Triton's live models ("Found 5 live models" at exit, all unloaded): a short
    # exit timeout, or every run waits out the default 30 s.
    settings = ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                              admin_token=admin_token, log_file=scratch / "server.log", exit_timeout_s=3, mps="off",
                              triton_args=["--model-control-mode=explicit", "--load-model=*"])
    with launch(settings) as group:
        yield group.first     # the tests read its process


def reload_router(server, token: str, **parameters):
    load_router_config(server.http_url, token, **parameters)


def test_split_sends_its_share_to_the_candidate_within_a_binomial_bound_and_sticks(ab_server, admin_token,
                                                                                   varied_images):
    reload_router(ab_server, admin_token, mode="split", primary="arm_a", candidate="arm_b", candidate_percent="10")
    requests, share = 400, 0.10
    url = ab_server.metrics_url
    before = metric(url, AB_REQUESTS_METRIC, mode="split")
    before_candidate = metric(url, AB_REQUESTS_METRIC, mode="split", arm="candidate")
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        engines = {f"client-{i}": infer(client, AB_ROUTER_MODEL, varied_images[:1], request_id=f"client-{i}")[1]
                   for i in range(requests)}
        to_candidate = sum(engine == "engine-b" for engine in engines.values())
        # Binomial(400, 0.1): mean 40, standard deviation 6; 4.5 standard deviations either side.
        sigma = math.sqrt(requests * share * (1 - share))
        assert abs(to_candidate - requests * share) <= 4.5 * sigma, to_candidate
        assert set(engines.values()) == {"engine-a", "engine-b"}
        # The router's hash (libb2 in C++) is Python's hashlib blake2b: each id lands where sticky_share says.
        assert engines == {request_id: "engine-b" if sticky_share(request_id) < 10 else "engine-a"
                           for request_id in engines}
        # Sticky: the same request id lands on the same arm again; an ab_key wins over the request id.
        for request_id in list(engines)[:40]:
            assert infer(client, AB_ROUTER_MODEL, varied_images[:1], request_id=request_id)[1] == engines[request_id]
        keyed = {infer(client, AB_ROUTER_MODEL, varied_images[:1], request_id=f"other-{i}",
                       parameters={AB_STICKY_PARAMETER: "one-client"})[1] for i in range(20)}
        assert len(keyed) == 1
    assert wait_for_increase(url, AB_REQUESTS_METRIC, before, requests + 60, mode="split") == requests + 60
    again = sum(engines[r] == "engine-b" for r in list(engines)[:40]) + (20 if keyed == {"engine-b"} else 0)
    assert metric(url, AB_REQUESTS_METRIC, mode="split", arm="candidate") - before_candidate == to_candidate + again


def test_concurrent_shadow_requests_each_get_their_own_answer_and_are_all_compared(ab_server, admin_token,
                                                                                   varied_images):
    """Requests that queue for the router go as batches of several (one call per arm whose input is their buffers
    appended), and each gets its own rows of the answer."""
    # Room for every batch at the candidate, and time (a busy 2-core host): none may go unshadowed or late.
    reload_router(ab_server, admin_token, mode="shadow", primary="arm_a", candidate="arm_b",
                  shadow_max_in_flight="64", shadow_timeout_ms="30000")
    url = ab_server.metrics_url
    before_compared = metric(url, AB_COMPARED_METRIC)
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        expected = infer(client, "arm_a", varied_images)[0]
    threads, per_thread, mismatches, failures = 8, 12, [], []

    def client_loop(seed: int):
        rng = np.random.default_rng(seed)
        with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
            for _ in range(per_thread):
                start, size = int(rng.integers(0, 30)), int(rng.integers(1, 8))
                try:
                    logits, engine = infer(client, AB_ROUTER_MODEL, varied_images[start:start + size])
                except Exception as error:
                    failures.append(str(error))
                    continue
                if engine != "engine-a" or not np.array_equal(logits, expected[start:start + size]):
                    mismatches.append((start, size, engine))

    workers = [threading.Thread(target=client_loop, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures and not mismatches, (failures[:3], mismatches[:3])
    requests = threads * per_thread
    assert wait_for_increase(url, AB_COMPARED_METRIC, before_compared, requests) == requests


def test_a_slow_canary_does_not_hold_up_the_primarys_requests(ab_server, admin_token, varied_images):
    # The test server's router has one instance; half the keys go to the slow candidate, half to the primary.
    reload_router(ab_server, admin_token, mode="split", primary="arm_a", candidate="arm_slow", candidate_percent="50")
    slow_key = next(f"key-{i}" for i in range(1000) if sticky_share(f"key-{i}") < 50)
    fast_key = next(f"key-{i}" for i in range(1000) if sticky_share(f"key-{i}") >= 50)
    answers = {}

    def slow_request():
        with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
            started = time.monotonic()
            answers["slow"] = infer(client, AB_ROUTER_MODEL, varied_images[:1], parameters={
                AB_STICKY_PARAMETER: slow_key})[1], time.monotonic() - started

    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        infer(client, AB_ROUTER_MODEL, varied_images[:1], parameters={AB_STICKY_PARAMETER: fast_key})  # warm
        index = len(slow_executions(ab_server))
        slow = threading.Thread(target=slow_request)
        slow.start()
        wait_for_slow_execution(ab_server, index, ended=False)     # the slow request is in the candidate's sleep
        engine = infer(client, AB_ROUTER_MODEL, varied_images[1:2], parameters={AB_STICKY_PARAMETER: fast_key})[1]
        answered_at = time.time()
    slow.join()
    assert engine == "engine-a" and answers["slow"][0] == "engine-slow"
    assert answers["slow"][1] >= SLOW_ARM_SLEEP_S * 0.9
    # A router that waited for the slow candidate could take the primary's request only once the candidate's
    # execution had returned: the answer came while the slow one was still in the candidate's sleep.
    slow_end = wait_for_slow_execution(ab_server, index, ended=True)["end"]
    assert answered_at < slow_end, \
        f"the primary's request waited for the slow candidate's: answered {answered_at - slow_end:.2f} s after it"


def test_slow_candidate_neither_fails_nor_delays_the_answer_and_counts_a_timeout(ab_server, admin_token,
                                                                                   varied_images):
    reload_router(ab_server, admin_token, mode="shadow", primary="arm_a", candidate="arm_slow",
                  shadow_timeout_ms=str(SHADOW_TIMEOUT_MS))
    url = ab_server.metrics_url
    before_timeouts, before_compared = metric(url, AB_TIMEOUTS_METRIC), metric(url, AB_COMPARED_METRIC)
    before_slow = slow_successes(ab_server, admin_token)
    index = len(slow_executions(ab_server))
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        expected, _ = infer(client, "arm_a", varied_images[:2])
        logits, engine = infer(client, AB_ROUTER_MODEL, varied_images[:2], request_id="slow-1")
        answered_at = time.time()
    assert engine == "engine-a"
    np.testing.assert_array_equal(logits, expected)
    assert wait_for_increase(url, AB_TIMEOUTS_METRIC, before_timeouts, 1) == 1
    counted_at = time.time()
    # The candidate's execution of the shadow copy ends after the client had its answer (a router that waited for
    # the candidate answers only after it), and after the timeout was counted: at the deadline (300 ms after the
    # call left, seen within a flush), not when the late answer came.
    slow_end = wait_for_slow_execution(ab_server, index, ended=True)["end"]
    assert answered_at < slow_end, f"the answer waited for the slow candidate: {answered_at - slow_end:.2f} s after"
    assert counted_at < slow_end, f"the timeout was counted {counted_at - slow_end:.2f} s after the late answer"
    # The late answer came after all (Triton counts the candidate's request once its execution returned): it is
    # not compared, neither when it came nor within the flushes after.
    assert read_until(lambda: slow_successes(ab_server, admin_token), lambda n: n > before_slow,
                      EVENT_DEADLINE_S) == before_slow + 1
    compared = read_until(lambda: metric(url, AB_COMPARED_METRIC), lambda n: n != before_compared,
                          4 * METRICS_FLUSH_S, 0.1)
    assert compared == before_compared


def test_failing_candidate_does_not_fail_the_request_and_is_counted(ab_server, admin_token, varied_images):
    reload_router(ab_server, admin_token, mode="shadow", primary="arm_a", candidate="arm_failing")
    url = ab_server.metrics_url
    before = metric(url, AB_FAILURES_METRIC, mode="shadow", arm="candidate")
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        expected, _ = infer(client, "arm_a", varied_images[:3])
        logits, engine = infer(client, AB_ROUTER_MODEL, varied_images[:3])
    assert engine == "engine-a"
    np.testing.assert_array_equal(logits, expected)
    assert wait_for_increase(url, AB_FAILURES_METRIC, before, 1, mode="shadow", arm="candidate") == 1


def test_disagreeing_requests_are_counted_and_recorded_with_both_top5(ab_server, admin_token, varied_images):
    reload_router(ab_server, admin_token, mode="shadow", primary="arm_a", candidate="arm_reversed")
    record_file = AB_DISAGREEMENTS_DIR / f"{AB_ROUTER_MODEL}_0_0-server{ab_server.process.pid}.json"
    record_file.unlink(missing_ok=True)
    before = metric(ab_server.metrics_url, AB_DISAGREEING_METRIC)
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        primary, _ = infer(client, "arm_a", varied_images[:2])
        reversed_logits, _ = infer(client, "arm_reversed", varied_images[:2])
        infer(client, AB_ROUTER_MODEL, varied_images[:2], request_id="disagree-1")
    assert wait_for_increase(ab_server.metrics_url, AB_DISAGREEING_METRIC, before, 1) == 1
    deadline = time.monotonic() + METRICS_DEADLINE_S
    while not record_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    records = json.loads(record_file.read_text())
    assert [r["request_id"] for r in records] == ["disagree-1"]
    top5 = lambda logits: np.argsort(-logits, axis=1)[:, :5].tolist()  # noqa: E731
    assert [d["primary_top5"] for d in records[0]["disagreeing"]] == top5(primary)
    assert [d["candidate_top5"] for d in records[0]["disagreeing"]] == top5(reversed_logits)


BAD_PARAMETERS = [
    ({"mode": "mirror"}, "mode"), ({"candidate_percent": "150"}, "candidate_percent"),
    ({"shadow_timeout_ms": "soon"}, "shadow_timeout_ms"), ({"candidate": "arm_a", "primary": "arm_a"}, "candidate"),
    ({"canary_percent": "5"}, "canary_percent"),
    # texts Python's int() and float() read but the router's grammar does not (both refuse them now)
    ({"shadow_max_in_flight": "1_6"}, "shadow_max_in_flight"), ({"shadow_timeout_ms": "0x1p3"}, "shadow_timeout_ms"),
    # out of range: beyond the deadline clock's reach; beyond int64
    ({"shadow_timeout_ms": "1e13"}, "shadow_timeout_ms"),
    ({"shadow_max_in_flight": "99999999999999999999"}, "shadow_max_in_flight")]


@pytest.mark.parametrize("parameters, named", BAD_PARAMETERS)
def test_ab_mode_refuses_a_bad_parameter_before_sending_it(ab_server, admin_token, parameters, named, varied_images):
    with pytest.raises(RouterConfigError, match=f"parameter.*{named}.*not sent"):
        reload_router(ab_server, admin_token, **parameters)
    # The configuration loaded before goes on serving.
    with grpcclient.InferenceServerClient(ab_server.grpc_url) as client:
        assert client.is_model_ready(AB_ROUTER_MODEL)
        assert infer(client, AB_ROUTER_MODEL, varied_images[:1])[1] == "engine-a"


def test_bad_router_parameters_fail_the_load_with_the_parameter_named(admin_token, tmp_path):
    """The router's own check at load: a server whose router entries carry bad parameters does not start, and its
    log names each one (Triton loads every entry, then exits)."""
    shipped = (MODEL_REPOSITORY / AB_ROUTER_MODEL / "config.pbtxt").read_text()
    for index, (parameters, _) in enumerate(BAD_PARAMETERS):
        entry = tmp_path / "models" / f"bad_router_{index}"
        (entry / "1").mkdir(parents=True)
        (entry / "config.pbtxt").write_text(shipped + pbtxt_parameters(parameters) + "\n")
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(tmp_path / "models", "127.0.0.1", http_port, grpc_port, metrics_port,
                              processes_per_gpu=1, admin_token=admin_token, log_file=tmp_path / "server.log",
                              exit_timeout_s=3, ready_timeout_s=120, mps="off")
    with pytest.raises(ServerError, match="exited"):
        launch(settings)
    log = (tmp_path / "server.log").read_text()
    for index, (_, named) in enumerate(BAD_PARAMETERS):
        failed = [line for line in log.splitlines() if f"failed to load 'bad_router_{index}'" in line]
        assert failed and (f"parameter {named}" in failed[0] or f"['{named}']" in failed[0]), failed
