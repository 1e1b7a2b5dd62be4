"""conv_wgmma_ws: conv_wgmma with warp specialisation on cp.async loads (kernels/dev/conv_wgmma_ws.cu).

    python -m fusedresnet.kernels.dev.conv_wgmma_ws [--batch 128] [--tiles ws128x128g2s4,...]

On an H100 / H200 (sm_90a): first checks every "ws" tile on each 3x3 convolution of ResNet-18 at 224 x 224
(bias, ReLU) against a float32 reference computed tap by tap with CuPy (relative L2 error at most
MAX_REL_L2), stopping at the first failure; then times each tile and the plan the served library uses for
that shape (CUDA-graph timed, kernels/tune.time_graph) and prints CSV:
layer,N,H,W,C,K,stride,kernel,ms,TFLOP/s,rel_l2.

Why it is here and not served: a producer warpgroup issues every cp.async of the A and B tiles, the
consumer warpgroups only wgmma and the epilogue, per-stage full / empty mbarriers instead of a
__syncthreads per k-tile. Measured on the H100 (NOTES.md outcome 11): correct, 17-23% slower than the
plain wgmma tiles; the tuner never chose one. Its mbarrier ring lives on in conv_wgmma_tma.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..geometry import BK
from ..planner import make_plan
from ..tiles import Schedule, WgmmaConfig

SOURCE = Path(__file__).resolve().with_suffix(".cu")
# 2 consumer warpgroups + 1 producer warpgroup (384 threads), one block per SM
WS = Schedule.CP_ASYNC_WARP_SPECIALIZED
TILES = (
    WgmmaConfig(128, 128, 2, 4, efficiency=1.2, blocks_per_sm=1, schedule=WS),   # 129 KB
    WgmmaConfig(128, 128, 2, 6, efficiency=1.2, blocks_per_sm=1, schedule=WS),   # 193 KB
    WgmmaConfig(128, 256, 2, 4, efficiency=1.5, blocks_per_sm=1, schedule=WS),   # 193 KB
    WgmmaConfig(256, 128, 2, 4, efficiency=1.5, blocks_per_sm=1, schedule=WS),   # 193 KB
)
# ResNet-18's 3x3 convolutions after the stem at 224 x 224: (name, input H = W, C, K, stride)
LAYERS = (("layer1", 56, 64, 64, 1), ("layer2.0.conv1", 56, 64, 128, 2), ("layer2", 28, 128, 128, 1),
          ("layer3.0.conv1", 28, 128, 256, 2), ("layer3", 14, 256, 256, 1), ("layer4.0.conv1", 14, 256, 512, 2),
          ("layer4", 7, 512, 512, 1))
MAX_REL_L2 = 5e-3   # fp16 output of fp32 sums: ~5e-4 measured on the served tiles


def dev_library(device_id: int = 0):
    """The served library of this device with conv_wgmma_ws added (sm_90a only)."""
    from ..launch import KernelLibrary
    return KernelLibrary(device_id, "auto", dev_sources=(SOURCE,),
                         dev_kernels={t.name_expression: t.smem_bytes for t in TILES})


def reference(cp, x, weight, bias, stride: int):
    """float32 NHWC output of the 3x3 / pad 1 convolution + bias + ReLU, tap by tap."""
    n, h, w, c = x.shape
    k = weight.shape[0]
    p, q = (h - 1) // stride + 1, (w - 1) // stride + 1
    padded = cp.pad(x.astype(cp.float32), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = cp.zeros((n * p * q, k), dtype=cp.float32)
    for r in range(3):
        for s in range(3):
            taps = padded[:, r:r + stride * (p - 1) + 1:stride, s:s + stride * (q - 1) + 1:stride, :]
            out += taps.reshape(-1, c) @ weight[:, r, s, :].astype(cp.float32).T
    return cp.maximum(out + bias, 0).reshape(n, p, q, k)


def main(argv=None) -> int:
    import cupy as cp

    from ..tune import time_graph
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tiles", help="comma-separated labels (default: every ws tile)")
    args = parser.parse_args(argv)
    tiles = [t for t in TILES if not args.tiles or t.label in args.tiles.split(",")]
    if cp.cuda.Device(0).compute_capability != "90":
        raise SystemExit("conv_wgmma_ws needs the sm_90a module (compute capability 9.0, an H100 or H200)")
    lib = dev_library(0)
    lib.load([t.name_expression for t in tiles])
    rng = cp.random.default_rng(0)
    cases = []
    for name, hw, c, k, stride in LAYERS:   # check everything first
        n = args.batch
        x = rng.standard_normal((n, hw, hw, c), dtype=cp.float32).astype(cp.float16)
        weight = (rng.standard_normal((k, 3, 3, c), dtype=cp.float32) * (2 / (9 * c)) ** 0.5).astype(cp.float16)
        bias = rng.standard_normal(k, dtype=cp.float32) * 0.1
        p = (hw - 1) // stride + 1
        y = cp.empty((n, p, p, k), dtype=cp.float16)
        expected = reference(cp, x, weight, bias, stride)
        served = lib.plan(n, hw, hw, c, k, 3, 3, stride, 1)
        plans = [(t.label, make_plan(t, 1, n * p * p, k, 9 * c // BK)) for t in tiles]
        workspace = cp.empty(max(1, served.workspace_floats(y.size)), dtype=cp.float32)
        for label, plan in plans + [(f"served:{served.tile.label}/k{served.splits}", served)]:
            y.fill(cp.nan)
            lib.conv(x, weight, bias, y, stride=stride, pad=1, relu=True, plan=plan, workspace=workspace)
            error = float(cp.linalg.norm(y.astype(cp.float32) - expected) / cp.linalg.norm(expected))
            if not error <= MAX_REL_L2:
                print(f"FAIL {name} N={n} {label}: relative L2 error {error:.3g} > {MAX_REL_L2}", flush=True)
                return 1
            cases.append((name, n, hw, c, k, stride, label, plan, error, x, weight, bias, y, workspace))
    print(f"check: {len(cases)} convolutions within relative L2 {MAX_REL_L2}", flush=True)
    print("layer,N,H,W,C,K,stride,kernel,ms,TFLOP/s,rel_l2")
    for name, n, hw, c, k, stride, label, plan, error, x, weight, bias, y, workspace in cases:
        def run(x=x, weight=weight, bias=bias, y=y, stride=stride, plan=plan, workspace=workspace):
            lib.conv(x, weight, bias, y, stride=stride, pad=1, relu=True, plan=plan, workspace=workspace)
        with lib.launch_mode(False):
            ms = time_graph(run)
        flops = 2 * y.size * 9 * c
        print(f"{name},{n},{hw},{hw},{c},{k},{stride},{label},{ms:.4f},{flops / ms / 1e9:.1f},{error:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
