"""Same-host zero-copy requests: inputs and LOGITS in system or CUDA shared memory.

Instead of carrying tensors in the request and the response, the client puts the
input in a shared-memory region the server maps, and the server writes LOGITS
into another. tritonclient's utilities create and map the regions
(`tritonclient.utils.shared_memory` for POSIX shared memory,
`tritonclient.utils.cuda_shared_memory` for GPU memory shared through a CUDA IPC
handle; the latter needs cuda-python and a GPU).

Registering a region with the server is one of Triton's restricted admin APIs
here: it takes the admin token (spec.ADMIN_TOKEN_HEADER over HTTP,
spec.GRPC_ADMIN_TOKEN_HEADER over gRPC). `registered_region` is a context manager
that creates, registers and, on exit (also when the body raised), unregisters and
destroys one region, so nothing outlives the client in /dev/shm, in GPU memory or
in the server's table. Region names carry the process id and a random suffix, so
processes and clients never collide.

    with registered_region(triton, "grpc", "system", 4 * 150528, admin_token) as region:
        region.write(images)
        tensor.set_shared_memory(region.name, images.nbytes)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

# read_admin_token: the one resolver of the launcher and the clients, imported from here by the clients
from fusedresnet.backend.admin_token import DEFAULT_TOKEN_FILE, read_admin_token  # noqa: F401
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV, ADMIN_TOKEN_HEADER, GRPC_ADMIN_TOKEN_HEADER

SHARED_MEMORY_KINDS = ("none", "system", "cuda")
UNREGISTER_WAIT_S = 5.0


class SharedMemoryError(InferenceServerException):
    """A shared-memory region could not be set up; the message says why and what to do."""


def admin_headers(protocol: str, admin_token: str | None) -> dict | None:
    """Headers (HTTP) or metadata (gRPC) that unlock the admin APIs; None without a token."""
    if not admin_token:
        return None
    return {GRPC_ADMIN_TOKEN_HEADER if protocol == "grpc" else ADMIN_TOKEN_HEADER: admin_token}


def unique_region_name(label: str) -> str:
    return f"fusedresnet-{os.getpid()}-{secrets.token_hex(4)}-{label}"


def _cuda_shared_memory():
    """tritonclient's CUDA utilities, imported only when asked for (they need cuda-python)."""
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except RuntimeError as error:   # tritonclient raises RuntimeError when cuda-python is missing
        raise SharedMemoryError(f"CUDA shared memory is unavailable: {error}") from error
    return cudashm


@dataclass
class Region:
    """One shared-memory region, created here and registered with the server under `name`."""
    kind: str             # "system" or "cuda"
    name: str
    byte_size: int
    handle: Any           # tritonclient's SharedMemoryRegion or CudaSharedMemoryRegion

    def write(self, array: np.ndarray, offset: int = 0):
        array = np.ascontiguousarray(array)
        if offset + array.nbytes > self.byte_size:
            raise SharedMemoryError(f"{array.nbytes} bytes at offset {offset} do not fit region {self.name!r} "
                                    f"of {self.byte_size} bytes")
        if self.kind == "system":
            import tritonclient.utils.shared_memory as shm
            shm.set_shared_memory_region(self.handle, [array], offset=offset)
        elif offset:
            raise ValueError("tritonclient writes CUDA shared memory from offset 0 only")
        else:
            _cuda_shared_memory().set_shared_memory_region(self.handle, [array])

    def read(self, dtype, shape, offset: int = 0) -> np.ndarray:
        """A copy of the region's contents (a view would keep the mapping alive past the region)."""
        if self.kind == "system":
            import tritonclient.utils.shared_memory as shm
            return shm.get_contents_as_numpy(self.handle, dtype, shape, offset=offset).copy()
        if offset:
            raise ValueError("tritonclient reads CUDA shared memory from offset 0 only")
        return _cuda_shared_memory().get_contents_as_numpy(self.handle, dtype, shape)


def _create(kind: str, name: str, byte_size: int, device_id: int):
    if kind == "system":
        import tritonclient.utils.shared_memory as shm
        return shm.create_shared_memory_region(name, "/" + name, byte_size, create_only=True)
    return _cuda_shared_memory().create_shared_memory_region(name, byte_size, device_id)


def _destroy(region: Region):
    if region.kind == "system":
        import tritonclient.utils.shared_memory as shm
        shm.destroy_shared_memory_region(region.handle)
    else:
        _cuda_shared_memory().destroy_shared_memory_region(region.handle)


def _register(triton, region: Region, device_id: int, headers: dict | None):
    if region.kind == "system":
        triton.register_system_shared_memory(region.name, "/" + region.name, region.byte_size, headers=headers)
    else:
        raw_handle = _cuda_shared_memory().get_raw_handle(region.handle)
        triton.register_cuda_shared_memory(region.name, raw_handle, device_id, region.byte_size, headers=headers)


def _unregister(triton, region: Region, headers: dict | None):
    """Unregister `region`, waiting (up to UNREGISTER_WAIT_S) while the server still holds it: Triton releases
    a request's regions just after the client has its answer, and refuses until then ("currently in use")."""
    unregister = (triton.unregister_system_shared_memory if region.kind == "system"
                  else triton.unregister_cuda_shared_memory)
    deadline = time.monotonic() + UNREGISTER_WAIT_S
    while True:
        try:
            unregister(region.name, headers=headers)
            return
        except InferenceServerException as error:
            if "in use" not in (error.message() or "") or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


