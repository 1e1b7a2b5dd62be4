"""The fused CUDA engine: ResNet-18 on our own kernels (``fusedresnet.kernels``).

Importing this module needs CuPy: on a host without it the import raises
ImportError, and a GPU instance of `resnet18_custom` refuses to load, naming
it (`serving.custom_engine_plan`: no silent fallback).

How a batch runs:
1. The input (uint8 [N,H,W,3] or fp32 [N,3,H,W], CPU or CUDA) is copied into a
   static device buffer of the plan for (batch bucket, input kind, H, W); the
   bucket is the next power of two >= N (up to 256; larger batches go in chunks).
   The Triton model writes straight into that buffer (`input_buffer`, the
   serving interface of `backend/engines/serving.py`), so a served batch is copied once.
2. The plan's CUDA graph is replayed: stem conv (normalisation fused into its
   loader, the 3x3/2 max-pool into its epilogue) -> 8 BasicBlocks, each conv
   an implicit-GEMM kernel with the folded BatchNorm bias, residual and ReLU
   in its epilogue. Each conv's plan (kernel family, tile shape, split-K)
   comes from the tuning table of this GPU model, else the cost model; on
   compute capability 9.0 (the mixed path) a plan may name a wgmma tile or
   an mma.sync one (generic or conv3x3_patch), per layer and batch bucket,
   and the one sm_90a module holds both; mma.sync only elsewhere;
   config conv_path or FUSEDRESNET_CONV_PATH=mma|wgmma forces one family;
   in a downsampling block, from batch bucket SHORTCUT_FUSION_MIN_BATCH up,
   the 1x1 projection is fused into the second conv (`folding.with_shortcut`:
   its input channels are extra k-tiles of that conv's reduction, so it has
   no kernel and no output of its own); in smaller buckets it is its own
   kernel on a second captured stream, concurrent with the block's first
   conv -> avgpool + fc in one kernel.
3. The first N rows of the logits are copied out and handed to PyTorch by DLPack.

Threads: the library calls (classify_uint8, classify_normalized, features,
checkpoint_outputs) may come from several threads; the engine's lock holds
each call's copy-in, replay, copy-out and synchronisation together. The
serving interface has one caller at a time (see `backend/engines/serving.py`).

A CUDA input is read on the engine's own stream after the caller's current torch
stream has reached this point (the engine's stream waits on it), so an input
produced by earlier torch work on the current stream is complete; results are
ready when a call returns.

Every buffer of a plan is allocated when the plan is built (first use of a
bucket and shape), never during a replay. No cuDNN, cuBLAS or torch op runs on
the way: torch only hands tensors over.
"""

from __future__ import annotations

import threading

import cupy as cp  # noqa: E402  (ImportError here means: no fused engine on this host)
import numpy as np
import torch

from ...kernels.geometry import STEM_FILTER_ROWS, STEM_KG_PADDED, STEM_ROW_VALUES
from ...kernels.launch import conv_out_size, library
from ...kernels.launch_choices import PDL_MAX_BATCH, SHORTCUT_FUSION_MIN_BATCH
from ...kernels.tiles import tile_family
from ..resnet.folding import (
    MAXPOOL_KERNEL,
    MAXPOOL_PADDING,
    MAXPOOL_STRIDE,
    STEM,
    engine_convs,
    load_folded,
    resnet18_blocks,
    shortcut_params,
)
from ..spec import (
    IMAGE_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    INPUT_FP32,
    INPUT_UINT8,
    MIN_INPUT_SIZE,
    power_of_two_buckets,
)
from .batch_buckets import next_power_of_two

