"""The load-test sweep for real on the CPU: locust traffic to the real Triton server, its metrics, the report.

One tiny sweep (both models; gRPC at two levels, HTTP with 2-image requests through
two locust processes; a few seconds per step) runs once for the module; the
tests read what it wrote.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import threading

import numpy as np
import pytest

from fusedresnet.backend.spec import INPUT_FP32, MODEL_CUDNN, MODEL_CUSTOM, MODELS
from fusedresnet.client.preprocess import model_input
from fusedresnet.client.resnet_client import ResNetClient, build_request, response_bytes
from fusedresnet.loadtest import report, sweep, triton_metrics
from fusedresnet.loadtest.h2load_step import h2load_path
from fusedresnet.loadtest.image_pool import RequestWindows, build_image_pool
from fusedresnet.loadtest.step import Series, sanity_problems

TINY_SERIES = ("grpc/1@1,2", "http/2@2")
STEP_FIELDS = ("model", "protocol", "users", "images_per_request", "img_per_s", "p50_ms", "p99_ms", "sent",
               "failures", "avg_batch")
REPORT_SUFFIXES = (".json", ".csv", ".md", "_latency_vs_throughput.png", "_throughput_by_users.png",
                   "_server_time.png")


def server_options(server) -> list[str]:
    return ["--host", "127.0.0.1", "--grpc-port", str(server.grpc_port), "--http-port", str(server.http_port),
            "--metrics-port", str(server.metrics_port)]


@pytest.fixture(scope="module")
def tiny_sweep(triton_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    argv = server_options(triton_server) + [
        "--warmup-s", "1", "--measure-s", "3", "--processes", "2", "--pool-size", "24",
        "--agreement-images", "0", "--out", str(out), "--raw-dir", str(out / "raw")]
    for series in TINY_SERIES:
        argv += ["--series", series]
    exit_code = sweep.main(argv)
    results = json.loads((out / f"{sweep.DEFAULT_NAME}.json").read_text())
    return exit_code, results, out


def test_tiny_sweep_runs_both_models_at_every_level_of_every_series(tiny_sweep):
    exit_code, results, _ = tiny_sweep
    assert exit_code == 0
    ran = {(s["model"], s["protocol"], s["images_per_request"], s["users"]) for s in results["steps"]}
    assert ran == {(m, "grpc", 1, 1) for m in MODELS} | {(m, "grpc", 1, 2) for m in MODELS} \
        | {(m, "http", 2, 2) for m in MODELS}
    for step in results["steps"]:
        assert all(step[field] is not None for field in STEP_FIELDS), step
        assert step["img_per_s"] > 0 and step["measured_requests"] > 0
        assert step["failures"] == 0


def test_every_request_sent_is_counted_by_locust_and_by_triton(tiny_sweep):
    _, results, _ = tiny_sweep
    for step in results["steps"]:
        assert step["problems"] == [], step
        assert step["sent"] > 0
        assert step["sent"] == step["completed"] == step["locust_requests"]
        assert step["sent"] == step["triton_success_run"] + step["triton_failure_run"]
        assert step["triton_inferences_run"] == step["triton_success_run"] * step["images_per_request"]
        assert step["other_models_requests_run"] == 0


def test_two_locust_processes_each_record_their_requests(tiny_sweep):
    _, results, out = tiny_sweep
    http_steps = [s for s in results["steps"] if s["protocol"] == "http"]
    assert http_steps and all(s["processes"] == 2 for s in http_steps)
    for step in http_steps:
        step_dir = next((out / "raw").glob(f"{step['index']:02d}-*"))
        assert len(list(step_dir.glob("requests-*.npz"))) == 2


def test_models_alternate_which_goes_first_from_level_to_level(tiny_sweep):
    _, results, _ = tiny_sweep
    steps = sorted(results["steps"], key=lambda s: s["index"])
    pairs = [(steps[i]["model"], steps[i + 1]["model"]) for i in range(0, len(steps), 2)]
    assert pairs == [(MODEL_CUSTOM, MODEL_CUDNN), (MODEL_CUDNN, MODEL_CUSTOM), (MODEL_CUSTOM, MODEL_CUDNN)]
    for first, second in zip(steps[::2], steps[1::2]):
        assert (first["protocol"], first["users"]) == (second["protocol"], second["users"])


def test_latency_and_server_time_figures_are_consistent(tiny_sweep):
    _, results, _ = tiny_sweep
    for step in results["steps"]:
        assert 0 < step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"]
        assert step["img_per_s"] == pytest.approx(step["req_per_s"] * step["images_per_request"])
        # The dynamic batcher can only join requests that are in flight together. (Over the whole
        # run: the window's counters are read under load and may be one batch apart.)
        run_batch = step["triton_inferences_run"] / step["triton_executions_run"]
        assert step["images_per_request"] <= run_batch <= step["users"] * step["images_per_request"]
        assert step["avg_batch"] > 0
        parts = [step[key] for key in triton_metrics.TIME_BREAKDOWN]
        assert all(part >= 0 for part in parts)
        # A request's time in the server covers its queueing and computing; its client waits longer still.
        assert sum(parts) <= step["request_us"] * 1.01
        assert step["request_us"] / 1e3 <= step["p99_ms"] * 1.1
        assert step["gpu_utilization"] is None or 0 <= step["gpu_utilization"] <= 1


def test_report_files_are_written_and_the_markdown_ratios_match_the_json(tiny_sweep):
    _, results, out = tiny_sweep
    for suffix in REPORT_SUFFIXES:
        path = out / f"{sweep.DEFAULT_NAME}{suffix}"
        assert path.is_file() and path.stat().st_size > 0, path
        if suffix.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"device", "date", "command", "steps"} <= set(results)
    assert "CPU" in results["device"] and "--series" in results["command"]
    rows = list(csv.DictReader(open(out / f"{sweep.DEFAULT_NAME}.csv")))
    assert len(rows) == len(results["steps"])
    assert [float(r["img_per_s"]) for r in rows] == pytest.approx([s["img_per_s"] for s in results["steps"]])
    text = (out / f"{sweep.DEFAULT_NAME}.md").read_text()
    by_key = {(s["protocol"], s["users"], s["model"]): s for s in results["steps"]}
    custom, cudnn = by_key[("grpc", 1, MODEL_CUSTOM)], by_key[("grpc", 1, MODEL_CUDNN)]
    row = (f" | {report.number(custom['img_per_s'])} | {report.number(cudnn['img_per_s'])} | "
           f"{report.number(custom['img_per_s'] / cudnn['img_per_s'], 2)} | {report.number(custom['p50_ms'], 2)} |")
    assert row in text
    assert "All 6 steps add up" in text and "SANITY MISMATCH" not in text


def test_latency_plot_names_only_the_models_the_sweep_measured(tiny_sweep, tmp_path):
    _, results, _ = tiny_sweep
    legends = report.plot_latency_vs_throughput(report.grouped(results["steps"]), tmp_path / "latency.png")
    expected = [f"{report.MODEL_SHORT[m]} {p}" for m in report.MODEL_COLORS if m in MODELS for p in ("p50", "p99")]
    assert legends and all(sorted(legend) == sorted(expected) for legend in legends), legends


def test_report_redraws_from_the_saved_json(tiny_sweep, tmp_path):
    _, _, out = tiny_sweep
    assert report.main([str(out / f"{sweep.DEFAULT_NAME}.json"), "--out", str(tmp_path)]) == 0
    for suffix in REPORT_SUFFIXES:
        assert (tmp_path / f"{sweep.DEFAULT_NAME}{suffix}").is_file()


def test_traffic_from_outside_the_sweep_is_caught_as_a_mismatch(triton_server, varied_images, tmp_path, capsys):
    """Someone else's requests during a step make Triton's counts differ from the users': exit code 3."""
    stop = threading.Event()

    def send_to_the_baseline():
        with ResNetClient(MODEL_CUDNN, "grpc", triton_server.grpc_url) as client:
            while not stop.is_set():
                client.infer(varied_images[:1])

    intruder = threading.Thread(target=send_to_the_baseline)
    intruder.start()
    try:
        exit_code = sweep.main(server_options(triton_server) + [
            "--series", "grpc/1@1", "--warmup-s", "0.5", "--measure-s", "1.5", "--pool-size", "8",
            "--agreement-images", "0", "--out", str(tmp_path), "--raw-dir", str(tmp_path / "raw")])
    finally:
        stop.set()
        intruder.join()
    assert exit_code == sweep.EXIT_SANITY_MISMATCH
    assert "SANITY MISMATCH" in capsys.readouterr().err
    steps = {s["model"]: s for s in json.loads((tmp_path / f"{sweep.DEFAULT_NAME}.json").read_text())["steps"]}
    assert any("other model" in p for p in steps[MODEL_CUSTOM]["problems"])
    assert any("Triton counted" in p for p in steps[MODEL_CUDNN]["problems"])
    assert "SANITY MISMATCH" in (tmp_path / f"{sweep.DEFAULT_NAME}.md").read_text()


