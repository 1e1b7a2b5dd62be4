"""Is a Triton process alive and ready: how it ended, whether its gRPC endpoint answers, whether its own metrics
port lists its models loaded (the readiness of one process among several on shared ports)."""


from __future__ import annotations

import http.client
import re
import signal
import urllib.error
import urllib.request

from .settings import (
    PROBE_TIMEOUT_S,
)


def exit_cause(returncode: int) -> str:
    """How a process ended, in words: 'killed by SIGABRT (signal 6)' or 'exit status 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-returncode})"
    return f"exit status {returncode}"


def grpc_ready(grpc_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether Triton's gRPC endpoint answers ServerReady, over a connection of its own (a connection
    shared with earlier probes could hide a listener that accepts but no longer serves)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(grpc_url, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s).ready
        except grpc.RpcError:
            return False


def metrics_list_models(metrics_url: str, models: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the Triton process behind `metrics_url` answers and has loaded every one of `models`.

    Triton starts its metrics service after its gRPC and HTTP endpoints, and lists a model's counters
    once the model is loaded: the readiness of one process, read through a port that is its own."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, http.client.HTTPException):   # HTTPException: a probe of a port
        # no one listens on yet can connect to itself (TCP self-connect in the ephemeral range) and read its request
        return False
    loaded = set(re.findall(r'^nv_inference_count\{[^}]*model="([^"]+)"', text, re.MULTILINE))
    return set(models) <= loaded

