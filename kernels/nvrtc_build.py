"""NVRTC compile of the sm_90a (wgmma) module, cached on disk.

CuPy's RawModule picks the architecture itself (`-arch=sm_90` on an H100) and
has no way to ask for the architecture-specific target sm_90a, which wgmma
needs (ptxas rejects wgmma for plain sm_90). So the wgmma path compiles with
the NVRTC library CuPy itself uses (`cupy_backends.cuda.libs.nvrtc`), with
exactly `configs.nvrtc_options(arch)`, reads the lowered name of every kernel
instantiation, and loads the cubin through `cupy.RawModule(path=...)`. A
compile error raises (with NVRTC's log): there is no fallback to the mma.sync
kernels, which would hide the failure.

The cubin and its name mapping are kept under $CUPY_CACHE_DIR (default
~/.cupy/kernel_cache), keyed by a hash of the source, options, name
expressions and NVRTC version, so a server process compiles once per change.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


def _write_atomic(path: Path, data: bytes):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compile_cubin(source: str, options: tuple[str, ...], names: list[str]) -> tuple[Path, dict[str, str]]:
    """(cubin path, {name expression: lowered name}) for `source` compiled by NVRTC with `options`."""
    from cupy_backends.cuda.libs import nvrtc

    version = nvrtc.getVersion()
    key = hashlib.sha256(json.dumps([source, list(options), sorted(names), list(version)]).encode()).hexdigest()[:32]
    directory = cache_dir()
    cubin_path = directory / f"fusedresnet_{key}.cubin"
    names_path = directory / f"fusedresnet_{key}.names.json"
    if cubin_path.is_file() and names_path.is_file():
        mapping = json.loads(names_path.read_text())
        if sorted(mapping) == sorted(names):
            return cubin_path, mapping
    program = nvrtc.createProgram(source, "fusedresnet_kernels.cu", (), ())
    try:
        for name in names:
            nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC {version} failed to compile the kernels with {' '.join(options)}:\n"
                               f"{nvrtc.getProgramLog(program)}") from e
        cubin = nvrtc.getCUBIN(program)
        mapping = {name: nvrtc.getLoweredName(program, name) for name in names}
    finally:
        nvrtc.destroyProgram(program)
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(cubin_path, cubin)
    _write_atomic(names_path, json.dumps(mapping).encode())
    return cubin_path, mapping
