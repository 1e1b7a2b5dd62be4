"""fusedresnet.kernels: the CUDA kernels of the fused ResNet-18 engine.

CUDA sources (compiled at run time by CuPy/NVRTC as one translation unit, see
`build.source_text`; each file opens with a comment on how it works):

    common.cuh             PTX wrappers: cp.async, ldmatrix, mma.sync m16n8k16, fp16 packing; the swizzle;
                           pdl_begin (programmatic dependent launch, every kernel's first statement)
    warp_mma.cuh           the mma.sync warp tile (ldmatrix fragments + m16n8k16 over a k16 step), shared by
                           conv_implicit_gemm, conv3x3_patch and stem
    wgmma.cuh              sm_90a: wgmma.mma_async m64nNk16 wrappers and shared-memory descriptors
    epilogue.cuh           the fused epilogue (bias, residual, ReLU, fp16 NHWC / split-K partials) of every conv
    loaders.cuh            the cp.async im2col (A) and filter (B) loaders of the implicit-GEMM kernels
    stem.cuh               the stems' input-patch load and the fused 3x3/2 max-pool (shared by both stems)
    conv_implicit_gemm.cu  convolution as implicit GEMM + fused epilogue (bias, residual, ReLU),
                           split-K with `splitk_epilogue`; every conv of the network can run on it
    conv3x3_patch.cu       3x3/1 convs with the input patch in shared memory (all 9 taps from one copy)
    conv_wgmma.cu          sm_90a: the implicit GEMM on wgmma.mma_async (shared-memory descriptors), same
                           loaders and epilogue; the convolutions on compute capability 9.0
    stem.cu                7x7/2 stem from uint8 (normalisation fused), alone or fused with the max-pool
    stem_wgmma.cu          sm_90a: the stem fused with the max-pool on wgmma, A gathered from the input patch
                           into registers (no im2col tile); the stem on compute capability 9.0
    pool_head.cu           3x3/2 max-pool; global average pool + fully-connected layer in one kernel

Python:

    build.py          the build recipe: sources, headers, compile options, architectures, the translation
                      unit (`source_text`) and its kernel instantiations (`name_expressions`)
    geometry.py       the fixed tile sizes, thread counts and shared-memory formulas, pasted into the CUDA
                      source as constexpr and evaluated here (no eval)
    tiles.py          the catalogue: every tile shape with its named schedule and epilogue; labels from names
    launch_choices.py the conv path (mixed on cc 9.0, else mma.sync; a caller may force mma or wgmma) and
                      programmatic dependent launch (cc >= 9.0; the engine uses it up to PDL_MAX_BATCH),
                      from explicit arguments: nothing in this package reads the environment
    planner.py        tuned-plan lookup, the untuned rules and cost model, the kernels serving compiles
                      (build, geometry, tiles, launch_choices and planner are pure Python: no CuPy)
    launch.py         `library(device, path, pdl)`: the served kernels (those its plans can launch; the
                      tuner's other candidates on first use) + launchers with shape checks
    nvrtc_build.py    NVRTC compile, one program per kernel in parallel, cached on disk per kernel (CuPy's RawModule
                      cannot target sm_90a, and recompiles name expressions at every start)
    sass_diff.py      per-kernel SASS dump and compare (CPU, nvcc + cuobjdump): a refactor keeps the machine code
    tuned_plans/      one table per GPU model (<its name>.json: H100, H200): measured best tile / split-K per layer
                      shape and batch bucket, overall and per kernel family (both families)
    tune.py           times every candidate plan of one conv (CUDA-graph timed); the network tuner that
                      writes tuned_plans/<model>.json is `fusedresnet.harness.tune`
    gpu_check.sh      one GPU-host call: [tune +] check + bench [+ ncu]; `served`: cold start + quick check + dev
    dev/              experiments the tuner never chose, apart from what ships, each runnable as a check and then
                      a benchmark (dev/__init__.py lists them)

The engine that strings the kernels together is `fusedresnet.backend.engines.fused_cuda`; the harness that
checks, times and tunes them (check, bench, diff, profile_layers, tune) is `fusedresnet.harness`. This package
imports neither (nor `fusedresnet.client`): tests/test_package_layering.py.
Measurements, predictions and outcomes: NOTES.md.
"""