BATCH_BUCKETS = power_of_two_buckets(256)
# The kernels' name for the dtype of each Triton input.
KERNEL_INPUT_KIND = {INPUT_UINT8: "uint8", INPUT_FP32: "float32"}
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

    def __init__(self, engine: FusedCudaEngine, batch: int, input_name: str, h: int, w: int):
        lib = engine.lib
        self.batch, self.input_name, self.h, self.w = batch, input_name, h, w
        self.kernel_kind = KERNEL_INPUT_KIND[input_name]
        if input_name == INPUT_UINT8:
            self.input = cp.zeros((batch, h, w, 3), dtype=cp.uint8)
        else:
            self.input = cp.zeros((batch, 3, h, w), dtype=cp.float32)
        h2, w2 = stage_sizes(h, w)[1]
        # The fused stem+pool kernel writes the pooled map directly.
        self.pool_out = cp.empty((batch, h2, w2, STEM.out_channels), dtype=cp.float16)
        self.steps = []   # [_Step] per block
        workspace = workspace_side = 0
        for step, (n, *_), (p, q, k) in planned_steps(lib, engine.blocks, batch, h2, w2):
            workspace = max(workspace, *(pl.workspace_floats(n * p * q * k) for name, pl in step.plans.items()
                                         if name != "downsample"))
            if step.downsample is not None:   # its own kernel beside conv1, its output the residual
                workspace_side = max(workspace_side, step.plans["downsample"].workspace_floats(n * p * q * k))
                step.downsample_out = cp.empty((n, p, q, k), dtype=cp.float16)
                # fork / join of the side stream, made before any capture
                step.events = (cp.cuda.Event(block=False, disable_timing=True),
                               cp.cuda.Event(block=False, disable_timing=True))
            step.conv1_out = cp.empty((n, p, q, k), dtype=cp.float16)
            step.out = cp.empty((n, p, q, k), dtype=cp.float16)
            self.steps.append(step)
        self.features = self.steps[-1].out
        self.logits = cp.empty((batch, engine.fc_weight.shape[0]), dtype=cp.float32)
        self.workspace = cp.empty(max(workspace, 1), dtype=cp.float32)
        self.workspace_side = cp.empty(max(workspace_side, 1), dtype=cp.float32)
        self.graph = None
        # The same memory seen by torch (the Triton model copies into / out of these).
        self.input_torch = torch.from_dlpack(self.input)
        self.logits_torch = torch.from_dlpack(self.logits)


def planned_steps(lib, blocks, batch: int, h: int, w: int):
    """(_Step with its plans, its input's (N, H, W, C), its output's (P, Q, K)) of each BasicBlock of a batch
    whose stem + max-pool output is h x w."""
    x_shape = (batch, h, w, STEM.out_channels)
    for block in blocks:
        n, hh, ww, c = x_shape
        step = _Step(block, batch >= SHORTCUT_FUSION_MIN_BATCH)
        p, q = conv_out_size(hh, 3, step.conv1.stride, 1), conv_out_size(ww, 3, step.conv1.stride, 1)
        k = step.conv1.out_channels
        step.plans = {"conv1": lib.plan(n, hh, ww, c, k, 3, 3, step.conv1.stride, 1),
                      "conv2": lib.plan(n, p, q, k, k, 3, 3, 1, 1, shortcut_c=step.conv2.shortcut_channels)}
        if step.downsample is not None:
            step.plans["downsample"] = lib.plan(n, hh, ww, c, k, 1, 1, step.downsample.stride, 0)
        yield step, x_shape, (p, q, k)
        x_shape = (n, p, q, k)


def served_families(lib, blocks, h: int, w: int) -> list[str]:
    """The kernel families ("wgmma", "mma") that the library's plans for an h x w input run on at any batch
    bucket: those of the stem + max-pool and of every convolution's plan."""
    families = {"wgmma" if lib.wgmma_module else "mma"}
    h2, w2 = stage_sizes(h, w)[1]
    for batch in BATCH_BUCKETS:
        for step, _, _ in planned_steps(lib, blocks, batch, h2, w2):
            families.update(tile_family(plan.tile) for plan in step.plans.values())
    return [family for family in ("wgmma", "mma") if family in families]


