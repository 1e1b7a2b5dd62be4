"""resnet18_cudnn_normalized: the model of resnet18_cudnn (same engine and weights) on the IMAGE_NORMALIZED input."""

from fusedresnet.backend.triton_adapter.python_model import model_of_network

TritonPythonModel = model_of_network(__file__)
