"""The Python backend's shared memory, page-locked for the GPU, so a request's input goes to the GPU straight
from where Triton put it (issue 46, results/serving_cost.md).

Triton's Python backend copies each CPU input into its shared-memory pool (/dev/shm/<prefix>...), and the stub
reads it there. Copied to the GPU from pageable memory, an input costs the stub a CPU copy first: into the
model's pinned staging buffer (or the driver's own, which is the same work). Registered once with
cudaHostRegister, the pool's pages are page-locked, so each request's input is one asynchronous DMA from the
pool into the engine's input buffer and the stub's CPU copies nothing.

Safe because the backend never unmaps a mapping of its pool while the stub lives: when the pool grows it maps
the larger region anew and keeps the old mappings (python_backend src/shm_manager.cc, GrowIfNeeded:
`old_shm_maps_`), and growing a file does not move its pages. So each mapping is registered once, the first time
an input is seen in it, and stays registered until the stub exits. Only mappings of files under /dev/shm are
registered (the pool); memory anywhere else is staged as before. Where registration fails (a driver that
refuses, or FUSEDRESNET_HOST_INPUT=staging, the measured 'before'), every input is staged as before.
"""

from __future__ import annotations

import bisect
import ctypes
import os

import torch

HOST_INPUT_ENV = "FUSEDRESNET_HOST_INPUT"      # registered (default) | staging: how host inputs reach the GPU
HOST_INPUT_CHOICES = ("registered", "staging")
SHARED_MEMORY_DIR = "/dev/shm/"


def host_input_choice() -> str:
    choice = os.environ.get(HOST_INPUT_ENV, "") or HOST_INPUT_CHOICES[0]
    if choice not in HOST_INPUT_CHOICES:
        raise ValueError(f"{HOST_INPUT_ENV}={choice!r}: one of {', '.join(HOST_INPUT_CHOICES)}")
    return choice


def mapping_of(address: int, maps_text: str | None = None) -> tuple[int, int, str] | None:
    """(start, end, path) of this process's mapping that holds `address` (/proc/self/maps), None if none."""
    if maps_text is None:
        with open("/proc/self/maps") as maps:
            maps_text = maps.read()
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < end:
            return start, end, fields[5].strip() if len(fields) > 5 else ""
    return None


class PinnedSharedMemory:
    """The shared-memory mappings of this process registered with CUDA (page-locked), found by address."""

    def __init__(self, device: torch.device, register=None):
        self.device = device
        self.starts: list[int] = []        # sorted; ends[i] belongs to starts[i]
        self.ends: list[int] = []
        self.refused: set[tuple[int, int]] = set()   # mappings not to try again
        self.failure = ""                  # the first registration failure, in words
        self._register = register or cuda_host_register

    def covers(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor's bytes lie in a registered mapping."""
        start = tensor.data_ptr()
        index = bisect.bisect_right(self.starts, start) - 1
        return index >= 0 and start + tensor.nbytes <= self.ends[index]

    def pin(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor's bytes are page-locked: registers the /dev/shm mapping that holds them on first sight."""
        if self.covers(tensor):
            return True
        if not tensor.is_contiguous() or tensor.nbytes == 0:
            return False
        mapping = mapping_of(tensor.data_ptr())
        if mapping is None:
            return False
        start, end, path = mapping
        if not path.startswith(SHARED_MEMORY_DIR) or (start, end) in self.refused \
                or tensor.data_ptr() + tensor.nbytes > end:
            return False
        error = self._register(self.device, start, end - start)
        if error:
            self.refused.add((start, end))
            self.failure = self.failure or f"cudaHostRegister of {path} ({end - start} bytes): {error}"
            return False
        index = bisect.bisect_right(self.starts, start)
        self.starts.insert(index, start)
        self.ends.insert(index, end)
        return True


CU_MEMHOSTREGISTER_PORTABLE = 0x01   # page-locked for every CUDA context, not only the current one


def cuda_host_register(device: torch.device, address: int, size: int) -> str:
    """Page-lock [address, address + size) for the CUDA driver; '' when done, else the error in words.

    Through the driver API (cuMemHostRegister, as the runtime's cudaHostRegister does underneath): a refusal
    then leaves no error behind in the runtime for torch's next kernel-launch check to find."""
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
        _driver.cuMemHostRegister_v2.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
    torch.cuda.set_device(device)      # its primary context, the runtime's, current in this thread
    status = _driver.cuMemHostRegister_v2(address, size, CU_MEMHOSTREGISTER_PORTABLE)
    return f"CUDA driver error {status}" if status else ""


_driver: ctypes.CDLL | None = None
