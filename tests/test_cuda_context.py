"""The early CUDA context (backend/engines/cuda_context.py): made in the background through the driver API where exactly
one GPU is visible, left to initialize() elsewhere, off with FUSEDRESNET_EARLY_CUDA_CONTEXT=0.

On the CPU a stand-in libcuda.so.1 (built here with the C compiler) reports the device count a test asks for and
writes each driver call it gets to a file, so what the module asks of the driver is checked, not assumed. A GPU
host checks the real driver: the context made before torch is the primary context torch then uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from fusedresnet.backend.engines.cuda_context import EARLY_CONTEXT_ENV

FAKE_DRIVER = textwrap.dedent("""
    #include <stdio.h>
    #include <stdlib.h>
    static void note(const char *call, int value) {
        FILE *log = fopen(getenv("FAKE_CUDA_LOG"), "a");
        fprintf(log, "%s %d\\n", call, value);
        fclose(log);
    }
    int cuInit(unsigned flags) { note("cuInit", (int)flags); return 0; }
    int cuDeviceGetCount(int *count) { *count = atoi(getenv("FAKE_CUDA_DEVICES")); note("cuDeviceGetCount", *count);
                                       return 0; }
    int cuDeviceGet(int *device, int ordinal) { *device = 40 + ordinal; note("cuDeviceGet", ordinal); return 0; }
    int cuDevicePrimaryCtxRetain(void **context, int device) { *context = (void *)0x1234;
                                                               note("cuDevicePrimaryCtxRetain", device); return 0; }
""")
PROBE = "from fusedresnet.backend.engines import cuda_context; cuda_context.start(); print(cuda_context.wait())"


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in driver (.ci/apt-packages/toolchain installs it)")
    folder = tmp_path_factory.mktemp("fake_cuda")
    (folder / "fake_cuda.c").write_text(FAKE_DRIVER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(folder / "fake_cuda.c")],
                   check=True)
    return folder


def probe(driver_folder, tmp_path, devices: int, **env) -> tuple[str, list[str]]:
    log = tmp_path / "calls.txt"
    environment = {**os.environ, "LD_LIBRARY_PATH": str(driver_folder), "FAKE_CUDA_LOG": str(log),
                   "FAKE_CUDA_DEVICES": str(devices), **env}
    if EARLY_CONTEXT_ENV not in env:
        environment.pop(EARLY_CONTEXT_ENV, None)
    result = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True,
                            timeout=60, check=True)
    return result.stdout.strip(), log.read_text().splitlines() if log.exists() else []


def test_one_visible_gpu_gets_its_primary_context_retained(fake_driver, tmp_path):
    outcome, calls = probe(fake_driver, tmp_path, devices=1)
    assert outcome == "made during the imports"
    assert calls == ["cuInit 0", "cuDeviceGetCount 1", "cuDeviceGet 0", "cuDevicePrimaryCtxRetain 40"]


def test_several_visible_gpus_are_left_to_initialize(fake_driver, tmp_path):
    outcome, calls = probe(fake_driver, tmp_path, devices=2)
    assert outcome == "2 GPUs visible: left to initialize()"
    assert "cuDevicePrimaryCtxRetain 40" not in calls and "cuDeviceGet 0" not in calls


def test_no_gpu_makes_nothing(fake_driver, tmp_path):
    outcome, calls = probe(fake_driver, tmp_path, devices=0)
    assert outcome == "no GPU visible"
    assert calls == ["cuInit 0", "cuDeviceGetCount 0"]


def test_turned_off_asks_nothing_of_the_driver(fake_driver, tmp_path):
    outcome, calls = probe(fake_driver, tmp_path, devices=1, **{EARLY_CONTEXT_ENV: "0"})
    assert outcome == f"off ({EARLY_CONTEXT_ENV}=0)"
    assert calls == []


def test_no_driver_at_all(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != EARLY_CONTEXT_ENV}
    environment["LD_LIBRARY_PATH"] = str(tmp_path)      # nothing there
    result = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True,
                            timeout=60, check=True)
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("this host has an NVIDIA driver")
    assert result.stdout.strip() == "no CUDA driver"


@pytest.mark.gpu
def test_on_a_gpu_torch_uses_the_context_made_before_it():
    code = textwrap.dedent("""
        import ctypes, os
        from fusedresnet.backend.engines import cuda_context
        cuda_context.start()
        outcome = cuda_context.wait()
        driver = ctypes.CDLL("libcuda.so.1")
        before = ctypes.c_void_p()
        driver.cuDevicePrimaryCtxRetain(ctypes.byref(before), 0)
        import torch
        torch.empty(1, device="cuda:0")
        current = ctypes.c_void_p()
        driver.cuCtxGetCurrent(ctypes.byref(current))
        print(outcome, before.value == current.value)
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    env.pop(EARLY_CONTEXT_ENV, None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            check=True)
    assert result.stdout.strip() == "made during the imports True"
