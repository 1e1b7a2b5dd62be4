"""The A/B router entry: what it does is said by its config.pbtxt; the code is backend/ab_router.py."""

from fusedresnet.backend.ab_router import ABRouterModel


class TritonPythonModel(ABRouterModel):
    pass
