"""FusedResNet18 on the fused CUDA kernels against torchvision's resnet18 with the same weights (GPU host).

The reference is torchvision's own module in float32 on the CPU (no TF32, no
cuDNN), loaded with the project's seeded weights; the tolerances are the
served models' (fp16 weights and activations).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fusedresnet.backend.engines.fused_module import FusedResNet18
from fusedresnet.backend.images import normalize_uint8, smooth_random_images
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, SET_REL_L2_TOLERANCE, compare_logits

pytestmark = pytest.mark.gpu
torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def torchvision_resnet18():
    model = torchvision.models.resnet18(weights=None)
    model.load_state_dict(build_resnet18().state_dict(), strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def fused(torchvision_resnet18):
    return FusedResNet18.from_torchvision(torchvision_resnet18, device="cuda")


def reference(model, pixels: torch.Tensor, features: bool = False) -> torch.Tensor:
    """torchvision in float32 on the CPU: logits, or the output of layer4."""
    with torch.inference_mode():
        x = normalize_uint8(pixels.cpu())
        if not features:
            return model(x)
        trunk = torch.nn.Sequential(*list(model.children())[:-2])   # up to layer4: no avgpool, no fc
        return trunk(x)


def assert_close_to(candidate: torch.Tensor, expected: torch.Tensor):
    stats = compare_logits(candidate.detach().cpu().flatten(1).numpy(), expected.flatten(1).numpy())
    assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE, stats
    assert stats["max_row_rel_l2"] <= IMAGE_REL_L2_TOLERANCE, stats
    return stats


def test_runs_the_fused_kernels(fused):
    assert fused.engine_name.startswith("fused-cuda"), fused.engine_name
    assert fused.device == torch.device("cuda", torch.cuda.current_device())


def test_logits_match_torchvision_for_uint8_and_normalised_input(fused, torchvision_resnet18, varied_images):
    pixels = torch.from_numpy(varied_images).cuda()
    expected = reference(torchvision_resnet18, pixels)
    with torch.inference_mode():
        from_pixels = fused(pixels)
        from_normalized = fused(normalize_uint8(pixels))
    assert from_pixels.shape == (len(varied_images), 1000) and from_pixels.dtype == torch.float32
    assert from_pixels.device == fused.device
    for logits in (from_pixels, from_normalized):
        stats = assert_close_to(logits, expected)
        assert stats["clear_disagreements"] == 0, stats


@pytest.mark.parametrize("h, w", [(224, 224), (160, 200), (97, 61), (32, 32)])
def test_features_match_torchvision_at_any_size(fused, torchvision_resnet18, h, w):
    pixels = smooth_random_images(4, seed=h * w, size=max(h, w))[:, :h, :w].contiguous().cuda()
    expected = reference(torchvision_resnet18, pixels, features=True)
    with torch.inference_mode():
        features = fused(pixels, features=True)
        logits = fused(pixels)
    assert features.shape == expected.shape, (features.shape, expected.shape)
    assert_close_to(features, expected)
    assert_close_to(logits, reference(torchvision_resnet18, pixels))


def test_a_batch_larger_than_the_largest_bucket_is_answered_row_by_row(fused, torchvision_resnet18):
    pixels = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (300, 64, 64, 3), dtype=np.uint8)).cuda()
    with torch.inference_mode():
        logits = fused(pixels)
    assert logits.shape == (300, 1000)
    assert_close_to(logits, reference(torchvision_resnet18, pixels))


def test_input_written_on_the_current_stream_is_waited_for(fused, varied_images):
    source = torch.from_numpy(varied_images[:8]).cuda()
    with torch.inference_mode():
        expected = fused(source)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            pixels = torch.zeros_like(source)
            torch.cuda._sleep(500_000_000)   # the copy below lands long after forward() was called
            pixels.copy_(source)
            logits = fused(pixels)
            # forward has returned: the logits are complete and readable without any further wait
            on_host = logits.cpu()
    assert compare_logits(on_host.numpy(), expected.cpu().numpy())["rel_l2"] < 1e-3


def test_a_cpu_tensor_is_refused_naming_the_device(fused):
    with pytest.raises(ValueError, match=f"expected a tensor on {fused.device}, got one on cpu"):
        fused(torch.zeros(1, 224, 224, 3, dtype=torch.uint8))
