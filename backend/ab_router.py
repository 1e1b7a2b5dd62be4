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

- shadow: every batch goes to the primary as ONE batched BLS call; each request is answered (its response sent)
  the moment the primary's answer is there. Then the same batch goes to the candidate as one call, unless
  `shadow_max_in_flight` of this instance's batches are at the candidate already (counted as skipped). Its
  answer is compared with the primary's: per request top-1 agreement (images), top-5 overlap and the relative L2
  of the logits. `shadow_timeout_ms` is the candidate call's deadline from its start (also its queue timeout in
  the candidate's scheduler): a call still unanswered then is counted as a timeout (by the metrics thread, at
  most METRICS_FLUSH_S after the deadline) and its late answer is not compared; a failed one is counted too.
  The candidate's call leaves after the client's answer, so its compute never shares the hardware with the
  primary's call of the same batch, and nothing about it can delay or fail the client's answer.
- split: each request goes to one arm, `candidate_percent` of them to the candidate; sticky: a request's
  `ab_key` parameter (a client's name), else its Triton request id, hashed (`ab_config.sticky_share`), picks the
  arm, so the same key always lands on the same arm (on every instance and after restarts); without either,
  chance does. Each arm gets one batched call of its requests, both sent at once; each request is answered when
  its own arm answers.
- primary: every request to the primary only.

How a batch flows. `execute` does not wait for the arms: it hands the batch to one of this instance's worker
threads and returns at once (no responses: each request's response goes out through its response sender,
which Python backend 24.06+ allows a non-decoupled model, exactly one final response per request), so Triton
gives the instance its next batch while earlier ones are still at the arms. One instance thus keeps up to
ROUTES_IN_FLIGHT batches at the arms (plus `shadow_max_in_flight` at the candidate), and batches stay as small
as the traffic makes them: a batch of one request passes the request's own input tensor to the arm and the arm's
output tensors straight back in its response (no copy in the router; a batch of several is concatenated once).
A worker that fails unexpectedly answers each of its requests not yet answered with an error: no request is
left without an answer.

The ENGINE output passes the answering arm's through, so a client sees which engine answered.

Metrics (names in spec.py, labels model and model_instance) are added up here (a lock, a few additions per
batch) and written to Triton's metrics endpoint every METRICS_FLUSH_S by a thread of their own: each metric
update is a message from the stub to the server, too dear per request. Histograms are exposed as Prometheus
exposes them, cumulative `_bucket{le=...}` counters with `_sum` and `_count`, so `histogram_quantile` reads
them. Disagreeing requests (request id, both arms' top-5 per image) are kept, the last `disagreement_records`,
in AB_DISAGREEMENTS_DIR/<model instance>-server<pid>.json (rewritten with the metrics) and logged, at most a line
a second.

Tensors cross the boundary through DLPack only (as_numpy is wrong with NumPy 2 in this Triton build).
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import json
import math
import os
import random
import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from .ab_config import ConfigError, parse_router_config, sticky_share
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
# Batches one router instance has at its arms at once, beyond the shadow calls. Each call at an arm holds one of
# the instance's Python-backend threads (32 by default, shared with the responses it sends): 16 + the shadow
# calls leave room. Beyond, a batch waits for a worker (it is not refused); the arms' queues bound the load.
ROUTES_IN_FLIGHT = 16
# An instance with no batch at the arms for this long, given a batch of one request, serves it inline (see execute).
INLINE_IDLE_S = 0.1


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


class Counter:
    """One counter series: what was added since the last flush."""
    __slots__ = ("metric", "pending")

    def __init__(self, metric):
        self.metric, self.pending = metric, 0.0


class Histogram:
    """One histogram series: per-bucket counts since the last flush (made cumulative when written)."""
    __slots__ = ("bounds", "bucket_metrics", "sum_metric", "count_metric", "counts", "sum", "count")

    def __init__(self, bounds: tuple, bucket_metrics: list, sum_metric, count_metric):
        self.bounds, self.bucket_metrics = bounds, bucket_metrics
        self.sum_metric, self.count_metric = sum_metric, count_metric
        self.counts, self.sum, self.count = [0] * (len(bounds) + 1), 0.0, 0

    def observe(self, value: float, count: int = 1):
        """`count` observations of `value` (a batch's latency, once for each of its requests); under the lock."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count    # the first bucket with value <= le
        self.sum += value * count
        self.count += count


class PendingMetrics:
    """Counters and histograms added up in the stub (under `lock`), written to Triton's endpoint by `flush`."""

    def __init__(self, base_labels: dict):
        self.base_labels = base_labels
        self.lock = threading.Lock()
        self.families: dict[str, object] = {}
        self.metrics: list = []
        self.counters: list[Counter] = []
        self.histograms: list[Histogram] = []

    def _metric(self, name: str, description: str, labels: dict):
        if name not in self.families:
            self.families[name] = pb_utils.MetricFamily(name=name, description=description,
                                                        kind=pb_utils.MetricFamily.COUNTER)
        metric = self.families[name].Metric(labels={**self.base_labels, **labels})
        self.metrics.append(metric)
        return metric

    def counter(self, name: str, description: str, **labels) -> Counter:
        """A counter series (it shows, at 0, before anything is counted)."""
        series = Counter(self._metric(name, description, labels))
        self.counters.append(series)
        return series

    def histogram(self, name: str, description: str, buckets: tuple, **labels) -> Histogram:
        buckets_metrics = [self._metric(f"{name}_bucket", f"{description} (cumulative count per upper bound le)",
                                        {"le": _bound_text(bound), **labels}) for bound in (*buckets, math.inf)]
        series = Histogram(tuple(buckets), buckets_metrics, self._metric(f"{name}_sum", f"{description} (sum)", labels),
                           self._metric(f"{name}_count", f"{description} (count)", labels))
        self.histograms.append(series)
        return series

    def flush(self):
        increments = []
        with self.lock:
            for series in self.counters:
                if series.pending:
                    increments.append((series.metric, series.pending))
                    series.pending = 0.0
            for series in self.histograms:
                if series.count:
                    cumulative = 0
                    for metric, count in zip(series.bucket_metrics, series.counts):
                        cumulative += count
                        if cumulative:
                            increments.append((metric, cumulative))
                    increments += [(series.sum_metric, series.sum), (series.count_metric, series.count)]
                    series.counts, series.sum, series.count = [0] * len(series.counts), 0.0, 0
        for metric, amount in increments:   # messages to the server: outside the lock
            if amount:
                metric.increment(amount)

    def close(self):
        self.metrics.clear()     # metrics before their families (the backend requires that order)
        self.counters.clear()
        self.histograms.clear()
        self.families.clear()


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == math.inf else f"{bound:g}"


class ShadowCall:
    """A batch's call at the candidate: its deadline, and whether it was settled (answered or counted late)."""
    __slots__ = ("deadline", "requests", "settled")

    def __init__(self, deadline: float, requests: int):
        self.deadline, self.requests, self.settled = deadline, requests, False


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
        self.mode = self.config.mode
        self.arm_models = {"primary": self.config.primary, "candidate": self.config.candidate}
        self.shadow_timeout_s = self.config.shadow_timeout_ms / 1e3
        self.random = random.Random()
        self.shadow_lock = threading.Lock()       # the shadow calls in flight
        self.shadow_calls: set[ShadowCall] = set()
        self.record_lock = threading.Lock()       # the disagreement record and its log lines
        self.flush_lock = threading.Lock()        # the metrics thread and finalize
        self.disagreements = collections.deque(maxlen=self.config.disagreement_records)
        self.disagreements_changed = False
        self.last_log = 0.0
        self.suppressed_logs = 0
        # Per instance and per tritonserver (its pid: several servers may share the repository, and each
        # names its instances alike).
        self.record_file = AB_DISAGREEMENTS_DIR / f"{self.instance_name}-server{os.getppid()}.json"
        self._declare_metrics()
        self.route_lock = threading.Lock()        # the batches the workers have at the arms
        self.routes_in_flight = 0
        self.inline_from = 0.0                    # perf_counter time from which a batch may be served inline
        self.workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=ROUTES_IN_FLIGHT + (self.config.shadow_max_in_flight if self.mode == "shadow" else 0),
            thread_name_prefix="ab-route")
        self.stopping = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, name="ab-metrics", daemon=True)
        self.flusher.start()
        pb_utils.Logger.log_info(
            f"{self.model_name}: A/B router, mode {self.mode}, primary {self.config.primary}, candidate "
            f"{self.config.candidate}" + (f", {self.config.candidate_percent:g} % to the candidate"
                                          if self.mode == "split" else "")
            + (f", the candidate called once the client has its answer, its deadline "
               f"{self.config.shadow_timeout_ms:g} ms" if self.mode == "shadow" else ""))

    def _declare_metrics(self):
        mode = self.mode
        self.metrics = m = PendingMetrics({"model": self.model_name, "model_instance": self.instance_name})
        arms = ("primary",) if mode == "primary" else AB_ARMS
        self.requests_sent, self.failures, self.latency = {}, {}, {}
        for arm in arms:
            self.requests_sent[arm] = m.counter(AB_REQUESTS_METRIC, "Requests the A/B router sent to each arm",
                                                mode=mode, arm=arm)
            self.failures[arm] = m.counter(AB_FAILURES_METRIC, "Requests an arm answered with an error (for the "
                                           "router)", mode=mode, arm=arm)
            self.latency[arm] = m.histogram(AB_LATENCY_METRIC, "Seconds each arm took to answer the router's "
                                            "batched call, per request", LATENCY_BUCKETS_S, mode=mode, arm=arm)
        if mode == "shadow":
            self.timeouts = m.counter(AB_TIMEOUTS_METRIC, "Shadow requests the candidate did not answer within "
                                      "shadow_timeout_ms")
            self.skipped = m.counter(AB_SKIPPED_METRIC, "Shadow requests not sent: shadow_max_in_flight batches "
                                     "awaited already")
            self.compared = m.counter(AB_COMPARED_METRIC, "Requests answered by both arms and compared")
            self.disagreeing = m.counter(AB_DISAGREEING_METRIC, "Compared requests with an image whose top-1 class "
                                         "differs")
            self.images = m.counter(AB_IMAGES_METRIC, "Images compared")
            self.top1_agree = m.counter(AB_TOP1_AGREE_METRIC, "Compared images whose top-1 class is the same in "
                                        "both arms")
            self.top5_overlap = m.histogram(AB_TOP5_OVERLAP_METRIC, "Top-5 classes both arms share, mean over a "
                                            "request's images", TOP5_OVERLAP_BUCKETS)
            self.rel_l2 = m.histogram(AB_REL_L2_METRIC, "Relative L2 distance of the candidate's logits to the "
                                      "primary's, per request", REL_L2_BUCKETS)

    # ------------------------------------------------------------ requests

    def execute(self, requests):
        """Serve a batch: inline when the instance is idle, else handed to a worker (answers sent from there).

        Inline (a batch of one request for the primary, no batch of this instance at the arms, none for
        INLINE_IDLE_S, no batch of several requests for as long): the primary is called on this thread and the
        response returned, the cheapest path for a lone request, but the instance waits for the primary (as it
        would for a direct call; a split's canary request never waits so: a slow candidate holds no instance).
        Otherwise (requests queued for this instance: the load is beyond what inline serves) a worker calls the
        arm and sends the responses, and execute returns at once, so Triton gives the instance its next batch
        meanwhile; the instance stays so while it has batches at the arms and INLINE_IDLE_S after."""
        started = time.perf_counter()
        images = [pb_utils.get_input_tensor_by_name(request, INPUT_UINT8) for request in requests]
        if self.mode == "split":
            groups = {arm: indices for arm, indices in self._split(requests).items() if indices}
        else:
            groups = {"primary": list(range(len(requests)))}
        with self.route_lock:
            if len(requests) > 1:
                self.inline_from = max(self.inline_from, started + INLINE_IDLE_S)
            inline = (len(requests) == 1 and "candidate" not in groups and self.routes_in_flight == 0
                      and started >= self.inline_from)
            if not inline:
                self.routes_in_flight += len(groups)
        if inline:
            responses = [None]
            (arm, indices), = groups.items()
            self._route(arm, requests, images, indices, started, responses)
            return responses
        for arm, indices in groups.items():
            self.workers.submit(self._route, arm, requests, images, indices, started)
        return None

    def _split(self, requests) -> dict[str, list[int]]:
        groups = {"primary": [], "candidate": []}
        for index, request in enumerate(requests):
            key = request_key(request)
            share = sticky_share(key) if key is not None else self.random.uniform(0, 100)
            groups["candidate" if share < self.config.candidate_percent else "primary"].append(index)
        return groups

    def _route(self, arm: str, requests, images: list, indices: list[int], started: float, responses=None):
        """The requests `indices` to `arm` as one call, each answered; then (shadow) the candidate. On a worker
        each response is sent; inline (`responses`, the list execute returns) they are put there and the
        candidate's call goes to a worker."""
        answered = set()

        def deliver(index: int, response):
            if responses is None:
                self._send(requests[index], response)
            else:
                responses[index] = response
            answered.add(index)

        try:
            batch = self._batch(images, indices)
            outcome = call_now(self._request(arm, batch, len(indices)))
            logits = self._answer(arm, outcome, started, images, indices, deliver)
            if self.mode == "shadow" and logits is not None:
                shadow = (batch, logits, [requests[i] for i in indices], [images[i] for i in indices])
                if responses is None:
                    self._shadow(*shadow)
                else:
                    self.workers.submit(self._shadow_logged, *shadow)
        except BaseException as error:   # never leave a request without its answer
            for index in indices:
                if index not in answered:
                    deliver(index, pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"{self.model_name}: the router failed: {error}")))
            pb_utils.Logger.log_error(f"{self.model_name}: routing to {arm} failed: {error!r}")
        finally:
            if responses is None:
                with self.route_lock:
                    self.routes_in_flight -= 1
                    self.inline_from = max(self.inline_from, time.perf_counter() + INLINE_IDLE_S)

    @staticmethod
    def _batch(images: list, indices: list[int]):
        """The input of one call: a request's own tensor, or the requests' tensors concatenated once."""
        if len(indices) == 1:
            return images[indices[0]]
        return pb_utils.Tensor.from_dlpack(INPUT_UINT8, torch.cat([torch.from_dlpack(images[i].to_dlpack())
                                                                   for i in indices]))

    def _request(self, arm: str, batch, requests: int, timeout_ms: float | None = None):
        """The BLS request of one batch to `arm`."""
        with self.metrics.lock:
            self.requests_sent[arm].pending += requests
        return pb_utils.InferenceRequest(
            model_name=self.arm_models[arm], inputs=[batch], requested_output_names=[OUTPUT_LOGITS, OUTPUT_ENGINE],
            timeout=int(timeout_ms * 1000) if timeout_ms else 0)

    @staticmethod
    def _send(request, response):
        try:
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as error:   # the request was cancelled or answered already: nothing more to do for it
            pb_utils.Logger.log_warn(f"A/B router: response to request {request.request_id()!r} not sent: {error}")

    def _answer(self, arm: str, outcome: tuple, started: float, images: list, indices: list[int], deliver):
        """Deliver each of an arm's requests its rows (or its error); the logits (shadow: a copy), or None."""
        response, error = outcome
        with self.metrics.lock:
            self.latency[arm].observe(time.perf_counter() - started, len(indices))
            if error is not None:
                self.failures[arm].pending += len(indices)
        if error is not None:
            for index in indices:
                deliver(index, pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"{self.model_name}: {self.arm_models[arm]} failed: {error}")))
            return None
        logits = pb_utils.get_output_tensor_by_name(response, OUTPUT_LOGITS)
        engine = pb_utils.get_output_tensor_by_name(response, OUTPUT_ENGINE)
        # shadow: kept for the comparison, which comes after the response went out
        kept = torch.from_dlpack(logits.to_dlpack()).clone() if self.mode == "shadow" else None
        if len(indices) == 1:   # the arm's tensors as they came (the sender keeps the outputs the client asked for)
            deliver(indices[0], pb_utils.InferenceResponse(
                output_tensors=[logits] if engine is None else [logits, engine]))
            return kept
        all_logits = torch.from_dlpack(logits.to_dlpack())
        all_engine = torch.from_dlpack(engine.to_dlpack()) if engine is not None else None
        start = 0
        for index in indices:
            rows = images[index].shape()[0]
            outputs = [pb_utils.Tensor.from_dlpack(OUTPUT_LOGITS, all_logits[start:start + rows])]
            if all_engine is not None:
                outputs.append(pb_utils.Tensor.from_dlpack(OUTPUT_ENGINE, all_engine[start:start + rows]))
            deliver(index, pb_utils.InferenceResponse(output_tensors=outputs))
            start += rows
        return kept

    # ------------------------------------------------------------ shadow: the candidate after the answer

    def _shadow_logged(self, *shadow):
        try:
            self._shadow(*shadow)
        except Exception as error:   # the client has its answer; the comparison of this batch is lost
            pb_utils.Logger.log_error(f"{self.model_name}: the shadow comparison failed: {error!r}")

    def _shadow(self, batch, primary: torch.Tensor, requests: list, images: list):
        count = len(requests)
        with self.shadow_lock:
            if len(self.shadow_calls) >= self.config.shadow_max_in_flight:
                call = None
            else:
                call = ShadowCall(time.perf_counter() + self.shadow_timeout_s, count)
                self.shadow_calls.add(call)
        if call is None:
            with self.metrics.lock:
                self.skipped.pending += count
            return
        try:
            started = time.perf_counter()
            response, error = call_now(self._request("candidate", batch, count,
                                                     timeout_ms=self.config.shadow_timeout_ms))
            elapsed = time.perf_counter() - started
        finally:
            with self.shadow_lock:
                counted_late, call.settled = call.settled, True
                self.shadow_calls.discard(call)
        if counted_late:            # the metrics thread counted it at its deadline
            return
        # Triton's own queue timeout (the call's timeout) reads "Request timeout expired".
        late = elapsed > self.shadow_timeout_s or (error is not None and "timeout" in error.lower())
        with self.metrics.lock:
            if late:
                self.timeouts.pending += count
            elif error is not None:
                self.failures["candidate"].pending += count
            else:
                self.latency["candidate"].observe(elapsed, count)
        if late or error is not None:
            return
        candidate = torch.from_dlpack(pb_utils.get_output_tensor_by_name(response, OUTPUT_LOGITS).to_dlpack())
        self._compare(primary, candidate, requests, images)

    def _expire_shadows(self):
        """Count as timeouts the candidate calls past their deadline (their answers will not be compared)."""
        now = time.perf_counter()
        late = 0
        with self.shadow_lock:
            for call in self.shadow_calls:
                if not call.settled and now > call.deadline:
                    call.settled = True
                    late += call.requests
        if late:
            with self.metrics.lock:
                self.timeouts.pending += late

    def _compare(self, primary: torch.Tensor, candidate: torch.Tensor, requests: list, images: list):
        start = 0
        results = []
        for request, image in zip(requests, images):
            rows = image.shape()[0]
            results.append((request, compare(primary[start:start + rows], candidate[start:start + rows])))
            start += rows
        with self.metrics.lock:
            for _, result in results:
                self.compared.pending += 1
                self.images.pending += result["images"]
                self.top1_agree.pending += result["top1_agree"]
                self.top5_overlap.observe(result["top5_overlap"])
                self.rel_l2.observe(result["rel_l2"])
                if result["disagreeing"]:
                    self.disagreeing.pending += 1
        for request, result in results:
            if result["disagreeing"]:
                self._record(request.request_id(), result)

    def _record(self, request_id: str, result: dict):
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "request_id": request_id,
                  "primary": self.config.primary, "candidate": self.config.candidate,
                  "images": result["images"], "rel_l2": result["rel_l2"], "disagreeing": result["disagreeing"]}
        with self.record_lock:
            if self.config.disagreement_records:
                self.disagreements.append(record)
                self.disagreements_changed = True
            now = time.monotonic()
            if now - self.last_log < LOG_EVERY_S:
                self.suppressed_logs += 1
                return
            suppressed, self.last_log, self.suppressed_logs = self.suppressed_logs, now, 0
        first = result["disagreeing"][0]
        pb_utils.Logger.log_warn(
            f"{self.model_name}: top-1 differs on request {request_id!r} image {first['image']}: "
            f"{self.config.primary} top-5 {first['primary_top5']}, {self.config.candidate} top-5 "
            f"{first['candidate_top5']}" + (f" ({suppressed} more such requests since the last line)"
                                            if suppressed else ""))

    # ------------------------------------------------------------ metrics and the record, every METRICS_FLUSH_S

    def _flush_loop(self):
        while not self.stopping.wait(METRICS_FLUSH_S):
            self._flush()

    def _flush(self):
        with self.flush_lock:
            try:
                if self.mode == "shadow":
                    self._expire_shadows()
                self.metrics.flush()
                self._write_record()
            except Exception as error:  # serving goes on; the figures miss this flush
                pb_utils.Logger.log_warn(f"{self.model_name}: A/B metrics not written: {error}")

    def _write_record(self):
        with self.record_lock:
            if not self.disagreements_changed:
                return
            self.disagreements_changed = False
            records = list(self.disagreements)
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.record_file.with_name(f".{self.record_file.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(records, indent=1) + "\n")
        os.replace(temporary, self.record_file)

    def finalize(self):
        self.workers.shutdown(wait=True)    # every batch handed over is answered (and its shadow settled)
        self.stopping.set()
        self.flusher.join()
        self._flush()
        with self.flush_lock:
            self.metrics.close()
