"""Several GPUs on one host: the launcher's --gpus, per-GPU figures from Triton's metrics,
and (on a host with two or more GPUs) engines and served models on every GPU.

The served-model test uses the session's server, which runs on every GPU of the
host: with `KIND_AUTO` and `count: N` each model has N instances per GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fusedresnet.backend import serve
from fusedresnet.backend.engines.serving import TorchScriptEngine, create_custom_engine
from fusedresnet.backend.spec import (
    EXECUTE_PHASE_METRIC,
    EXECUTIONS_METRIC,
    FOLDED_PARAMS_FILE,
    GPU_UUID_LABEL,
    IMAGES_METRIC,
    METRICS_FLUSH_S,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    MODELS,
    TORCHSCRIPT_FILE,
    ZERO_MODEL,
)
from fusedresnet.backend.triton_server.installation import ServerError, find_triton, host_gpus
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, SET_REL_L2_TOLERANCE, compare_logits
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.loadtest import triton_metrics
from fusedresnet.loadtest.measurements import cpu_list, cpu_text

GPU_COUNT = torch.cuda.device_count()
RESULTS = Path(__file__).resolve().parent.parent / "results"
several_gpus = pytest.mark.skipif(GPU_COUNT < 2, reason=f"needs two or more GPUs ({GPU_COUNT} here)")


def test_gpus_option_takes_distinct_indices_or_uuids():
    assert serve.gpu_list("0") == "0"
    assert serve.gpu_list("1, 0") == "1,0"
    assert serve.gpu_list("GPU-8f3e4c2a-0000-1111-2222-333344445555") == "GPU-8f3e4c2a-0000-1111-2222-333344445555"
    for bad in ("0,0", "cuda:1", "", "0,,1", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            serve.gpu_list(bad)


def test_gpus_option_sets_the_servers_visible_devices(tmp_path):
    triton = find_triton()
    chosen = serve.TritonServer(admin_token="t", use_gpu=True, gpus="1")
    assert chosen.environment(triton)["CUDA_VISIBLE_DEVICES"] == "1"
    assert chosen.environment(triton)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"   # nvidia-smi's numbering
    hidden = serve.TritonServer(admin_token="t", use_gpu=False, gpus="1")
    assert hidden.environment(triton)["CUDA_VISIBLE_DEVICES"] == ""


def test_gpus_option_names_a_gpu_the_host_lacks_clearly(tmp_path):
    missing = str(len(host_gpus()) + 3)
    server = serve.TritonServer(model_repository=tmp_path, admin_token="t", gpus=missing)
    with pytest.raises(ServerError, match=f"--gpus {missing}: no such GPU"):
        server.start(ready_timeout_s=5)
    assert server.process is None


def test_per_gpu_splits_a_models_images_by_device():
    def snapshot(taken_at, first, second, executions):
        def instance(name, gpu, model="m"):
            return f'gpu_uuid="{gpu}",model_instance="{name}",model="{model}"'
        text = "\n".join([
            "# TYPE nv_inference_count counter",     # Triton's own count: no GPU label in this build
            f'nv_inference_count{{model="m",version="1"}} {first + second}',
            f"# TYPE {IMAGES_METRIC} counter",     # two instances on GPU-a, one on GPU-b, another model
            f"{IMAGES_METRIC}{{{instance('m_0', 'GPU-a')}}} {first * 5 // 6}",
            f"{IMAGES_METRIC}{{{instance('m_1', 'GPU-a')}}} {first - first * 5 // 6}",
            f"{IMAGES_METRIC}{{{instance('m_2', 'GPU-b')}}} {second}",
            f"{IMAGES_METRIC}{{{instance('other_0', 'GPU-a', 'other')}}} {first * 7}",
            f"# TYPE {EXECUTIONS_METRIC} counter",
            f"{EXECUTIONS_METRIC}{{{instance('m_0', 'GPU-a')}}} {executions}",
            f"{EXECUTIONS_METRIC}{{{instance('m_2', 'GPU-b')}}} {executions // 2}",
            "# TYPE nv_gpu_utilization gauge",
            f'nv_gpu_utilization{{gpu_uuid="GPU-a"}} {0.9 if first else 0.0}',
            f'nv_gpu_utilization{{gpu_uuid="GPU-b"}} {0.3 if first else 0.0}',
        ]) + "\n"
        return triton_metrics.MetricsSnapshot(taken_at, triton_metrics.parse_prometheus_text(text))

    before, after = snapshot(100.0, 0, 0, 0), snapshot(102.0, 3000, 1000, 40)
    during = [snapshot(101.0, 600, 1, 1), after]
    split = triton_metrics.per_gpu(before, after, "m", during)
    assert sorted(split) == ["GPU-a", "GPU-b"]
    assert split["GPU-a"]["img_per_s"] == pytest.approx(1500.0)
    assert split["GPU-b"]["img_per_s"] == pytest.approx(500.0)
    assert split["GPU-a"]["share"] == pytest.approx(0.75) and split["GPU-b"]["share"] == pytest.approx(0.25)
    assert (split["GPU-a"]["executions"], split["GPU-b"]["executions"]) == (40, 20)
    assert split["GPU-a"]["utilization"] == pytest.approx(0.9) and split["GPU-b"]["utilization"] == pytest.approx(0.3)


def test_cpu_host_metrics_have_no_gpu_split(triton_server, varied_images):
    if triton_server.use_gpu:
        pytest.skip("CPU-only host check")
    before = triton_metrics.scrape(triton_server.metrics_url)
    with ResNetClient(MODEL_CUSTOM, "grpc", triton_server.grpc_url) as client:
        client.infer(varied_images[:2])
        # an instance writes its counts at most every METRICS_FLUSH_S, at its next execute(): keep
        # asking (one image at a time) until the two images show
        deadline = time.monotonic() + 30
        while True:
            time.sleep(METRICS_FLUSH_S + 0.1)
            after = triton_metrics.scrape(triton_server.metrics_url)
            counted = after.total(IMAGES_METRIC, MODEL_CUSTOM) - before.total(IMAGES_METRIC, MODEL_CUSTOM)
            if counted >= 2 or time.monotonic() > deadline:
                break
            client.infer(varied_images[2:3])
    assert counted >= 2
    assert triton_metrics.per_gpu(before, after, MODEL_CUSTOM, [after]) == {}
    for name in (EXECUTE_PHASE_METRIC, IMAGES_METRIC, EXECUTIONS_METRIC):
        labels = [s.labels for s in after.samples if s.name == name and s.labels["model"] == MODEL_CUSTOM]
        assert labels and all(label["device"] == "cpu" and not label.get(GPU_UUID_LABEL)
                              and label["model_instance"].startswith(MODEL_CUSTOM) for label in labels), name


@pytest.mark.gpu
@several_gpus
@pytest.mark.parametrize("device_index", range(1, max(GPU_COUNT, 2)))
def test_engines_run_on_every_gpu_and_match_the_reference(prepared_repository, device_index, varied_images,
                                                          reference_logits):
    device = f"cuda:{device_index}"
    pixels = torch.from_numpy(varied_images)
    reference = reference_logits(varied_images)
    custom, _ = create_custom_engine(prepared_repository / MODEL_CUSTOM / "1" / FOLDED_PARAMS_FILE, device)
    cudnn = TorchScriptEngine(prepared_repository / MODEL_CUDNN / "1" / TORCHSCRIPT_FILE, device, "fp16",
                              cuda_graphs=True)
    for engine in (custom, cudnn):
        assert engine.name in ("fused-cuda-fp16-wgmma+mma", "fused-cuda-fp16-mma", "fused-cuda-fp16-wgmma",
                               "torchscript-cudnn-fp16-channels-last-cuda-graphs")
        bucket = engine.bucket(len(pixels))
        buffer = engine.input_buffer("IMAGE", bucket)
        assert buffer.device == torch.device(device), engine.name
        # the input written and finished first; then the engine runs with the caller's current device
        # left at cuda:0, so it must bind its own device and stream itself
        with torch.inference_mode():
            buffer.fill_(0)
            buffer[:len(pixels)].copy_(pixels)
            torch.cuda.synchronize(device)
            assert torch.cuda.current_device() == 0
            logits = engine.run_buffer("IMAGE", bucket, len(pixels))
            assert logits.device == torch.device(device), engine.name
            torch.cuda.synchronize(device)
            logits = logits.float().cpu().numpy()
        stats = compare_logits(logits, reference)
        assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE, (engine.name, stats)
        assert stats["max_row_rel_l2"] <= IMAGE_REL_L2_TOLERANCE, (engine.name, stats)
        assert stats["clear_disagreements"] == 0, (engine.name, stats)


@pytest.mark.gpu
@several_gpus
@pytest.mark.parametrize("model", MODELS)
def test_served_models_have_instances_on_every_gpu_and_each_answers_right(triton_server, model, varied_images,
                                                                          reference_logits):
    log = triton_server.log_file.read_text(errors="replace")
    for index in range(GPU_COUNT):
        assert re.search(rf"{model}: engine \S+ on cuda:{index} \(", log), f"no {model} instance on cuda:{index}"
    images = varied_images[:8]
    reference = reference_logits(images)
    before = triton_metrics.scrape(triton_server.metrics_url)

    def infer(_):
        with ResNetClient(model, "grpc", triton_server.grpc_url) as client:
            return [client.infer(images).logits for _ in range(12)]

    # Enough requests in flight that every instance, on every GPU, takes batches.
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        answers = [logits for batch in pool.map(infer, range(32)) for logits in batch]
    after = triton_metrics.scrape(triton_server.metrics_url)
    for logits in answers:
        stats = compare_logits(logits, reference)
        assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE and stats["clear_disagreements"] == 0, stats
    split = triton_metrics.per_gpu(before, after, model, [after])
    assert len(split) == GPU_COUNT, split
    assert all(gpu["executions"] > 0 for gpu in split.values()), split
    assert np.isclose(sum(gpu["share"] for gpu in split.values()), 1.0), split


def scaling_step(layout, gpus, series, img_per_s, processes=8, check=None, model=MODEL_CUSTOM, cpu_percent=400.0,
                 server_share=0.5, gpu_utilization=0.4, level=32):
    return {"layout": layout, "gpus": gpus, "series": series, "series_name": series, "img_per_s": img_per_s,
            "p50_ms": 1.0, "p99_ms": 10.0, "concurrency": level * gpus, "generators": 1, "processes": processes,
            "failures": 0, "generator_cpu_percent": cpu_percent, "generator_cpu_share": cpu_percent / 1600,
            "generator_cpu_max_process": cpu_percent / processes, "server_cpu_share": server_share,
            "gpu_utilization": gpu_utilization, "avg_batch": 64.0, "level_per_gpu": level, "check": check,
            "model": model, "problems": [], "errors": []}


def test_multi_gpu_summary_takes_each_layouts_peak_against_one_gpu_at_every_count():
    from fusedresnet.campaigns import multi_gpu
    step = scaling_step
    steps = [step("one-gpu", 1, "1", 20000.0), step("one-gpu", 1, "1", 21000.0), step("one-gpu", 1, "32", 40000.0),
             step("server-per-gpu", 2, "1", 38000.0), step("server-per-gpu", 2, "32", 76000.0),
             step("server-per-gpu", 2, "32", 74000.0), step("one-server", 2, "1", 30000.0),
             {**step("one-server", 2, "32", None), "errors": ["generator exited 1: Traceback\n  x | y\nBoom"]},
             step("server-per-gpu", 4, "32", 120000.0),
             step("server-per-gpu", 4, "32", 150000.0, processes=16, check="generator-x2"),
             step("server-per-gpu", 4, "32", 900000.0, processes=16, check="zero-model", model=ZERO_MODEL)]
    entries = {(e["layout"], e["gpus"]): e for e in multi_gpu.summarize(steps, [1, 2, 4])}
    assert set(entries) == {(layout, gpus) for layout in ("server-per-gpu", "one-server") for gpus in (2, 4)}
    for entry in entries.values():      # the report's keys, per layout and GPU count
        assert {"layout", "gpus", "scaling_1", "scaling_32"} <= set(entry)
    assert entries["server-per-gpu", 2]["scaling_1"] == pytest.approx(38000 / 21000)
    assert entries["server-per-gpu", 2]["scaling_32"] == pytest.approx(76000 / 40000)
    assert entries["one-server", 2]["scaling_1"] == pytest.approx(30000 / 21000)
    assert entries["one-server", 2]["scaling_32"] is None          # a failed step is no peak
    # the doubled generator's step counts towards the peak, the zero-answer model's never does
    assert entries["server-per-gpu", 4]["scaling_32"] == pytest.approx(150000 / 40000)
    assert entries["server-per-gpu", 2]["scaling_32_target"] == 1.8
    assert entries["server-per-gpu", 4]["scaling_32_target"] == 3.5
    assert entries["server-per-gpu", 4]["limit_32"]["text"].startswith("target met (3.75x >= 3.5x)")
    text = multi_gpu.markdown({"device": "d", "date": "t", "command": "c", "gpus": 4, "generator_cores": "32-63",
                               "server_cores": "0-31", "steps": steps, "layouts": list(entries.values())})
    assert "| server-per-gpu | 2 | gRPC, 32 image(s)/request | 40000 | 76000 | **1.90x** | 1.8 |" in text
    assert "| server-per-gpu | 4 | gRPC, 32 image(s)/request | 40000 | 150000 | **3.75x** | 3.5 |" in text
    assert "- server-per-gpu, 4 GPUs: target met" in text
    assert "| generator exited 1: Traceback x / y Boom |" in text     # an error stays in its table cell


def test_gpu_counts_of_one_run_and_its_estimate():
    from fusedresnet.campaigns import multi_gpu
    assert multi_gpu.gpu_counts(2) == [1, 2]
    assert multi_gpu.gpu_counts(4) == [1, 2, 4]
    assert multi_gpu.gpu_counts(6) == [1, 2, 4, 6]
    steps, starts = multi_gpu.planned_steps([1, 2, 4])
    # per count: 4 series steps and 2 checks on the per-GPU servers; one-server at 2 and 4: 4 steps and 1 check
    assert (steps, starts) == (3 * 6 + 2 * 5, 2 + 2)
    # the 4-GPU run's measurement fits the script's budget (390 s) with a step of overrun
    assert multi_gpu.estimate_s([1, 2, 4], 3.5, 1.5) < 390


def recorded_run() -> dict:
    """The 2-GPU run of 2026-11-26 02:13 (kept in history: results/multi_gpu.json is the latest run)."""
    return json.loads((RESULTS / "history" / "serving" / "multi_gpu_2026-11-26T0213.json").read_text())


def test_limit_of_the_recorded_2_gpu_run_is_its_generator_processes():
    """The last real run (2 x H200, no checks yet): its 8 generator processes each busy past a core at
    2 GPUs, under 80% at 1 GPU: the report names the generator's processes, from those figures."""
    from fusedresnet.campaigns import multi_gpu
    steps = recorded_run()["steps"]
    best = max((s for s in steps if s["layout"] == "server-per-gpu" and s["series"] == "32"),
               key=lambda s: s["img_per_s"])
    per_process = best["generator_cpu_percent"] / best["processes"]
    assert per_process > 100
    limit = multi_gpu.limit_of(steps, "server-per-gpu", 2)
    assert [f["limit"] for f in limit["findings"]] == ["the load generator's processes"]
    assert f"each of its 8 processes at {per_process:.0f}% of a core" in limit["text"]
    assert limit["text"].startswith("limit: ")
    assert limit["figures"]["scaling"] == pytest.approx(39952 / 33048, rel=1e-3)


