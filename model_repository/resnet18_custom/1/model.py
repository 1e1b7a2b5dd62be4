"""resnet18_custom: ResNet-18 on the fused CUDA kernels (folded PyTorch graph on CPU-only hosts)."""

from fusedresnet.backend.engines import create_custom_engine
from fusedresnet.backend.spec import FOLDED_PARAMS_FILE
from fusedresnet.backend.triton_model import ResNetTritonModel, config_parameter


class TritonPythonModel(ResNetTritonModel):
    def create_engine(self, model_dir, device, model_config):
        choice = config_parameter(model_config, "engine", "auto")
        return create_custom_engine(f"{model_dir}/{FOLDED_PARAMS_FILE}", device, choice)
