"""fusedresnet: ResNet-18 on fused CUDA kernels, served by Triton beside a cuDNN baseline.

The code lives in the top-level folders of the repository and is installed
under this one namespace: ``fusedresnet.backend`` (network, weights, engines,
server launcher), ``fusedresnet.kernels`` (CUDA sources and launchers),
``fusedresnet.client`` (preprocessing and command-line clients) and
``fusedresnet.loadtest`` (locust load tests and reports).
"""

__version__ = "0.1.0"
