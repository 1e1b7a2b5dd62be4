"""Several GPUs on one host: the launcher's --gpus, per-GPU figures from Triton's metrics,
and (on a host with two or more GPUs) engines and served models on every GPU.

The served-model test uses the session's server, which runs on every GPU of the
host: with `KIND_AUTO` and `count: N` each model has N instances per GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import time

import numpy as np
import pytest
import torch

from fusedresnet.backend import serve
from fusedresnet.backend.engines import TorchScriptEngine, create_custom_engine
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
)
from fusedresnet.backend.triton_install import ServerError, find_triton, host_gpus
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, SET_REL_L2_TOLERANCE, compare_logits
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.loadtest import triton_metrics

GPU_COUNT = torch.cuda.device_count()
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


def test_multi_gpu_summary_takes_each_layouts_peak_against_one_gpu():
    from fusedresnet.loadtest import multi_gpu

    def step(layout, gpus, series, img_per_s):
        return {"layout": layout, "gpus": gpus, "series": series, "series_name": series, "img_per_s": img_per_s,
                "p50_ms": 1.0, "p99_ms": 10.0, "concurrency": 64, "generators": 1, "processes": 8, "failures": 0,
                "generator_cpu_percent": 800.0, "generator_cpu_share": 0.5, "problems": [], "errors": []}

    steps = [step("one-gpu", 1, "1", 20000.0), step("one-gpu", 1, "1", 21000.0), step("one-gpu", 1, "32", 40000.0),
             step("server-per-gpu", 2, "1", 38000.0), step("server-per-gpu", 2, "32", 76000.0),
             step("server-per-gpu", 2, "32", 74000.0), step("one-server", 2, "1", 30000.0),
             step("one-server", 2, "32", None)]
    layouts = {entry["layout"]: entry for entry in multi_gpu.summarize(steps, 2)}
    assert set(layouts) == {"server-per-gpu", "one-server"}
    assert layouts["server-per-gpu"]["scaling_1"] == pytest.approx(38000 / 21000)
    assert layouts["server-per-gpu"]["scaling_32"] == pytest.approx(76000 / 40000)
    assert layouts["one-server"]["scaling_1"] == pytest.approx(30000 / 21000)
    assert layouts["one-server"]["scaling_32"] is None          # a failed step is no peak
    assert layouts["server-per-gpu"]["scaling_32_target"] == 1.8
    text = multi_gpu.markdown({"device": "d", "date": "t", "command": "c", "gpus": 2, "generator_cores": "16-31",
                               "server_cores": "0-15", "steps": steps, "layouts": list(layouts.values())})
    assert "| server-per-gpu | gRPC, 32 image(s)/request | 40000 | 76000 | **1.90x** | 1.8 |" in text


def test_cpu_lists_read_as_taskset_writes_them():
    from fusedresnet.loadtest import multi_gpu
    assert multi_gpu.cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert multi_gpu.cpu_text([16, 17]) == "16,17"
