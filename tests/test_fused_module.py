"""FusedResNet18 on the CPU (the folded graph): construction, outputs against the unfolded network, input errors.

The fused kernels themselves are checked against torchvision in test_fused_module_gpu.py.
"""

from __future__ import annotations

import threading

import pytest
import torch

from fusedresnet.backend.engines.fused_module import FusedResNet18
from fusedresnet.backend.images import normalize_uint8, smooth_random_images
from fusedresnet.backend.resnet.folding import fold_resnet18
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.client.agreement import compare_logits


@pytest.fixture(scope="module")
def network():
    return build_resnet18(seed=4)


@pytest.fixture(scope="module")
def module(network):
    return FusedResNet18.from_torchvision(network, device="cpu")


@pytest.fixture(scope="module")
def pixels():
    return smooth_random_images(3, seed=21, size=96)[:, :, :80].contiguous()   # 96x80: not 224, not square


def test_logits_and_features_match_the_unfolded_network_at_any_size(module, network, pixels):
    normalized = normalize_uint8(pixels)
    with torch.inference_mode():
        expected_logits = network(normalized)
        expected_features = network.features(normalized)
        logits, features = module(pixels), module(normalized, features=True)
    assert module.engine_name == "torch-folded-cpu-fp32"
    assert logits.shape == (3, 1000) and features.shape == (3, 512, 3, 3)
    assert compare_logits(logits, expected_logits)["rel_l2"] < 5e-3   # fp16 weights, fp32 compute
    assert compare_logits(features.flatten(1), expected_features.flatten(1))["rel_l2"] < 5e-3
    assert compare_logits(module(normalized.half()), logits)["rel_l2"] < 5e-3


def test_built_from_a_checkpoint_or_the_prepared_file_gives_the_same_logits(module, network, pixels, tmp_path):
    checkpoint = tmp_path / "resnet18.pth"
    torch.save(network.state_dict(), checkpoint)
    prepared = tmp_path / "resnet18_folded.pt"
    torch.save(fold_resnet18(network), prepared)
    with torch.inference_mode():
        expected = module(pixels)
        for other in (FusedResNet18.from_torchvision(checkpoint, device="cpu"),
                      FusedResNet18.from_prepared(prepared, device="cpu")):
            assert torch.equal(other(pixels), expected)


def test_a_network_that_is_not_resnet18_is_refused(network):
    wrong = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3))
    with pytest.raises(ValueError, match="not a torchvision ResNet-18"):
        FusedResNet18.from_torchvision(wrong, device="cpu")


@pytest.mark.parametrize("make, error, message", [
    (lambda: [[0]], TypeError, "expected a torch.Tensor"),
    (lambda: torch.zeros(1, 64, 64, 3, dtype=torch.int64), TypeError, "got dtype torch.int64"),
    (lambda: torch.zeros(64, 64, 3, dtype=torch.uint8), ValueError, "got 3-D shape"),
    (lambda: torch.zeros(1, 3, 64, 64, dtype=torch.uint8), ValueError, "this looks NCHW"),
    (lambda: torch.zeros(1, 64, 64, 3), ValueError, "this looks NHWC"),
    (lambda: torch.zeros(1, 4, 64, 64), ValueError, r"expected float images as \[N,3,H,W\]"),
    (lambda: torch.zeros(2, 31, 64, 3, dtype=torch.uint8), ValueError, "H, W >= 32, got 31x64"),
    (lambda: torch.zeros(0, 3, 64, 64), ValueError, "empty batch"),
    (lambda: torch.zeros(1, 3, 64, 64, requires_grad=True), RuntimeError, "inference-only"),
])
def test_a_wrong_input_gets_an_error_naming_what_was_expected(module, make, error, message):
    with pytest.raises(error, match=message):
        module(make())


def test_a_tensor_on_another_device_is_refused_and_the_module_does_not_move(module):
    meta = torch.zeros(1, 3, 64, 64, device="meta")
    with pytest.raises(ValueError, match="expected a tensor on cpu, got one on meta"):
        module(meta)
    with pytest.raises(RuntimeError, match="build a new one"):
        module.to(torch.float16)
    assert module.to("cpu") is module and module.eval() is module


def test_works_under_inference_mode_and_no_grad(module, pixels):
    with torch.inference_mode():
        a = module(pixels)
    with torch.no_grad():
        b = module(pixels)
    assert torch.equal(a, b) and not a.requires_grad


def test_calls_from_several_threads_each_get_the_answer_of_a_call_alone(module):
    batches = [smooth_random_images(n, seed=30 + n, size=64) for n in (1, 2, 3, 4)]
    with torch.inference_mode():
        alone = [module(batch) for batch in batches]
    results = {}

    def worker(thread: int):
        with torch.inference_mode():
            for round_ in range(6):
                results[thread, round_] = module(batches[(thread + round_) % len(batches)])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 * 6
    for (thread, round_), logits in results.items():
        torch.testing.assert_close(logits, alone[(thread + round_) % len(batches)], rtol=0, atol=1e-5)