def test_a_count_mismatch_is_reported_loudly(tiny_sweep, tmp_path):
    _, results, _ = tiny_sweep
    step = dict(results["steps"][0])
    step["triton_success_run"] -= 1           # as if Triton never saw one request the users sent
    problems = sanity_problems(step)
    assert any("Triton counted" in problem for problem in problems)
    broken = dict(results, steps=[dict(step, problems=problems)] + results["steps"][1:])
    report.write_report(broken, tmp_path, "broken")
    assert "SANITY MISMATCH" in (tmp_path / "broken.md").read_text()


def test_metrics_endpoint_parses_into_per_model_counters(triton_server):
    snapshot = triton_metrics.scrape(triton_server.metrics_url)
    for model in MODELS:
        assert any(s.name == triton_metrics.SUCCESS and s.labels.get("model") == model for s in snapshot.samples)
        assert snapshot.total(triton_metrics.INFERENCES, model) >= snapshot.total(triton_metrics.EXECUTIONS, model)


def test_request_windows_give_distinct_consecutive_batches_from_distinct_images():
    pool = build_image_pool(12, seed=3)
    flat = pool.reshape(len(pool), -1)
    assert len({row.tobytes() for row in flat}) == len(pool)
    windows = RequestWindows(model_input(pool, INPUT_FP32), images_per_request=4, offset=7)
    batches = [windows.next() for _ in range(windows.starts)]
    assert all(b.shape == (4, 3, 224, 224) and b.dtype == np.float32 for b in batches)
    assert len({b.tobytes() for b in batches}) == windows.starts


