"""fusedresnet.kernels: the CUDA kernels of the fused ResNet-18 engine.

CUDA sources (compiled at run time by CuPy/NVRTC as one translation unit, see
`configs.source_text`; each file opens with a comment on how it works):

    common.cuh             PTX wrappers: cp.async, ldmatrix, mma.sync m16n8k16, fp16 packing; the swizzle
    epilogue.cuh           the fused epilogue (bias, residual, ReLU, fp16 NHWC / split-K partials) of every conv
    loaders.cuh            the cp.async im2col (A) and filter (B) loaders of the implicit-GEMM kernels
    conv_implicit_gemm.cu  convolution as implicit GEMM + fused epilogue (bias, residual, ReLU),
                           split-K with `splitk_epilogue`; every conv of the network can run on it
    conv3x3_patch.cu       3x3/1 convs with the input patch in shared memory (all 9 taps from one copy)
    conv_wgmma.cu          sm_90a: the implicit GEMM on wgmma.mma_async (shared-memory descriptors), same
                           loaders and epilogue; the convolutions on compute capability 9.0
    stem.cu                7x7/2 stem from uint8 (normalisation fused), alone or fused with the max-pool
    pool_head.cu           3x3/2 max-pool; global average pool + fully-connected layer in one kernel

Python:

    configs.py        tile configurations, compile options, cost model, tuned-plan lookup (no CuPy)
    launch.py         `library(device)`: compiled kernels + launchers with shape checks; the conv path
                      (wgmma on cc 9.0, else mma.sync; FUSEDRESNET_CONV_PATH=mma|wgmma forces one)
    nvrtc_build.py    NVRTC compile of the sm_90a module (CuPy's RawModule cannot target sm_90a), disk cache
    sass_diff.py      per-kernel SASS dump and compare (CPU, nvcc + cuobjdump): a refactor keeps the machine code
    tuned_plans.json  measured best tile / split-K per layer shape and batch bucket (for the GPU model
                      and conv path it names: H100, mma.sync)
    tune.py           measures every candidate plan per layer (CUDA-graph timed), writes tuned_plans.json
    gpu_check.sh      one GPU-host call: [tune +] check + bench [+ ncu]

The engine that strings the kernels together is `fusedresnet.backend.engine_cuda`; the harness that
checks and times them (check, bench, diff, profile_layers) is `fusedresnet.harness`. This package
imports neither (nor `fusedresnet.client`): tests/test_package_layering.py.
Measurements, predictions and outcomes: NOTES.md.
"""
