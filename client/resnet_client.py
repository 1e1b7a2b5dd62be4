"""A thin client for both ResNet-18 models over gRPC or HTTP (tritonclient).

    client = ResNetClient("resnet18_custom", protocol="grpc", url="127.0.0.1:8001")
    result = client.infer(images_uint8)              # logits, engine name, latency
    top = client.classify(images_uint8, top_k=5)     # Triton's classification extension

`images` is either uint8 [N, 224, 224, 3] (sent as IMAGE, normalised on the
server) or float32 [N, 3, 224, 224] (sent as IMAGE_NORMALIZED). The client names
the network; each request goes to the model entry serving its input
(`served_model`: resnet18_custom for IMAGE, resnet18_custom_normalized for IMAGE_NORMALIZED).

On the server's host, `shared_memory="system"` (or `"cuda"`, with cuda-python and
a GPU) passes the input, and for `infer` the LOGITS, through shared-memory regions
instead of the request and response (client/shared_memory.py). Registering them
takes the admin token (`admin_token`, default $FUSEDRESNET_ADMIN_TOKEN or
build/admin-token). The regions grow to the largest batch sent and are unregistered
and freed by `close()` (use the client in a `with` block). `classify` keeps its
top-k answer in the response: Triton's classification output cannot go to shared memory.

`build_request` is the one place requests are built, for this client and for the
load generators (loadtest/locustfile.py, loadtest/grpc_flood.py).

Several servers: a gRPC `url` may name more than one (`grpc_channel`): "10.0.0.1:8001,10.0.0.2:8001",
"dns:///fusedresnet-headless:8001" (every address the name resolves to) or gRPC's own "ipv4:..." form.
gRPC's round_robin policy then sends each request to the next ready server, and a call a server could
not take (UNAVAILABLE: stopped, restarting, unreachable) is retried on another by the channel's retry
policy (also through a balancer: one address). `grpc_channel` is the one place this is set, for this
client and the load generators.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from fusedresnet.backend.spec import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    INPUT_FP32,
    INPUT_UINT8,
    NUM_CLASSES,
    OUTPUT_ENGINE,
    OUTPUT_LOGITS,
    network_of,
    served_model,
)
from fusedresnet.client.shared_memory import SHARED_MEMORY_KINDS, RequestRegions, read_admin_token, request_regions

PROTOCOLS = ("grpc", "http")
DEFAULT_URLS = {"grpc": f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}", "http": f"{DEFAULT_HOST}:{DEFAULT_HTTP_PORT}"}


GRPC_SERVICE = "inference.GRPCInferenceService"    # Triton's gRPC service (grpc_service.proto)
GRPC_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:")
GRPC_RETRY_ATTEMPTS = 5            # the first try and up to 4 retries, each on the next server of the round
GRPC_RETRY_BUFFER_BYTES = 64 << 20  # a call is retried only while its request fits gRPC's retry buffer (256 KiB
                                    # by default: less than two 224x224 images), so the buffer holds a full batch
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # what tritonclient sets on its own channels
# First and longest wait before a retry (doubling; gRPC draws each wait at random below it): the retries span
# about 1.5 s at most, time for a broken connection to be made again to a live process (GRPC_RECONNECT_MS).
RETRY_BACKOFF_S = (0.1, 1.0)
GRPC_RECONNECT_MS = 100             # first wait before a broken connection is made again (gRPC's default: 1 s)


def grpc_service_config() -> str:
    """gRPC service config: round robin over the target's addresses, and UNAVAILABLE calls retried.

    Inference is idempotent, so a request the stopped server never answered may be sent again. A retry
    waits initialBackoff (x backoffMultiplier per attempt, randomised by gRPC) and goes to the next ready
    address, so a stopped server costs a retried call a few milliseconds, not an error."""
    return json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{
            "name": [{"service": GRPC_SERVICE}],
            "retryPolicy": {"maxAttempts": GRPC_RETRY_ATTEMPTS, "initialBackoff": f"{RETRY_BACKOFF_S[0]}s",
                            "maxBackoff": f"{RETRY_BACKOFF_S[1]}s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
        }],
    })


def _address_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def grpc_target(url: str) -> str:
    """The gRPC target of `url`: gRPC's own forms as they are; "host:port,host:port" as "ipv4:"/"ipv6:" lists
    (names in such a list are resolved once, here: a name with several addresses belongs in "dns:///")."""
    if url.startswith(GRPC_TARGET_SCHEMES) or "," not in url:
        return url
    addresses = []
    for endpoint in (e.strip() for e in url.split(",")):
        host, sep, port = endpoint.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"gRPC endpoint {endpoint!r} of {url!r} is not host:port")
        literal = _address_literal(host)
        if literal is None:
            found = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
            literal = ipaddress.ip_address(found[0][4][0])
        addresses.append(f"[{literal}]:{port}" if literal.version == 6 else f"{literal}:{port}")
    versions = {"[" if a.startswith("[") else "4" for a in addresses}
    if len(versions) > 1:
        raise ValueError(f"{url!r} mixes IPv4 and IPv6 endpoints: gRPC takes one family per target")
    return ("ipv6:" if versions == {"["} else "ipv4:") + ",".join(addresses)


def grpc_balanced(url: str) -> bool:
    """Whether `url` names several servers (or a DNS name that may resolve to several)."""
    return url.startswith(GRPC_TARGET_SCHEMES) or "," in url


def grpc_channel(url: str) -> tuple[str, list[tuple]]:
    """(target, channel_args) for tritonclient's gRPC InferenceServerClient: round robin over the target's
    addresses, and UNAVAILABLE calls retried (grpc_service_config). Also for one address: behind a balancer
    (nginx cannot resend a gRPC request whose server died while answering it, and answers 502, UNAVAILABLE)
    the retry goes to the balancer again, which passes it to a live server."""
    return grpc_target(url), [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.lb_policy_name", "round_robin"),
        ("grpc.service_config", grpc_service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.per_rpc_retry_buffer_size", GRPC_RETRY_BUFFER_BYTES),
        ("grpc.retry_buffer_size", 4 * GRPC_RETRY_BUFFER_BYTES),
        # Connections of its own: gRPC would otherwise share one connection among every channel of the
        # process to the same address, and with several server processes behind one port (the launcher's
        # --processes-per-gpu) the kernel picks a process per connection, so clients spread by theirs.
        ("grpc.use_local_subchannel_pool", 1),
        # A connection that broke (its server process died) is made again within GRPC_RECONNECT_MS, not gRPC's
        # default 1 s or more: until then the channel fails calls at once, and the retries above (about 0.75 s
        # in all) would be spent before a new connection could reach a live process behind the port.
        ("grpc.initial_reconnect_backoff_ms", GRPC_RECONNECT_MS),
        ("grpc.min_reconnect_backoff_ms", GRPC_RECONNECT_MS),
        ("grpc.max_reconnect_backoff_ms", 10 * GRPC_RECONNECT_MS),
    ]


def check_endpoints(protocol: str, url: str, shared_memory: str = "none"):
    """Several servers in one `url` only over gRPC, and without shared memory (a region is registered with
    one server, so each client of shared memory talks to its own local server)."""
    if grpc_balanced(url) and protocol != "grpc":
        raise ValueError(f"{url!r} names several servers: only gRPC spreads requests over them "
                         "(for HTTP, put a balancer such as nginx in front)")
    if grpc_balanced(url) and shared_memory != "none":
        raise ValueError(f"{url!r} names several servers: shared memory needs one server (its own host's)")


def grpc_client(url: str, client_class=grpcclient.InferenceServerClient):
    """A tritonclient gRPC client (or `client_class`, e.g. tritonclient.grpc.aio's) for one server or several."""
    target, channel_args = grpc_channel(url)
    return client_class(target, channel_args=channel_args)


@dataclass
class InferResult:
    logits: np.ndarray | None         # float32 [N, 1000] (None when classifying)
    top: list[list[tuple[float, int, str]]] | None  # per image: (score, class index, label)
    engine: str                       # the engine that computed the answer (output ENGINE)
    latency_ms: float


def input_name_for(images: np.ndarray) -> str:
    if images.dtype == np.uint8:
        return INPUT_UINT8
    if images.dtype == np.float32:
        return INPUT_FP32
    raise TypeError(f"images must be uint8 [N,224,224,3] or float32 [N,3,224,224], not {images.dtype}")


def parse_classification(entries) -> list[tuple[float, int, str]]:
    """Triton's classification strings "score:index:label" -> tuples."""
    top = []
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        score, index, label = text.split(":", 2)
        top.append((float(score), int(index), label))
    return top


LOGITS_BYTES_PER_IMAGE = NUM_CLASSES * np.dtype(np.float32).itemsize


@dataclass(frozen=True)
class SharedMemorySlot:
    """Where one request's input is (already written) and where its LOGITS go, by registered region name."""
    input_region: str
    logits_region: str
    input_offset: int = 0
    logits_offset: int = 0


def build_request(protocol: str, images: np.ndarray, class_count: int = 0, engine: bool = True,
                  shared_memory: SharedMemorySlot | None = None) -> tuple[list, list]:
    """(inputs, requested outputs) of one request carrying `images` (uint8 NHWC or float32 NCHW).

    With `shared_memory`, the input is read by the server from the slot's input region (the caller
    wrote `images` there) and LOGITS is written into its logits region, unless `class_count` asks for
    Triton's top-k strings, which only travel in the response. ENGINE always comes in the response.
    """
    lib = grpcclient if protocol == "grpc" else httpclient
    name = input_name_for(images)
    tensor = lib.InferInput(name, list(images.shape), "UINT8" if name == INPUT_UINT8 else "FP32")
    if shared_memory is None:
        tensor.set_data_from_numpy(np.ascontiguousarray(images))
    else:
        tensor.set_shared_memory(shared_memory.input_region, images.nbytes, offset=shared_memory.input_offset)
    logits = lib.InferRequestedOutput(OUTPUT_LOGITS, class_count=class_count)
    if shared_memory is not None and not class_count:
        logits.set_shared_memory(shared_memory.logits_region, len(images) * LOGITS_BYTES_PER_IMAGE,
                                 offset=shared_memory.logits_offset)
    outputs = [logits] + ([lib.InferRequestedOutput(OUTPUT_ENGINE)] if engine else [])
    return [tensor], outputs


def output_shape(result, name: str) -> tuple[int, ...] | None:
    """The shape the response declares for output `name` (also when its data went to shared memory)."""
    output = result.get_output(name)
    if output is None:
        return None
    return tuple(int(d) for d in (output["shape"] if isinstance(output, dict) else output.shape))


def response_bytes(result) -> int:
    """Bytes of the response as received: gRPC, the serialised ModelInferResponse; HTTP, the JSON header
    (re-serialised compactly, as Triton writes it) plus the binary outputs it declares. Outputs written to
    shared memory are not received, so they do not count."""
    response = result.get_response()
    if isinstance(response, dict):
        header = len(json.dumps(response, separators=(",", ":")))
        return header + sum(int(output.get("parameters", {}).get("binary_data_size", 0))
                            for output in response.get("outputs", []))
    return response.ByteSize()


def check_logits_received(result, images_sent: int, in_shared_memory: bool):
    """Raise unless the response holds (or, with shared memory, declares) LOGITS [images_sent, 1000]."""
    expected = (images_sent, NUM_CLASSES)
    if in_shared_memory:
        shape = output_shape(result, OUTPUT_LOGITS)
    else:
        logits = result.as_numpy(OUTPUT_LOGITS)
        shape = None if logits is None else logits.shape
    if shape != expected:
        raise ValueError(f"expected logits {list(expected)}, got {None if shape is None else list(shape)}")


def backoff_waits(first_s: float = RETRY_BACKOFF_S[0], longest_s: float = RETRY_BACKOFF_S[1]) -> Iterator[float]:
    """The waits before each retry of one request: `first_s`, doubling, at most `longest_s`."""
    wait = first_s
    while True:
        yield wait
        wait = min(2 * wait, longest_s)


def http_infer_with_retries(client, model: str, inputs: list, outputs: list, headers: dict | None):
    """An HTTP inference resent, as the gRPC channels' retry policy does (grpc_service_config: up to
    GRPC_RETRY_ATTEMPTS tries, RETRY_BACKOFF_S), when its connection broke or was refused
    before an answer came: the server process behind it died or restarts, and a new connection reaches a
    live one (several processes share the port). Inference is idempotent. An answer, an error status
    included, is never resent."""
    from geventhttpclient.response import HTTPConnectionClosed  # tritonclient.http's transport

    waits = backoff_waits()
    for attempt in range(GRPC_RETRY_ATTEMPTS):
        try:
            return client.infer(model, inputs, outputs=outputs, headers=headers)
        except (ConnectionError, HTTPConnectionClosed):
            if attempt == GRPC_RETRY_ATTEMPTS - 1:
                raise
            time.sleep(next(waits))
    raise AssertionError("unreachable")


class ResNetClient:
    def __init__(self, model: str, protocol: str = "grpc", url: str | None = None, timeout_s: float = 60.0,
                 headers: dict | None = None, shared_memory: str = "none", admin_token: str | None = None,
                 admin_token_file: Path | str | None = None, cuda_device: int = 0):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
        if shared_memory not in SHARED_MEMORY_KINDS:
            raise ValueError(f"shared_memory must be one of {SHARED_MEMORY_KINDS}, not {shared_memory!r}")
        self.model, self.protocol = network_of(model), protocol
        self.url = url or DEFAULT_URLS[protocol]
        check_endpoints(protocol, self.url, shared_memory)
        self.timeout_s, self.headers = timeout_s, headers
        self.shared_memory, self.cuda_device = shared_memory, cuda_device
        self.admin_token = admin_token
        if shared_memory != "none" and admin_token is None:
            self.admin_token = read_admin_token(admin_token_file)
        self._regions: RequestRegions | None = None
        self._regions_exit = contextlib.ExitStack()
        if protocol == "grpc":
            self.client = grpc_client(self.url)
        else:
            self.client = httpclient.InferenceServerClient(self.url, network_timeout=timeout_s,
                                                           connection_timeout=timeout_s)

    def close(self):
        try:
            self._regions_exit.close()     # unregister and free this client's regions
        finally:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _regions_for(self, images: np.ndarray) -> RequestRegions:
        """This client's regions, replaced by larger ones when `images` do not fit."""
        input_bytes, logits_bytes = images.nbytes, len(images) * LOGITS_BYTES_PER_IMAGE
        regions = self._regions
        if regions is None or regions.input.byte_size < input_bytes or regions.logits.byte_size < logits_bytes:
            if regions is not None:
                input_bytes = max(input_bytes, regions.input.byte_size)
                logits_bytes = max(logits_bytes, regions.logits.byte_size)
            self._regions = None
            self._regions_exit.close()
            self._regions = self._regions_exit.enter_context(request_regions(
                self.client, self.protocol, self.shared_memory, input_bytes, logits_bytes, self.admin_token,
                self.cuda_device))
        return self._regions

    def _request(self, images: np.ndarray, class_count: int):
        slot = None
        if self.shared_memory != "none":
            regions = self._regions_for(images)
            regions.input.write(images)
            slot = SharedMemorySlot(regions.input.name, regions.logits.name)
        inputs, outputs = build_request(self.protocol, images, class_count, shared_memory=slot)
        kwargs = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        entry = served_model(self.model, inputs[0].name())
        started = time.perf_counter()
        if self.protocol == "grpc":     # the channel's retry policy resends a call a server could not take
            result = self.client.infer(entry, inputs, outputs=outputs, headers=self.headers, **kwargs)
        else:
            result = http_infer_with_retries(self.client, entry, inputs, outputs, self.headers)
        latency_ms = (time.perf_counter() - started) * 1e3
        return result, latency_ms

    @staticmethod
    def _engine(result) -> str:
        return result.as_numpy(OUTPUT_ENGINE)[0].tobytes().decode()

    def infer(self, images: np.ndarray) -> InferResult:
        result, latency_ms = self._request(images, class_count=0)
        if self.shared_memory == "none":
            logits = result.as_numpy(OUTPUT_LOGITS)
        else:
            check_logits_received(result, len(images), in_shared_memory=True)
            logits = self._regions.logits.read(np.float32, (len(images), NUM_CLASSES))
        return InferResult(logits, None, self._engine(result), latency_ms)

    def classify(self, images: np.ndarray, top_k: int = 5) -> InferResult:
        result, latency_ms = self._request(images, class_count=top_k)
        entries = result.as_numpy(OUTPUT_LOGITS).reshape(images.shape[0], top_k)
        return InferResult(None, [parse_classification(row) for row in entries], self._engine(result), latency_ms)