class _Step:
    """One BasicBlock of a plan: its convolutions (`folding.engine_convs`), their plans and buffers."""

    def __init__(self, block, fuse_shortcut: bool):
        convs = engine_convs(block, fuse_shortcut)
        self.name = block.name
        self.downsample = convs[0] if len(convs) == 3 else None   # launched as its own kernel
        self.conv1, self.conv2 = convs[-2:]
        self.plans: dict = {}
        self.conv1_out = self.out = self.downsample_out = self.events = None   # set by _Plan


class FusedCudaEngine:
    """ResNet-18 forward pass on our fused fp16 kernels, one CUDA graph per batch bucket and input shape."""

    # The name the models answer with (ENGINE output, load log, load-test report): "fused-cuda-fp16-" and the
    # kernel families its plans at 224 x 224 run on, at any batch (`served_families`: "wgmma" where every plan
    # of the mixed path is a wgmma one, as the H100's tuned table has them, "wgmma+mma" where both are).
    NAME_PREFIX = "fused-cuda-fp16-"

    def __init__(self, params_or_path, device: str = "cuda:0", conv_path: str | None = None,
                 pdl: bool | None = None, pdl_max_batch: int = PDL_MAX_BATCH):
        """`conv_path`: "mma", "wgmma", "auto" or None (auto: by compute capability);
        `pdl`: programmatic dependent launch, None = where the device has it
        (`kernels.launch_choices.pdl_choice`), for the batch buckets up to `pdl_max_batch`. Both explicit:
        the environment's overrides are resolved by the caller (`config`)."""
        params = load_folded(params_or_path) if not isinstance(params_or_path, dict) else params_or_path
        self.torch_device = torch.device(device)
        if self.torch_device.type != "cuda":
            raise ValueError(f"FusedCudaEngine runs on a CUDA device, not {device!r}")
        self.device_id = self.torch_device.index if self.torch_device.index is not None else 0
        self.device = torch.device("cuda", self.device_id)
        self.blocks = resnet18_blocks()
        self._lock = threading.Lock()
        self._plans: dict[tuple, _Plan] = {}
        with cp.cuda.Device(self.device_id):
            self.lib = library(self.device_id, conv_path, pdl)
            self.pdl_max_batch = pdl_max_batch
            self.name = self.NAME_PREFIX + "+".join(served_families(self.lib, self.blocks, IMAGE_SIZE, IMAGE_SIZE))
            self.cupy_stream = cp.cuda.Stream(non_blocking=True)
            self.side_stream = cp.cuda.Stream(non_blocking=True)
            # The same CUDA stream seen by torch: the serving interface's `stream`.
            self.stream = torch.cuda.ExternalStream(self.cupy_stream.ptr, device=self.device)
            convs = params["convs"]
            self.weights = {}
            for name, conv in convs.items():
                weight = cp.asarray(conv["weight"].contiguous().view(torch.int16).numpy()).view(cp.float16)
                self.weights[name] = (weight, cp.asarray(conv["bias"].float().numpy()))
            for block in self.blocks:   # the downsampling blocks' conv2 with the projection fused in
                fused = engine_convs(block)[1]
                if fused.shortcut is not None:
                    weight, bias = shortcut_params(convs, fused)
                    self.weights[fused.name] = (cp.asarray(weight.view(torch.int16).numpy()).view(cp.float16),
                                                cp.asarray(bias.numpy()))
            stem_w, stem_b = self.weights[STEM.name]
            k, row = stem_w.shape[0], STEM.kernel * STEM.in_channels
            # [K,7,7,3] -> [K, 8 filter rows, 24 = 7*3 values + 3 zeros]: the stem loader's layout.
            padded = cp.zeros((k, STEM_FILTER_ROWS, STEM_ROW_VALUES), dtype=cp.float16)
            padded[:, :STEM.kernel, :row] = stem_w.reshape(k, STEM.kernel, row)
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

    def drop_graphs(self):
        """Forget every captured graph and its buffers: the next `plan` captures afresh, with the library's
        plans as they are then (the tuner's network refinement, harness.capture_spread)."""
        with self._lock:
            self._plans.clear()

    def plan(self, batch: int, input_name: str, h: int, w: int) -> _Plan:
        key = (batch, input_name, h, w)
        plan = self._plans.get(key)
        if plan is None:
            with cp.cuda.Device(self.device_id):
                plan = _Plan(self, batch, input_name, h, w)
                with self.lib.launch_mode(batch <= self.pdl_max_batch):
                    with self.cupy_stream:
                        self._forward(plan)          # first run: loads the module, checks the launches
                    self.cupy_stream.synchronize()
                    self.cupy_stream.begin_capture()
                    try:
                        with self.cupy_stream:
                            self._forward(plan)
                    finally:
                        plan.graph = self.cupy_stream.end_capture()
                self._plans[key] = plan
        return plan

    def _forward(self, plan: _Plan):
        """Launch the whole network on the current CuPy stream (self.cupy_stream)."""
        lib = self.lib
        lib.stem_pool(plan.input, self.stem_weight, self.stem_bias, plan.pool_out, kind=plan.kernel_kind,
                      in_scale=self.in_scale, in_shift=self.in_shift)
        x = plan.pool_out
        for step in plan.steps:
            identity = x
            if step.downsample is not None:   # on the side stream, concurrent with conv1
                w_d, b_d = self.weights[step.downsample.name]
                fork, joined = step.events
                fork.record(self.cupy_stream)
                self.side_stream.wait_event(fork)
                with self.side_stream:
                    lib.conv(x, w_d, b_d, step.downsample_out, stride=step.downsample.stride, pad=0, relu=False,
                             plan=step.plans["downsample"], workspace=plan.workspace_side)
                joined.record(self.side_stream)
                identity = step.downsample_out
            w1, b1 = self.weights[step.conv1.name]
            lib.conv(x, w1, b1, step.conv1_out, stride=step.conv1.stride, pad=1, relu=True, plan=step.plans["conv1"],
                     workspace=plan.workspace)
            w2, b2 = self.weights[step.conv2.name]
            if step.conv2.shortcut is not None:   # the block's projection of x fused in
                lib.conv_shortcut(step.conv1_out, w2, b2, step.out, x, shortcut_stride=step.conv2.shortcut.stride,
                                  plan=step.plans["conv2"], workspace=plan.workspace)
            else:
                if step.downsample is not None:
                    self.cupy_stream.wait_event(step.events[1])
                lib.conv(step.conv1_out, w2, b2, step.out, stride=1, pad=1, relu=True, residual=identity,
                         plan=step.plans["conv2"], workspace=plan.workspace)
            x = step.out
        lib.avgpool_fc(x, self.fc_weight, self.fc_bias, plan.logits)

    # -- serving interface (backend/engines/serving.py: ServingEngine) --------
    def describe(self) -> str:
        lib = self.lib
        return (f"fused CUDA kernels on {self.device} ({lib.device_name}, cc {lib.cc[0]}.{lib.cc[1]}), conv path "
                f"{lib.path}, {len(lib.tuned)} tuned plans, programmatic dependent launch {lib.pdl} "
                f"({lib.pdl_reason}; batches <= {self.pdl_max_batch})")

    def bucket(self, count: int) -> int:
        if count > BATCH_BUCKETS[-1]:
            raise ValueError(f"batch of {count}: the serving interface runs at most {BATCH_BUCKETS[-1]} images")
        return next_power_of_two(count)

    # One caller at a time (a Triton model instance): it writes the buffer input_buffer returns, then calls
    # run_buffer. The lock keeps plan building apart from library calls on other threads, nothing more.
    def input_buffer(self, input_name: str, bucket: int, h: int = IMAGE_SIZE, w: int = IMAGE_SIZE) -> torch.Tensor:
        with self._lock:
            return self.plan(bucket, input_name, h, w).input_torch

    def run_buffer(self, input_name: str, bucket: int, count: int, h: int = IMAGE_SIZE,
                   w: int = IMAGE_SIZE) -> torch.Tensor:
        """Replay the plan's graph on its input buffer (queued on `stream`); fp32 logits [count, 1000]."""
        with self._lock:
            plan = self.plan(bucket, input_name, h, w)
            with cp.cuda.Device(self.device_id):
                plan.graph.launch(self.cupy_stream)
            return plan.logits_torch[:count]

    # -- library interface ----------------------------------------------------
    @staticmethod
    def _outputs(plan: _Plan, count: int, want: str) -> dict[str, torch.Tensor]:
        """Copies of the first `count` rows of what `want` names, on the engine's stream (fp32, NCHW)."""
        def nchw(buffer):
            return torch.from_dlpack(buffer[:count]).permute(0, 3, 1, 2).float()
        if want == "logits":
            return {"logits": plan.logits_torch[:count].clone()}
        if want == "features":
            return {"features": nchw(plan.features)}
        outputs = {"stem+maxpool": nchw(plan.pool_out)}
        for step in plan.steps:
            outputs[step.name] = nchw(step.out)
        outputs["logits"] = plan.logits_torch[:count].clone()
        return outputs

    def _run(self, images: torch.Tensor, input_name: str, want: str) -> dict[str, torch.Tensor]:
        if input_name == INPUT_UINT8:
            if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[3] != 3:
                raise ValueError(f"expected uint8 [N,H,W,3] images, got {images.dtype} {tuple(images.shape)}")
            n, h, w = images.shape[0], images.shape[1], images.shape[2]
        else:
            if images.dim() != 4 or images.shape[1] != 3:
                raise ValueError(f"expected float [N,3,H,W] images, got {images.dtype} {tuple(images.shape)}")
            n, h, w = images.shape[0], images.shape[2], images.shape[3]
        if h < MIN_INPUT_SIZE or w < MIN_INPUT_SIZE:
            raise ValueError(f"input {h}x{w}: the fused engine needs H, W >= {MIN_INPUT_SIZE}")
        if n == 0:
            raise ValueError("empty batch")
        chunk = self.max_chunk(h, w)
        # The caller's stream, taken before ours becomes current: an input it wrote must be complete
        # before our stream reads it, and our outputs must not be reused while it still reads them.
        caller = torch.cuda.current_stream(self.device)
        parts: list[dict[str, torch.Tensor]] = []
        with self._lock, torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if images.is_cuda:
                self.stream.wait_stream(caller if images.device == self.device
                                        else torch.cuda.current_stream(images.device))
            for start in range(0, n, chunk):
                part = images[start:start + chunk]
                count = part.shape[0]
                plan = self.plan(next_power_of_two(count), input_name, h, w)
                plan.input_torch[:count].copy_(part, non_blocking=True)
                with cp.cuda.Device(self.device_id):
                    plan.graph.launch(self.cupy_stream)
                parts.append(self._outputs(plan, count, want))
            result = parts[0] if len(parts) == 1 else {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
            self.stream.synchronize()
        for tensor in result.values():
            tensor.record_stream(caller)
        return result

    def classify_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [N,H,W,3] RGB pixels (CPU or CUDA) -> fp32 logits [N,1000] on this engine's device."""
        return self._run(images, INPUT_UINT8, "logits")["logits"]

    def classify_normalized(self, images: torch.Tensor) -> torch.Tensor:
        """fp32 [N,3,H,W] ImageNet-normalised images -> fp32 logits [N,1000] on this engine's device."""
        return self._run(images, INPUT_FP32, "logits")["logits"]

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Features before the head, fp32 [N,512,H/32,W/32]: uint8 NHWC or fp32 NCHW normalised input."""
        return self._run(images, INPUT_UINT8 if images.dtype == torch.uint8 else INPUT_FP32, "features")["features"]

    def checkpoint_outputs(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """fp32 NCHW activations after the stem + max-pool and after each BasicBlock, and the logits
        (the layer-by-layer diff tool, harness/diff.py); uint8 NHWC or fp32 NCHW normalised input."""
        return self._run(images, INPUT_UINT8 if images.dtype == torch.uint8 else INPUT_FP32, "checkpoints")
