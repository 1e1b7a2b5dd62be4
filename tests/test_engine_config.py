"""The engine contract: config parameters parsed once and validated, one factory, the same model.py for both
models, configs that differ only where the engines do, and no silent fallback on a GPU.

The GPU-instance decision is exercised on any host with CuPy really missing: tests/shims/no_cupy.py,
imported first, makes `import cupy` fail in that interpreter, and `custom_engine_plan` is asked about a GPU
device ("cuda:0": the decision reads the device name and the import, nothing else). The real server runs
models whose copy imports the same shim before the real model.py (`model_copy`): on the CPU the refusals
and the CPU path are checked here; on a GPU host tests/test_engine_choice_gpu.py checks the GPU instance's
refusal and the `engine: torch` opt-in.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from google.protobuf import json_format

from fusedresnet.backend import spec
from fusedresnet.backend.engines.config import (
    ConfigError,
    EngineConfig,
    environment_engine_arguments,
    parse_engine_config,
)
from fusedresnet.backend.engines.serving import (
    GPU_INSTALL_COMMAND,
    ServingEngine,
    TorchFoldedEngine,
    TorchScriptEngine,
    create_engine,
)
from fusedresnet.backend.network import free_ports
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.client.resnet_client import ResNetClient

ROOT = Path(__file__).resolve().parent.parent
SHIM = Path(__file__).resolve().parent / "shims" / "no_cupy.py"
SHIM_MARK = "blocked by tests/shims/no_cupy.py"


def parameters(**values) -> dict:
    """A model configuration's parameters as Triton hands them to initialize() (JSON)."""
    return {"parameters": {key: {"string_value": value} for key, value in values.items()}}


def config_json(model: str) -> dict:
    return json_format.MessageToDict(spec.model_config(model), preserving_proto_field_name=True)


# ---------------------------------------------------------------- parsing

def test_shipped_configs_parse_to_the_engines_the_models_are_named_for():
    assert parse_engine_config(config_json(spec.MODEL_CUSTOM)) == EngineConfig(engine="auto")
    assert parse_engine_config(config_json(spec.MODEL_CUDNN)) == EngineConfig(
        engine="torchscript", precision="fp16", cuda_graphs=True)


def test_every_parameter_is_parsed_into_its_type():
    config = parse_engine_config(parameters(engine="cuda", conv_path="wgmma", pdl="off", torch_threads="3",
                                            FORCE_CPU_ONLY_INPUT_TENSORS="no"))
    assert (config.engine, config.conv_path, config.pdl, config.torch_threads) == ("cuda", "wgmma", "off", 3)
    config = parse_engine_config(parameters(engine="torchscript", precision="fp32", cuda_graphs="false"))
    assert (config.precision, config.cuda_graphs) == ("fp32", False)


@pytest.mark.parametrize("values, message", [
    ({"engine": "cudnn"}, "config parameter engine: 'cudnn' is not one of auto, cuda, torch, torchscript"),
    ({"conv_path": "tensorcore"}, "config parameter conv_path: 'tensorcore' is not one of auto, mma, wgmma"),
    ({"pdl": "yes"}, "config parameter pdl: 'yes' is not one of auto, on, off"),
    ({"engine": "torchscript", "cuda_graphs": "1"}, "config parameter cuda_graphs: '1' is not one of true, false"),
    ({"torch_threads": "0"}, "config parameter torch_threads: '0' is neither auto nor a positive integer"),
    ({"torch_threads": "many"}, "config parameter torch_threads: 'many' is neither auto nor a positive integer"),
    ({"precision": "fp32"}, "config parameter precision applies to engine torchscript, not to engine auto"),
    ({"engine": "torchscript", "pdl": "on"}, "config parameter pdl applies to engine auto or cuda, "
                                              "not to engine torchscript"),
    ({"engine": "torch", "conv_path": "mma"}, "config parameter conv_path applies to engine auto or cuda, "
                                              "not to engine torch"),
    ({"engin": "auto"}, "unknown config parameter(s) engin: the models read engine, conv_path, pdl"),
])
def test_a_bad_parameter_is_refused_naming_the_key_and_what_is_allowed(values, message):
    with pytest.raises(ConfigError) as refused:
        parse_engine_config(parameters(**values))
    assert str(refused.value).startswith(message)


def test_the_refusals_advice_engine_torch_in_the_shipped_config_is_a_valid_config():
    config = config_json(spec.MODEL_CUSTOM)
    config["parameters"]["engine"] = {"string_value": "torch"}
    assert parse_engine_config(config).engine == "torch"


