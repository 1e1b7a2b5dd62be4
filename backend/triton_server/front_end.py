"""Which front end the launcher's Triton processes serve through, and why.

- `inprocess`: the Triton 2.51 core behind Triton 2.73.0's gRPC, HTTP and metrics frontends, in one Python process
  (backend/triton_server/inprocess_server.py). Those frontends carry upstream's fixes of the cancellation races that
  crash the 2.51 binary when clients abandon calls (docs/ROBUSTNESS.md). They come from the `tritonfrontend` 2.73.0
  wheel, built for CPython 3.12 and glibc 2.38 or later (manylinux_2_39).
- `binary`: the tritonserver 2.51 binary of the nvidia-pytriton wheel, everywhere else.

`--front-end auto` (the default) takes the in-process one wherever it loads: this Python has the wheel at the
version the shim's declarations mirror, glibc is recent enough, the shim builds, and a child process loads the
wheel's library, its 2.51 core and the shim; except with `--client-shared-memory` (local clients that share memory
with the server), which gets the binary: CUDA regions do not register through the in-process frontends
(CUDA_SHM_UNSUPPORTED). The launcher says which in one line (`FrontEndChoice.line`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FRONT_ENDS = ("auto", "inprocess", "binary")
FRONT_END_ENV = "FUSEDRESNET_FRONT_END"   # the default of --front-end, and of every server the code starts
TRITONFRONTEND_VERSION = "2.73.0"   # the release whose classes backend/triton_server/frontend_shim declares
MIN_GLIBC = (2, 38)                 # the wheel is manylinux_2_39; its C++ runtime needs GLIBCXX_3.4.32
PROBE_TIMEOUT_S = 120.0
# Loads the wheel's library (and through it the 2.51 core) and the shim, every symbol bound at once.
PROBE = ("import ctypes, os, sys\n"
         "for path in sys.argv[1:]:\n"
         "    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)\n")


@dataclass(frozen=True)
class FrontEndChoice:
    name: str     # "inprocess" or "binary"
    why: str

    def line(self) -> str:
        what = (f"in-process (Triton 2.51 core behind tritonfrontend {TRITONFRONTEND_VERSION}'s gRPC, HTTP and "
                "metrics frontends)" if self.name == "inprocess" else "the tritonserver binary")
        return f"fusedresnet: front end: {what}: {self.why}"


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of this process's glibc; None where the C library is another one."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = text.partition(" ")
    if name != "glibc":
        return None
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def frontend_library() -> Path | None:
    """The tritonfrontend wheel's frontend library (tritonfrontend/_c/tritonfrontend_bindings*.so), found without
    importing the package."""
    spec = importlib.util.find_spec("tritonfrontend")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder, "_c").glob("tritonfrontend_bindings*.so"))
        if found:
            return found[0]
    return None


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("tritonfrontend")
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable_because(environment: dict) -> str | None:
    """Why the in-process front end cannot serve here, in words; None when it can. `environment`: the server
    process's (its library path holds the 2.51 core as libtritonserver.so)."""
    from .frontend_shim_build import ShimBuildError, build

    glibc = glibc_version()
    if glibc is None or glibc < MIN_GLIBC:
        found = "not glibc" if glibc is None else f"glibc {glibc[0]}.{glibc[1]}"
        return f"{found} here; the tritonfrontend wheel needs glibc {MIN_GLIBC[0]}.{MIN_GLIBC[1]} or later"
    version = installed_version()
    library = frontend_library()
    if version is None or library is None:
        return (f"the tritonfrontend wheel is not installed (pip install tritonfrontend=={TRITONFRONTEND_VERSION} "
                f"--no-deps, CPython 3.12; this is {sys.version_info.major}.{sys.version_info.minor})")
    if version != TRITONFRONTEND_VERSION:
        return f"tritonfrontend {version} is installed; the shim declares the classes of {TRITONFRONTEND_VERSION}"
    try:
        shim = build()
    except ShimBuildError as error:
        return str(error)
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE, str(library), str(shim)], env=environment,
                               capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"loading its libraries took more than {PROBE_TIMEOUT_S:.0f} s"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return f"its libraries do not load here: {last}"
    return None


_WHY_NOT: dict[tuple, str | None] = {}   # unavailable_because, once per environment's library path and interpreter


# CUDA shared memory does not register through the in-process frontends: the frontend's cudaIpcOpenMemHandle fails
# ("failed to register shared memory region ...: invalid args"), with or without MPS, where the binary maps the same
# client's regions (system shared memory registers and serves; results/front_end.md). Clients that share memory with the
# server are local and ask for it (--client-shared-memory): they get the binary, with its crash exposure.
CUDA_SHM_UNSUPPORTED = "CUDA shared-memory regions do not register through the in-process frontends"


def choose_front_end(requested: str, environment: dict, client_shared_memory: bool = False) -> FrontEndChoice:
    """The front end for --front-end `requested` (auto, inprocess, binary), with or without --client-shared-memory.
    A ValueError where `inprocess` was asked for and cannot serve here."""
    if requested not in FRONT_ENDS:
        raise ValueError(f"front end {requested!r}: expected one of {', '.join(FRONT_ENDS)}")
    if requested == "binary":
        return FrontEndChoice("binary", "asked for (--front-end binary)")
    if requested == "auto" and client_shared_memory:
        return FrontEndChoice("binary", "client shared memory asked for (--client-shared-memory): "
                                        f"{CUDA_SHM_UNSUPPORTED} (docs/ROBUSTNESS.md: what the binary's crashes cost)")
    key = (environment.get("LD_LIBRARY_PATH"), environment.get("PATH"), sys.executable)
    if key not in _WHY_NOT:
        _WHY_NOT[key] = unavailable_because(environment)
    why_not = _WHY_NOT[key]
    if why_not is None:
        shm = f"; system shared memory only: {CUDA_SHM_UNSUPPORTED}" if client_shared_memory else ""
        how = " (--front-end auto)" if requested == "auto" else ""
        return FrontEndChoice("inprocess", f"it loads here{how}{shm}")
    if requested == "inprocess":
        raise ValueError(f"--front-end inprocess: {why_not}")
    return FrontEndChoice("binary", f"the in-process one cannot serve here: {why_not}")