def test_series_syntax_names_protocol_images_input_and_levels():
    series = Series.parse("http/8/IMAGE_NORMALIZED@4,16")
    assert (series.protocol, series.images_per_request, series.input_format, series.levels) == \
        ("http", 8, "IMAGE_NORMALIZED", (4, 16))
    assert Series.parse("grpc/1@1").input_format == "IMAGE"
    with pytest.raises(argparse.ArgumentTypeError):
        Series.parse("http/8/fp32@4,16")        # inputs are named as the model names them


def test_report_reads_sweeps_saved_with_the_old_input_names(tiny_sweep, tmp_path):
    _, results, _ = tiny_sweep
    old = dict(results, steps=[dict(step, input_format={"IMAGE": "uint8", "IMAGE_NORMALIZED": "fp32"}[
        step["input_format"]]) for step in results["steps"]], agreement={"input_format": "fp32", "sets": {}})
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(old))
    read = report.read_results(saved)
    assert {step["input_format"] for step in read["steps"]} == {"IMAGE"}
    assert read["agreement"]["input_format"] == "IMAGE_NORMALIZED"
    assert report.main([str(saved), "--out", str(tmp_path / "report")]) == 0
    assert "1 image/request, IMAGE (locust)" in (tmp_path / "report" / "old.md").read_text()


