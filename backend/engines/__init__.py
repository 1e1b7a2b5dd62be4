"""The engines that run the network, and what a model's config asks of them (issue 47: a room per role). Each
module imports only those before it:

    cuda_context  a model stub's CUDA context, made while the stub still imports torch (standard library only)
    batch_buckets the batch an engine runs for a request's images: the power-of-two bucket at or above them
    config        the models' config parameters, parsed once into a validated EngineConfig (no torch)
    fused_cuda    the fused CUDA engine: ResNet-18 on our own kernels (needs CuPy)
    serving       the serving interface every engine offers, the PyTorch engines, and the one factory that
                  builds the engine a model's config asks for (it imports fused_cuda only where it runs it)
    fused_module  the custom engine as a torch.nn.Module, for use inside a PyTorch program

The network, its weights and the folding they run are below, in `fusedresnet.backend.resnet`; the Triton adapter
that serves the engines from a Python-backend stub is above, in `fusedresnet.backend.triton_adapter`. This file
imports nothing: the Triton adapter imports cuda_context before torch, and the tests read config without torch.
"""
