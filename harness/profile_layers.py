"""A handful of kernel launches at batch 128 for Nsight Compute (outside any CUDA graph).

    ncu --section SpeedOfLight ... python -m fusedresnet.harness.profile_layers

Launches, in order: the fused stem + max-pool (uint8), layer1's 3x3 conv and
layer3's 3x3 conv with the plans the engine uses, each once after a warm-up.
"""

from __future__ import annotations

import cupy as cp

# The engine only for its prepared weights (folded, fp16 KRSC, the stem padded).
from ..backend.engine_cuda import FusedCudaEngine
from ..backend.folding import fold_resnet18
from ..backend.resnet import build_resnet18
from ..kernels.launch import library


def main():
    n = 128
    engine = FusedCudaEngine(fold_resnet18(build_resnet18()), "cuda:0")
    lib = library(0)
    images = cp.random.randint(0, 256, (n, 224, 224, 3), dtype=cp.int32).astype(cp.uint8)
    pooled = cp.empty((n, 56, 56, 64), dtype=cp.float16)
    l1 = cp.empty_like(pooled)
    x3 = cp.random.standard_normal((n, 14, 14, 256), dtype=cp.float32).astype(cp.float16)
    y3 = cp.empty_like(x3)
    w1, b1 = engine.weights["layer1.0.conv1"]
    w3, b3 = engine.weights["layer3.1.conv1"]
    plan1 = lib.plan(n, 56, 56, 64, 64, 3, 3, 1, 1)
    plan3 = lib.plan(n, 14, 14, 256, 256, 3, 3, 1, 1)
    print("plans:", plan1.tile.label, plan1.splits, plan3.tile.label, plan3.splits)
    for _ in range(2):
        lib.stem_pool(images, engine.stem_weight, engine.stem_bias, pooled, kind="uint8",
                      in_scale=engine.in_scale, in_shift=engine.in_shift)
        lib.conv(pooled, w1, b1, l1, stride=1, pad=1, relu=True, plan=plan1)
        lib.conv(x3, w3, b3, y3, stride=1, pad=1, relu=True, plan=plan3)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
