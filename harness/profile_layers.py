"""A handful of kernel launches at batch 128 for Nsight Compute (outside any CUDA graph).

    ncu --clock-control none --launch-skip 6 --launch-count 6 ... python -m fusedresnet.harness.profile_layers

Launches, in order, twice (a warm-up round, then the round to profile): the
fused stem + max-pool (uint8), layer1's 3x3 conv without and with the
residual, layer2's first 3x3 conv (stride 2), layer2's and layer3's 3x3 conv,
each with the plan the engine uses (LAUNCHES_PER_ROUND: gpu_check.sh profile
skips the first round).
"""

from __future__ import annotations

import cupy as cp

# The engine only for its prepared weights (folded, fp16 KRSC, the stem padded).
from ..backend.engines.config import environment_engine_arguments
from ..backend.engines.fused_cuda import FusedCudaEngine
from ..backend.resnet.folding import fold_resnet18
from ..backend.resnet.weights import build_resnet18

LAUNCHES_PER_ROUND = 6   # the stem and five convolutions


def main():
    n = 128
    engine = FusedCudaEngine(fold_resnet18(build_resnet18()), "cuda:0", **environment_engine_arguments())
    lib = engine.lib
    images = cp.random.randint(0, 256, (n, 224, 224, 3), dtype=cp.int32).astype(cp.uint8)
    pooled = cp.empty((n, 56, 56, 64), dtype=cp.float16)
    l1 = cp.empty_like(pooled)
    l1b = cp.empty_like(pooled)

    def activations(hw, c):
        return cp.random.standard_normal((n, hw, hw, c), dtype=cp.float32).astype(cp.float16)

    x2, x3 = activations(28, 128), activations(14, 256)
    y2, y3 = cp.empty_like(x2), cp.empty_like(x3)
    y2s = cp.empty_like(x2)
    # (name, input size, input channels, output channels, stride, input, output, residual)
    convs = [("layer1.0.conv1", 56, 64, 64, 1, pooled, l1, None), ("layer1.0.conv2", 56, 64, 64, 1, l1, l1b, pooled),
             ("layer2.0.conv1", 56, 64, 128, 2, l1b, y2s, None), ("layer2.1.conv1", 28, 128, 128, 1, x2, y2, None),
             ("layer3.1.conv1", 14, 256, 256, 1, x3, y3, None)]
    assert 1 + len(convs) == LAUNCHES_PER_ROUND
    plans = {name: lib.plan(n, hw, hw, c, k, 3, 3, stride, 1) for name, hw, c, k, stride, *_ in convs}
    print("plans:", {name: (p.tile.label, p.splits) for name, p in plans.items()})
    for _ in range(2):
        lib.stem_pool(images, engine.stem_weight, engine.stem_bias, pooled, kind="uint8",
                      in_scale=engine.in_scale, in_shift=engine.in_shift)
        for name, _hw, _c, _k, stride, x, y, residual in convs:
            w, b = engine.weights[name]
            lib.conv(x, w, b, y, stride=stride, pad=1, relu=True, residual=residual, plan=plans[name])
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
