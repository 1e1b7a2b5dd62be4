"""fusedresnet.harness: the harness that validates every kernel and the whole network against a float32
PyTorch reference before timing anything (in the style of llm.c's dev/cuda harness).

    check.py          correctness of every kernel and of the whole engine vs float32 PyTorch
                      (`python -m fusedresnet.harness.check`)
    bench.py          whole-network benchmark vs the cuDNN baselines, per-layer table, plot
                      (`python -m fusedresnet.harness.bench`)
    diff.py           layer-by-layer diff of an engine against the float32 reference, CPU or GPU
                      (`python -m fusedresnet.harness.diff`)
    profile_layers.py a few launches for Nsight Compute (`python -m fusedresnet.harness.profile_layers`)
    tune.py           every conv of ResNet-18 at every batch bucket of the engine through
                      `fusedresnet.kernels.tune`, refined in the engine's graph, writes kernels/tuned_plans/<model>.json
                      (`python -m fusedresnet.harness.tune`)
    launch_gaps.py    the network graph idle, behind a spin kernel and back to back, PDL on and off
    capture_spread.py the network graph's time over fresh captures (`python -m fusedresnet.harness.capture_spread`)

The GPU-host run of check and bench (and tune, ncu) is `kernels/gpu_check.sh`.

Dependency direction: the harness depends on `fusedresnet.kernels` (the kernels it checks and times),
`fusedresnet.backend` (ResNet-18, its folded weights and the engine that strings the kernels together)
and `fusedresnet.client` (the agreement measures and the sample photos); nothing depends on it.
"""
