"""The light load generator (loadtest/grpc_flood.py) against the session's real server, on the CPU.

A short step through two processes, plainly and through system shared memory: every request it says it sent
is one Triton counted (Triton's own metrics), the step record has the fields of a locust step plus its
`load_generator` and `shared_memory`, its own CPU use is measured, and it leaves no region behind.
"""

from __future__ import annotations

import json

import pytest
import tritonclient.grpc as grpcclient

from fusedresnet.backend.spec import MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.client.shared_memory import shared_memory_status
from fusedresnet.loadtest import grpc_flood
from fusedresnet.loadtest.image_pool import build_image_pool, save_image_pool

LOCUST_STEP_FIELDS = ("model", "protocol", "users", "images_per_request", "input_format", "processes", "img_per_s",
                      "req_per_s", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "sent", "completed", "succeeded",
                      "failures", "measured_requests", "triton_success_run", "triton_failure_run", "avg_batch",
                      "queue_us", "compute_infer_us", "request_us", "client_cpu_saturated", "problems")


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory):
    return save_image_pool(build_image_pool(12), tmp_path_factory.mktemp("pool") / "pool.npy")


@pytest.mark.parametrize("model, shared_memory, images_per_request", [(MODEL_CUSTOM, "none", 1),
                                                                       (MODEL_CUDNN, "system", 2)])
def test_a_short_step_is_counted_by_triton_and_records_its_own_cpu(triton_server, admin_token, pool_file, model,
                                                                  shared_memory, images_per_request):
    step = grpc_flood.run_step(model, triton_server.grpc_url, triton_server.metrics_url, concurrency=4,
                               images_per_request=images_per_request, processes=2, warmup_s=0.5, measure_s=2.0,
                               image_pool=pool_file, shared_memory=shared_memory, admin_token=admin_token)
    assert set(LOCUST_STEP_FIELDS) <= set(step)
    assert step["load_generator"] == "grpc_flood" and step["shared_memory"] == shared_memory
    assert step["input_format"] == "IMAGE"
    assert step["failures"] == 0, step["error_examples"]
    assert step["problems"] == []
    # Triton's counters, from its metrics endpoint, against what the generator says it sent.
    assert step["sent"] == step["completed"] == step["triton_success_run"] > 0
    assert step["triton_failure_run"] == 0 and step["other_models_requests_run"] == 0
    assert step["triton_inferences_run"] == step["sent"] * images_per_request
    assert 0 < step["measured_requests"] <= step["sent"]
    assert step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["max_ms"]
    assert step["processes"] == 2 and step["users"] == 4
    # Its own CPU (psutil; a few requests a second on this CPU server may take under one clock tick), and the
    # host's, busy with the server's computing.
    assert 0 <= step["client_cpu_percent_max_process"] <= step["client_cpu_percent"] < 100 * step["processes"]
    assert step["client_cpu_saturated"] is False and step["host_cpu_percent"] > 0
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as triton:
        left = shared_memory_status(triton, "grpc", "system", admin_token)
    assert not [name for name in left if name.startswith("fusedresnet-")]


def test_cli_writes_the_step_record(triton_server, admin_token, pool_file, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDRESNET_ADMIN_TOKEN", admin_token)
    out = tmp_path / "step.json"
    assert grpc_flood.main(["--model", MODEL_CUSTOM, "--url", triton_server.grpc_url,
                            "--metrics-url", triton_server.metrics_url, "--concurrency", "2", "--processes", "1",
                            "--seconds", "1", "--warmup-s", "0.3", "--image-pool", str(pool_file),
                            "--input-format", "IMAGE_NORMALIZED", "--shared-memory", "system", "--out", str(out)]) == 0
    step = json.loads(out.read_text())
    assert step["shared_memory"] == "system" and step["sent"] == step["triton_success_run"]
    assert step["input_format"] == "IMAGE_NORMALIZED" and step["failures"] == 0
