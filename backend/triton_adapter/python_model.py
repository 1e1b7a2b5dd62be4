"""Adapter between Triton's Python backend and an engine of `fusedresnet.backend.engines`.

Both `model_repository/*/1/model.py` files are the same file: their
`TritonPythonModel` is `ResNetTritonModel`, and each model's config.pbtxt says
which engine it serves (`engines.config.EngineConfig`, parsed and validated once
at load: a bad parameter fails the load with a message naming it; the engine
comes from the one factory `engines.serving.create_engine`). Everything lives here:

- placement: the instance kind and device id Triton gives (`KIND_AUTO`
  becomes GPU on a GPU host, CPU elsewhere);
- one input per model entry: the config declares exactly one input, required
  (IMAGE, or IMAGE_NORMALIZED for the `*_normalized` entries, whose model.py is
  the network's own, `model_of_network`, and whose weights are read from the
  network's entry folder); Triton refuses any other input before execute().
- batching: with dynamic batching `execute()` receives several requests. Each
  is validated on its own; the valid ones are gathered into one batch,
  run once, and the logits split back in order. A malformed request gets its
  own INVALID_ARG error; the others still get their answers.
- few copies (docs/SERVING.md): the stub copies no input on the CPU. The Python
  backend's shared-memory pool, where Triton puts each input, is page-locked on
  first sight (`pinned_shm.py`), and each request's input is one asynchronous
  DMA into the engine's own input buffer of the batch bucket
  (`engine.input_buffer`); a GPU input, from a client's CUDA shared memory, goes
  device-to-device; memory that cannot be page-locked is staged through a pinned
  buffer as before (FUSEDRESNET_HOST_INPUT=staging: all of it). Normalisation
  happens on the GPU, inside the engine; the logits come back in one
  device-to-host copy into page-locked memory, and the stub's thread sleeps on a
  blocking-sync event meanwhile (FUSEDRESNET_GPU_WAIT=spin: spins, as CUDA's
  default).
- threads: each instance sets its own torch/OpenMP thread count at load
  (`torch_threads`), so any Triton start gets it: several stub processes each
  running a thread per core would oversubscribe the CPU.
- timing: the time of each phase of `execute()` is added to Triton's metrics
  endpoint as `fusedresnet_execute_phase_us{model,model_instance,device,gpu_uuid,phase}`, with
  the images and engine runs of each instance (`fusedresnet_images`, `fusedresnet_executions`;
  written at most every METRICS_FLUSH_S and at unload).
- several GPUs: `KIND_AUTO` with `count: N` gives N instances on every visible
  GPU; each instance builds its engine, CUDA graphs and buffers on the device
  Triton gives it (`model_instance_device_id`).
- the engine in use: this Python backend (Triton 2.51) has no response
  parameters and keeps auto-completed config parameters out of the model
  configuration, so every response carries the engine's name in the output
  ENGINE (UTF-8 bytes as UINT8; only sent when asked for, or when a client
  asks for no output in particular), and the load log names it too.
- tensors cross the boundary only through DLPack: with NumPy 2 in the stub's
  environment `as_numpy()` and `pb_utils.Tensor(name, ndarray)` silently
  return zeros / empty outputs on this Triton build.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path

import psutil

from ..engines import cuda_context

cuda_context.start()    # the CUDA context is made while torch imports (backend/engines/cuda_context.py)

import torch
import triton_python_backend_utils as pb_utils

from ..engines.config import ConfigError, EngineConfig, parse_engine_config
from ..engines.serving import EngineUnavailable, ServingEngine, create_engine, input_shape
from ..spec import (
    EXECUTE_PHASE_METRIC,
    EXECUTE_PHASES,
    EXECUTIONS_METRIC,
    FP32_INPUT_ABS_LIMIT,
    IMAGES_METRIC,
    INPUT_FP32,
    INPUT_SHAPES,
    INPUT_UINT8,
    INPUTS,
    METRIC_LABELS,
    METRICS_FLUSH_S,
    NORMALIZED_ENTRY_SUFFIX,
    OUTPUT_ENGINE,
    OUTPUT_LOGITS,
    STARTUP_PHASES_TEXT,
    network_of,
    power_of_two_buckets,
)
from .pinned_shm import PinnedSharedMemory, host_input_choice

# Warm-up at load runs each batch size once, so that no first request pays for
# kernel compilation, CUDA-graph capture or cuDNN's algorithm choice. On a GPU
# every power of two up to the config's max_batch_size (the engines' graph buckets).
CPU_WARMUP_BATCH_SIZES = (1, 8)

# How execute() waits for the GPU (issue 46, results/serving_cost.md): block (default) = the stub's thread sleeps
# on a blocking-sync CUDA event; spin = as the CUDA runtime does by default, a core busy for the whole wait.
GPU_WAIT_ENV = "FUSEDRESNET_GPU_WAIT"
GPU_WAIT_CHOICES = ("block", "spin")


def gpu_wait_choice() -> str:
    choice = os.environ.get(GPU_WAIT_ENV, "") or GPU_WAIT_CHOICES[0]
    if choice not in GPU_WAIT_CHOICES:
        raise ValueError(f"{GPU_WAIT_ENV}={choice!r}: one of {', '.join(GPU_WAIT_CHOICES)}")
    return choice


class RequestError(ValueError):
    """A request that cannot be answered as sent; its message goes back to the client."""


def torch_threads(model_config: dict, config: EngineConfig, on_gpu: bool) -> int:
    """Intra-op threads of this instance: config `torch_threads`, or auto.

    Auto: 1 on a GPU (the host work per batch is a few copies; more threads in each
    of several stub processes only fight over the cores); on a CPU-only host the
    usable cores shared among this model's instances.
    """
    if config.torch_threads is not None:
        return config.torch_threads
    if on_gpu:
        return 1
    instances = sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])) or 1
    return max(1, len(os.sched_getaffinity(0)) // instances)


def declared_input(model_config: dict) -> str:
    """The one input the model entry's config declares (IMAGE or IMAGE_NORMALIZED), required."""
    inputs = model_config.get("input", [])
    if len(inputs) != 1 or inputs[0]["name"] not in INPUTS or inputs[0].get("optional", False):
        raise pb_utils.TritonModelException(
            f"{model_config.get('name')}: config must declare exactly one required input, one of {INPUTS} "
            f"(got {[(i['name'], 'optional' if i.get('optional') else 'required') for i in inputs]})")
    return inputs[0]["name"]