def test_targets_section_says_which_serving_targets_a_sweep_meets():
    def step(model, images, shared_memory, users, img_per_s, p50, p99, max_ms):
        return {"model": model, "load_generator": "grpc_flood", "protocol": "grpc", "images_per_request": images,
                "input_format": "IMAGE", "shared_memory": shared_memory, "processes_asked": 8, "users": users,
                "img_per_s": img_per_s, "p50_ms": p50, "p99_ms": p99, "max_ms": max_ms, "sent": 1, "failures": 0,
                "measured_requests": 1}
    custom, cudnn = report.MODEL_CUSTOM, report.MODEL_CUDNN
    steps = [step(custom, 1, "none", 1, 700, 1.4, 4.0, 9.0), step(cudnn, 1, "none", 1, 600, 1.6, 4.5, 9.5),
             step(custom, 1, "none", 256, 21_000, 12.0, 60.0, 70.0),     # fastest, but p99 over 50 ms
             step(cudnn, 1, "none", 256, 15_000, 16.0, 40.0, 45.0),
             step(custom, 1, "none", 128, 19_000, 6.0, 30.0, 40.0),
             step(cudnn, 1, "none", 128, 14_000, 8.0, 35.0, 44.0),
             step(custom, 32, "cuda", 16, 46_000, 10.0, 20.0, 30.0),
             step(cudnn, 32, "cuda", 16, 30_000, 15.0, 25.0, 31.0)]
    text = "\n".join(report.targets_section({"bottlenecks": "THE ANALYSIS"}, report.grouped(steps)))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    one = rows["gRPC, 1 image/request (p99 <= 50 ms)"]
    assert "19,000 img/s (128 in flight" in one and "**not met**" in one   # 21k had p99 60 ms
    assert "46,000 img/s" in rows["CUDA shared memory, 32 images/request"]
    assert rows["CUDA shared memory, 32 images/request"].endswith("| met |")
    assert "-" in rows["gRPC, 32 images/request"] and "**not met**" in rows["gRPC, 32 images/request"]
    assert rows["1 request in flight (grpc_flood)"].endswith("| met |")
    assert "3 of 4 levels" not in text and "4 of 4 levels" in text
    # the 1-image series peaks (95% of 21k) at 256 in flight, whose slowest request took 70 ms
    slowest = next(line for name, line in rows.items() if name.startswith("slowest request"))
    assert "70.0 ms" in slowest and "**not met**" in slowest
    assert "THE ANALYSIS" in text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_locust_response_length_is_the_bytes_received_not_the_image_count(triton_server, varied_images, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    with ResNetClient(MODEL_CUSTOM, protocol, url) as client:
        for count in (1, 4):
            inputs, outputs = build_request(protocol, varied_images[:count], engine=False)
            received = response_bytes(client.client.infer(MODEL_CUSTOM, inputs, outputs=outputs))
            logits = count * 1000 * 4     # fp32 [count, 1000] on the wire, plus a header of a few hundred bytes
            assert logits < received < logits + 512, (count, received)


def test_the_server_cpu_by_thread_pool_counts_a_busy_named_thread_and_not_an_idle_one():
    """loadtest/measurements.tree_thread_cpu_seconds, as front_door samples it around a step: a child process with
    a thread named 'spinner7' that computes for a while and one named 'sleeper' that waits. The busy pool shows the
    time it computed, under its name without the index; the idle one next to nothing."""
    import subprocess
    import sys
    import time

    import psutil

    from fusedresnet.loadtest.measurements import thread_group, tree_thread_cpu_seconds

    child_code = """
import ctypes, threading, time
libc = ctypes.CDLL(None)
def named(name, work):
    def run():
        libc.prctl(15, name.encode(), 0, 0, 0)   # PR_SET_NAME: the thread's own comm
        work()
    return threading.Thread(target=run)
def spin():
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        sum(range(1000))
    time.sleep(30)                              # alive, idle, while sampled
threads = [named("spinner7", spin), named("sleeper", lambda: time.sleep(30))]
for t in threads: t.start()
print("started", flush=True)
time.sleep(30)
"""
    child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        time.sleep(1.7)
        pools = tree_thread_cpu_seconds(psutil.Process(child.pid))
        name = psutil.Process(child.pid).name()
    finally:
        child.kill()
        child.wait()
    assert pools[thread_group(name, "spinner7")] == pytest.approx(1.5, abs=0.5), pools
    assert thread_group(name, "spinner7") == f"{name}/spinner"
    assert pools.get(f"{name}/sleeper", 0.0) < 0.1, pools


def test_serving_cost_divides_each_stage_by_the_images_served():
    """campaigns/serving_cost.stage_rows on a front_door step: 1,000 img/s with 200% of a core in the EventEngine
    threads, 100% in tritonserver's others and 50% in the stubs is 2,000, 1,000 and 500 µs of CPU per image."""
    from fusedresnet.campaigns import serving_cost

    step = {"processes_per_gpu": 2, "model": MODEL_CUSTOM, "images_per_request": 32, "shared_memory": False,
            "img_per_s": 1000.0, "server_cpu_percent": 350.0,
            "server_cpu_percent_by_thread": {"tritonserver/event_engine": 200.0, "tritonserver/tritonserver": 60.0,
                                             "tritonserver/default-executo": 40.0,
                                             "triton_python_backend_stub/triton_python_b": 50.0}}
    stages, runs = serving_cost.stage_rows("before", "inprocess", {"layouts": [step]})
    per_stage = {row["name"]: row["cpu_us_per_image_32"] for row in stages}
    names = [name for name, _ in serving_cost.STAGES]
    assert per_stage == {names[0]: 2000.0, names[1]: 1000.0, names[2]: 500.0}
    assert all(row["cpu_us_per_image_1"] is None for row in stages)
    assert runs == [{"code": "before", "front_end": "inprocess", "model": MODEL_CUSTOM, "images_per_request": 32,
                     "shared_memory": False, "protocol": "grpc", "processes_per_gpu": 2, "img_per_s": 1000.0,
                     "server_cpu_cores": 3.5,
                     "cpu_us_per_image": 3500.0, "gpu_util": None}]


def test_a_levers_figures_are_its_plain_grpc_steps_with_the_stubs_share():
    """campaigns/serving_cost.lever_rows: per plain-gRPC step of a lever's report, img/s, the server's CPU per image
    and the stubs' part of it; shared-memory steps left out."""
    from fusedresnet.campaigns import serving_cost

    def step(images, shm, img_per_s, stub_percent):
        return {"processes_per_gpu": 2, "model": MODEL_CUSTOM, "images_per_request": images, "shared_memory": shm,
                "img_per_s": img_per_s, "server_cpu_percent": 400.0,
                "server_cpu_percent_by_thread": {"tritonserver/tritonserver": 400.0 - stub_percent,
                                                 "triton_python_backend_stub/triton_python_b": stub_percent}}
    rows = serving_cost.lever_rows("registered", {"layouts": [step(1, False, 2000.0, 100.0),
                                                              step(32, False, 4000.0, 40.0),
                                                              step(32, True, 8000.0, 10.0)]})
    assert [(r["images_per_request"], r["img_per_s"], r["cpu_us_per_image"], r["stub_cpu_us_per_image"])
            for r in rows] == [(1, 2000.0, 2000.0, 500.0), (32, 4000.0, 1000.0, 100.0)]
    assert {r["lever"] for r in rows} == {"registered"}

def test_retries_wait_the_first_backoff_then_double_up_to_the_longest():
    """client/resnet_client.backoff_waits, the one retry schedule of the project's HTTP client and of the soaks'
    valid clients: 0.1 s, doubling, capped at 1 s (RETRY_BACKOFF_S)."""
    from itertools import islice

    from fusedresnet.client.resnet_client import RETRY_BACKOFF_S, backoff_waits

    assert RETRY_BACKOFF_S == (0.1, 1.0)
    assert list(islice(backoff_waits(), 6)) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert list(islice(backoff_waits(0.25, 0.5), 3)) == [0.25, 0.5, 0.5]


def test_the_metrics_sampler_averages_a_gauge_over_the_block_only():
    """loadtest/triton_metrics.Sampler (the GPU's busy share of an h2load step): snapshots from start_after_s
    until the block ends, read from a real HTTP endpoint whose gauge changes while it runs."""
    import http.server
    import time

    from robustness_helpers import text_handler

    served = []

    def gauge(port: int) -> str:
        served.append(0.25 if len(served) < 2 else 0.75)
        return f'nv_gpu_utilization{{gpu_uuid="GPU-1"}} {served[-1]}\n'

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), text_handler(gauge))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with triton_metrics.Sampler(url, interval_s=0.05, start_after_s=0.2) as sampler:
            time.sleep(0.1)
            assert sampler.snapshots == []          # not before start_after_s
            time.sleep(0.5)
        count = len(sampler.snapshots)
        time.sleep(0.2)
        assert len(sampler.snapshots) == count >= 4  # none after the block
        mean = triton_metrics.mean_gauge(sampler.snapshots, triton_metrics.GPU_UTILIZATION)
        assert mean == pytest.approx(sum(served[:count]) / count)
        assert 0.25 < mean < 0.75
    finally:
        server.shutdown()


@pytest.mark.skipif(h2load_path() is None and os.environ.get("CI") != "true",
                    reason="h2load not installed (Debian nghttp2-client; .ci/apt-packages/robustness)")
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_h2load_step_over_either_protocol_is_counted_by_triton_as_successes(triton_server, protocol):
    """loadtest/h2load_step over gRPC (HTTP/2) and over KServe HTTP/1.1 with binary tensors, against the real
    server: every call h2load finished is a success in Triton's own counters, and the bodies are right (a
    malformed one would be a failure there, an HTTP 400 or a grpc-status)."""
    from fusedresnet.loadtest.h2load_step import run_h2load_step

    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    record = run_h2load_step(MODEL_CUSTOM, url, triton_server.metrics_url, images_per_request=2, connections=2,
                             streams=2, threads=2, seconds=1.5, warmup_s=0.5, protocol=protocol)
    assert record["problems"] == [], record["problems"]
    assert record["protocol"] == protocol and record["failures"] == 0
    assert record["triton_success"] >= record["h2load"]["requests_succeeded"] > 0
    assert record["img_per_s"] > 0 and record["p50_ms"] is not None
