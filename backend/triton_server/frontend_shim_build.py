"""Build the in-process front end's shim (backend/triton_server/frontend_shim/frontend_shim.cc): Triton's current gRPC,
HTTP and metrics frontends, from the tritonfrontend wheel's library, given the admin token's restrictions and a client
shared-memory manager, which that wheel's Python options cannot pass (backend/triton_server/inprocess_server.py uses
it).

It compiles with the system C++ compiler and nothing else: against the frontend classes' declarations of Triton
2.73.0 (frontend_shim/include/triton_server, upstream's restricted_features.h verbatim, with its licence) and
Triton's C API headers of r24.10 (the core this project runs, backend/ab_router/ab_router_backend/include). Built once
per source into build/frontend_shim/<digest>/ (backend/native_build.py, the pattern the A/B router's build shares); the
offline bundle brings one built here for the GPU host
($FUSEDRESNET_FRONTEND_SHIM_PREBUILT), as it does the A/B router.

    python -m fusedresnet.backend.triton_server.frontend_shim_build      # build (or find) it, print its path
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..native_build import find_or_build, source_digest
from ..spec import BUILD_DIR

SOURCE_DIR = Path(__file__).resolve().parent / "frontend_shim"
SOURCE = SOURCE_DIR / "frontend_shim.cc"
# Triton's C API headers are those the A/B router compiles against (one copy of r24.10, in the router's folder).
INCLUDE_DIRS = (SOURCE_DIR / "include",
                Path(__file__).resolve().parent.parent / "ab_router" / "ab_router_backend" / "include")
HEADERS = (SOURCE_DIR / "include" / "triton_server" / "frontend_abi.h",
           SOURCE_DIR / "include" / "triton_server" / "restricted_features.h",
           INCLUDE_DIRS[1] / "triton" / "core" / "tritonserver.h")
LIBRARY_NAME = "libfusedresnet_frontend_shim.so"
OUTPUT_DIR = BUILD_DIR / "frontend_shim"
PREBUILT_ENV = "FUSEDRESNET_FRONTEND_SHIM_PREBUILT"   # a folder of <digest>/<library> built elsewhere
# The frontends' objects are made and released here and deleted by nobody (the process ends with them): no sized
# delete of a class whose size only the wheel's library knows. The C++ runtime is the host's (the wheel needs a
# newer one than this shim does).
COMPILE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-fno-sized-deallocation")


class ShimBuildError(RuntimeError):
    """The shim cannot be built here; the message says why."""


def build_digest() -> str:
    return source_digest(((source.name, source) for source in (SOURCE, *HEADERS)), " ".join(COMPILE_FLAGS).encode())


def compile_command(cxx: str, library: Path) -> list[str]:
    return [cxx, *COMPILE_FLAGS, *(f"-I{folder}" for folder in INCLUDE_DIRS), str(SOURCE), "-o", str(library)]


def build(output_dir: Path = OUTPUT_DIR) -> Path:
    """The shim for these sources: the one built before (here, or in $PREBUILT_ENV), else built now."""
    return find_or_build(output_dir / build_digest() / LIBRARY_NAME, PREBUILT_ENV, compile_command, ShimBuildError,
                         missing_compiler="the in-process front end's shim needs a C++ compiler (g++ not found)",
                         failed="building the front end's shim failed")


if __name__ == "__main__":
    try:
        print(build())
    except ShimBuildError as error:
        sys.exit(str(error))
