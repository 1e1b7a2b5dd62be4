"""The build pattern both of the project's native libraries share (backend/ab_router/build.py, the A/B router's Triton
backend; backend/triton_server/frontend_shim_build.py, the in-process front end's shim): one library per source, built
with the system C++ compiler into `<output>/<digest>/<library>`, where the digest (`source_digest`) covers what it is
built from; a library built elsewhere (the offline bundle's, for the GPU host, which has no compiler) is used as it is
from the folder an environment variable names, when its digest matches. The standard library alone: the offline bundle
builds both with a bare python3.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def compiler() -> str:
    """The C++ compiler: $CXX, else g++."""
    return os.environ.get("CXX", "g++")


def source_digest(sources: Iterable[tuple[str, Path]], *extra: bytes) -> str:
    """16 hex digits of SHA-256 over each source's name and bytes (name NUL bytes NUL, in order; the name, not the
    path, so the digest is the same in any checkout), then each of `extra` (a generated header, the flags)."""
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for more in extra:
        digest.update(more)
    return digest.hexdigest()[:16]


def find_or_build(library: Path, prebuilt_env: str, command: Callable[[str, Path], list[str]],
                  error: type[Exception], missing_compiler: str, failed: str,
                  files: dict[str, str] | None = None) -> Path:
    """`library` (`<output>/<digest>/<name>`) when built before; else the one of the same digest and name in the
    folder $`prebuilt_env` names; else built now with `command(compiler, scratch / name)`, in a scratch folder
    beside it that first holds `files` (name: text, such as a generated header), and renamed into place at once
    (a concurrent build finds a whole library or none). Raises `error`: `missing_compiler` without a compiler,
    `failed` and the command and the end of its errors when it fails."""
    if library.is_file():
        return library
    if os.environ.get(prebuilt_env):
        prebuilt = Path(os.environ[prebuilt_env]) / library.parent.name / library.name
        if prebuilt.is_file():
            return prebuilt
    cxx = shutil.which(compiler())
    if cxx is None:
        raise error(missing_compiler)
    library.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="build.", dir=library.parent))
    try:
        for name, text in (files or {}).items():
            (scratch / name).write_text(text)
        built = command(cxx, scratch / library.name)
        done = subprocess.run(built, capture_output=True, text=True)
        if done.returncode != 0:
            raise error(f"{failed}:\n{' '.join(built)}\n{done.stderr[-4000:]}")
        (scratch / library.name).rename(library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return library
