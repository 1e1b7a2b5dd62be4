"""ONNX import: `prepare --weights model.onnx` against onnxruntime on the same file.

The seeded model is exported twice with torch.onnx (the TorchScript exporter,
as torchvision users export): in eval mode with constant folding, which folds
every BatchNorm into its convolution, and without, which keeps them. Expected
answers come from onnxruntime (CPU) running the very file that was imported.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from fusedresnet.backend.images import normalize_uint8
from fusedresnet.backend.network import free_ports
from fusedresnet.backend.repository.prepare import main as prepare_main
from fusedresnet.backend.repository.prepare import prepare
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE
from fusedresnet.backend.resnet.onnx_import import OnnxImportError, state_dict_from_onnx
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import MODEL_CUSTOM, MODEL_REPOSITORY, MODELS, TORCHSCRIPT_FILE
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, SET_REL_L2_TOLERANCE, compare_logits
from fusedresnet.client.resnet_client import ResNetClient

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

GENERATED = ("*.pt", "labels.txt", STAMP_FILE, "__pycache__", ".*.tmp")


def export(path, fold_batchnorm: bool, opset: int):
    torch.onnx.export(build_resnet18(), torch.randn(1, 3, 224, 224), str(path), dynamo=False, opset_version=opset,
                      do_constant_folding=fold_batchnorm, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}})
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert ("BatchNormalization" in ops) != fold_batchnorm, ops   # the export is the kind the test means
    return path


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx")
    return {"folded": export(folder / "resnet18_folded_bn.onnx", True, 13),
            "unfolded": export(folder / "resnet18.onnx", False, 17)}


def onnxruntime_logits(path, normalized: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: normalized.astype(np.float32)})[0]


@pytest.fixture(scope="module")
def images(varied_images) -> np.ndarray:
    return np.concatenate([varied_images[:5], varied_images[5:37:4]])   # photos, smooth and noise images


@pytest.mark.parametrize("kind", ["folded", "unfolded"])
def test_imported_weights_reproduce_onnxruntime_logits(onnx_files, kind, images):
    model = build_resnet18(str(onnx_files[kind]))     # .onnx goes through the importer
    normalized = normalize_uint8(torch.from_numpy(images))
    with torch.inference_mode():
        logits = model(normalized).numpy()
    stats = compare_logits(logits, onnxruntime_logits(onnx_files[kind], normalized.numpy()))
    assert stats["rel_l2"] < 1e-5 and stats["top1_disagreements"] == 0, stats   # float32 both sides


def test_dynamo_export_imports_too(tmp_path, images):
    pytest.importorskip("onnxscript")   # torch's default exporter needs it; CI has none
    path = tmp_path / "resnet18_dynamo.onnx"
    torch.onnx.export(build_resnet18(), (torch.randn(1, 3, 224, 224),), str(path), dynamo=True)
    model = build_resnet18(str(path))
    normalized = normalize_uint8(torch.from_numpy(images[:3]))
    with torch.inference_mode():
        logits = model(normalized).numpy()
    expected = np.concatenate([onnxruntime_logits(path, normalized[i:i + 1].numpy()) for i in range(3)])
    assert compare_logits(logits, expected)["rel_l2"] < 1e-5


def test_imported_state_dict_has_torchvision_keys_and_batchnorm_of_unfolded_export(onnx_files):
    seeded = build_resnet18().state_dict()
    state = state_dict_from_onnx(onnx_files["unfolded"])
    assert set(state) == set(seeded)
    for key in ("conv1.weight", "bn1.running_var", "layer2.0.downsample.1.weight", "layer4.1.bn2.bias", "fc.weight"):
        torch.testing.assert_close(state[key], seeded[key], rtol=0, atol=0)


def repository_copy(tmp_path):
    """The model definitions (config.pbtxt, model.py) without any generated file."""
    target = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, target, ignore=shutil.ignore_patterns(*GENERATED))
    return target


def mutated(path, tmp_path, change):
    model = onnx.load(str(path))
    change(model.graph)
    out = tmp_path / f"bad_{change.__name__}.onnx"
    onnx.save(model, str(out))
    return out


def drop_an_initializer(graph):
    victim = next(node for node in graph.node if node.op_type == "Conv" and "layer3.1" in node.name)
    initializer = next(i for i in graph.initializer if i.name == victim.input[1])
    graph.initializer.remove(initializer)


def fc_for_ten_classes(graph):
    fc = next(i for i in graph.initializer if i.name == "fc.weight")
    fc.CopyFrom(onnx.numpy_helper.from_array(np.zeros((10, 512), np.float32), "fc.weight"))


def sigmoid_after_the_stem(graph):
    relu = next(node for node in graph.node if node.op_type == "Relu")
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == relu.output[0]:
                node.input[i] = "stem_sigmoid"
    graph.node.insert(list(graph.node).index(relu) + 1,
                      onnx.helper.make_node("Sigmoid", [relu.output[0]], ["stem_sigmoid"], name="extra"))


@pytest.mark.parametrize("change, message", [
    (drop_an_initializer, "is not an initialiser (missing initialiser)"),
    (fc_for_ten_classes, "fc weight 'fc.weight' has shape (10, 512), expected (1000, 512)"),
    (sigmoid_after_the_stem, "unexpected operator Sigmoid"),
])
def test_prepare_refuses_a_graph_that_is_not_resnet18_and_writes_nothing(onnx_files, tmp_path, change, message):
    bad = mutated(onnx_files["folded"], tmp_path, change)
    repository = repository_copy(tmp_path)
    before = sorted(p.relative_to(repository) for p in repository.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(["--weights", str(bad), "--repository", str(repository)])
    assert message in str(exit_info.value) and str(bad) in str(exit_info.value)
    assert sorted(p.relative_to(repository) for p in repository.rglob("*")) == before


def test_prepare_failing_midway_leaves_the_files_as_they_were(onnx_files, tmp_path):
    repository = repository_copy(tmp_path)
    prepare(repository)   # seeded weights
    snapshot = {p: p.read_bytes() for p in repository.rglob("*") if p.is_file()}
    # A file where the custom model's version folder was: its weights, written after the TorchScript file,
    # cannot be written, so that one is undone (a missing folder is refused before anything is written).
    shutil.rmtree(repository / MODEL_CUSTOM / "1")
    (repository / MODEL_CUSTOM / "1").write_bytes(b"")
    with pytest.raises((NotADirectoryError, RuntimeError), match="does not exist|Not a directory"):
        prepare(repository, str(onnx_files["folded"]))
    after = {p: p.read_bytes() for p in repository.rglob("*") if p.is_file() and MODEL_CUSTOM + "/1" not in str(p)}
    assert after == {p: data for p, data in snapshot.items() if MODEL_CUSTOM + "/1" not in str(p)}
    assert any(p.name == TORCHSCRIPT_FILE for p in after)


def test_import_refuses_an_old_opset_and_a_file_that_is_not_onnx(tmp_path, onnx_files):
    model = onnx.load(str(onnx_files["folded"]))
    model.opset_import[0].version = 11
    old = tmp_path / "old.onnx"
    onnx.save(model, str(old))
    with pytest.raises(OnnxImportError, match="opset 11; supported: 13 and later"):
        state_dict_from_onnx(old)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a model" * 10)
    with pytest.raises(OnnxImportError, match="not a readable ONNX model"):
        state_dict_from_onnx(garbage)


@pytest.fixture(scope="module")
def onnx_server(onnx_files, admin_token, tmp_path_factory):
    """A real Triton serving both models prepared from the folded ONNX export."""
    folder = tmp_path_factory.mktemp("onnx_repository")
    repository = repository_copy(folder)
    prepare_main(["--weights", str(onnx_files["folded"]), "--repository", str(repository)])
    http_port, grpc_port, metrics_port = free_ports(3)
    with launch(ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                               admin_token=admin_token, log_file=folder / "server.log", mps="off")) as server:
        yield server


@pytest.mark.parametrize("model", MODELS)
def test_models_prepared_from_onnx_serve_onnxruntime_logits(onnx_server, onnx_files, model, images):
    expected = onnxruntime_logits(onnx_files["folded"], normalize_uint8(torch.from_numpy(images)).numpy())
    with ResNetClient(model, "grpc", onnx_server.grpc_url) as client:
        logits = client.infer(images).logits
    stats = compare_logits(logits, expected)
    assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE, stats
    assert stats["max_row_rel_l2"] <= IMAGE_REL_L2_TOLERANCE, stats
    assert stats["clear_disagreements"] == 0, stats