def model_of_network(model_file: str) -> type:
    """TritonPythonModel of the network a `*_normalized` entry serves, from that network's own entry
    (model_repository/<network>/<version>/model.py): one model.py per network, whichever input it is given."""
    version_dir = Path(model_file).resolve().parent
    entry = version_dir.parent.name
    if not entry.endswith(NORMALIZED_ENTRY_SUFFIX):
        raise ValueError(f"{model_file}: only a *{NORMALIZED_ENTRY_SUFFIX} entry takes its network's model")
    network_file = version_dir.parent.parent / network_of(entry) / version_dir.name / "model.py"
    spec = importlib.util.spec_from_file_location(f"{network_of(entry)}_model", network_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def read_request(request, name: str, max_batch: int) -> torch.Tensor:
    """The tensor of input `name` of one request, or RequestError naming what is wrong.

    Triton has already refused a request without the input or with another one, a wrong dtype or
    a wrong shape; those checks stay here as the engine buffers' guard, the value checks are the model's own."""
    tensor = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, name).to_dlpack())
    expected_dtype, expected_shape = torch.uint8 if name == INPUT_UINT8 else torch.float32, INPUT_SHAPES[name]
    if tensor.dtype != expected_dtype:
        raise RequestError(f"input {name} must be {expected_dtype}, got {tensor.dtype}")
    if tensor.dim() != 4 or tuple(tensor.shape[1:]) != expected_shape:
        raise RequestError(f"input {name} must have shape [N,{','.join(map(str, expected_shape))}], "
                           f"got {list(tensor.shape)}")
    if not 1 <= tensor.shape[0] <= max_batch:
        raise RequestError(f"input {name}: batch size must be 1..{max_batch}, got {tensor.shape[0]}")
    if name == INPUT_FP32:
        peak = float(tensor.abs().amax())  # NaN propagates
        if not math.isfinite(peak):
            raise RequestError(f"input {name} contains NaN or Inf values")
        if peak > FP32_INPUT_ABS_LIMIT:
            raise RequestError(f"input {name} has values up to {peak:.3g}: send ImageNet-normalised pixels "
                               f"(about -2.2..2.7; at most {FP32_INPUT_ABS_LIMIT:g} in magnitude)")
    return tensor


