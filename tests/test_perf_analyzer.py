"""The perf_analyzer run's parts that do not need the GPU host: its CSV, its commands, its model repository
with the zero-answer model (served here by the real Triton server), and the report's sections."""

from __future__ import annotations

import numpy as np
import pytest

from fusedresnet.backend.spec import (
    ADMIN_TOKEN_HEADER,
    GRPC_ADMIN_TOKEN_HEADER,
    INPUT_UINT8,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    NUM_CLASSES,
    ZERO_MODEL,
    model_config,
)
from fusedresnet.loadtest import perf_analyzer, report
from fusedresnet.loadtest.measurements import cpu_list

# Verbatim from upstream: triton-inference-server/perf_analyzer, docs/measurements_metrics.md
# ("Visualizing Latency vs. Throughput"), the output of
# `perf_analyzer -m inception_graphdef --concurrency-range 1:4 -f perf.csv`.
UPSTREAM_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    """\
1,69.2,225,2148,64,206,11781,19,0,13891,18795,19753,21018
3,84.2,237,1768,21673,209,11742,17,0,35398,43984,47085,51701
4,84.2,279,1604,33669,233,11731,18,1,47045,56545,59225,64886
2,87.2,235,1973,9151,190,11346,17,0,21874,28557,29768,34766
""")
# The older perf_client format (TensorRT Inference Server 1.x docs): one "Server Compute" column.
PERF_CLIENT_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,160.8,68,1291,38,4801,7,6212,6289,6328,7407\n")


def test_upstream_perf_analyzer_csv_is_read_with_latencies_in_ms():
    rows = perf_analyzer.parse_csv(UPSTREAM_CSV)
    assert [row["concurrency"] for row in rows] == [1, 3, 4, 2]
    first = rows[0]
    assert first["img_per_s"] == 69.2
    assert (first["p50_ms"], first["p90_ms"], first["p95_ms"], first["p99_ms"]) == (13.891, 18.795, 19.753, 21.018)
    assert (first["pa_queue_us"], first["pa_compute_input_us"], first["pa_compute_infer_us"],
            first["pa_compute_output_us"]) == (64, 206, 11781, 19)
    assert rows[3]["client_send_us"] == 235 and rows[3]["network_server_send_recv_us"] == 1973


def test_a_csv_without_perf_analyzer_columns_is_refused_naming_them():
    with pytest.raises(ValueError, match="Server Compute Input"):
        perf_analyzer.parse_csv(PERF_CLIENT_CSV)


def test_commands_carry_the_admin_token_without_a_space_and_the_shared_memory_sizes(tmp_path):
    grpc = perf_analyzer.command(tmp_path / "pa", MODEL_CUSTOM, "grpc", "127.0.0.1:8001", 32, 16, "cuda", "s3cret",
                                 tmp_path / "x.csv")
    assert grpc[grpc.index("-H") + 1] == f"{GRPC_ADMIN_TOKEN_HEADER}:s3cret" == "triton-grpc-protocol-admin-key:s3cret"
    assert grpc[grpc.index("--shared-memory") + 1] == "cuda"
    assert int(grpc[grpc.index("--output-shared-memory-size") + 1]) == 32 * NUM_CLASSES * 4
    assert grpc[grpc.index("-b") + 1] == "32" and grpc[grpc.index("--concurrency-range") + 1] == "16:16"
    http = perf_analyzer.command(tmp_path / "pa", MODEL_CUDNN, "http", "127.0.0.1:8000", 1, 1, "none", "s3cret",
                                 tmp_path / "y.csv")
    assert http[http.index("-H") + 1] == f"{ADMIN_TOKEN_HEADER}:s3cret" and "--shared-memory" not in http
    shown = perf_analyzer.shown(http, "s3cret")
    assert "s3cret" not in shown and "-H admin-key:$FUSEDRESNET_ADMIN_TOKEN" in shown
    assert shown.startswith("pa -m resnet18_cudnn -i http -u 127.0.0.1:8000 -b 1 ") and " -f y.csv" in shown


def test_load_cores_parse_and_the_default_leaves_the_server_cores():
    assert cpu_list("12-15") == [12, 13, 14, 15]
    assert cpu_list("0,2,4-5") == [0, 2, 4, 5]
    default = set(cpu_list(perf_analyzer.default_load_cores()))
    import os
    assert default and default <= os.sched_getaffinity(0)


