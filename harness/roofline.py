"""The roofline of each convolution (issue 48): its FLOPs and the bytes it must move at least, against the tensor
cores' peak and the memory's bandwidth, both measured on the GPU that runs the table (harness/bench.py).

A layer's compulsory bytes are what it reads and writes once: its input, weights and bias, its output, the
residual it adds, a fused shortcut's input and weights; fp16 activations and weights (the stem reads uint8
pixels and writes the max-pooled map), fp32 biases. Split-K's fp32 workspace and re-reads of the input by
neighbouring tiles are not compulsory: where a layer's time exceeds its roof, they are among the reasons.

    roof_ms = max(FLOPs / peak, bytes / bandwidth)

`pct_roof` = roof_ms / ms: 100% is a layer at its roof; the bound that sets the roof (compute or memory) says
which resource a faster kernel would have to use better.
"""

from __future__ import annotations

FP16_BYTES = 2
FP32_BYTES = 4


def conv_bytes(n: int, h: int, w: int, p: int, q: int, in_channels: int, out_channels: int, kernel: int, *,
               adds_residual: bool = False, shortcut_channels: int = 0, shortcut_hw: tuple[int, int] | None = None,
               shortcut_stride: int = 1, input_bytes: int = FP16_BYTES) -> int:
    """The bytes a convolution of batch n, input h x w x in_channels, output p x q x out_channels, must move at least
    (module docstring). A 1x1 convolution reads only the pixels its stride lands on (p x q of them); a 3x3 one of
    stride 2 reads every pixel."""
    read_h, read_w = (p, q) if kernel == 1 else (h, w)
    moved = n * read_h * read_w * in_channels * input_bytes              # input
    moved += out_channels * kernel * kernel * in_channels * FP16_BYTES   # weights
    moved += out_channels * FP32_BYTES                                   # bias
    moved += n * p * q * out_channels * FP16_BYTES                       # output
    if adds_residual:
        moved += n * p * q * out_channels * FP16_BYTES
    if shortcut_channels:   # a fused 1x1 projection: the pixels its stride lands on, and its weights
        sh, sw = (-(-side // shortcut_stride) for side in shortcut_hw)
        moved += n * sh * sw * shortcut_channels * FP16_BYTES + out_channels * shortcut_channels * FP16_BYTES
    return moved


def stem_bytes(n: int, h: int, w: int, pooled_h: int, pooled_w: int, out_channels: int = 64, kernel: int = 7) -> int:
    """The fused stem and max-pool: uint8 pixels in, the pooled fp16 map out (the pre-pool map never leaves chip)."""
    return (n * h * w * 3 + out_channels * kernel * kernel * 3 * FP16_BYTES + out_channels * FP32_BYTES
            + n * pooled_h * pooled_w * out_channels * FP16_BYTES)


def roofline(flops: float, moved_bytes: int, ms: float, peak_tflops: float, bandwidth_gbs: float,
             l2_bytes: int = 0) -> dict:
    """A layer's place under its roof: arithmetic intensity, achieved TFLOP/s and GB/s, each resource's time at
    its peak, which one bounds it, and the share of the roof reached. `fits_l2`: the bytes fit in an L2 cache of
    `l2_bytes`, so replayed back to back the layer may read from L2 faster than the memory's bandwidth (GB/s and the
    share of a memory roof can then exceed it)."""
    compute_ms = flops / (peak_tflops * 1e9)
    memory_ms = moved_bytes / (bandwidth_gbs * 1e6)
    roof_ms = max(compute_ms, memory_ms)
    return {"MB": round(moved_bytes / 1e6, 2), "flop_per_byte": round(flops / moved_bytes, 1),
            "GB/s": round(moved_bytes / ms / 1e6, 1), "compute_ms": round(compute_ms, 5),
            "memory_ms": round(memory_ms, 5), "bound": "compute" if compute_ms >= memory_ms else "memory",
            "pct_roof": round(100 * roof_ms / ms, 1), "fits_l2": moved_bytes <= l2_bytes}


def memory_bandwidth_gbs(size_bytes: int = 1 << 30, trials: int = 5) -> float:
    """The device memory's bandwidth as a copy reaches it: the best of `trials` medians of copying `size_bytes`
    (read + write), after a warm-up."""
    import statistics

    import cupy as cp

    source = cp.ones(size_bytes // 4, dtype=cp.float32)
    target = cp.empty_like(source)
    for _ in range(10):
        cp.copyto(target, source)
    best = 0.0
    for _ in range(trials):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(10):
            start.record()
            cp.copyto(target, source)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        best = max(best, 2 * source.nbytes / statistics.median(times) / 1e6)
    return best


def time_shares(rows: list[dict]) -> list[dict]:
    """Each row with its share of the time of all rows of its batch and path (`time_share`, %)."""
    totals: dict[tuple, float] = {}
    for row in rows:
        totals[(row["path"], row["N"])] = totals.get((row["path"], row["N"]), 0.0) + row["ms"]
    return [dict(row, time_share=round(100 * row["ms"] / totals[(row["path"], row["N"])], 1)) for row in rows]
