"""The layer-by-layer diff tool: the folded graph against the unfolded float32 network (CPU), fused kernels (GPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from fusedresnet.backend.engines.serving import TorchFoldedEngine
from fusedresnet.backend.images import normalize_uint8, smooth_random_images
from fusedresnet.backend.resnet.folding import fold_resnet18
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.client.agreement import compare_logits
from fusedresnet.client.preprocess import preprocess_files, sample_photo_paths
from fusedresnet.harness.diff import main, reference_checkpoints, run_diff

# The checkpoints the diff reports: stem + max-pool, each BasicBlock (the second of each stage is
# layer1-4's output), average pool, logits.
CHECKPOINTS = ["stem+maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
               "layer4.0", "layer4.1", "avgpool", "logits"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fusedresnet.harness.diff", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def few_images() -> np.ndarray:
    return smooth_random_images(2, seed=13, size=64).numpy()


def test_cpu_diff_of_the_folded_graph_is_within_tolerance_at_every_checkpoint():
    photos = [str(p) for p in sample_photo_paths()]
    done = run_cli("--device", "cpu", "--json", *photos)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["name"] for row in report["checkpoints"]] == CHECKPOINTS and report["not_compared"] == []
    assert report["first_beyond_tolerance"] is None and report["images"] == len(photos)
    assert all(row["within_tolerance"] and row["min_cosine"] > 0.999 for row in report["checkpoints"])
    assert [row["stage"] for row in report["checkpoints"] if row["stage"]] == ["layer1", "layer2", "layer3", "layer4"]
    assert report["checkpoints"][0]["shape"] == [len(photos), 64, 56, 56]
    # The logits row is what the engine's own classify path gives against the network's own forward.
    model, pixels = build_resnet18(), torch.from_numpy(preprocess_files(photos))
    with torch.inference_mode():
        expected = compare_logits(TorchFoldedEngine(fold_resnet18(model)).classify_uint8(pixels).numpy(),
                                  model(normalize_uint8(pixels)).numpy())
    logits_row = report["checkpoints"][-1]
    assert logits_row["rel_l2"] == pytest.approx(expected["rel_l2"], rel=1e-4)
    assert logits_row["max_abs"] == pytest.approx(expected["max_abs"], rel=1e-4)


def test_a_corrupted_layer_is_the_first_checkpoint_beyond_tolerance(few_images):
    params = fold_resnet18(build_resnet18())
    params["convs"]["layer3.0.conv2"]["bias"] += 2.0
    report = run_diff(images=few_images, params=params)
    assert report["first_beyond_tolerance"] == "layer3.0"
    rows = {row["name"]: row for row in report["checkpoints"]}
    assert all(rows[name]["within_tolerance"] for name in CHECKPOINTS[:CHECKPOINTS.index("layer3.0")])
    assert rows["layer3.0"]["rel_l2"] > 0.05


def test_reference_checkpoints_are_the_networks_own_activations(few_images):
    model = build_resnet18()
    pixels = torch.from_numpy(few_images)
    outputs = reference_checkpoints(model, pixels)
    with torch.inference_mode():
        x = normalize_uint8(pixels)
        assert torch.equal(outputs["logits"], model(x))
        features = model.features(x)
    assert torch.equal(outputs["layer4.1"], features)
    torch.testing.assert_close(outputs["avgpool"], features.mean(dim=(2, 3)))
    assert list(outputs) and sorted(outputs) == sorted(CHECKPOINTS)


def test_exit_status_is_1_when_a_checkpoint_is_beyond_tolerance(tmp_path, capsys, few_images):
    from PIL import Image
    path = tmp_path / "image.png"
    Image.fromarray(few_images[0]).resize((256, 256)).save(path)
    assert main(["--device", "cpu", "--tolerance", "1e-9", str(path)]) == 1   # fp16 weights differ at once
    out = capsys.readouterr().out
    assert "first checkpoint beyond tolerance: stem+maxpool" in out and "<- beyond tolerance" in out


@pytest.mark.gpu
def test_gpu_diff_of_the_fused_kernels_is_within_tolerance():
    done = run_cli("--device", "cuda", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["engine"].startswith("fused-cuda") and report["first_beyond_tolerance"] is None
    compared = [row["name"] for row in report["checkpoints"]]
    assert compared == [name for name in CHECKPOINTS if name not in report["not_compared"]]
    assert {"stem+maxpool", "layer1.0", "layer4.1", "logits"} <= set(compared)
