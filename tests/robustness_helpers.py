"""What the robustness tests share: raw requests that tritonclient would refuse to build,
Triton's own counters, the server's processes and memory, a launcher run as users run it,
and where the measured figures go.

Figures (counts, times, memory) are written as JSON + a markdown table into
$FUSEDRESNET_RESULTS_DIR (default: a pytest temporary folder), so a run on the GPU
host leaves a record next to the one from CI.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import platform
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fusedresnet.backend.launcher import LaunchedServer, metrics_url_of, parse_settings  # noqa: F401  (the tests' import)
from fusedresnet.backend.launcher.stub_processes import python_stubs
from fusedresnet.backend.spec import INPUT_UINT8, OUTPUT_LOGITS
from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, compare_logits
from fusedresnet.loadtest import triton_metrics

RESULTS_ENV = "FUSEDRESNET_RESULTS_DIR"

CLIENT_TIMEOUT_S = 120.0         # no test request may wait longer than this for its answer
PROTOCOLS = ("grpc", "http")


# ---------------------------------------------------------------- answers

def assert_correct(logits: np.ndarray, reference: np.ndarray):
    """Each row's logits within IMAGE_REL_L2_TOLERANCE (relative L2) of its reference row."""
    assert logits.shape == reference.shape, (logits.shape, reference.shape)
    for row, ref in zip(logits, reference):
        stats = compare_logits(row[None], ref[None])
        assert stats["rel_l2"] <= IMAGE_REL_L2_TOLERANCE, stats


def client(server, protocol: str, **kwargs):
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(server.grpc_url, **kwargs)
    return httpclient.InferenceServerClient(server.http_url, network_timeout=CLIENT_TIMEOUT_S,
                                            connection_timeout=CLIENT_TIMEOUT_S, **kwargs)


def infer_image(triton, protocol: str, model: str, images: np.ndarray, headers=None) -> np.ndarray:
    """Logits of uint8 images [N,224,224,3] through tritonclient (raises InferenceServerException)."""
    lib = grpcclient if protocol == "grpc" else httpclient
    tensor = lib.InferInput(INPUT_UINT8, list(images.shape), "UINT8")
    tensor.set_data_from_numpy(np.ascontiguousarray(images))
    kwargs = {"client_timeout": CLIENT_TIMEOUT_S} if protocol == "grpc" else {}
    result = triton.infer(model, [tensor], outputs=[lib.InferRequestedOutput(OUTPUT_LOGITS)], headers=headers,
                          **kwargs)
    return result.as_numpy(OUTPUT_LOGITS)


def error_of(call) -> InferenceServerException | None:
    try:
        call()
    except InferenceServerException as error:
        return error
    return None


# ---------------------------------------------------------------- raw requests

