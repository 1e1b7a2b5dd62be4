"""The A/B router: one Triton entry (`resnet18_ab`) that sends live traffic to two engines' entries.

Its `config.pbtxt` parameters choose what it does (`ab_config.RouterConfig`, parsed and validated once at load: a
bad value fails the load with a message naming the parameter):

| parameter              | values                                   | default          |
|------------------------|------------------------------------------|------------------|
| `mode`                 | shadow, split, primary                   | shadow           |
| `primary`              | a model entry with the IMAGE contract    | resnet18_cudnn   |
| `candidate`            | another such entry                       | resnet18_custom  |
| `candidate_percent`    | 0..100, the share split sends candidate  | 10               |
| `shadow_timeout_ms`    | > 0                                      | 1000             |
| `shadow_max_in_flight` | >= 1, shadow batches awaited at once     | 4                |
| `disagreement_records` | >= 0, disagreeing requests kept          | 100              |

- shadow: every batch goes to both arms, each as ONE batched BLS call (`async_exec`), sent together. The client
  gets the primary's answer as soon as the primary answers: the router never waits for the candidate. The
  candidate's answer is awaited in the background, at most `shadow_timeout_ms` from the batch's start (also
  its queue timeout in the candidate's scheduler), and compared with the primary's: per request top-1
  agreement (images), top-5 overlap and the relative L2 of the logits. A late, failed or skipped shadow copy
  (more than `shadow_max_in_flight` batches awaited already) is counted, never the client's concern.
- split: each request goes to one arm, `candidate_percent` of them to the candidate; sticky: a request's
  `ab_key` parameter (a client's name), else its Triton request id, hashed, picks the arm, so the same key
  always lands on the same arm (on every instance and after restarts); without either, chance does. Each
  arm gets one batched call of its requests, both sent together.
- primary: every request to the primary only.

The ENGINE output passes the answering arm's through, so a client sees which engine answered.

Metrics (names in spec.py, labels model and model_instance) are added up here and written to Triton's metrics
endpoint at most every METRICS_FLUSH_S, from a timer on the stub's event loop (so the last ones arrive also
when traffic stops): each metric update is a message from the stub to the server, too dear per request.
Histograms are exposed as Prometheus exposes them, cumulative `_bucket{le=...}` counters with `_sum` and
`_count`, so `histogram_quantile` reads them. Disagreeing requests (request id, both arms' top-5 per image)
are kept, the last `disagreement_records`, in AB_DISAGREEMENTS_DIR/<model instance>-server<pid>.json (rewritten
with the metrics) and logged, at most a line a second.

Tensors cross the boundary through DLPack only (as_numpy is wrong with NumPy 2 in this Triton build).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import random
import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from .ab_config import ConfigError, parse_router_config
from .spec import (
    AB_ARMS,
    AB_COMPARED_METRIC,
    AB_DISAGREEING_METRIC,
    AB_DISAGREEMENTS_DIR,
    AB_FAILURES_METRIC,
    AB_IMAGES_METRIC,
    AB_LATENCY_METRIC,
    AB_REL_L2_METRIC,
    AB_REQUESTS_METRIC,
    AB_SKIPPED_METRIC,
    AB_STICKY_PARAMETER,
    AB_TIMEOUTS_METRIC,
    AB_TOP1_AGREE_METRIC,
    AB_TOP5_OVERLAP_METRIC,
    INPUT_UINT8,
    METRICS_FLUSH_S,
    OUTPUT_ENGINE,
    OUTPUT_LOGITS,
)

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
TOP5_OVERLAP_BUCKETS = (0, 1, 2, 3, 4, 4.5, 5)   # mean shared classes of the request's images (4.5: one image off)
REL_L2_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
TOP_K = 5
LOG_EVERY_S = 1.0           # at most one log line a second about disagreements
STICKY_BUCKETS = 10_000     # candidate_percent resolves to 0.01 %


def sticky_share(key: str) -> float:
    """Where `key` falls in 0..100 (percent), the same in every process: the arm of a sticky split."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STICKY_BUCKETS * 100.0 / STICKY_BUCKETS


