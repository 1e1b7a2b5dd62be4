"""Security by default: loopback only unless asked, Triton's admin APIs locked behind a token
on both protocols, model control mode none, the token never printed.

The token travels as the HTTP header `admin-key`; Triton's gRPC frontend prefixes restricted
metadata keys, so over gRPC it is `triton-grpc-protocol-admin-key` (spec.GRPC_ADMIN_TOKEN_HEADER).
Refusals: HTTP 403 "This API is restricted"; gRPC UNAVAILABLE "This protocol is restricted".
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from fusedresnet.backend import admin_token, serve
from fusedresnet.backend.spec import (
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_HEADER,
    GRPC_ADMIN_TOKEN_HEADER,
    MODELS,
    RESTRICTED_APIS,
    SERVED_ENTRIES,
)
from fusedresnet.backend.triton_server.installation import ServerError, find_triton
from fusedresnet.campaigns.serving_sequence import repository_with_instances

from robustness_helpers import Launcher, assert_correct, client, infer_image, listening_addresses

MODEL = MODELS[0]

# (restricted API, HTTP method, path, JSON body): one or more calls on each of Triton's admin surfaces
HTTP_ADMIN_CALLS = [
    ("model-repository", "POST", "/v2/repository/index", {}),
    ("model-repository", "POST", f"/v2/repository/models/{MODEL}/unload", {}),
    ("model-repository", "POST", f"/v2/repository/models/{MODEL}/load", {}),
    ("statistics", "GET", "/v2/models/stats", None),
    ("statistics", "GET", f"/v2/models/{MODEL}/stats", None),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    ("shared-memory", "POST", "/v2/systemsharedmemory/region/probe/register",
     {"key": "/fusedresnet-probe", "offset": 0, "byte_size": 64}),
    ("shared-memory", "GET", "/v2/cudasharedmemory/status", None),
    ("trace", "GET", "/v2/trace/setting", None),
    ("trace", "POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("logging", "GET", "/v2/logging", None),
    ("logging", "POST", "/v2/logging", {"log_verbose_level": 1}),
]

GRPC_ADMIN_CALLS = [
    ("model-repository", "index", lambda c, h: c.get_model_repository_index(headers=h)),
    ("model-repository", "unload", lambda c, h: c.unload_model(MODEL, headers=h)),
    ("model-repository", "load", lambda c, h: c.load_model(MODEL, headers=h)),
    ("statistics", "statistics", lambda c, h: c.get_inference_statistics(headers=h)),
    ("shared-memory", "system shm status", lambda c, h: c.get_system_shared_memory_status(headers=h)),
    ("shared-memory", "system shm register",
     lambda c, h: c.register_system_shared_memory("probe", "/fusedresnet-probe", 64, headers=h)),
    ("shared-memory", "cuda shm status", lambda c, h: c.get_cuda_shared_memory_status(headers=h)),
    ("trace", "trace settings", lambda c, h: c.get_trace_settings(headers=h)),
    ("trace", "update trace", lambda c, h: c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]},
                                                                    headers=h)),
    ("logging", "log settings", lambda c, h: c.get_log_settings(headers=h)),
    ("logging", "update log", lambda c, h: c.update_log_settings({"log_verbose_level": 1}, headers=h)),
]


def http_call(server, method, path, body=None, headers=None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def grpc_call(server, call, headers) -> tuple[str, str]:
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        try:
            return "OK", str(call(triton, headers))
        except InferenceServerException as error:
            return str(error.status()), error.message()


def test_every_restricted_api_group_is_exercised():
    assert {api for api, *_ in HTTP_ADMIN_CALLS} == set(RESTRICTED_APIS)
    assert {api for api, *_ in GRPC_ADMIN_CALLS} == set(RESTRICTED_APIS)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", MODELS)
def test_inference_health_and_metadata_need_no_token(triton_server, protocol, model, varied_images,
                                                     reference_logits):
    with client(triton_server, protocol) as triton:
        assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready(model)
        assert triton.get_model_metadata(model) and triton.get_model_config(model)
        assert_correct(infer_image(triton, protocol, model, varied_images[:2]), reference_logits(varied_images[:2]))


@pytest.mark.parametrize("token", [None, "wrong-token"], ids=["no-token", "wrong-token"])
@pytest.mark.parametrize("api, method, path, body", HTTP_ADMIN_CALLS,
                         ids=[f"{m} {p}" for _, m, p, _ in HTTP_ADMIN_CALLS])
def test_http_admin_api_is_refused_without_the_right_token(triton_server, api, method, path, body, token):
    headers = {ADMIN_TOKEN_HEADER: token} if token else None
    status, text = http_call(triton_server, method, path, body, headers)
    assert status == 403, (status, text)
    assert "restricted" in text and ADMIN_TOKEN_HEADER in text


@pytest.mark.parametrize("token", [None, "wrong-token"], ids=["no-token", "wrong-token"])
@pytest.mark.parametrize("api, name, call", GRPC_ADMIN_CALLS, ids=[n for _, n, _ in GRPC_ADMIN_CALLS])
def test_grpc_admin_api_is_refused_without_the_right_token(triton_server, api, name, call, token):
    # the plain HTTP-style key does not unlock gRPC either
    for headers in ({GRPC_ADMIN_TOKEN_HEADER: token} if token else None, {ADMIN_TOKEN_HEADER: token or "x"}):
        status, message = grpc_call(triton_server, call, headers)
        assert status == "StatusCode.UNAVAILABLE", (status, message)
        assert "restricted" in message and GRPC_ADMIN_TOKEN_HEADER in message


def test_refused_admin_calls_changed_nothing(triton_server, admin_headers, grpc_admin_headers):
    for _, method, path, body in HTTP_ADMIN_CALLS:
        http_call(triton_server, method, path, body)
    for _, _, call in GRPC_ADMIN_CALLS:
        grpc_call(triton_server, call, None)
    status, text = http_call(triton_server, "GET", "/v2/logging", headers=admin_headers)
    assert status == 200 and json.loads(text)["log_verbose_level"] == 0
    status, text = http_call(triton_server, "GET", "/v2/trace/setting", headers=admin_headers)
    assert status == 200 and json.loads(text)["trace_level"] == ["OFF"]
    status, text = http_call(triton_server, "GET", "/v2/systemsharedmemory/status", headers=admin_headers)
    assert status == 200 and json.loads(text) == []
    status, text = http_call(triton_server, "POST", "/v2/repository/index", {}, headers=admin_headers)
    assert {(m["name"], m["state"]) for m in json.loads(text)} == {(m, "READY") for m in SERVED_ENTRIES}


def test_admin_apis_work_with_the_token_on_both_protocols(triton_server, admin_headers, grpc_admin_headers):
    status, text = http_call(triton_server, "POST", "/v2/repository/index", {}, admin_headers)
    assert status == 200 and {m["name"] for m in json.loads(text)} == set(SERVED_ENTRIES)
    status, text = http_call(triton_server, "GET", f"/v2/models/{MODEL}/stats", headers=admin_headers)
    assert status == 200 and json.loads(text)["model_stats"][0]["name"] == MODEL
    for path in ("/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status", "/v2/trace/setting", "/v2/logging"):
        status, text = http_call(triton_server, "GET", path, headers=admin_headers)
        assert status == 200, (path, text)
    status, text = http_call(triton_server, "POST", "/v2/logging", {"log_verbose_level": 0}, admin_headers)
    assert status == 200, text
    # past the gate: the register call fails on its own merits (no such shared-memory region)
    status, text = http_call(triton_server, "POST", "/v2/systemsharedmemory/region/probe/register",
                             {"key": "/fusedresnet-probe", "offset": 0, "byte_size": 64}, admin_headers)
    assert status != 403 and "Unable to open shared memory region" in text

    with grpcclient.InferenceServerClient(triton_server.grpc_url) as triton:
        index = triton.get_model_repository_index(headers=grpc_admin_headers)
        assert {m.name for m in index.models} == set(SERVED_ENTRIES)
        stats = triton.get_inference_statistics(MODEL, headers=grpc_admin_headers)
        assert stats.model_stats[0].name == MODEL
        triton.get_system_shared_memory_status(headers=grpc_admin_headers)
        triton.get_cuda_shared_memory_status(headers=grpc_admin_headers)
        triton.get_trace_settings(headers=grpc_admin_headers)
        assert triton.get_log_settings(headers=grpc_admin_headers, as_json=True)["settings"]
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
            triton.register_system_shared_memory("probe", "/fusedresnet-probe", 64, headers=grpc_admin_headers)


def test_model_repository_cannot_be_changed_even_with_the_token(triton_server, admin_headers,
                                                                grpc_admin_headers):
    """Model control mode none: the token unlocks the repository API, but nothing loads or unloads."""
    for action in ("unload", "load"):
        status, text = http_call(triton_server, "POST", f"/v2/repository/models/{MODEL}/{action}", {},
                                 admin_headers)
        assert status != 200 and "explicit model load / unload is not allowed" in text, (status, text)
        with grpcclient.InferenceServerClient(triton_server.grpc_url) as triton:
            with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
                getattr(triton, f"{action}_model")(MODEL, headers=grpc_admin_headers)
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as triton:
        assert all(triton.is_model_ready(m) for m in SERVED_ENTRIES)


def test_server_listens_on_loopback_only(triton_server):
    ports = [int(url.rsplit(":", 1)[1].split("/")[0])
             for url in (triton_server.http_url, triton_server.grpc_url, triton_server.metrics_url)]
    addresses = listening_addresses(ports)
    assert all(addresses[p] for p in ports), addresses
    assert all(a == "127.0.0.1" for p in ports for a in addresses[p]), addresses


def test_exposing_the_service_takes_an_explicit_host(tmp_path):
    triton = find_triton()
    default = serve.TritonServer(admin_token="t").command(triton, tmp_path)
    exposed = serve.TritonServer(host="0.0.0.0", admin_token="t").command(triton, tmp_path)
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        assert f"{flag}=127.0.0.1" in default
        assert f"{flag}=0.0.0.0" in exposed
    assert "--model-control-mode=none" in default and "--model-control-mode=none" in exposed
    for command in (default, exposed):
        restricted = [a for a in command if a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))]
        assert len(restricted) == 2
        assert all(a.split("=", 1)[1] == f"{','.join(RESTRICTED_APIS)}:{ADMIN_TOKEN_HEADER}=t" for a in restricted)


def test_generated_admin_token_is_random_private_reused_and_overridden_by_the_environment(tmp_path,
                                                                                            monkeypatch):
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    monkeypatch.setattr(admin_token, "DEFAULT_TOKEN_FILE", tmp_path / "build" / "admin-token")
    token = admin_token.read_or_create_token()
    assert len(token) >= 32 and token == admin_token.read_or_create_token()
    assert stat.S_IMODE(os.stat(tmp_path / "build" / "admin-token").st_mode) == 0o600
    monkeypatch.setattr(admin_token, "DEFAULT_TOKEN_FILE", tmp_path / "other" / "admin-token")
    assert admin_token.read_or_create_token() != token  # a fresh secret, not a fixed default
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-the-environment")
    assert admin_token.read_or_create_token() == "from-the-environment"
    with pytest.raises(ServerError, match="missing or empty"):
        monkeypatch.delenv(ADMIN_TOKEN_ENV)
        admin_token.read_or_create_token(tmp_path / "no-such-file")


def test_launcher_defaults_to_loopback_takes_the_token_from_a_file_and_never_prints_it(
        tmp_path, prepared_repository, varied_images, reference_logits):
    token_file = tmp_path / "admin-token"
    token = "file-token-" + os.urandom(12).hex()
    token_file.write_text(token + "\n")
    # one network, one instance: the listening addresses and the token do not depend on the models (a third
    # of the shipped repository's start time)
    repository = repository_with_instances(prepared_repository, 1, tmp_path / "model_repository", entries=(MODEL,))
    with Launcher(tmp_path, None, extra_args=["--admin-token-file", str(token_file),
                                              "--model-repository", str(repository)]) as launcher:
        addresses = listening_addresses([launcher.http_port, launcher.grpc_port, launcher.metrics_port])
        assert all(addresses[p] == {"127.0.0.1"} for p in addresses), addresses
        status, _ = http_call(launcher, "GET", "/v2/logging", headers={ADMIN_TOKEN_HEADER: token})
        assert status == 200
        assert http_call(launcher, "GET", "/v2/logging")[0] == 403
        with grpcclient.InferenceServerClient(launcher.grpc_url) as triton:
            triton.get_log_settings(headers={GRPC_ADMIN_TOKEN_HEADER: token})
        with client(launcher, "grpc") as triton:
            assert_correct(infer_image(triton, "grpc", MODEL, varied_images[:1]), reference_logits(varied_images[:1]))
    printed = launcher.output() + launcher.log_file.read_text(errors="replace")
    assert serve.READY_LINE in printed and token not in printed
