"""The Python backend's shared memory page-locked for the GPU (backend/triton_adapter/pinned_shm.py): which mappings it
registers, once each, and what it leaves staged; on a GPU, the DMA from a registered /dev/shm mapping."""

from __future__ import annotations

import mmap
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch

from fusedresnet.backend.triton_adapter.pinned_shm import (
    HOST_INPUT_ENV,
    PinnedSharedMemory,
    host_input_choice,
    mapping_of,
)


@pytest.fixture
def shm_region():
    """A 4 MiB POSIX shared-memory region (/dev/shm), as the Python backend makes its pool, filled with bytes."""
    region = shared_memory.SharedMemory(create=True, size=4 << 20)
    region.buf[:] = np.random.default_rng(7).integers(0, 256, size=4 << 20, dtype=np.uint8).tobytes()
    yield region
    region.close()
    region.unlink()


def tensor_in(region, offset: int, length: int) -> torch.Tensor:
    return torch.frombuffer(region.buf, dtype=torch.uint8, count=length, offset=offset)


class Recorder:
    def __init__(self, error: str = ""):
        self.calls: list[tuple[int, int]] = []
        self.error = error

    def __call__(self, device, address: int, size: int) -> str:
        self.calls.append((address, size))
        return self.error


def test_mapping_of_finds_the_shared_memory_file_that_holds_an_address(shm_region):
    tensor = tensor_in(shm_region, 12345, 1000)
    start, end, path = mapping_of(tensor.data_ptr())
    assert path == f"/dev/shm/{shm_region.name.lstrip('/')}"
    assert start <= tensor.data_ptr() and tensor.data_ptr() + 1000 <= end
    assert end - start == 4 << 20
    assert mapping_of(0) is None


def test_mapping_of_reads_lines_with_and_without_a_path():
    maps = ("00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n"
            "7f0000000000-7f0000200000 rw-s 00000000 00:19 42   /dev/shm/triton_python_backend_shm_region_1\n"
            "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0\n")
    assert mapping_of(0x7F0000100000, maps) == (0x7F0000000000, 0x7F0000200000,
                                                 "/dev/shm/triton_python_backend_shm_region_1")
    assert mapping_of(0x7FFD00000010, maps) == (0x7FFD00000000, 0x7FFD00021000, "")
    assert mapping_of(0x7F0000200000, maps) is None      # the end is outside


def test_a_shared_memory_mapping_is_registered_once_whole_and_then_covers_every_tensor_in_it(shm_region):
    recorder = Recorder()
    pinned = PinnedSharedMemory(torch.device("cpu"), register=recorder)
    first, second = tensor_in(shm_region, 0, 150528), tensor_in(shm_region, (4 << 20) - 150528, 150528)
    assert not pinned.covers(first)
    assert pinned.pin(first) and pinned.pin(second) and pinned.pin(first)
    start, end, _ = mapping_of(first.data_ptr())
    assert recorder.calls == [(start, end - start)]
    assert pinned.covers(second)


def test_memory_outside_dev_shm_is_left_to_the_staging_buffer():
    recorder = Recorder()
    pinned = PinnedSharedMemory(torch.device("cpu"), register=recorder)
    heap = torch.randint(0, 256, (4, 224, 224, 3), dtype=torch.uint8)
    anonymous = mmap.mmap(-1, 1 << 20)
    in_anonymous = torch.frombuffer(anonymous, dtype=torch.uint8)
    assert not pinned.pin(heap) and not pinned.pin(in_anonymous)
    assert not pinned.pin(heap[:, :, :, 0])                   # not contiguous
    assert recorder.calls == []
    del in_anonymous
    anonymous.close()


def test_a_refused_registration_is_said_once_and_not_tried_again(shm_region):
    recorder = Recorder(error="CUDA driver error 1")
    pinned = PinnedSharedMemory(torch.device("cpu"), register=recorder)
    tensor = tensor_in(shm_region, 4096, 150528)
    assert not pinned.pin(tensor) and not pinned.pin(tensor)
    assert len(recorder.calls) == 1
    assert "CUDA driver error 1" in pinned.failure and shm_region.name.lstrip("/") in pinned.failure


def test_two_mappings_of_a_grown_pool_are_each_registered(shm_region):
    """The backend maps a grown pool anew and keeps the old mapping: both hold inputs."""
    again = shared_memory.SharedMemory(name=shm_region.name)     # a second mapping of the same file
    try:
        recorder = Recorder()
        pinned = PinnedSharedMemory(torch.device("cpu"), register=recorder)
        old, new = tensor_in(shm_region, 0, 1000), tensor_in(again, 0, 1000)
        assert pinned.pin(old) and pinned.pin(new) and pinned.covers(old) and pinned.covers(new)
        assert len(recorder.calls) == 2 and torch.equal(old, new)
        del old, new
    finally:
        again.close()


def test_the_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(HOST_INPUT_ENV, raising=False)
    assert host_input_choice() == "registered"
    monkeypatch.setenv(HOST_INPUT_ENV, "staging")
    assert host_input_choice() == "staging"
    monkeypatch.setenv(HOST_INPUT_ENV, "pageable")
    with pytest.raises(ValueError, match="registered, staging"):
        host_input_choice()


@pytest.mark.gpu
def test_on_a_gpu_inputs_go_to_the_device_straight_from_registered_shared_memory(shm_region):
    device = torch.device("cuda:0")
    pinned = PinnedSharedMemory(device)
    stream = torch.cuda.Stream(device)
    target = torch.full((4 << 20,), 0xA5, dtype=torch.uint8, device=device)     # poisoned
    pieces = [(0, 150528), (150528 + 64, 150528 * 4), ((4 << 20) - 150528, 150528)]
    start = 0
    with torch.cuda.stream(stream):
        for offset, length in pieces:
            source = tensor_in(shm_region, offset, length)
            assert pinned.pin(source), pinned.failure
            target[start:start + length].copy_(source, non_blocking=True)
            start += length
    stream.synchronize()
    expected = torch.cat([tensor_in(shm_region, offset, length) for offset, length in pieces])
    assert torch.equal(target[:start].cpu(), expected)
    assert torch.all(target[start:] == 0xA5)
    assert tensor_in(shm_region, 0, 1000).is_pinned()       # the driver knows the pages as page-locked
    assert not torch.empty(1000, dtype=torch.uint8).is_pinned()