def request_key(request) -> str | None:
    """The request's `ab_key` parameter, else its Triton request id, else None."""
    parameters = request.parameters()
    if parameters and parameters != "{}":
        value = json.loads(parameters).get(AB_STICKY_PARAMETER)
        if value is not None:
            return str(value)
    return request.request_id() or None


def compare(primary: torch.Tensor, candidate: torch.Tensor) -> dict:
    """One request's comparison: images whose top-1 agree, mean shared top-5 classes, relative L2, both top-5s."""
    top_p = primary.topk(TOP_K, dim=1).indices
    top_c = candidate.topk(TOP_K, dim=1).indices
    overlap = (top_p.unsqueeze(2) == top_c.unsqueeze(1)).any(dim=2).sum(dim=1)
    agree = top_p[:, 0] == top_c[:, 0]
    norm = float(torch.linalg.vector_norm(primary))
    return {"images": primary.shape[0], "top1_agree": int(agree.sum()), "top5_overlap": float(overlap.float().mean()),
            "rel_l2": float(torch.linalg.vector_norm(candidate - primary)) / norm if norm else math.inf,
            "disagreeing": [{"image": i, "primary_top5": top_p[i].tolist(), "candidate_top5": top_c[i].tolist()}
                            for i in torch.nonzero(~agree).flatten().tolist()]}


def call_now(request) -> tuple:
    """Run a BLS request on this thread: (response, error message or None); a failed call never raises."""
    try:
        response = request.exec()
    except Exception as raised:
        return None, str(raised)
    return response, response.error().message() if response.has_error() else None


async def outcome_of(call) -> tuple:
    """Await a BLS call (async_exec): (response, error message or None); a failed call never raises."""
    try:
        response = await call
    except asyncio.CancelledError:
        raise
    except Exception as raised:
        return None, str(raised)
    return response, response.error().message() if response.has_error() else None


class PendingMetrics:
    """Counters and histograms added up in the stub, written to Triton's endpoint by `flush`."""

    def __init__(self, base_labels: dict):
        self.base_labels = base_labels
        self.families: dict[str, object] = {}
        self.metrics: dict[tuple, object] = {}
        self.pending: dict[tuple, float] = collections.defaultdict(float)
        self.buckets: dict[str, tuple] = {}

    def counter(self, name: str, description: str, **labels):
        """Declare a counter series (it shows, at 0, before anything is counted)."""
        if name not in self.families:
            self.families[name] = pb_utils.MetricFamily(name=name, description=description,
                                                        kind=pb_utils.MetricFamily.COUNTER)
        key = (name, tuple(sorted(labels.items())))
        if key not in self.metrics:
            self.metrics[key] = self.families[name].Metric(labels={**self.base_labels, **labels})
        return key

    def histogram(self, name: str, description: str, buckets: tuple, **labels):
        self.buckets[name] = buckets
        for bound in (*buckets, math.inf):
            self.counter(f"{name}_bucket", f"{description} (cumulative count per upper bound le)",
                         le=_bound_text(bound), **labels)
        self.counter(f"{name}_sum", f"{description} (sum)", **labels)
        self.counter(f"{name}_count", f"{description} (count)", **labels)

    def add(self, name: str, amount: float = 1.0, **labels):
        self.pending[(name, tuple(sorted(labels.items())))] += amount

    def observe(self, name: str, value: float, count: int = 1, **labels):
        """`count` observations of `value` (a batch's latency, once for each of its requests)."""
        for bound in (*self.buckets[name], math.inf):
            if value <= bound:
                self.add(f"{name}_bucket", count, le=_bound_text(bound), **labels)
        self.add(f"{name}_sum", value * count, **labels)
        self.add(f"{name}_count", count, **labels)

    def flush(self):
        pending, self.pending = self.pending, collections.defaultdict(float)
        for key, amount in pending.items():
            if amount:
                self.metrics[key].increment(amount)

    def close(self):
        self.metrics.clear()     # metrics before their families (the backend requires that order)
        self.families.clear()


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == math.inf else f"{bound:g}"