@contextlib.contextmanager
def registered_region(triton, protocol: str, kind: str, byte_size: int, admin_token: str | None,
                      label: str = "region", device_id: int = 0) -> Iterator[Region]:
    """Create a `kind` ("system" | "cuda") region of `byte_size` bytes and register it with the server
    through `triton` (a synchronous tritonclient gRPC or HTTP client); unregister and destroy it on exit."""
    if kind not in SHARED_MEMORY_KINDS[1:]:
        raise ValueError(f"shared memory must be one of {SHARED_MEMORY_KINDS[1:]}, not {kind!r}")
    region = Region(kind, unique_region_name(label), int(byte_size), None)
    try:
        region.handle = _create(kind, region.name, region.byte_size, device_id)
    except SharedMemoryError:
        raise
    except Exception as error:   # tritonclient's SharedMemoryException / CudaSharedMemoryException, and their causes
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise SharedMemoryError(f"cannot create {kind} shared-memory region {region.name!r} of {region.byte_size} "
                                f"bytes: {error}{cause}") from error
    headers = admin_headers(protocol, admin_token)
    try:
        try:
            _register(triton, region, device_id, headers)
        except InferenceServerException as error:
            hint = ("" if admin_token else
                    f" Registering shared memory is a restricted admin API: give the admin token "
                    f"(${ADMIN_TOKEN_ENV}, --admin-token-file, or {DEFAULT_TOKEN_FILE}).")
            raise SharedMemoryError(f"the server refused to register {kind} shared-memory region "
                                    f"{region.name!r} ({region.byte_size} bytes): {error.message()}.{hint}",
                                    error.status()) from error
        try:
            yield region
        finally:
            try:
                _unregister(triton, region, headers)
            except InferenceServerException as error:   # a server that is gone has nothing left to unregister
                warnings.warn(f"could not unregister shared-memory region {region.name!r}: {error.message()}",
                              stacklevel=2)
    finally:
        _destroy(region)


@dataclass
class RequestRegions:
    """The two regions of one client: its requests' input and their LOGITS output."""
    input: Region
    logits: Region


@contextlib.contextmanager
def request_regions(triton, protocol: str, kind: str, input_bytes: int, logits_bytes: int,
                    admin_token: str | None, device_id: int = 0) -> Iterator[RequestRegions]:
    """Input and LOGITS regions sized for a batch (e.g. N images x per-image bytes, N x 1000 x 4)."""
    with contextlib.ExitStack() as stack:
        regions = [stack.enter_context(registered_region(triton, protocol, kind, size, admin_token, label,
                                                         device_id))
                   for label, size in (("input", input_bytes), ("logits", logits_bytes))]
        yield RequestRegions(*regions)


def shared_memory_status(triton, protocol: str, kind: str, admin_token: str | None) -> dict:
    """{region name: registered byte size} as the server reports it (an admin API)."""
    headers = admin_headers(protocol, admin_token)
    if kind == "system":
        status = triton.get_system_shared_memory_status(headers=headers)
    else:
        status = triton.get_cuda_shared_memory_status(headers=headers)
    if protocol == "grpc":
        return {name: int(region.byte_size) for name, region in status.regions.items()}
    return {region["name"]: int(region["byte_size"]) for region in status}


@contextlib.contextmanager
def registered_on_every_process(url: str, kind: str, byte_size: int, admin_token: str | None, processes: int,
                                label: str = "region", device_id: int = 0, attempts_per_process: int = 50
                                ) -> Iterator[Region]:
    """One region registered with each of the `processes` tritonservers behind one gRPC port (the launcher's
    --processes-per-gpu): a region is known only to the process that registered it, and the kernel hands
    each connection to any of them. Registers over fresh connections until `processes` registrations have
    succeeded (a process that already holds the region refuses a second one), then, on exit, unregisters
    over fresh connections and destroys the region. For one process, registered_region on one connection."""
    import tritonclient.grpc as grpcclient

    def connection():
        return grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])

    if processes <= 1:
        with connection() as triton, registered_region(triton, "grpc", kind, byte_size, admin_token, label,
                                                       device_id) as region:
            yield region
        return
    region = Region(kind, unique_region_name(label), int(byte_size), None)
    region.handle = _create(kind, region.name, region.byte_size, device_id)
    headers = admin_headers("grpc", admin_token)

    def on_every_process(action, done_already: str):
        """`action` over fresh connections until `processes` of them succeeded (`done_already`: a refusal of
        a process that has it done)."""
        succeeded = 0
        for _ in range(attempts_per_process * processes):
            with connection() as triton:
                try:
                    action(triton)
                    succeeded += 1
                except InferenceServerException as error:
                    if done_already not in (error.message() or ""):
                        raise
            if succeeded == processes:
                return
        raise SharedMemoryError(f"region {region.name!r}: {succeeded} of {processes} server processes reached "
                                f"in {attempts_per_process * processes} connections")

    try:
        on_every_process(lambda triton: _register(triton, region, device_id, headers), "already in manager")
        try:
            yield region
        finally:
            # Triton unregisters a name it does not hold without complaint: as many connections as make
            # missing a process unlikely (8 per process: each missed with chance ((N-1)/N)^(8N) < 1e-3)
            for _ in range(8 * processes):
                with connection() as triton, contextlib.suppress(InferenceServerException):
                    _unregister(triton, region, headers)
    finally:
        _destroy(region)
