"""A gRPC or HTTP load step driven by h2load (Debian's nghttp2-client): a C load generator.

    python -m fusedresnet.loadtest.h2load_step --model resnet18_custom --url 127.0.0.1:8001 \\
        --metrics-url http://127.0.0.1:8002/metrics --images-per-request 32 --connections 64 --seconds 4
    python -m fusedresnet.loadtest.h2load_step --protocol http --url 127.0.0.1:8000 ...   # KServe HTTP/1.1

Where grpc_flood (Python, asyncio) needs about a core per 2-3k requests/s and saturates before several
server processes do, h2load sends one pre-serialised ModelInfer request (loadtest/raw_grpc.infer_request:
uint8 images, LOGITS only) over `connections` HTTP/2 connections with `streams` calls in flight on each,
from `threads` native threads, for `seconds` after `warmup_s`. Each connection goes to the server
process the kernel picks, so connections spread over the processes behind one port.

Over HTTP (`--protocol http`: HTTP/1.1, one call at a time on each connection, as Triton's HTTP endpoint
serves) the request is KServe's infer with the binary tensor extension, its body made by tritonclient.http
(uint8 images, LOGITS as binary data); a failure there is an HTTP error status.

Over gRPC, h2load sees HTTP statuses, not gRPC ones (a gRPC error is an HTTP 200 with a grpc-status trailer), so the
step is judged by Triton's own counters over the step: every request h2load finished must be a success
there, and Triton's failures must be 0, but for the calls h2load resets when its time is up (counted as
CANCELED, reported apart). Throughput is h2load's over its measurement window; latency
percentiles come from its per-request log (--log-file), of the requests started inside the window; the
generator's CPU is h2load's own (user + system over the step).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fusedresnet.backend.images import smooth_random_images
from fusedresnet.backend.spec import DEFAULT_GRPC_URL, DEFAULT_METRICS_URL, INPUT_UINT8, OUTPUT_LOGITS
from fusedresnet.loadtest import triton_metrics
from fusedresnet.loadtest.raw_grpc import MODEL_INFER, grpc_frame, infer_request

LOAD_GENERATOR = "h2load"


def h2load_path() -> str | None:
    """Where h2load is (PATH), None where it is not installed."""
    return shutil.which("h2load")


def h2load_binary() -> str:
    binary = h2load_path()
    if binary is None:
        raise FileNotFoundError("h2load not found: install Debian's nghttp2-client (or put its h2load on PATH)")
    return binary


def parse_h2load(text: str) -> dict:
    """The counts of h2load's summary: requests total/started/done/succeeded/failed/errored/timeout
    and status codes 2xx..5xx."""
    figures = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("requests:"):
            for part in line[len("requests:"):].split(","):
                value, name = part.split()
                figures[f"requests_{name}"] = int(value)
        elif line.startswith("status codes:"):
            for part in line[len("status codes:"):].split(","):
                value, name = part.split()
                figures[f"status_{name}"] = int(value)
    return figures


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def window_latencies_ms(log_file: Path, window: tuple[float, float]) -> np.ndarray:
    """Latencies (ms) of the requests h2load logged as HTTP 200 that started inside `window` (epoch s)."""
    rows = [line.split("\t") for line in log_file.read_text().splitlines() if line.strip()]
    table = np.array([(int(start) / 1e6, int(status), int(elapsed) / 1e3) for start, status, elapsed in rows]
                     or np.zeros((0, 3)), dtype=np.float64).reshape(-1, 3)
    inside = (table[:, 0] >= window[0]) & (table[:, 0] < window[1]) & (table[:, 1] == 200)
    return table[inside, 2]


PROTOCOLS = ("grpc", "http")


def http_infer_body(images: np.ndarray) -> tuple[bytes, int]:
    """KServe's HTTP infer request for uint8 images [N,224,224,3], LOGITS only, both as binary data: (the body,
    the length of its JSON header), made by tritonclient.http as its client sends them."""
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput(INPUT_UINT8, list(images.shape), "UINT8")
    tensor.set_data_from_numpy(np.ascontiguousarray(images, dtype=np.uint8), binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [tensor], outputs=[httpclient.InferRequestedOutput(OUTPUT_LOGITS, binary_data=True)])
    return body, json_size


def request_of(protocol: str, model: str, url: str, images: np.ndarray) -> tuple[str, bytes, list[str]]:
    """(h2load's URL, the request body, h2load's protocol and header arguments) of one infer call."""
    if protocol == "grpc":
        return (f"http://{url}{MODEL_INFER}", grpc_frame(infer_request(model, images)),
                ["-H", "content-type: application/grpc", "-H", "te: trailers"])
    if protocol == "http":
        body, json_size = http_infer_body(images)
        return (f"http://{url}/v2/models/{model}/infer", body,
                ["--h1", "-H", "content-type: application/octet-stream",
                 "-H", f"inference-header-content-length: {json_size}"])
    raise ValueError(f"protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")


def run_h2load_step(model: str, url: str, metrics_url: str, images_per_request: int, connections: int,
                    streams: int = 8, threads: int = 8, seconds: float = 4.0, warmup_s: float = 1.5,
                    protocol: str = "grpc") -> dict:
    images = smooth_random_images(images_per_request, seed=images_per_request).numpy()
    target, request, protocol_args = request_of(protocol, model, url, images)
    if protocol == "http":
        streams = 1          # HTTP/1.1: one call at a time on a connection (no pipelining)
    before = triton_metrics.scrape(metrics_url, timeout_s=10)
    with tempfile.TemporaryDirectory(prefix="h2load-") as folder:
        body, log_file = Path(folder) / "request.body", Path(folder) / "requests.tsv"
        body.write_bytes(request)
        command = [h2load_binary(), target, "-c", str(connections), "-m", str(streams),
                   "-t", str(min(threads, connections)), "-D", f"{round(seconds * 1000)}ms",
                   f"--warm-up-time={round(warmup_s * 1000)}ms", "-d", str(body), *protocol_args,
                   f"--log-file={log_file}"]
        cpu_before, started = children_cpu_s(), time.time()
        with triton_metrics.Sampler(metrics_url, start_after_s=warmup_s) as sampler:   # the GPU's busy share
            finished = subprocess.run(command, capture_output=True, text=True, timeout=seconds + warmup_s + 120)
        wall_s, cpu_s = time.time() - started, children_cpu_s() - cpu_before
        if not log_file.is_file():
            raise RuntimeError(f"h2load ran no step (exit {finished.returncode}): {finished.stdout[-500:]} "
                               f"{finished.stderr[-500:]}")
        window = (started + warmup_s, started + warmup_s + seconds)
        latencies = window_latencies_ms(log_file, window)
    after = triton_metrics.scrape(metrics_url, timeout_s=10)
    counts = parse_h2load(finished.stdout)
    triton = triton_metrics.model_delta(before, after, model)
    # h2load ends its run by resetting the calls still in flight: Triton counts them as failures of reason
    # CANCELED. Those are the generator's stop, not the server's errors.
    triton["triton_cancelled"] = int(after.total(triton_metrics.FAILURE, model, reason="CANCELED")
                                     - before.total(triton_metrics.FAILURE, model, reason="CANCELED"))
    errors = triton["triton_failure"] - triton["triton_cancelled"]
    done = counts.get("requests_succeeded", 0)
    requests_per_s = next((float(line.split(",")[1].split()[0]) for line in finished.stdout.splitlines()
                           if line.startswith("finished in")), 0.0)
    problems = []
    if finished.returncode != 0:
        problems.append(f"h2load exited {finished.returncode}: {finished.stderr.strip()[-300:]}")
    if errors:
        problems.append(f"Triton counted {errors} failed requests (besides {triton['triton_cancelled']} cancelled)")
    if triton["triton_success"] < done:
        problems.append(f"h2load finished {done} requests after its warm-up, Triton counted only "
                        f"{triton['triton_success']} successes over the whole step (gRPC errors are HTTP 200)")
    return {"model": model, "protocol": protocol, "load_generator": LOAD_GENERATOR, "images_per_request":
            images_per_request, "concurrency": connections * streams, "connections": connections,
            "streams": streams, "threads": min(threads, connections), "shared_memory": "none",
            "img_per_s": requests_per_s * images_per_request, "sent": counts.get("requests_total", 0),
            "failures": counts.get("requests_failed", 0) + counts.get("requests_errored", 0) + errors,
            "p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else None,
            "p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else None,
            "gpu_utilization": triton_metrics.mean_gauge(sampler.snapshots, triton_metrics.GPU_UTILIZATION),
            "client_cpu_percent": round(100 * cpu_s / wall_s, 1), "client_cpu_saturated":
            bool(cpu_s / wall_s > 0.9 * min(threads, connections)), "h2load": counts, **triton,
            "problems": problems, "command": " ".join(["h2load", *command[1:2], *command[2:12]])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc", help="grpc (HTTP/2) or http (HTTP/1.1)")
    parser.add_argument("--url", default=DEFAULT_GRPC_URL)
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL,
                        help="every server process's metrics URL, comma-separated")
    parser.add_argument("--images-per-request", type=int, default=1)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=8, help="calls in flight per connection")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    args = parser.parse_args(argv)
    record = run_h2load_step(args.model, args.url, args.metrics_url, args.images_per_request, args.connections,
                             args.streams, args.threads, args.seconds, args.warmup_s, args.protocol)
    print(json.dumps({k: v for k, v in record.items() if k != "h2load"}, indent=1, default=str))
    return 3 if record["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