def test_environment_overrides_the_configured_kernel_family_and_launch_mode(monkeypatch):
    config = EngineConfig(conv_path="mma", pdl="off")
    monkeypatch.delenv("FUSEDRESNET_CONV_PATH", raising=False)
    monkeypatch.delenv("FUSEDRESNET_PDL", raising=False)
    assert config.conv_path_request() == ("mma", "config conv_path mma")
    assert config.pdl_request() == (False, "config pdl off")
    # Read here, once, and passed to the kernel library as explicit arguments.
    monkeypatch.setenv("FUSEDRESNET_CONV_PATH", "wgmma")
    monkeypatch.setenv("FUSEDRESNET_PDL", "1")
    assert config.conv_path_request() == ("wgmma", "FUSEDRESNET_CONV_PATH=wgmma overrides config conv_path")
    assert config.pdl_request() == (True, "FUSEDRESNET_PDL=1 overrides config pdl")
    assert environment_engine_arguments() == {"conv_path": "wgmma", "pdl": True}
    monkeypatch.setenv("FUSEDRESNET_PDL", "0")
    assert config.pdl_request() == (False, "FUSEDRESNET_PDL=0 overrides config pdl")
    monkeypatch.setenv("FUSEDRESNET_CONV_PATH", "tensor")
    with pytest.raises(ConfigError, match="FUSEDRESNET_CONV_PATH='tensor': expected auto, mma or wgmma"):
        config.conv_path_request()


# ---------------------------------------------------------------- the two models' files

def shared_lines(model: str) -> list[str]:
    """The config.pbtxt's lines without what belongs to its engine: the parameters lines of engine and of the
    engine-specific keys, each with the comment block right above it; the model's name written as <model>, the
    other network's as <other>."""
    lines = (spec.MODEL_REPOSITORY / model / "config.pbtxt").read_text().splitlines()
    own = set()
    for index, line in enumerate(lines):
        match = re.match(r'parameters: \{ key: "(\w+)"', line)
        if match and match.group(1) in ("engine", "conv_path", "pdl", "precision", "cuda_graphs"):
            own.add(index)
            above = index - 1
            while above >= 0 and lines[above].startswith("#"):
                own.add(above)
                above -= 1
    other, = (network for network in spec.MODELS if network != model)  # "same outputs as <other>"
    return [line.replace(model, "<model>").replace(other, "<other>") for index, line in enumerate(lines)
            if index not in own]


def test_both_configs_are_identical_but_for_their_engine_parameters():
    custom, cudnn = shared_lines(spec.MODEL_CUSTOM), shared_lines(spec.MODEL_CUDNN)
    assert len(custom) >= 50, "the shared part of the configs (inputs, outputs, batching, instances) is missing"
    assert custom == cudnn
    keys = {model: set(spec.model_config(model).parameters) for model in spec.MODELS}
    shared = {"FORCE_CPU_ONLY_INPUT_TENSORS", "torch_threads", "engine"}
    assert keys[spec.MODEL_CUSTOM] == shared | {"conv_path", "pdl"}
    assert keys[spec.MODEL_CUDNN] == shared | {"precision", "cuda_graphs"}
    configs = {model: spec.model_config(model) for model in spec.MODELS}
    for message in configs.values():
        del message.parameters["engine"]
        for key in ("conv_path", "pdl", "precision", "cuda_graphs"):
            message.parameters.pop(key, None)
    assert configs[spec.MODEL_CUSTOM] == configs[spec.MODEL_CUDNN]


def test_both_model_files_are_the_same_thin_adapter():
    custom, cudnn = (spec.MODEL_REPOSITORY / model / "1" / "model.py" for model in spec.MODELS)
    assert custom.read_bytes() == cudnn.read_bytes()
    assert len(custom.read_text().splitlines()) <= 10


# ---------------------------------------------------------------- the factory and the protocol

def test_factory_builds_the_configured_cpu_engines_with_the_serving_protocol(prepared_repository):
    folded, reason = create_engine(prepared_repository / spec.MODEL_CUSTOM / "1", "cpu", EngineConfig())
    assert isinstance(folded, TorchFoldedEngine) and reason == "no GPU for this instance"
    script, reason = create_engine(prepared_repository / spec.MODEL_CUDNN / "1", "cpu",
                                   EngineConfig(engine="torchscript", precision="fp16"))
    assert isinstance(script, TorchScriptEngine) and reason == "fp16 needs a GPU" and script.precision == "fp32"
    for engine in (folded, script):
        assert isinstance(engine, ServingEngine)
        assert str(engine.device) in engine.describe()
        bucket = engine.bucket(3)
        engine.input_buffer(spec.INPUT_UINT8, bucket).copy_(torch.randint(0, 256, (3, 224, 224, 3), dtype=torch.uint8))
        assert engine.run_buffer(spec.INPUT_UINT8, bucket, 3).shape == (3, spec.NUM_CLASSES)


# ---------------------------------------------------------------- no silent fallback on a GPU

