"""Triton's Prometheus metrics endpoint: scrape, parse, and difference two snapshots.

Triton's per-model counters are cumulative, so what happened during a load
step is the difference of a snapshot taken after it and one taken before it:

    nv_inference_request_success / _failure   requests answered / failed (failures summed over `reason`)
    nv_inference_count / nv_inference_exec_count
                                              images inferred / model executions: their ratio is the
                                              average batch the dynamic batcher formed
    nv_inference_request_duration_us          end-to-end time inside the server, summed over requests
    nv_inference_queue_duration_us            waiting in the scheduler queue
    nv_inference_compute_{input,infer,output}_duration_us
                                              copying inputs in, running the model, copying outputs out

The models add the time of each phase of their execute() (backend/triton_adapter/python_model.py),
summed over executions: `fusedresnet_execute_phase_us{model,model_instance,device,gpu_uuid,phase}`.

The A/B router (`resnet18_ab`) counts what it sends each arm and what it compares, with histograms of each
arm's latency, the top-5 overlap and the logits' relative L2 (`fusedresnet_ab_*`, spec.py); `ab_delta` reads
them between two snapshots, quantiles interpolated within the buckets as Prometheus's `histogram_quantile` does.

GPU utilisation (`nv_gpu_utilization`, a 0..1 gauge per GPU, refreshed every
--metrics-interval-ms) only exists on a GPU host; it is sampled, not differenced.
The models also count the images and batches of each instance (`fusedresnet_images`,
`fusedresnet_executions`) labelled with the `gpu_uuid` that Triton's GPU gauges carry
(Triton's own per-model counters have no GPU label in this build), so with
instances on several GPUs `per_gpu` tells how the work was shared.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fusedresnet.backend.spec import (
    AB_COMPARED_METRIC,
    AB_DISAGREEING_METRIC,
    AB_FAILURES_METRIC,
    AB_IMAGES_METRIC,
    AB_LATENCY_METRIC,
    AB_REL_L2_METRIC,
    AB_REQUESTS_METRIC,
    AB_ROUTER_MODEL,
    AB_SKIPPED_METRIC,
    AB_TIMEOUTS_METRIC,
    AB_TOP1_AGREE_METRIC,
    AB_TOP5_OVERLAP_METRIC,
    EXECUTE_PHASE_METRIC,
    EXECUTE_PHASES,
    EXECUTIONS_METRIC,
    GPU_UUID_LABEL,
    IMAGES_METRIC,
    MODEL_ENTRIES,
    MODELS,
)

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
REQUEST_US = "nv_inference_request_duration_us"
QUEUE_US = "nv_inference_queue_duration_us"
COMPUTE_INPUT_US = "nv_inference_compute_input_duration_us"
COMPUTE_INFER_US = "nv_inference_compute_infer_duration_us"
COMPUTE_OUTPUT_US = "nv_inference_compute_output_duration_us"
GPU_UTILIZATION = "nv_gpu_utilization"
CPU_UTILIZATION = "nv_cpu_utilization"
GPU_LABEL = GPU_UUID_LABEL

# Server-side time per request, in the order a request spends it.
TIME_BREAKDOWN = {"queue_us": QUEUE_US, "compute_input_us": COMPUTE_INPUT_US,
                  "compute_infer_us": COMPUTE_INFER_US, "compute_output_us": COMPUTE_OUTPUT_US}

@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


def parse_prometheus_text(text: str) -> list[Sample]:
    # prometheus_client names a counter's samples <family>_total; Triton's counters carry no such
    # suffix, so a counter's samples keep the family name, the one Triton wrote.
    return [Sample(family.name if family.type == "counter" else sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples]


@dataclass
class MetricsSnapshot:
    taken_at: float           # epoch seconds
    samples: list[Sample]

    def total(self, name: str, model: str | None = None, **labels) -> float:
        """Sum of `name` over all its label sets (of one model, and with the given labels, when given)."""
        return sum(s.value for s in self.samples
                   if s.name == name and (model is None or s.labels.get("model") == model)
                   and all(s.labels.get(key) == value for key, value in labels.items()))

    def values(self, name: str) -> list[float]:
        return [s.value for s in self.samples if s.name == name]


def scrape(metrics_url: str, timeout_s: float = 5.0) -> MetricsSnapshot:
    """One snapshot of Triton's metrics; of several servers (URLs separated by commas) their samples
    together, so that totals are the servers' sums."""
    samples = []
    for url in metrics_url.split(","):
        with urllib.request.urlopen(url.strip(), timeout=timeout_s) as response:
            samples += parse_prometheus_text(response.read().decode())
    return MetricsSnapshot(time.time(), samples)


