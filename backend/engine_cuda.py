"""The fused CUDA engine: ResNet-18 on our own kernels (``fusedresnet.kernels``).

Importing this module needs CuPy: on a host without it the import raises
ImportError and `create_custom_engine` falls back to the PyTorch folded graph.

How a batch runs:
1. The input (uint8 [N,H,W,3] or fp32 [N,3,H,W], CPU or CUDA) is copied into a
   static device buffer of the plan for (batch bucket, input kind, H, W); the
   bucket is the next power of two >= N (up to 256; larger batches go in chunks).
2. The plan's CUDA graph is replayed: stem conv (normalisation fused into its
   loader, the 3x3/2 max-pool into its epilogue) -> 8 BasicBlocks, each conv
   an implicit-GEMM kernel (tile shape and split-K per layer from the tuning
   table) with the folded BatchNorm bias, residual and ReLU in its epilogue,
   the downsample conv on a second captured stream, concurrent with the
   block's first conv -> avgpool + fc in one kernel.
3. The first N rows of the logits are copied out and handed to PyTorch by DLPack.

Every buffer of a plan is allocated when the plan is built (first use of a
bucket and shape), never during a replay. No cuDNN, cuBLAS or torch op runs on
the way: torch only hands tensors over.
"""

from __future__ import annotations

import threading

import cupy as cp  # noqa: E402  (ImportError here means: no fused engine on this host)
import numpy as np
import torch

from ..kernels.configs import STEM_KG_PADDED
from ..kernels.launch import conv_out_size, library
from .folding import MAXPOOL_KERNEL, MAXPOOL_PADDING, MAXPOOL_STRIDE, STEM, load_folded, resnet18_blocks
from .spec import IMAGENET_MEAN, IMAGENET_STD

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_SIZE = 32
INT32_LIMIT = 2 ** 31 - 1


def stage_sizes(h: int, w: int) -> list[tuple[int, int]]:
    """Spatial size after the stem, the max-pool and each of the 4 stages."""
    sizes = [(conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3))]
    sizes.append(tuple(conv_out_size(v, MAXPOOL_KERNEL, MAXPOOL_STRIDE, MAXPOOL_PADDING) for v in sizes[-1]))
    for stride in (1, 2, 2, 2):
        sizes.append(tuple(conv_out_size(v, 3, stride, 1) for v in sizes[-1]))
    return sizes


class _Plan:
    """Buffers, launch plans and the captured graph for one (bucket, kind, H, W)."""

    def __init__(self, engine: "FusedCudaEngine", batch: int, kind: str, h: int, w: int):
        lib = engine.lib
        self.batch, self.kind, self.h, self.w = batch, kind, h, w
        if kind == "uint8":
            self.input = cp.zeros((batch, h, w, 3), dtype=cp.uint8)
        else:
            self.input = cp.zeros((batch, 3, h, w), dtype=cp.float32)
        (h1, w1), (h2, w2) = stage_sizes(h, w)[:2]
        # The fused stem+pool kernel writes the pooled map directly; the unfused
        # path (fuse_stem_pool=False) keeps the stem output.
        self.stem_out = (None if engine.fuse_stem_pool else
                         cp.empty((batch, h1, w1, STEM.out_channels), dtype=cp.float16))
        self.pool_out = cp.empty((batch, h2, w2, STEM.out_channels), dtype=cp.float16)
        self.steps = []   # (block, conv1 out, downsample out or None, block out, plans, events)
        x_shape = self.pool_out.shape
        workspace_main = workspace_side = 0
        for block in engine.blocks:
            n, hh, ww, c = x_shape
            s = block.conv1.stride
            p, q = conv_out_size(hh, 3, s, 1), conv_out_size(ww, 3, s, 1)
            k = block.conv1.out_channels
            plans = {
                "conv1": lib.plan(n, hh, ww, c, k, 3, 3, s, 1),
                "conv2": lib.plan(n, p, q, k, k, 3, 3, 1, 1),
            }
            if block.downsample is not None:
                plans["downsample"] = lib.plan(n, hh, ww, c, k, 1, 1, s, 0)
                workspace_side = max(workspace_side, self._workspace(plans["downsample"], n * p * q * k))
            for key in ("conv1", "conv2"):
                workspace_main = max(workspace_main, self._workspace(plans[key], n * p * q * k))
            t = cp.empty((n, p, q, k), dtype=cp.float16)
            d = cp.empty((n, p, q, k), dtype=cp.float16) if block.downsample is not None else None
            out = cp.empty((n, p, q, k), dtype=cp.float16)
            events = None
            if block.downsample is not None:   # fork/join of the side stream, made before any capture
                events = (cp.cuda.Event(block=False, disable_timing=True),
                          cp.cuda.Event(block=False, disable_timing=True))
            self.steps.append((block, t, d, out, plans, events))
            x_shape = out.shape
        self.features = self.steps[-1][3]
        self.logits = cp.empty((batch, engine.fc_weight.shape[0]), dtype=cp.float32)
        self.workspace_main = cp.empty(max(workspace_main, 1), dtype=cp.float32)
        self.workspace_side = cp.empty(max(workspace_side, 1), dtype=cp.float32)
        self.graph = None

    @staticmethod
    def _workspace(plan, outputs: int) -> int:
        return plan.splits * outputs if plan.splits > 1 else 0