def test_repository_holds_the_entries_asked_and_the_zero_model_with_the_shipped_contract(prepared_repository,
                                                                                         tmp_path):
    shipped = model_config(MODEL_CUSTOM).SerializeToString()
    folder = perf_analyzer.build_repository(tmp_path / "repo", entries=(MODEL_CUSTOM,), instances=8)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [MODEL_CUSTOM, ZERO_MODEL]
    assert model_config(MODEL_CUSTOM, folder).instance_group[0].count == 8
    assert model_config(MODEL_CUSTOM).SerializeToString() == shipped     # the shipped config is untouched
    custom, zero = model_config(MODEL_CUSTOM), model_config(ZERO_MODEL, folder)
    assert zero.name == ZERO_MODEL and zero.input == custom.input
    assert [o.name for o in zero.output] == [o.name for o in custom.output]
    assert zero.max_batch_size == custom.max_batch_size and zero.dynamic_batching == custom.dynamic_batching
    assert zero.instance_group == model_config(MODEL_CUSTOM, folder).instance_group
    assert set(zero.parameters) == {"FORCE_CPU_ONLY_INPUT_TENSORS"}


def test_zero_model_answers_zero_logits_on_the_real_server(prepared_repository, tmp_path, admin_token):
    import os

    from fusedresnet.client.resnet_client import ResNetClient
    folder = perf_analyzer.build_repository(tmp_path / "repo", entries=(), instances=1)
    cores = set(os.sched_getaffinity(0))
    # the shipped launcher's layout (one process on a host without a GPU), as every perf_analyzer step uses it
    with perf_analyzer.pinned_server(folder, admin_token, cores, cores, tmp_path / "server.log") as server:
        cpu_before = perf_analyzer.server_cpu_seconds(server)
        assert len(server.servers) == 1 and server.first.mps_environment is None
        for protocol in ("grpc", "http"):
            url = server.grpc_url if protocol == "grpc" else server.http_url
            with ResNetClient(ZERO_MODEL, protocol, url) as client:
                images = np.random.default_rng(0).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
                result = client.infer(images)
            assert result.logits.shape == (3, NUM_CLASSES) and not result.logits.any()
            assert result.engine == "zero-answer"
        with pytest.raises(Exception, match="unexpected inference input 'IMAGE_NORMALIZED'"):
            import tritonclient.grpc as grpcclient
            tensor = grpcclient.InferInput("IMAGE_NORMALIZED", [1, 3, 224, 224], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
            with grpcclient.InferenceServerClient(server.grpc_url) as raw:
                raw.infer(ZERO_MODEL, [tensor])
        with ResNetClient(ZERO_MODEL, "grpc", server.grpc_url) as client:
            for _ in range(200):
                client.infer(images)
        # the server's processes and their stubs counted (the counters tick in 10 ms: 200 calls move them)
        assert perf_analyzer.server_cpu_seconds(server) > cpu_before
    assert os.sched_getaffinity(0) == cores


def test_plain_grpc_runs_spread_over_connections_and_shared_memory_runs_keep_one(tmp_path):
    def run(protocol, shm, in_flight):
        args = perf_analyzer.command(tmp_path / "pa", MODEL_CUSTOM, protocol, "127.0.0.1:8001", 1, in_flight, shm,
                                     "t", tmp_path / "x.csv")
        return perf_analyzer.run_environment(protocol, shm, in_flight), args
    environment, args = run("grpc", "none", 64)
    assert environment == {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"}
    assert args[args.index("--max-threads") + 1] == "16"
    environment, args = run("grpc", "none", 8)
    assert args[args.index("--max-threads") + 1] == "8"
    environment, args = run("grpc", "none", 1)     # one in flight: one connection, its statistics beside it
    assert environment == {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1024"} and "--max-threads" not in args
    for shm in ("cuda", "system"):      # one channel: the regions' process gets every call
        environment, args = run("grpc", shm, 64)
        assert environment == {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1024"} and "--max-threads" not in args
    environment, args = run("http", "none", 64)
    assert environment == {} and "--max-threads" not in args


def step(model, generator, images, shm, users, img_per_s, p50, p99):
    return {"model": model, "load_generator": generator, "protocol": "grpc", "images_per_request": images,
            "input_format": INPUT_UINT8, "shared_memory": shm, "users": users, "concurrency": users,
            "img_per_s": img_per_s, "p50_ms": p50, "p99_ms": p99, "sent": 10, "failures": 0, "measured_requests": 10,
            "problems": []}


def test_report_compares_with_the_zero_model_and_checks_the_targets_of_issue_31():
    pa = perf_analyzer.PERF_ANALYZER
    zero = ZERO_MODEL
    steps = [step(MODEL_CUSTOM, pa, 1, "none", 1, 700, 1.40, 2.0), step(zero, pa, 1, "none", 1, 900, 1.00, 1.5),
             step(MODEL_CUSTOM, pa, 32, "none", 32, 46_000, 20, 30), step(zero, pa, 32, "none", 32, 50_000, 19, 25),
             step(MODEL_CUSTOM, pa, 32, "cuda", 32, 80_000, 10, 12),
             # the serving story's best server setting counts for the CUDA shared-memory target
             dict(step(MODEL_CUSTOM, pa, 32, "cuda", 64, 96_000, 10, 13), server_setting="mps8", story_step=5),
             # the latency probe: one instance per model, one request in flight
             dict(step(MODEL_CUSTOM, pa, 1, "none", 1, 800, 1.20, 1.6), server_setting="instances1",
                  execute_engine_us=155.0, compute_infer_us=700.0),
             dict(step(zero, pa, 1, "none", 1, 1000, 0.95, 1.3), server_setting="instances1", compute_infer_us=290.0)]
    text = "\n".join(report.ceiling_section(report.grouped(steps), steps))
    assert ("| custom, CUDA shared memory, 32 images/request (perf_analyzer, best server setting) | >= 95,000 img/s "
            "| 96,000 img/s (64 in flight, p99 13.00 ms, server: mps8) | met |") in text
    assert "32 images/request, peak against the zero model's | >= 90% | 92% | met |" in text
    assert "1 image/request, peak against the zero model's | >= 90% | 78% | **not met** |" in text
    assert "1.40 - 1.00 = +0.40 ms | **not met** |" in text
    assert "| the same, server setting instances1 | <= +0.3 ms | 1.20 - 0.95 = +0.25 ms | met |" in text
    assert "compute infer 700 us against the zero model's 290 us" in text and "engine 155" in text
    shipped_only = [s for s in steps if not s.get("server_setting")]
    assert "80,000 img/s (32 in flight, p99 12.00 ms, server: as shipped) | **not met** |" in "\n".join(
        report.ceiling_section(report.grouped(shipped_only), shipped_only))


def test_each_step_measures_a_fixed_request_count_after_a_warm_up(tmp_path):
    def counts(images, in_flight):
        args = perf_analyzer.command(tmp_path / "pa", MODEL_CUSTOM, "grpc", "127.0.0.1:8001", images, in_flight,
                                     "none", "t", tmp_path / "x.csv")
        return int(args[args.index("--request-count") + 1]), int(args[args.index("--warmup-request-count") + 1]), args
    one, warm, args = counts(1, 64)
    assert one == 64_000 and warm == 12_800 and "--async" in args and "--measurement-interval" not in args
    assert counts(32, 32)[0] == round(32_000 / 32 ** 0.5)
    single, _, args = counts(1, 1)
    assert single == perf_analyzer.MIN_REQUESTS and "--async" not in args     # one in flight: synchronous calls


def test_cross_check_pairs_the_two_load_generators_on_the_same_traffic():
    on_mps = dict(step(MODEL_CUSTOM, perf_analyzer.PERF_ANALYZER, 32, "cuda", 32, 99_000, 9, 11), server_setting="mps")
    records = [on_mps,   # a serving-story step on another server setting: not the flood's twin
               dict(step(MODEL_CUSTOM, perf_analyzer.PERF_ANALYZER, 32, "cuda", 32, 90_000, 10, 12), story_step=2),
               step(MODEL_CUSTOM, "grpc_flood", 32, "cuda", 32, 75_000, 12, 20),
               step(MODEL_CUSTOM, "grpc_flood", 1, "none", 64, 20_000, 3, 6)]   # no perf_analyzer twin: no pair
    pairs = perf_analyzer.cross_check(records)
    assert len(pairs) == 1 and pairs[0]["ratio"] == pytest.approx(1.2)
    assert "| resnet18_custom | 32 | cuda | 32 | 90,000.0 | 75,000.0 | 1.20 |" in "\n".join(
        report.cross_check_section(pairs))


def test_a_step_that_measured_nothing_is_reported_as_a_problem_not_a_crash(tmp_path):
    # As on the H100 (2026-11-26): perf_analyzer timed out at 64 in flight and left no figures for that step.
    pa = perf_analyzer.PERF_ANALYZER
    failed = step(MODEL_CUSTOM, pa, 1, "none", 64, None, None, None)
    failed["problems"] = ["perf_analyzer gave no result (exit code 124): timed out after 90 s"]
    steps = [step(MODEL_CUSTOM, pa, 1, "none", 1, 729, 1.24, 2.35), step(MODEL_CUDNN, pa, 1, "none", 1, 599, 1.53, 2.9),
             failed, step(MODEL_CUDNN, pa, 1, "none", 64, 11_828, 5.11, 14.18)]
    for index, s in enumerate(steps):
        s["index"] = index
    results = {"device": "test", "date": "2026-11-26", "commit": "test", "command": "test", "steps": steps}
    report.write_report(results, tmp_path, "partial")
    text = (tmp_path / "partial.md").read_text()
    assert "SANITY MISMATCH in 1 check(s)" in text
    assert "perf_analyzer gave no result (exit code 124)" in text
    assert "729" in text and "11,828" in text