class ExecuteTimer:
    """Seconds per phase of execute(), and the images and executions served, added to Triton's counters
    now and then (see METRICS_FLUSH_S)."""

    def __init__(self, model_name: str, instance_name: str, device: str, gpu_uuid: str):
        labels = dict(zip(METRIC_LABELS, (model_name, instance_name, device, gpu_uuid), strict=True))
        # The families must outlive their metrics: keep them.
        self.phase_family = pb_utils.MetricFamily(
            name=EXECUTE_PHASE_METRIC, kind=pb_utils.MetricFamily.COUNTER,
            description="Microseconds spent in each phase of the model's execute(), summed "
                        "(h2d, engine, d2h: GPU time between CUDA events)")
        self.images_family = pb_utils.MetricFamily(
            name=IMAGES_METRIC, kind=pb_utils.MetricFamily.COUNTER,
            description="Images this instance computed (per device: gpu_uuid as Triton's GPU metrics name it)")
        self.executions_family = pb_utils.MetricFamily(
            name=EXECUTIONS_METRIC, kind=pb_utils.MetricFamily.COUNTER,
            description="Batches this instance computed")
        self.metrics = {phase: self.phase_family.Metric(labels={**labels, "phase": phase}) for phase in EXECUTE_PHASES}
        self.images_metric = self.images_family.Metric(labels=labels)
        self.executions_metric = self.executions_family.Metric(labels=labels)
        self.discard()
        self.last_flush = time.monotonic()

    def add(self, phase: str, seconds: float):
        self.pending[phase] += seconds

    def count(self, images: int):
        self.pending_images += images
        self.pending_executions += 1

    def discard(self):
        self.pending = dict.fromkeys(EXECUTE_PHASES, 0.0)
        self.pending_images = self.pending_executions = 0

    def close(self):
        self.last_flush = 0.0    # what is still pending reaches the server before the metrics go
        try:
            self.flush_now_and_then()
        except Exception as error:  # unloading goes on; the counters only miss the last half second
            pb_utils.Logger.log_warn(f"execute metrics not written at unload: {error}")
        self.metrics.clear()     # metrics before their families (the backend requires that order)
        self.images_metric = self.executions_metric = None
        self.phase_family = self.images_family = self.executions_family = None

    def flush_now_and_then(self):
        now = time.monotonic()
        if now - self.last_flush < METRICS_FLUSH_S:
            return
        self.last_flush = now
        for phase, seconds in self.pending.items():
            if seconds:
                self.metrics[phase].increment(seconds * 1e6)
        if self.pending_executions:
            self.images_metric.increment(self.pending_images)
            self.executions_metric.increment(self.pending_executions)
        self.discard()


def gpu_uuid(device: str) -> str:
    """The GPU's UUID as Triton's and nvidia-smi's metrics write it ("GPU-..."); empty on the CPU."""
    if not device.startswith("cuda"):
        return ""
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


