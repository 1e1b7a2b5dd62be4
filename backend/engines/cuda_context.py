"""A model stub's CUDA context, made while the stub still imports.

A restarted server's time goes to its stubs (results/recovery.md): each starts, imports torch (1-3 s of CPU,
with 8 stubs starting at once) and only then makes its CUDA context, and the GPU driver makes the contexts of
a process's stubs one after another (2 s for 8 stubs on the H200, results/front_door.md). Started
before `import torch`, `start()` makes the context in a thread of its own through the driver API (ctypes on
libcuda.so.1; a foreign call releases the GIL), so the driver's work overlaps the imports; torch and CuPy then
find the device's primary context, the one the CUDA runtime uses, already there. `wait()` joins that thread.

It makes a context only where exactly one GPU is visible, as in every process the launcher starts (its
CUDA_VISIBLE_DEVICES names one GPU): with several, which one an instance gets is known only at
`initialize()`. Elsewhere (no driver, no GPU, several GPUs) it does nothing, and torch makes the context at
`initialize()` as before. FUSEDRESNET_EARLY_CUDA_CONTEXT=0 turns it off (campaigns/recovery.py measures both).
"""

from __future__ import annotations

import ctypes
import os
import threading

EARLY_CONTEXT_ENV = "FUSEDRESNET_EARLY_CUDA_CONTEXT"

_thread: threading.Thread | None = None
outcome = "not started"     # what the thread did, in words (the model's load line says it)


def _retain_primary_context():
    global outcome
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        outcome = "no CUDA driver"
        return
    count, device, context = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        outcome = "no GPU"
        return
    if count.value == 0:
        outcome = "no GPU visible"
        return
    if count.value > 1:
        outcome = f"{count.value} GPUs visible: left to initialize()"
        return
    status = driver.cuDeviceGet(ctypes.byref(device), 0)
    if status == 0:
        # The primary context stays retained for the life of the process, as torch's and CuPy's own.
        status = driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    outcome = "made during the imports" if status == 0 else f"not made (CUDA driver error {status})"


def start() -> None:
    """Make the primary context in the background (once per process), unless turned off."""
    global _thread, outcome
    if _thread is not None:
        return
    if os.environ.get(EARLY_CONTEXT_ENV, "1") == "0":
        outcome = f"off ({EARLY_CONTEXT_ENV}=0)"
        return
    _thread = threading.Thread(target=_retain_primary_context, daemon=True, name="early-cuda-context")
    _thread.start()


def wait(timeout_s: float = 60.0) -> str:
    """Until the background context is made (or given up); what happened, in words."""
    if _thread is not None:
        _thread.join(timeout_s)
    return outcome
