"""The launcher's processes together (ServerGroup): planned per GPU on shared ports, started together, each
supervised on its own, stopped together; the front end and CUDA MPS they share."""


from __future__ import annotations

import contextlib
import queue
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..admin_token import read_or_create_token
from ..cuda_mps import MpsError, private_mps
from ..network import port_is_free
from ..server_error import ServerError
from ..triton_server.front_end import FrontEndChoice
from ..triton_server.installation import (
    find_triton,
    host_gpus,
)
from .process import TritonServer
from .settings import (
    DEFAULT_READY_TIMEOUT_S,
    EXIT_SERVER_DIED,
)


@dataclass
class ServerGroup:
    """The launcher's tritonserver processes: `processes_per_gpu` on each GPU (that many on a host without
    one), all on the same gRPC and HTTP ports when there are several, each with its own metrics port
    (metrics_port + its index). Started together, supervised one by one, stopped together, with what they use
    (`resources`: the CUDA MPS daemon of use_mps), closed on stop."""

    servers: list[TritonServer]
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @classmethod
    def plan(cls, processes_per_gpu: int, gpus: str | None, use_gpu: bool, metrics_port: int,
             log_file: Path | None = None, **server) -> ServerGroup:
        """The processes for these GPUs ("0,1"; None: every GPU of the host) and server settings."""
        if processes_per_gpu < 1:
            raise ServerError(f"--processes-per-gpu must be at least 1, not {processes_per_gpu}")
        devices = (gpus.split(",") if gpus else [str(i) for i in range(len(host_gpus()))]) if use_gpu else [None]
        layout = [(device, k) for device in devices for k in range(processes_per_gpu)]
        shares_ports = len(layout) > 1
        servers = []
        for index, (device, k) in enumerate(layout):
            label = "" if not shares_ports else f"gpu{device}.p{k}" if device is not None else f"p{k}"
            servers.append(TritonServer(**server, metrics_port=metrics_port + index, log_file=log_file,
                                        use_gpu=use_gpu, gpus=device if gpus or shares_ports else None,
                                        shares_ports=shares_ports, label=label, truncate_log=not shares_ports))
        return cls(servers)

    first = property(lambda self: self.servers[0])
    http_url = property(lambda self: self.first.http_url)
    grpc_url = property(lambda self: self.first.grpc_url)
    # every process's metrics, comma-separated (loadtest/triton_metrics.scrape sums them)
    metrics_url = property(lambda self: ",".join(server.metrics_url for server in self.servers))

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> ServerGroup:
        first = self.first
        if len(self.servers) > 1:
            # SO_REUSEPORT would let these processes join another server already on the ports: refuse that.
            taken = [port for port in (first.http_port, first.grpc_port) if not port_is_free(port, first.host)]
            taken += [s.metrics_port for s in self.servers if not port_is_free(s.metrics_port, s.host)]
            if taken:
                raise ServerError(f"port(s) {', '.join(map(str, taken))} on {first.host} already in use")
            if first.log_file:
                Path(first.log_file).parent.mkdir(parents=True, exist_ok=True)
                Path(first.log_file).write_bytes(b"")
        if first.admin_token is None:
            token = read_or_create_token()
            for server in self.servers:
                server.admin_token = token
        failures: list[BaseException] = []

        def start_one(server: TritonServer):
            try:
                server.start(ready_timeout_s)
            except BaseException as error:   # noqa: BLE001 - reported below, with the others stopped
                failures.append(error)

        threads = [threading.Thread(target=start_one, args=(server,)) for server in self.servers]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:             # Ctrl-C while the processes start: none may outlive the launcher
            while any(thread.is_alive() for thread in threads):
                for server in self.servers:
                    server.stopping.set()   # again each time: a start that had not begun clears it
                for thread in threads:
                    thread.join(timeout=0.1)
            self.stop()
            raise
        if failures:
            self.stop()
            raise failures[0]
        return self

    def supervise(self, restart: bool = True, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> int:
        """Supervise every process (TritonServer.supervise, each in a thread of its own: a restart of one
        leaves the others serving). Returns the first status a process's supervision gives up with
        (with restart=False: its first failure), once every process is stopped."""
        statuses: queue.Queue = queue.Queue()

        def watch(server: TritonServer):
            try:
                statuses.put(server.supervise(restart=restart, ready_timeout_s=ready_timeout_s))
            except ServerError as error:        # a restart that did not become ready (or was stopped)
                if not server.stopping.is_set():
                    print(f"fusedresnet: {error}", file=sys.stderr, flush=True)
                statuses.put(EXIT_SERVER_DIED)

        for server in self.servers:
            threading.Thread(target=watch, args=(server,), daemon=True, name=f"supervise-{server.label}").start()
        while True:
            try:
                status = statuses.get(timeout=0.5)   # a timeout, so that Ctrl-C reaches this thread
                break
            except queue.Empty:
                continue
        self.stop()
        return status

    def stop(self):
        threads = [threading.Thread(target=server.stop) for server in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.resources.close()

    def choose_front_end(self, requested: str, client_shared_memory: bool = False) -> FrontEndChoice:
        """Serve through the front end that --front-end `requested` gives here (backend/triton_server/front_end.py),
        said in one line; a ServerError where `inprocess` was asked for and cannot serve."""
        self.first.front_end, self.first.client_shared_memory = requested, client_shared_memory
        choice = self.first.resolve_front_end(find_triton())
        for server in self.servers:
            server.front_end, server.front_end_choice = requested, choice
            server.client_shared_memory = client_shared_memory
        print(choice.line(), file=sys.stderr, flush=True)
        return choice

    def use_mps(self, choice: str, folder: Path, resources: contextlib.ExitStack | None = None):
        """Put the processes under a private CUDA MPS daemon (its pipes under `folder`, stopped when `resources`
        closes: by default the group's own, on stop) as --mps `choice` says: on (ServerError where it cannot run),
        auto (on a GPU host, where the daemon starts; else a line says why not), off."""
        use_gpu = self.first.use_gpu
        if choice == "off" or (choice == "auto" and not use_gpu):
            return
        if not use_gpu:
            raise ServerError("--mps: no GPU on this host (CUDA MPS shares a GPU among processes)")
        try:
            environment = (self.resources if resources is None else resources).enter_context(private_mps(folder))
        except MpsError as error:
            if choice == "on":
                raise ServerError(f"--mps: {error}") from error
            print(f"fusedresnet: CUDA MPS off (--mps auto): {error}", file=sys.stderr, flush=True)
            return
        for server in self.servers:
            server.mps_environment = environment

    def __enter__(self):
        return self.start() if self.first.process is None else self   # launch() gives it started

    def __exit__(self, *exc):
        self.stop()

