"""resnet18_cudnn: the TorchScript baseline (cuDNN on a GPU), fp32 or fp16 channels-last."""

from fusedresnet.backend.engines import TorchScriptEngine
from fusedresnet.backend.spec import TORCHSCRIPT_FILE
from fusedresnet.backend.triton_model import ResNetTritonModel, config_parameter


class TritonPythonModel(ResNetTritonModel):
    def create_engine(self, model_dir, device, model_config):
        precision = config_parameter(model_config, "precision", "fp16")
        cuda_graphs = config_parameter(model_config, "cuda_graphs", "true") == "true"
        engine = TorchScriptEngine(f"{model_dir}/{TORCHSCRIPT_FILE}", device, precision, cuda_graphs)
        reason = "config precision" if engine.precision == precision else f"{precision} needs a GPU"
        return engine, reason