def combined(snapshots: list[MetricsSnapshot]) -> MetricsSnapshot:
    """Several servers' snapshots (one each, taken one after another) as one: their samples together, taken at
    the first one's time."""
    return MetricsSnapshot(snapshots[0].taken_at, [sample for snapshot in snapshots for sample in snapshot.samples])


def requests_seen(snapshot: MetricsSnapshot, model: str) -> float:
    """Requests Triton has finished for `model`, successfully or not."""
    return snapshot.total(SUCCESS, model) + snapshot.total(FAILURE, model)


def model_delta(before: MetricsSnapshot, after: MetricsSnapshot, model: str) -> dict:
    """What Triton did for `model` between two snapshots: counts, average batch, time per request."""
    def delta(name):
        return after.total(name, model) - before.total(name, model)

    succeeded, failed = delta(SUCCESS), delta(FAILURE)
    executions = delta(EXECUTIONS)
    seconds = max(after.taken_at - before.taken_at, 1e-9)
    summary = {
        "triton_success": int(round(succeeded)),
        "triton_failure": int(round(failed)),
        "triton_inferences": int(round(delta(INFERENCES))),
        "triton_executions": int(round(executions)),
        "avg_batch": delta(INFERENCES) / executions if executions else None,
        "server_img_per_s": delta(INFERENCES) / seconds,
        "request_us": delta(REQUEST_US) / succeeded if succeeded else None,
    }
    for key, name in TIME_BREAKDOWN.items():
        summary[key] = delta(name) / succeeded if succeeded else None
    for phase in EXECUTE_PHASES:   # per execution, inside the model's execute()
        spent = (after.total(EXECUTE_PHASE_METRIC, model, phase=phase)
                 - before.total(EXECUTE_PHASE_METRIC, model, phase=phase))
        summary[f"execute_{phase}_us"] = spent / executions if executions else None
    return summary


class Sampler:
    """Snapshots of Triton's metrics every `interval_s` in a thread of its own, from `start_after_s` after entering
    until the block ends (gauges such as nv_gpu_utilization over a step; a failed scrape is skipped)."""

    def __init__(self, metrics_url: str, interval_s: float = 0.5, start_after_s: float = 0.0):
        self.metrics_url, self.interval_s, self.start_after_s = metrics_url, interval_s, start_after_s
        self.snapshots: list[MetricsSnapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="metrics-sampler")

    def _run(self):
        if self._stop.wait(self.start_after_s):
            return
        while not self._stop.is_set():
            try:
                self.snapshots.append(scrape(self.metrics_url, timeout_s=max(self.interval_s, 1.0)))
            except (OSError, ValueError):
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def mean_gauge(snapshots: list[MetricsSnapshot], name: str) -> float | None:
    """Mean of a gauge over snapshots and over its label sets (e.g. all GPUs); None when absent."""
    values = [v for snapshot in snapshots for v in snapshot.values(name)]
    return sum(values) / len(values) if values else None


def per_gpu(before: MetricsSnapshot, after: MetricsSnapshot, model: str,
            during: list[MetricsSnapshot]) -> dict[str, dict]:
    """Per GPU (by uuid) between two snapshots: the share of `model`'s images its instances computed,
    that share of the images Triton counted (img/s), their engine runs, and the GPU's mean utilisation;
    empty where there is no GPU. The models write their counters at most every 0.5 s, so the share
    and runs of a window are approximate at its edges; img/s takes its total from Triton's own count."""
    uuids = sorted({s.labels[GPU_LABEL] for s in after.samples
                    if s.name in (IMAGES_METRIC, GPU_UTILIZATION) and s.labels.get(GPU_LABEL)})
    seconds = max(after.taken_at - before.taken_at, 1e-9)

    def delta(name, **labels):
        return after.total(name, model, **labels) - before.total(name, model, **labels)

    counted = delta(IMAGES_METRIC)
    served = delta(INFERENCES)
    result = {}
    for uuid in uuids:
        share = delta(IMAGES_METRIC, **{GPU_LABEL: uuid}) / counted if counted else None
        utilization = [s.value for snapshot in during for s in snapshot.samples
                       if s.name == GPU_UTILIZATION and s.labels.get(GPU_LABEL) == uuid]
        result[uuid] = {
            "img_per_s": share * served / seconds if share is not None else 0.0,
            "executions": int(round(delta(EXECUTIONS_METRIC, **{GPU_LABEL: uuid}))),
            "share": share,
            "utilization": sum(utilization) / len(utilization) if utilization else None,
        }
    return result