class FusedCudaEngine:
    """ResNet-18 forward pass on our fused fp16 kernels, one CUDA graph per batch bucket and input shape."""

    @staticmethod
    def describe(device: str) -> str:
        return "fused-cuda-fp16"

    def __init__(self, params_or_path, device: str = "cuda:0", concurrent_downsample: bool = True,
                 fuse_stem_pool: bool = True):
        params = load_folded(params_or_path) if not isinstance(params_or_path, dict) else params_or_path
        self.torch_device = torch.device(device)
        if self.torch_device.type != "cuda":
            raise ValueError(f"FusedCudaEngine runs on a CUDA device, not {device!r}")
        self.device_id = self.torch_device.index if self.torch_device.index is not None else 0
        self.name = self.describe(device)
        self.blocks = resnet18_blocks()
        self.concurrent_downsample = concurrent_downsample
        self.fuse_stem_pool = fuse_stem_pool
        self._lock = threading.Lock()
        self._plans: dict[tuple, _Plan] = {}
        with cp.cuda.Device(self.device_id):
            self.lib = library(self.device_id)
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.side_stream = cp.cuda.Stream(non_blocking=True)
            convs = params["convs"]
            self.weights = {}
            for name, conv in convs.items():
                weight = cp.asarray(conv["weight"].contiguous().view(torch.int16).numpy()).view(cp.float16)
                self.weights[name] = (weight, cp.asarray(conv["bias"].float().numpy()))
            stem_w, stem_b = self.weights[STEM.name]
            k = stem_w.shape[0]
            # [K,7,7,3] -> [K, 8 filter rows, 24 = 7*3 values + 3 zeros]: the stem loader's layout.
            padded = cp.zeros((k, 8, 24), dtype=cp.float16)
            padded[:, :7, :21] = stem_w.reshape(k, 7, 21)
            padded = padded.reshape(k, STEM_KG_PADDED)
            self.stem_weight, self.stem_bias = padded, stem_b
            mean = np.array(IMAGENET_MEAN, dtype=np.float64)
            std = np.array(IMAGENET_STD, dtype=np.float64)
            self.in_scale = cp.asarray((1.0 / (255.0 * std)).astype(np.float32))
            self.in_shift = cp.asarray((-mean / std).astype(np.float32))
            self.fc_weight = cp.asarray(params["fc"]["weight"].contiguous().view(torch.int16).numpy()).view(cp.float16)
            self.fc_bias = cp.asarray(params["fc"]["bias"].float().numpy())
            cp.cuda.Device(self.device_id).synchronize()

    # -- plans and graphs ----------------------------------------------------
    def max_chunk(self, h: int, w: int) -> int:
        """Largest bucket whose biggest activation (the stem output) stays within int32 indexing."""
        h1, w1 = stage_sizes(h, w)[0]
        per_image = h1 * w1 * STEM.out_channels
        fitting = [b for b in BATCH_BUCKETS if b * per_image <= INT32_LIMIT]
        if not fitting:
            raise ValueError(f"input {h}x{w} is too large for the fused engine")
        return fitting[-1]

    def plan(self, batch: int, kind: str, h: int, w: int) -> _Plan:
        key = (batch, kind, h, w)
        plan = self._plans.get(key)
        if plan is None:
            with cp.cuda.Device(self.device_id):
                plan = _Plan(self, batch, kind, h, w)
                with self.stream:
                    self._forward(plan)          # first run: loads the module, checks the launches
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    with self.stream:
                        self._forward(plan)
                finally:
                    plan.graph = self.stream.end_capture()
                self._plans[key] = plan
        return plan

    def _forward(self, plan: _Plan):
        """Launch the whole network on the current stream (self.stream)."""
        lib = self.lib
        if self.fuse_stem_pool:
            lib.stem_pool(plan.input, self.stem_weight, self.stem_bias, plan.pool_out, kind=plan.kind,
                          in_scale=self.in_scale, in_shift=self.in_shift)
        else:
            lib.stem(plan.input, self.stem_weight, self.stem_bias, plan.stem_out, kind=plan.kind,
                     in_scale=self.in_scale, in_shift=self.in_shift)
            lib.maxpool_3x3s2(plan.stem_out, plan.pool_out)
        x = plan.pool_out
        for block, t, d, out, plans, events in plan.steps:
            identity = x
            joined = None
            if block.downsample is not None:
                w_d, b_d = self.weights[block.downsample.name]
                if self.concurrent_downsample:
                    fork, joined = events
                    fork.record(self.stream)
                    self.side_stream.wait_event(fork)
                    with self.side_stream:
                        lib.conv(x, w_d, b_d, d, stride=block.downsample.stride, pad=0, relu=False,
                                 plan=plans["downsample"], workspace=plan.workspace_side)
                    joined.record(self.side_stream)
                else:
                    lib.conv(x, w_d, b_d, d, stride=block.downsample.stride, pad=0, relu=False,
                             plan=plans["downsample"], workspace=plan.workspace_side)
                identity = d
            w1, b1 = self.weights[block.conv1.name]
            lib.conv(x, w1, b1, t, stride=block.conv1.stride, pad=1, relu=True, plan=plans["conv1"],
                     workspace=plan.workspace_main)
            if joined is not None:
                self.stream.wait_event(joined)
            w2, b2 = self.weights[block.conv2.name]
            lib.conv(t, w2, b2, out, stride=1, pad=1, relu=True, residual=identity, plan=plans["conv2"],
                     workspace=plan.workspace_main)
            x = out
        lib.avgpool_fc(x, self.fc_weight, self.fc_bias, plan.logits)

    # -- public interface ----------------------------------------------------
    def _to_cupy(self, images: torch.Tensor):
        if images.is_cuda:
            if images.device != self.torch_device:
                images = images.to(self.torch_device)
            return cp.from_dlpack(images.contiguous())
        return cp.asarray(images.contiguous().numpy())

    def _run(self, images: torch.Tensor, kind: str, want: str) -> torch.Tensor:
        if kind == "uint8":
            if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[3] != 3:
                raise ValueError(f"expected uint8 [N,H,W,3] images, got {images.dtype} {tuple(images.shape)}")
            n, h, w = images.shape[0], images.shape[1], images.shape[2]
        else:
            if images.dim() != 4 or images.shape[1] != 3:
                raise ValueError(f"expected float [N,3,H,W] images, got {images.dtype} {tuple(images.shape)}")
            images = images.float()
            n, h, w = images.shape[0], images.shape[2], images.shape[3]
        if h < MIN_SIZE or w < MIN_SIZE:
            raise ValueError(f"input {h}x{w}: the fused engine needs H, W >= {MIN_SIZE}")
        if n == 0:
            raise ValueError("empty batch")
        chunk = self.max_chunk(h, w)
        outputs = []
        with self._lock, cp.cuda.Device(self.device_id), self.stream:
            source = self._to_cupy(images)
            for start in range(0, n, chunk):
                part = source[start:start + chunk]
                count = part.shape[0]
                bucket = next(b for b in BATCH_BUCKETS if b >= count)
                plan = self.plan(bucket, kind, h, w)
                plan.input[:count] = part
                plan.graph.launch(self.stream)
                if want == "logits":
                    outputs.append(plan.logits[:count].copy())
                else:   # fp32 NCHW features, like torch's
                    outputs.append(plan.features[:count].astype(cp.float32).transpose(0, 3, 1, 2).copy())
            result = outputs[0] if len(outputs) == 1 else cp.concatenate(outputs)
            self.stream.synchronize()
        return torch.from_dlpack(result)

    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [N,H,W,3] RGB pixels (CPU or CUDA) -> fp32 logits [N,1000] on this engine's device."""
        return self._run(images, "uint8", "logits")

    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        """fp32 [N,3,H,W] ImageNet-normalised images -> fp32 logits [N,1000] on this engine's device."""
        return self._run(images, "float32", "logits")

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Features before the head, fp32 [N,512,H/32,W/32]: uint8 NHWC or fp32 NCHW normalised input."""
        return self._run(images, "uint8" if images.dtype == torch.uint8 else "float32", "features")

    def warm_up(self, batches=BATCH_BUCKETS[:8], size: tuple[int, int] = (224, 224), kinds=("uint8",)):
        """Build and capture the plans ahead of the first requests (a Triton model's initialize)."""
        with self._lock:
            for kind in kinds:
                for batch in batches:
                    self.plan(batch, kind, *size)

    def replay(self, batch: int, h: int = 224, w: int = 224, kind: str = "uint8"):
        """Launch one captured forward pass on the plan's current input (benchmarks); does not wait."""
        plan = self.plan(batch, kind, h, w)
        with cp.cuda.Device(self.device_id):
            plan.graph.launch(self.stream)
        return plan
