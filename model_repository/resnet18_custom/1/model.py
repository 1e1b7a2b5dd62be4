"""A ResNet-18 model of this repository. Which engine it serves is said by its config.pbtxt (parameter
`engine`: backend/engines/config.py); both models' model.py are this file, the adapter is
backend/triton_adapter/python_model.py."""

from fusedresnet.backend.triton_adapter.python_model import ResNetTritonModel


class TritonPythonModel(ResNetTritonModel):
    pass