def other_entries_requests(before: MetricsSnapshot, after: MetricsSnapshot, model: str) -> int:
    """Requests that reached model entries other than `model` between two snapshots, leaving out those `model`
    sends on itself (the A/B router's arms: the networks' IMAGE entries)."""
    passed_on = MODELS if model == AB_ROUTER_MODEL else ()
    return int(sum(requests_seen(after, m) - requests_seen(before, m)
                   for m in MODEL_ENTRIES if m != model and m not in passed_on))


def histogram_quantile(quantile: float, buckets: list[tuple[float, float]]) -> float | None:
    """The quantile of cumulative (upper bound, count) buckets, linear within a bucket as Prometheus's
    histogram_quantile; the highest finite bound when it falls in the +Inf bucket; None without observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = quantile * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == math.inf:
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, model: str, **labels) -> dict:
    """One histogram between two snapshots, summed over instances: count, mean, p50, p99."""
    def delta(series, **more):
        return after.total(f"{name}_{series}", model, **labels, **more) - before.total(f"{name}_{series}", model,
                                                                                       **labels, **more)
    bounds = {float(s.labels["le"]) for s in after.samples if s.name == f"{name}_bucket" and "le" in s.labels}
    buckets = [(bound, delta("bucket", le=_le_text(bound, after, name))) for bound in bounds]
    count = delta("count")
    return {"count": int(round(count)), "mean": delta("sum") / count if count else None,
            "p50": histogram_quantile(0.5, buckets), "p99": histogram_quantile(0.99, buckets)}


def _le_text(bound: float, snapshot: MetricsSnapshot, name: str) -> str:
    """The `le` label as the snapshot writes it for `bound` ("0.001", "+Inf")."""
    return next(s.labels["le"] for s in snapshot.samples
                if s.name == f"{name}_bucket" and "le" in s.labels and float(s.labels["le"]) == bound)


def ab_delta(before: MetricsSnapshot, after: MetricsSnapshot, model: str = AB_ROUTER_MODEL) -> dict:
    """What the A/B router did between two snapshots: per arm requests, failures and latency (ms), and in
    shadow mode the comparison (requests compared, top-1 agreement of images, mean top-5 overlap, p99 of the
    logits' relative L2), the shadow copies late or not sent."""
    def delta(name, **labels):
        return after.total(name, model, **labels) - before.total(name, model, **labels)

    modes = sorted({s.labels["mode"] for s in after.samples
                    if s.name == AB_REQUESTS_METRIC and s.labels.get("model") == model
                    and delta(AB_REQUESTS_METRIC, mode=s.labels["mode"]) > 0})
    arms = {}
    for arm in ("primary", "candidate"):
        requests = delta(AB_REQUESTS_METRIC, arm=arm)
        if not requests:
            continue
        latency = histogram_delta(before, after, AB_LATENCY_METRIC, model, arm=arm)
        arms[arm] = {"requests": int(round(requests)), "failures": int(round(delta(AB_FAILURES_METRIC, arm=arm))),
                     **{f"{key}_ms": None if latency[key] is None else latency[key] * 1e3
                        for key in ("p50", "p99", "mean")}}
    images = delta(AB_IMAGES_METRIC)
    overlap = histogram_delta(before, after, AB_TOP5_OVERLAP_METRIC, model)
    rel_l2 = histogram_delta(before, after, AB_REL_L2_METRIC, model)
    return {"modes": modes, "arms": arms,
            "requests": int(round(delta(AB_COMPARED_METRIC))),
            "disagreeing_requests": int(round(delta(AB_DISAGREEING_METRIC))),
            "images": int(round(images)),
            "top1_agree": delta(AB_TOP1_AGREE_METRIC) / images if images else None,
            "top5_overlap_mean": overlap["mean"], "rel_l2_p99": rel_l2["p99"],
            "shadow_timeouts": int(round(delta(AB_TIMEOUTS_METRIC))),
            "shadow_skipped": int(round(delta(AB_SKIPPED_METRIC)))}