class ABRouterModel:
    """`TritonPythonModel` of the router entry (model_repository/resnet18_ab/1/model.py)."""

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.instance_name = args["model_instance_name"]
        outputs = {o["name"] for o in self.model_config.get("output", [])}
        inputs = [i["name"] for i in self.model_config.get("input", [])]
        if inputs != [INPUT_UINT8] or not {OUTPUT_LOGITS, OUTPUT_ENGINE} <= outputs:
            raise pb_utils.TritonModelException(
                f"{self.model_name}: the router's config must declare input {INPUT_UINT8} and outputs "
                f"{OUTPUT_LOGITS}, {OUTPUT_ENGINE} (got inputs {inputs}, outputs {sorted(outputs)})")
        try:
            self.config = parse_router_config(self.model_config)
        except ConfigError as error:
            raise pb_utils.TritonModelException(f"{self.model_name}: {error}") from error
        torch.set_num_threads(1)
        self.arm_models = {"primary": self.config.primary, "candidate": self.config.candidate}
        self.random = random.Random()
        self.shadows_in_flight = 0
        self.lock = threading.Lock()          # the metrics: the event loop's timer and finalize
        self.flush_timer = None
        self.executor_set = False
        self.disagreements = collections.deque(maxlen=self.config.disagreement_records)
        self.disagreements_changed = False
        self.last_log = 0.0
        self.suppressed_logs = 0
        # Per instance and per tritonserver (its pid: several servers may share the repository, and each
        # names its instances alike).
        self.record_file = AB_DISAGREEMENTS_DIR / f"{self.instance_name}-server{os.getppid()}.json"
        self._declare_metrics()
        pb_utils.Logger.log_info(
            f"{self.model_name}: A/B router, mode {self.config.mode}, primary {self.config.primary}, candidate "
            f"{self.config.candidate}" + (f", {self.config.candidate_percent:g} % to the candidate"
                                          if self.config.mode == "split" else "")
            + (f", shadow answers awaited up to {self.config.shadow_timeout_ms:g} ms in the background"
               if self.config.mode == "shadow" else ""))

    def _declare_metrics(self):
        mode = self.config.mode
        self.metrics = PendingMetrics({"model": self.model_name, "model_instance": self.instance_name})
        m = self.metrics
        arms = ("primary",) if mode == "primary" else AB_ARMS
        for arm in arms:
            m.counter(AB_REQUESTS_METRIC, "Requests the A/B router sent to each arm", mode=mode, arm=arm)
            m.counter(AB_FAILURES_METRIC, "Requests an arm answered with an error (for the router)",
                      mode=mode, arm=arm)
            m.histogram(AB_LATENCY_METRIC, "Seconds each arm took to answer the router's batched call, per request",
                        LATENCY_BUCKETS_S, mode=mode, arm=arm)
        if mode == "shadow":
            m.counter(AB_TIMEOUTS_METRIC, "Shadow requests the candidate did not answer within shadow_timeout_ms")
            m.counter(AB_SKIPPED_METRIC, "Shadow requests not sent: shadow_max_in_flight batches awaited already")
            m.counter(AB_COMPARED_METRIC, "Requests answered by both arms and compared")
            m.counter(AB_DISAGREEING_METRIC, "Compared requests with an image whose top-1 class differs")
            m.counter(AB_IMAGES_METRIC, "Images compared")
            m.counter(AB_TOP1_AGREE_METRIC, "Compared images whose top-1 class is the same in both arms")
            m.histogram(AB_TOP5_OVERLAP_METRIC, "Top-5 classes both arms share, mean over a request's images",
                        TOP5_OVERLAP_BUCKETS)
            m.histogram(AB_REL_L2_METRIC, "Relative L2 distance of the candidate's logits to the primary's, "
                        "per request", REL_L2_BUCKETS)

    # ------------------------------------------------------------ requests

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        if not self.executor_set:
            # async_exec runs each call in the loop's default executor: room for the awaited shadow calls and
            # both arms of a split, so a slow candidate never holds up a primary's call.
            loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
                max_workers=self.config.shadow_max_in_flight + 2, thread_name_prefix="ab-router"))
            self.executor_set = True
        started = time.perf_counter()
        images = [pb_utils.get_input_tensor_by_name(request, INPUT_UINT8) for request in requests]
        mode = self.config.mode
        if mode == "split":
            groups = self._split(requests)
        else:
            groups = {"primary": list(range(len(requests)))}
        # The candidate's call leaves first, in the executor (async_exec); the primary's runs here, on the event
        # loop's thread (exec): no hand-over to another thread on the client's path.
        shadow = None
        if mode == "shadow":
            if self.shadows_in_flight < self.config.shadow_max_in_flight:
                shadow = asyncio.ensure_future(self._request(
                    "candidate", images, groups["primary"], timeout_ms=self.config.shadow_timeout_ms).async_exec())
            else:
                self.metrics.add(AB_SKIPPED_METRIC, len(requests))
        canary = None
        if groups.get("candidate"):
            canary = asyncio.ensure_future(self._request("candidate", images, groups["candidate"]).async_exec())
        responses = [None] * len(requests)
        primary = None
        if groups["primary"]:
            outcome = call_now(self._request("primary", images, groups["primary"]))
            primary = self._answer("primary", outcome, started, requests, groups["primary"], responses)
        if canary is not None:
            self._answer("candidate", await outcome_of(canary), started, requests, groups["candidate"], responses)
        if shadow is not None:
            primary = None if primary is None else primary.clone()   # a view of the arm's output: kept beyond it
            self.shadows_in_flight += 1
            task = loop.create_task(self._await_shadow(shadow, started, primary, requests))
            task.add_done_callback(lambda _: self._shadow_done())
        self._schedule_flush(loop)
        return responses

    def _split(self, requests) -> dict[str, list[int]]:
        groups = {"primary": [], "candidate": []}
        for index, request in enumerate(requests):
            key = request_key(request)
            share = sticky_share(key) if key is not None else self.random.uniform(0, 100)
            groups["candidate" if share < self.config.candidate_percent else "primary"].append(index)
        return groups

    def _request(self, arm: str, images: list, indices: list[int], timeout_ms: float | None = None):
        """The BLS request of the requests `indices` as one batch to `arm`."""
        if len(indices) == 1:
            batch = images[indices[0]]
        else:
            tensors = [torch.from_dlpack(images[i].to_dlpack()) for i in indices]
            batch = pb_utils.Tensor.from_dlpack(INPUT_UINT8, torch.cat(tensors))
        self.metrics.add(AB_REQUESTS_METRIC, len(indices), mode=self.config.mode, arm=arm)
        return pb_utils.InferenceRequest(
            model_name=self.arm_models[arm], inputs=[batch], requested_output_names=[OUTPUT_LOGITS, OUTPUT_ENGINE],
            timeout=int(timeout_ms * 1000) if timeout_ms else 0)

    def _answer(self, arm: str, outcome: tuple, started: float, requests, indices: list[int], responses: list):
        """Give each of an answering arm's requests its rows (or its error); the logits, or None on failure."""
        mode = self.config.mode
        response, error = outcome
        self.metrics.observe(AB_LATENCY_METRIC, time.perf_counter() - started, len(indices), mode=mode, arm=arm)
        if error is not None:
            self.metrics.add(AB_FAILURES_METRIC, len(indices), mode=mode, arm=arm)
            for index in indices:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"{self.model_name}: {self.arm_models[arm]} failed: {error}"))
            return None
        logits = pb_utils.get_output_tensor_by_name(response, OUTPUT_LOGITS)
        engine = pb_utils.get_output_tensor_by_name(response, OUTPUT_ENGINE)
        if len(indices) == 1:   # the arm's tensors as they came
            responses[indices[0]] = self._respond(requests[indices[0]], logits, engine)
            return torch.from_dlpack(logits.to_dlpack())
        all_logits = torch.from_dlpack(logits.to_dlpack())
        all_engine = torch.from_dlpack(engine.to_dlpack()) if engine is not None else None
        start = 0
        for index in indices:
            rows = pb_utils.get_input_tensor_by_name(requests[index], INPUT_UINT8).shape()[0]
            responses[index] = self._respond(
                requests[index], pb_utils.Tensor.from_dlpack(OUTPUT_LOGITS, all_logits[start:start + rows]),
                None if all_engine is None else pb_utils.Tensor.from_dlpack(OUTPUT_ENGINE,
                                                                            all_engine[start:start + rows]))
            start += rows
        return all_logits

    @staticmethod
    def _respond(request, logits, engine):
        outputs = [logits]
        if engine is not None and OUTPUT_ENGINE in request.requested_output_names():
            outputs.append(engine)
        return pb_utils.InferenceResponse(output_tensors=outputs)

    # ------------------------------------------------------------ shadow comparison, in the background

    def _shadow_done(self):
        self.shadows_in_flight -= 1

    async def _await_shadow(self, call, started: float, primary: torch.Tensor | None, requests):
        count = len(requests)
        remaining = self.config.shadow_timeout_ms / 1e3 - (time.perf_counter() - started)
        try:
            response, error = await asyncio.wait_for(outcome_of(asyncio.shield(call)), timeout=max(remaining, 0.0))
        except asyncio.TimeoutError:
            response, error = None, "timeout"
        if error is not None:
            # Triton's own queue timeout (the call's timeout) reads "Request timeout expired".
            timed_out = error == "timeout" or "timeout" in error.lower()
            self.metrics.add(AB_TIMEOUTS_METRIC if timed_out else AB_FAILURES_METRIC, count,
                             **({} if timed_out else {"mode": "shadow", "arm": "candidate"}))
            self._schedule_flush(asyncio.get_running_loop())
            if timed_out:   # the call goes on in its thread: it still counts as in flight until it ends
                await asyncio.wait([call])
            return
        self.metrics.observe(AB_LATENCY_METRIC, time.perf_counter() - started, count, mode="shadow", arm="candidate")
        if primary is not None:
            candidate = torch.from_dlpack(pb_utils.get_output_tensor_by_name(response, OUTPUT_LOGITS).to_dlpack())
            self._compare(primary, candidate, requests)
        self._schedule_flush(asyncio.get_running_loop())

    def _compare(self, primary: torch.Tensor, candidate: torch.Tensor, requests):
        start = 0
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, INPUT_UINT8).shape()[0]
            result = compare(primary[start:start + rows], candidate[start:start + rows])
            start += rows
            m = self.metrics
            m.add(AB_COMPARED_METRIC)
            m.add(AB_IMAGES_METRIC, result["images"])
            m.add(AB_TOP1_AGREE_METRIC, result["top1_agree"])
            m.observe(AB_TOP5_OVERLAP_METRIC, result["top5_overlap"])
            m.observe(AB_REL_L2_METRIC, result["rel_l2"])
            if result["disagreeing"]:
                m.add(AB_DISAGREEING_METRIC)
                self._record(request.request_id(), result)

    def _record(self, request_id: str, result: dict):
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "request_id": request_id,
                  "primary": self.config.primary, "candidate": self.config.candidate,
                  "images": result["images"], "rel_l2": result["rel_l2"], "disagreeing": result["disagreeing"]}
        if self.config.disagreement_records:
            self.disagreements.append(record)
            self.disagreements_changed = True
        now = time.monotonic()
        if now - self.last_log >= LOG_EVERY_S:
            first = result["disagreeing"][0]
            pb_utils.Logger.log_warn(
                f"{self.model_name}: top-1 differs on request {request_id!r} image {first['image']}: "
                f"{self.config.primary} top-5 {first['primary_top5']}, {self.config.candidate} top-5 "
                f"{first['candidate_top5']}" + (f" ({self.suppressed_logs} more such requests since the last line)"
                                                if self.suppressed_logs else ""))
            self.last_log, self.suppressed_logs = now, 0
        else:
            self.suppressed_logs += 1

    # ------------------------------------------------------------ metrics and the record, now and then

    def _schedule_flush(self, loop):
        if self.flush_timer is None:
            self.flush_timer = loop.call_later(METRICS_FLUSH_S, self._flush)

    def _flush(self):
        self.flush_timer = None
        with self.lock:
            try:
                self.metrics.flush()
                self._write_record()
            except Exception as error:  # serving goes on; the figures miss this flush
                pb_utils.Logger.log_warn(f"{self.model_name}: A/B metrics not written: {error}")

    def _write_record(self):
        if not self.disagreements_changed:
            return
        self.disagreements_changed = False
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.record_file.with_name(f".{self.record_file.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(list(self.disagreements), indent=1) + "\n")
        os.replace(temporary, self.record_file)

    def finalize(self):
        if self.flush_timer is not None:
            self.flush_timer.cancel()
        self._flush()
        with self.lock:
            self.metrics.close()