def raw_http_infer(server, model: str, header: dict, body: bytes, header_length: int | None = None,
                   version: str = "", timeout_s: float = CLIENT_TIMEOUT_S) -> tuple[int, str]:
    """POST a KServe v2 binary-tensor request exactly as given: (HTTP status, response text)."""
    header_bytes = json.dumps(header).encode()
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=header_bytes + body, method="POST",
        headers={"Inference-Header-Content-Length": str(len(header_bytes) if header_length is None
                                                        else header_length),
                 "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()[:2000].decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def raw_grpc_infer(server, model: str, inputs: list[tuple[str, str, list[int]]], contents: list[bytes],
                   version: str = "", outputs=(OUTPUT_LOGITS,), timeout_s: float = CLIENT_TIMEOUT_S):
    """ModelInfer with the given (name, datatype, shape) inputs and raw contents as they are:
    (grpc status code name, details) or ("OK", response whose raw_output_contents follow `outputs`)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in inputs:
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(shape)
    for name in outputs:
        request.outputs.add().name = name
    request.raw_input_contents.extend(contents)
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", -1),
                                                         ("grpc.max_receive_message_length", -1)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            return "OK", stub.ModelInfer(request, timeout=timeout_s)
        except grpc.RpcError as error:
            return error.code().name, error.details()


class ClientThreads:
    """Client threads, one per protocol in `protocols`, each sending (its `_run(worker, protocol)`) until
    stopped and recording (start, end, first image, outcome) of every request: the logits or the exception."""

    def __init__(self, protocols):
        self.protocols = protocols
        self.records: list[tuple[float, float, int, object]] = []
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, p), daemon=True) for i, p in enumerate(protocols)]

    def _run(self, worker: int, protocol: str):
        raise NotImplementedError

    def record(self, started: float, first: int, outcome):
        with self.lock:
            self.records.append((started, time.monotonic(), first, outcome))

    def snapshot(self) -> list:
        with self.lock:
            return list(self.records)

    def failures(self) -> list:
        return [r for r in self.snapshot() if isinstance(r[3], Exception)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 10)
        assert not any(thread.is_alive() for thread in self.threads), "a client thread hung"


# ---------------------------------------------------------------- Triton's own counters

PENDING = "nv_inference_pending_request_count"


def request_counters(server, model: str, snapshot: triton_metrics.MetricsSnapshot | None = None) -> dict:
    if snapshot is None:
        snapshot = triton_metrics.scrape(server.metrics_url, timeout_s=10)
    return {"success": snapshot.total(triton_metrics.SUCCESS, model),
            "failure": snapshot.total(triton_metrics.FAILURE, model),
            "rejected": snapshot.total(triton_metrics.FAILURE, model, reason="REJECTED"),
            "backend": snapshot.total(triton_metrics.FAILURE, model, reason="BACKEND"),
            # calls whose client left, answered CANCELLED by Triton's scheduler (still queued) or the model
            "cancelled": snapshot.total(triton_metrics.FAILURE, model, reason="CANCELED"),
            "computed": snapshot.total(triton_metrics.INFERENCES, model)}   # images the model computed


def counter_delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def settled_counters(server, model: str, timeout_s: float, quiet_s: float = 1.0) -> dict:
    """Triton's request counters once nothing is pending (nv_inference_pending_request_count 0) and they
    have not changed for `quiet_s`. A request in execution is no longer pending, and Triton counts it just
    after its answer leaves: `quiet_s` must outlast the longest execution that may still be running."""
    deadline = time.monotonic() + timeout_s
    previous, quiet_since = None, time.monotonic()
    while True:
        snapshot = triton_metrics.scrape(server.metrics_url, timeout_s=10)
        current, now = request_counters(server, model, snapshot), time.monotonic()
        idle = snapshot.total(PENDING, model) == 0
        if idle and current == previous:
            if now - quiet_since >= quiet_s:
                return current
        else:
            previous, quiet_since = (current if idle else None), now
        if now > deadline:
            raise AssertionError(f"{model}: Triton's counters not settled {timeout_s:.0f} s on (pending or changing)")
        time.sleep(min(0.5, quiet_s / 2))


def counter_delta_reaching(server, model: str, before: dict, least: dict, timeout_s: float = 10.0) -> dict:
    """counter_delta from `before` once every counter named in `least` has grown by at least that much,
    or after `timeout_s` (read_until)."""
    return read_until(lambda: counter_delta(request_counters(server, model), before),
                      lambda delta: all(delta[key] >= value for key, value in least.items()), timeout_s)


# ---------------------------------------------------------------- processes and memory

def rss_bytes(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def server_rss_bytes(server_pid: int) -> dict[str, int]:
    """Resident memory of tritonserver and of each of its Python stubs."""
    sizes = {"tritonserver": rss_bytes(psutil.Process(server_pid))}
    for instance, stub in python_stubs(server_pid).items():
        sizes[instance] = rss_bytes(stub)
    return sizes


def stub_pids(server_pid: int | None) -> dict[str, int]:
    """Model instance name -> pid of each live Python-backend stub of tritonserver `server_pid`."""
    return {instance: stub.pid for instance, stub in python_stubs(server_pid).items()} if server_pid else {}


def shm_regions_of_stubs(server_pid: int) -> list[str]:
    """The /dev/shm regions the Python-backend stubs of `server_pid` have mapped."""
    regions = set()
    for stub in python_stubs(server_pid).values():
        try:
            regions |= {Path(m.path).name for m in stub.memory_maps() if m.path.startswith("/dev/shm/")}
        except psutil.NoSuchProcess:
            continue
    return sorted(regions)


def device_description() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and "GPU" in out.stdout:
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU only: {os.cpu_count()} x {cpu}"


def read_until(read, done, timeout_s: float, interval_s: float = 0.05):
    """read() again every `interval_s` until done(value) or `timeout_s` has passed: the last value read.
    For Triton's counters: it counts a request just after its answer leaves, so the last answers may
    arrive before they are counted."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.25) -> bool:
    return bool(read_until(predicate, bool, timeout_s, interval_s))


