"""Loopback ports and Triton's readiness probe: what the launcher, the load tests and the tests share.

Standard library only, so a client-only install can use it.
"""

from __future__ import annotations

import http.client
import random
import socket
import urllib.error
import urllib.request
from pathlib import Path

from .spec import DEFAULT_HOST

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_CHOSEN_PORT = 10000


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (and to bind(port 0)): Linux's ip_local_port_range."""
    try:
        low, high = map(int, Path(EPHEMERAL_RANGE_FILE).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _unused(port: int, host: str) -> bool:
    """Nothing at all on `port` (no listener, no connection, not even TIME_WAIT): a port safe to hand out."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _random_ports(run: int = 1):
    """First ports of `run` consecutive ones, at random, all outside the kernel's ephemeral range: a port chosen
    there could be taken by any outgoing connection (a client, a probe) between being chosen and a server
    listening on it, as happened to a launcher's second metrics port in CI."""
    low, high = ephemeral_port_range()
    ranges = [(LOWEST_CHOSEN_PORT, low - run), (high + 1, 65536 - run)]
    ranges = [(first, last) for first, last in ranges if last > first]
    while True:
        first, last = random.choice(ranges)
        yield random.randrange(first, last)


def free_ports(count: int, host: str = DEFAULT_HOST) -> list[int]:
    """`count` distinct ports that nothing used a moment ago, outside the ephemeral range (_random_ports)."""
    chosen: list[int] = []
    for port in _random_ports():
        if port not in chosen and _unused(port, host):
            chosen.append(port)
            if len(chosen) == count:
                return chosen


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
    """The first of `count` consecutive ports that nothing used a moment ago (the launcher's metrics ports),
    outside the ephemeral range."""
    for first in _random_ports(count):
        if all(_unused(first + i, host) for i in range(count)):
            return first
    raise AssertionError("unreachable")


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