def limit_case(plain, doubled, zero, cpu_percent=400.0, server_share=0.5, gpu_utilization=0.4, gpus=4,
               avg_batch=64.0):
    def step(*args, **kwargs):      # the measured step's CPU, GPU and batch figures, whichever is the peak
        return {**scaling_step(*args, cpu_percent=cpu_percent, server_share=server_share,
                               gpu_utilization=gpu_utilization, **kwargs), "avg_batch": avg_batch}
    steps = [step("one-gpu", 1, "32", 33000.0), step("server-per-gpu", gpus, "32", plain)]
    if doubled:
        steps.append(step("server-per-gpu", gpus, "32", doubled, processes=16, check="generator-x2"))
    if zero:
        steps.append(step("server-per-gpu", gpus, "32", zero, processes=16, check="zero-model", model=ZERO_MODEL))
    from fusedresnet.campaigns import multi_gpu
    return multi_gpu.limit_of(steps, "server-per-gpu", gpus)


def test_limit_named_from_each_measurement_and_not_without_one():
    generator = limit_case(60000.0, 75000.0, 300000.0)
    assert [f["limit"] for f in generator["findings"]] == ["the load generator"]
    assert "16 generator processes gave +25% img/s over 8" in generator["text"]
    path = limit_case(60000.0, 61000.0, 64000.0)
    assert [f["limit"] for f in path["findings"]] == ["the servers' gRPC / Python-backend path"]
    assert "the zero-answer model 64000 img/s vs the custom model 61000 img/s (95%)" in path["text"]
    gpus = limit_case(60000.0, 60500.0, 300000.0, gpu_utilization=0.97)
    assert [f["limit"] for f in gpus["findings"]] == ["the GPUs"]
    cores = limit_case(60000.0, 60500.0, 300000.0, server_share=0.95, cpu_percent=1500.0)
    assert [f["limit"] for f in cores["findings"]] == ["the load generator's processes", "the load generator's cores",
                                                       "the servers' cores"]
    assert "each of its 16 processes at 94% of a core" in cores["text"]
    full = limit_case(60000.0, 60500.0, 300000.0, avg_batch=127.0)
    assert [f["limit"] for f in full["findings"]] == ["the model instances"]
    assert "mean batch 127 of 128" in full["text"]
    unknown = limit_case(60000.0, 60500.0, 300000.0)
    assert unknown["findings"] == [] and unknown["text"].startswith("limit not separated by these measurements: ")
    assert "zero-answer model 300000 img/s" in unknown["text"] and "16 generator processes +1%" in unknown["text"]
    met = limit_case(120000.0, 121000.0, 300000.0)
    assert met["text"].startswith("target met (3.67x >= 3.5x)")
    two = limit_case(60000.0, 61000.0, 64000.0, gpus=2)
    assert two["target"] == 1.8 and two["text"].startswith("target met")


