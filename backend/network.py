"""Loopback ports and Triton's readiness probe: what the launcher, the load tests and the tests share.

Standard library only, so a client-only install can use it.
"""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request

from .spec import DEFAULT_HOST


def free_ports(count: int, host: str = DEFAULT_HOST) -> list[int]:
    """`count` distinct ports that were free a moment ago (all held open together while chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_is_free(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether a server could listen on `port` now. SO_REUSEADDR, as Triton's frontends bind: the closed
    connections of a server just stopped (TIME_WAIT) don't make the port taken; a socket listening on it does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port_run(count: int, host: str = DEFAULT_HOST) -> int:
    """The first of `count` consecutive ports that were all free a moment ago (the launcher's metrics ports)."""
    while True:
        first = free_ports(1, host)[0]
        if first + count <= 65536 and all(port_is_free(first + i, host) for i in range(count)):
            return first


def server_ports(metrics_ports: int, host: str = DEFAULT_HOST) -> tuple[int, int, int]:
    """Free (HTTP, gRPC, first metrics) ports for a server of `metrics_ports` processes: the metrics ports a run
    of consecutive ones, none of them the HTTP or gRPC port."""
    http_port, grpc_port = free_ports(2, host)
    metrics_port = free_port_run(metrics_ports, host)
    while {http_port, grpc_port} & set(range(metrics_port, metrics_port + metrics_ports)):
        metrics_port = free_port_run(metrics_ports, host)
    return http_port, grpc_port, metrics_port


def http_ready(http_url: str) -> bool:
    """Whether the Triton server at host:port answers its readiness probe."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, http.client.HTTPException):   # HTTPException: a probe of a port
        # no one listens on yet can connect to itself (TCP self-connect in the ephemeral range) and read its request
        return False