# ---------------------------------------------------------------- the launcher, run as users run it

class Launcher(LaunchedServer):
    """`python -m fusedresnet.backend.serve` in a subprocess on free loopback ports (its own servers,
    so a test may kill its stubs or stop them), with the admin token in the environment unless None;
    `processes` tritonservers on the same gRPC and HTTP ports (--processes-per-gpu on this GPU-less
    machine), each with its metrics port, metrics_ports[i]. Its output in log_dir/launcher.out, Triton's
    log in log_dir/server.log."""

    def __init__(self, log_dir: Path, admin_token: str | None, exit_timeout_s: int = 30, extra_args=(),
                 processes: int = 1):
        settings = parse_settings(["--processes-per-gpu", str(processes), "--exit-timeout", str(exit_timeout_s),
                                   *extra_args]).replace(log_file=Path(log_dir) / "server.log", admin_token=admin_token)
        super().__init__(settings, Path(log_dir) / "launcher.out", stop_timeout_s=exit_timeout_s + 30)


# ---------------------------------------------------------------- recorded figures

def results_dir(tmp_path_factory) -> Path:
    folder = os.environ.get(RESULTS_ENV)
    path = Path(folder) if folder else tmp_path_factory.getbasetemp() / "robustness-results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(folder: Path, name: str, figures: dict):
    """Merge `figures` under `name` into robustness_<name>.json and rewrite its markdown twin."""
    path = Path(folder) / f"robustness_{name}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(figures)
    data["device"] = device_description()
    data["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    lines = [f"# robustness: {name}", "", "| key | value |", "|---|---|"]
    lines += [f"| {key} | {json.dumps(value) if isinstance(value, (dict, list)) else value} |"
              for key, value in sorted(data.items())]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def listening_addresses(ports) -> dict[int, set[str]]:
    """port -> local addresses with a listening TCP socket on it."""
    found: dict[int, set[str]] = {port: set() for port in ports}
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status != psutil.CONN_LISTEN or connection.laddr.port not in found:
            continue
        ip = ipaddress.ip_address(connection.laddr.ip.split("%")[0])
        if ip.version == 6:
            ip = ip.ipv4_mapped or ip  # gRPC listens on ::ffff:127.0.0.1 for 127.0.0.1
        found[connection.laddr.port].add(str(ip))
    return found


def burst_window(index: int, images_per_request: int, count: int) -> list[int]:
    """Which of `count` images request `index` of a burst carries (consecutive, wrapping around)."""
    return [(index + i) % count for i in range(images_per_request)]


def grpc_burst_in_process(grpc_url: str, model: str, images: np.ndarray, first_index: int, count: int,
                          queue_timeout_us: int, stop_after_refusals: int, channels: int = 1,
                          images_per_request: int = 1) -> dict:
    """One sender of a burst (alone, or one of a spawned process pool, so its gRPC channels are its
    own): `count` requests of `images_per_request` images (`burst_window`) fired asynchronously over
    `channels` channels, every 4th with a queue timeout of `queue_timeout_us`, stopping early after
    `stop_after_refusals` queue-full refusals. Returns {index: [(seconds to answer, logits or error
    text)]} for every request sent."""
    triton = [grpcclient.InferenceServerClient(grpc_url) for _ in range(channels)]
    try:
        tensors = []
        for i in range(len(images)):
            window = images[burst_window(i, images_per_request, len(images))]
            tensor = grpcclient.InferInput(INPUT_UINT8, list(window.shape), "UINT8")
            tensor.set_data_from_numpy(window)
            tensors.append(tensor)
        return fire_burst(triton, model, tensors, first_index, count, queue_timeout_us, stop_after_refusals)
    finally:
        for channel in triton:
            channel.close()


def grpc_shm_burst_in_process(grpc_url: str, admin_token: str, model: str, images: np.ndarray, first_index: int,
                              count: int, queue_timeout_us: int, stop_after_refusals: int, images_per_request: int,
                              region_images: int) -> tuple[dict, str]:
    """One sender of a burst whose inputs are in SYSTEM SHARED MEMORY, so a request costs the sender
    almost nothing (no pixels serialised) while the server does the full work of `images_per_request`
    images: one region of `region_images` images (the burst images repeated: slot k holds image
    k % len(images)) is registered with the admin token; request `index` reads `images_per_request`
    consecutive slots from slot index % len(images), i.e. exactly `burst_window(index % len(images),
    images_per_request, len(images))`. LOGITS come back in the gRPC response. Otherwise as
    `grpc_burst_in_process` (one channel). The region is unregistered and unlinked on the way out,
    also when sending failed. Returns (answers as `grpc_burst_in_process`, the region's name)."""
    from fusedresnet.client.shared_memory import registered_region

    count_images = len(images)
    if count_images - 1 + images_per_request > region_images:
        raise ValueError(f"{images_per_request} images from any of {count_images} slots need a region of "
                         f"{count_images - 1 + images_per_request} images, not {region_images}")
    image_bytes = images[0].nbytes
    triton = grpcclient.InferenceServerClient(grpc_url)
    try:
        with registered_region(triton, "grpc", "system", region_images * image_bytes, admin_token,
                               label="burst") as region:
            region.write(images[burst_window(0, region_images, count_images)])
            tensors = []
            for i in range(count_images):
                tensor = grpcclient.InferInput(INPUT_UINT8, [images_per_request, *images.shape[1:]], "UINT8")
                tensor.set_shared_memory(region.name, images_per_request * image_bytes, offset=i * image_bytes)
                tensors.append(tensor)
            answers = fire_burst([triton], model, tensors, first_index, count, queue_timeout_us,
                                 stop_after_refusals)
        return answers, region.name
    finally:
        triton.close()


def fire_burst(triton: list, model: str, tensors: list, first_index: int, count: int, queue_timeout_us: int,
               stop_after_refusals: int) -> dict:
    """Request `first_index + i` carries tensors[(first_index + i) % len(tensors)] and goes out on
    channel i % len(triton); every 4th asks for a queue timeout of `queue_timeout_us`; sending stops
    after `count` requests or `stop_after_refusals` queue-full refusals. Waits until every call sent has
    called back: {index: [(seconds to answer, logits or error text)]}. gRPC runs a call's done-callback
    once, so after as many callbacks as calls none is left to come: an index with two outcomes (a
    duplicate) then leaves another without one, and the caller sees both."""
    import threading as _threading

    answers: dict[int, list] = {}
    sent_at: dict[int, float] = {}
    lock = _threading.Lock()
    refusals, callbacks = [0], [0]

    def on_answer(index):
        def callback(result, error):
            outcome = str(error) if error is not None else result.as_numpy(OUTPUT_LOGITS)
            with lock:
                answers.setdefault(index, []).append((time.monotonic() - sent_at[index], outcome))
                refusals[0] += error is not None and "Exceeds maximum queue size" in str(error)
                callbacks[0] += 1
        return callback

    sent = 0
    while sent < count and refusals[0] < stop_after_refusals:
        index = first_index + sent
        sent_at[index] = time.monotonic()
        triton[sent % len(triton)].async_infer(model, [tensors[index % len(tensors)]], on_answer(index),
                                               client_timeout=CLIENT_TIMEOUT_S,
                                               timeout=queue_timeout_us if index % 4 == 3 else None)
        sent += 1
    wait_until(lambda: callbacks[0] >= sent, CLIENT_TIMEOUT_S + 10, 0.1)
    with lock:
        return {index: list(outcomes) for index, outcomes in answers.items()} | \
            {first_index + i: [] for i in range(sent) if first_index + i not in answers}


def text_handler(text_of) -> type[http.server.BaseHTTPRequestHandler]:
    """An HTTP handler that answers every GET with `text_of(its server's port)` (a stand-in metrics endpoint for
    http.server.ThreadingHTTPServer), logging nothing."""

    class TextHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text_of(self.server.server_address[1]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return TextHandler