def test_the_zero_model_check_runs_through_the_launcher_and_records_the_servers_cpu(prepared_repository, tmp_path):
    """The zero-answer check as the GPU run makes it, on this host's CPU: the scaling repository (custom
    model and zero-answer model) behind the launcher, one grpc_flood step of 32 images/request; the
    generator's window is recorded and the server's process tree (launcher, tritonserver, stubs) and
    tritonserver itself are measured over it."""
    from fusedresnet.backend.spec import MODEL_REPOSITORY
    from fusedresnet.campaigns import multi_gpu
    from fusedresnet.campaigns.serving_sequence import start_server
    from fusedresnet.loadtest.image_pool import build_image_pool, save_image_pool
    token_file = tmp_path / "token"
    token_file.write_text("unused")      # gRPC without shared memory registers nothing
    repository = multi_gpu.scaling_repository(tmp_path / "models")
    assert sorted(p.name for p in repository.iterdir() if p.is_dir()) == sorted([MODEL_CUSTOM, ZERO_MODEL])
    cores = sorted(os.sched_getaffinity(0))
    bench = multi_gpu.Bench(tmp_path, save_image_pool(build_image_pool(64), tmp_path / "pool.npy"), token_file,
                            cores, cores, seconds=1.5, warmup_s=0.5)
    launched = start_server(repository, token_file, tmp_path / "server.log", cwd=MODEL_REPOSITORY.parent)
    try:
        series = multi_gpu.Series("32", 32, "none", (2,))
        record = multi_gpu.drive(bench, "one-gpu", [launched], series, 2, 1, model=ZERO_MODEL, check="zero-model")
    finally:
        launched.stop()
    assert record["errors"] == [] and record["problems"] == [] and record["failures"] == 0, record
    assert record["img_per_s"] > 0 and record["avg_batch"] >= 1
    (generator,) = record["generator_records"]
    assert generator["model"] == ZERO_MODEL
    window = generator["window_unix"]
    assert window[1] - window[0] == pytest.approx(1.5)
    (tree,), (triton,) = record["server_cpu_percent"], record["tritonserver_cpu_percent"]
    assert 0 < triton <= tree        # tritonserver found in the launcher's tree, busy through the window
    assert record["server_cpu_share"] == pytest.approx(tree / (100 * len(cores)))
    assert (record["gpus"], record["check"], record["model"], record["level_per_gpu"]) == (1, "zero-model",
                                                                                         ZERO_MODEL, 2)


def test_cpu_lists_read_as_taskset_writes_them():
    assert cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_text([16, 17]) == "16,17"
