"""No silent fallback on a GPU, on the real server on a GPU host: resnet18_custom's GPU instance with CuPy
blocked (tests/shims/no_cupy.py, imported before the model's code) refuses to load, naming CuPy and the command
that installs it; with `engine: torch` in its config the same instance serves the PyTorch graph on the GPU,
as the user asked, with a warning in the log. And the fused engine's library calls from several threads.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
import torch
from test_engine_config import SHIM_MARK, model_copy

from fusedresnet.backend import spec
from fusedresnet.backend.engines.config import EngineConfig
from fusedresnet.backend.engines.serving import ServingEngine, create_engine
from fusedresnet.backend.images import smooth_random_images
from fusedresnet.backend.network import free_ports
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.client.resnet_client import ResNetClient

pytestmark = pytest.mark.gpu


def test_gpu_instance_without_cupy_refuses_to_load_unless_the_config_opts_in_to_torch(
        prepared_repository, admin_token, tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    shutil.copy(prepared_repository / STAMP_FILE, repository)
    source = prepared_repository / spec.MODEL_CUSTOM
    model_copy(source, repository, "custom_auto", {})
    model_copy(source, repository, "custom_torch", {"engine": "torch"})
    log = tmp_path / "server.log"
    http_port, grpc_port, metrics_port = free_ports(3)
    with launch(ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                               admin_token=admin_token, log_file=log, mps="off",
                               triton_args=["--exit-on-error=false", "--strict-readiness=false"])) as server:
        with ResNetClient("custom_torch", "grpc", server.grpc_url) as client:
            assert client.classify(smooth_random_images(2, seed=3).numpy()).engine == "torch-folded-cuda-fp32"
            assert not client.client.is_model_ready("custom_auto")
    text = log.read_text()
    assert "custom_auto: the fused CUDA engine cannot load on cuda:0: cupy is missing" in text, text[-3000:]
    assert SHIM_MARK in text and "pip install" in text and "engine to torch" in text
    assert "custom_torch: serving torch-folded-cuda-fp32 on a GPU, not the fused kernels" in text


def test_fused_engine_library_calls_from_several_threads_each_get_their_own_answer(prepared_repository):
    from fusedresnet.backend.engines.fused_cuda import FusedCudaEngine
    engine = FusedCudaEngine(prepared_repository / spec.MODEL_CUSTOM / "1" / spec.FOLDED_PARAMS_FILE, "cuda:0")
    batches = [smooth_random_images(n, seed=n) for n in (1, 3, 8, 5, 2, 8)]
    alone = [engine.classify_uint8(batch.cuda()).cpu() for batch in batches]   # one call at a time
    results: dict[tuple[int, int], torch.Tensor] = {}

    def worker(thread: int):
        for round_ in range(20):
            index = (thread + round_) % len(batches)
            results[thread, round_] = engine.classify_uint8(batches[index].cuda()).cpu()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (thread, round_), logits in results.items():
        np.testing.assert_array_equal(logits.numpy(), alone[(thread + round_) % len(batches)].numpy())
    assert len(results) == 6 * 20


def test_config_kernel_family_and_launch_mode_reach_the_fused_engine_and_the_environment_overrides_them(
        prepared_repository, monkeypatch):
    model_dir = prepared_repository / spec.MODEL_CUSTOM / "1"
    monkeypatch.delenv("FUSEDRESNET_CONV_PATH", raising=False)
    monkeypatch.delenv("FUSEDRESNET_PDL", raising=False)
    engine, reason = create_engine(model_dir, "cuda:0", EngineConfig(conv_path="mma", pdl="off"))
    assert isinstance(engine, ServingEngine)
    assert (engine.name, engine.lib.path, engine.lib.pdl) == ("fused-cuda-fp16-mma", "mma", False)
    assert "config conv_path mma, config pdl off" in reason and "conv path mma" in engine.describe()
    monkeypatch.setenv("FUSEDRESNET_CONV_PATH", "mma")
    engine, reason = create_engine(model_dir, "cuda:0", EngineConfig(pdl="off"))
    assert engine.lib.path == "mma" and "FUSEDRESNET_CONV_PATH=mma overrides config conv_path" in reason