class ResNetTritonModel:
    """Both models' `TritonPythonModel`: the engine their config names, behind Triton's Python backend."""

    engine: ServingEngine

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.max_batch_size = int(self.model_config["max_batch_size"])
        self.input_name = declared_input(self.model_config)
        outputs = {o["name"] for o in self.model_config["output"]}
        if not {OUTPUT_LOGITS, OUTPUT_ENGINE} <= outputs:
            raise pb_utils.TritonModelException(
                f"{self.model_name}: config must declare outputs {OUTPUT_LOGITS} and {OUTPUT_ENGINE}")
        try:
            config = parse_engine_config(self.model_config)
        except ConfigError as error:
            raise pb_utils.TritonModelException(f"{self.model_name}: {error}") from error
        on_gpu = args["model_instance_kind"] == "GPU"
        threads = torch_threads(self.model_config, config, on_gpu)
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:   # only possible before any inter-op work in this process
            pass
        # Where a (re)start's time goes (results/front_door.md, recovery): this stub's start and imports until
        # here, its CUDA context, the engine's build (weights, kernels, graphs) and the warm-up.
        phases = {"stub start and imports": time.time() - psutil.Process().create_time()}
        mark = time.perf_counter()
        if on_gpu:
            device = f"cuda:{args['model_instance_device_id']}"
            early_context = cuda_context.wait()
            torch.cuda.set_device(device)
            torch.empty(1, device=device)   # the context exists once memory does
        else:
            device, early_context = "cpu", "none on the CPU"
        phases["CUDA context"] = time.perf_counter() - mark
        # The weights are in the network's entry (a *_normalized entry serves the same network).
        repository_entry = Path(args["model_repository"])
        model_dir = f"{repository_entry.parent / network_of(repository_entry.name)}/{args['model_version']}"
        started = mark = time.perf_counter()
        try:
            self.engine, reason = create_engine(model_dir, device, config)
        except EngineUnavailable as error:
            raise pb_utils.TritonModelException(f"{self.model_name}: {error}") from error
        self.device = torch.device(device)
        self.on_gpu = on_gpu
        self.engine_name_bytes = torch.frombuffer(bytearray(self.engine.name.encode()), dtype=torch.uint8)
        self.engine_rows: dict[int, torch.Tensor] = {}   # batch size -> ENGINE output of that many rows
        self.host_staging: dict[str, torch.Tensor] = {}  # input name -> pinned [max_batch_size, ...]
        self.pinned = PinnedSharedMemory(self.device) if on_gpu and host_input_choice() == "registered" else None
        self.pinning_failure_logged = False
        self.gpu_wait = gpu_wait_choice()
        if on_gpu:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            # the last one: with blocking sync the stub's thread sleeps, not spins, while the GPU computes
            self.events.append(torch.cuda.Event(enable_timing=True, blocking=self.gpu_wait == "block"))
        self.timer = ExecuteTimer(self.model_name, args["model_instance_name"], device, gpu_uuid(device))
        phases["engine"] = time.perf_counter() - mark
        mark = time.perf_counter()
        self._warm_up()
        phases["warm-up"] = time.perf_counter() - mark
        self.timer.discard()     # the figures describe served requests only
        pb_utils.Logger.log_info(
            f"{self.model_name}: engine {self.engine.name} on {device} ({reason}), {threads} torch thread(s); "
            + (f"host inputs {'from page-locked shared memory' if self.pinned else 'staged'}, "
               f"GPU wait {self.gpu_wait}; " if on_gpu else "") +
            f"{self.engine.describe()}; loaded and warmed up in {time.perf_counter() - started:.1f} s "
            f"({STARTUP_PHASES_TEXT}: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
            + f"; CUDA context {early_context})")
        if on_gpu and not self.engine.name.startswith("fused-cuda") and config.engine != "torchscript":
            pb_utils.Logger.log_warn(f"{self.model_name}: serving {self.engine.name} on a GPU, not the fused "
                                     f"kernels, because the config says engine {config.engine}")

    def _warm_up(self):
        generator = torch.Generator().manual_seed(0)
        sizes = power_of_two_buckets(self.max_batch_size) if self.on_gpu else CPU_WARMUP_BATCH_SIZES
        for batch in sizes:
            shape, dtype = input_shape(self.input_name, batch)
            if dtype == torch.uint8:
                images = torch.randint(0, 256, shape, dtype=dtype, generator=generator)
            else:
                images = torch.randn(shape, dtype=dtype, generator=generator)
            logits = self._run_batch(self.input_name, [images])
            if not bool(torch.isfinite(logits).all()):
                raise pb_utils.TritonModelException(f"{self.model_name}: warm-up produced non-finite logits")

    def _staging(self, input_name: str) -> torch.Tensor:
        buffer = self.host_staging.get(input_name)
        if buffer is None:
            shape, dtype = input_shape(input_name, self.max_batch_size)
            buffer = self.host_staging[input_name] = torch.empty(shape, dtype=dtype).pin_memory()
        return buffer

    @torch.inference_mode()
    def _run_batch(self, input_name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The requests' images as one batch through the engine; fp32 logits [count, 1000] on the CPU."""
        count = sum(tensor.shape[0] for tensor in tensors)
        bucket = self.engine.bucket(count)
        started = time.perf_counter()
        engine_input = self.engine.input_buffer(input_name, bucket)
        if not self.on_gpu:
            torch.cat(tensors, out=engine_input[:count])
            self.timer.add("gather", time.perf_counter() - started)
            started = time.perf_counter()
            logits = self.engine.run_buffer(input_name, bucket, count)
            self.timer.add("engine", time.perf_counter() - started)
            return logits
        # Each host input straight from the backend's page-locked shared memory (pinned_shm.py), or staged
        # through the pinned staging buffer where it cannot be (FUSEDRESNET_HOST_INPUT=staging: all of them).
        sources, staged, start = [], 0, 0
        for tensor in tensors:
            if tensor.is_cuda or (self.pinned is not None and self.pinned.pin(tensor)):
                sources.append(tensor)
            else:
                sources.append(self._staging(input_name)[start:start + tensor.shape[0]].copy_(tensor))
                staged += 1
            start += tensor.shape[0]
        self._warn_pinning_failure()
        self.timer.add("gather", time.perf_counter() - started)
        before_h2d, before_engine, before_d2h, done = self.events
        with torch.cuda.stream(self.engine.stream):
            before_h2d.record()
            if staged == len(tensors):         # one copy of the whole batch
                engine_input[:count].copy_(self._staging(input_name)[:count], non_blocking=True)
            else:                              # one DMA per request (inputs in CUDA memory: device to device)
                start = 0
                for source in sources:
                    engine_input[start:start + source.shape[0]].copy_(source, non_blocking=True)
                    start += source.shape[0]
            before_engine.record()
            logits = self.engine.run_buffer(input_name, bucket, count)
            before_d2h.record()
            if self.gpu_wait == "block":       # into page-locked memory, then sleep until the GPU is done
                host_logits = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
                logits = host_logits.copy_(logits, non_blocking=True)
            else:
                logits = logits.to("cpu")      # the driver spins until the copy is done
            done.record()
        done.synchronize()
        for phase, (first, last) in (("h2d", (before_h2d, before_engine)), ("engine", (before_engine, before_d2h)),
                                     ("d2h", (before_d2h, done))):
            self.timer.add(phase, first.elapsed_time(last) / 1e3)
        return logits

    def _warn_pinning_failure(self):
        if self.pinned is not None and self.pinned.failure and not self.pinning_failure_logged:
            self.pinning_failure_logged = True
            pb_utils.Logger.log_warn(f"{self.model_name}: inputs staged through pinned memory: {self.pinned.failure}")

    def _engine_output(self, rows: int) -> torch.Tensor:
        output = self.engine_rows.get(rows)
        if output is None:
            output = self.engine_rows[rows] = self.engine_name_bytes.expand(rows, -1).contiguous()
        return output

    def _respond(self, request, logits: torch.Tensor):
        outputs = [pb_utils.Tensor.from_dlpack(OUTPUT_LOGITS, logits)]
        if OUTPUT_ENGINE in request.requested_output_names():
            outputs.append(pb_utils.Tensor.from_dlpack(OUTPUT_ENGINE, self._engine_output(logits.shape[0])))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def execute(self, requests):
        started = time.perf_counter()
        responses = [None] * len(requests)
        items: list[tuple[int, torch.Tensor]] = []
        for index, request in enumerate(requests):
            try:
                items.append((index, read_request(request, self.input_name, self.max_batch_size)))
            except RequestError as error:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        self.timer.add("read", time.perf_counter() - started)
        if items:
            self._answer(requests, items, responses)
        self.timer.flush_now_and_then()
        return responses

    def _answer(self, requests, items: list[tuple[int, torch.Tensor]], responses: list):
        """Run the valid requests' images as one batch and put each request's answer in `responses`."""
        try:
            logits = self._run_batch(self.input_name, [tensor for _, tensor in items])
        except Exception as error:  # an engine failure fails this batch, not the model
            for index, _ in items:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{self.model_name}: inference failed: {error}"))
            return
        self.timer.count(logits.shape[0])
        started = time.perf_counter()
        start = 0
        for index, tensor in items:
            count = tensor.shape[0]
            responses[index] = self._respond(requests[index], logits[start:start + count])
            start += count
        self.timer.add("respond", time.perf_counter() - started)

    def finalize(self):
        self.engine = None
        self.timer.close()
