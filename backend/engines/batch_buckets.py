"""The batch an engine runs for `count` images: the power-of-two bucket at or above it.

Both engines that capture CUDA graphs (the fused kernels, TorchScript on cuDNN) capture one per bucket, so a
request of 5 images runs the batch-8 graph; `spec.power_of_two_buckets` lists the buckets up to a limit.
"""

from __future__ import annotations


def next_power_of_two(count: int) -> int:
    return 1 << (count - 1).bit_length()