DECIDE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import no_cupy  # noqa: F401  (before anything can import CuPy)
from fusedresnet.backend.engines.serving import EngineUnavailable, custom_engine_plan
out = {}
try:
    import cupy  # noqa: F401
    out["import cupy"] = "imported"
except ImportError as error:
    out["import cupy"] = str(error)
for device in ("cuda:0", "cpu"):
    for choice in ("auto", "cuda", "torch"):
        try:
            out[f"{device} {choice}"] = list(custom_engine_plan(device, choice))
        except EngineUnavailable as error:
            out[f"{device} {choice}"] = "refused: " + str(error)
print(json.dumps(out))
"""


def test_a_gpu_instance_without_cupy_refuses_to_load_naming_it_and_the_install_command():
    done = subprocess.run([sys.executable, "-c", DECIDE, str(SHIM.parent)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    decisions = json.loads(done.stdout.splitlines()[-1])
    assert SHIM_MARK in decisions["import cupy"]            # the shim really took CuPy away
    for choice in ("auto", "cuda"):
        refusal = decisions[f"cuda:0 {choice}"]
        assert refusal.startswith("refused: the fused CUDA engine cannot load on cuda:0: cupy is missing"), refusal
        assert SHIM_MARK in refusal                          # the refusal comes from that very import
        assert "pip install" in refusal and "[gpu]" in refusal and "engine to torch" in refusal
    assert decisions["cuda:0 torch"] == ["torch", "config engine torch"]   # the explicit opt-in
    assert decisions["cpu auto"] == ["torch", "no GPU for this instance"]
    assert decisions["cpu torch"] == ["torch", "config engine torch"]
    assert decisions["cpu cuda"].startswith("refused: config engine cuda asks for the fused CUDA kernels, but this "
                                            "instance has no GPU")


def test_the_install_command_in_the_refusal_installs_cupy():
    gpu_extra = re.search(r"^gpu = \[(.*?)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE | re.DOTALL)
    assert "'.[gpu]'" in GPU_INSTALL_COMMAND and "'fusedresnet[gpu]'" in GPU_INSTALL_COMMAND
    assert gpu_extra and '"cupy' in gpu_extra.group(1), "pyproject's gpu extra must install CuPy"


def model_copy(source: Path, repository: Path, name: str, replace: dict[str, str]) -> None:
    """`source`'s model folder as `repository/name`, one instance, its config's parameters replaced, CuPy
    blocked: the shim beside model.py (the stub puts that folder on sys.path), imported before its code."""
    shutil.copytree(source, repository / name)
    shutil.copy(SHIM, repository / name / "1")
    model = repository / name / "1" / "model.py"
    model.write_text("import no_cupy  # noqa: F401  (the test's CuPy blocker, first)\n" + model.read_text())
    config = repository / name / "config.pbtxt"
    text = config.read_text().replace("count: 4", "count: 1")
    for key, value in replace.items():
        line = re.search(rf'parameters: {{ key: "{key}" value: {{ string_value: "\w+" }} }}', text)
        new = f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        text = text.replace(line.group(0), new) if line else text + new + "\n"
    config.write_text(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU instances' side; a GPU host runs test_engine_choice_gpu")
def test_real_server_without_cupy_serves_the_cpu_path_and_refuses_bad_configs_at_load(
        prepared_repository, admin_token, tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    shutil.copy(prepared_repository / STAMP_FILE, repository)
    source = prepared_repository / spec.MODEL_CUSTOM
    model_copy(source, repository, "custom_auto", {})
    model_copy(source, repository, "custom_cuda", {"engine": "cuda"})
    model_copy(source, repository, "custom_typo", {"precision": "fp32"})
    log = tmp_path / "server.log"
    http_port, grpc_port, metrics_port = free_ports(3)
    # Not exiting on a model's load error, ready with the models that loaded: one server for the three.
    with launch(ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                               admin_token=admin_token, log_file=log, mps="off",
                               triton_args=["--exit-on-error=false", "--strict-readiness=false"])) as server:
        with ResNetClient("custom_auto", "grpc", server.grpc_url) as client:
            result = client.classify(torch.randint(0, 256, (2, 224, 224, 3), dtype=torch.uint8).numpy())
            assert result.engine == "torch-folded-cpu-fp32"
            for refused in ("custom_cuda", "custom_typo"):
                assert not client.client.is_model_ready(refused)
    text = log.read_text()
    assert "custom_auto: engine torch-folded-cpu-fp32 on cpu (no GPU for this instance)" in text
    assert ("custom_cuda: config engine cuda asks for the fused CUDA kernels, but this instance has no GPU"
            in text), text[-3000:]
    assert "custom_typo: config parameter precision applies to engine torchscript, not to engine auto" in text
