"""NVRTC compile of the sm_90a (wgmma) kernels: one program per kernel, in parallel, cached on disk.

CuPy's RawModule picks the architecture itself (`-arch=sm_90` on an H100) and
has no way to ask for the architecture-specific target sm_90a, which wgmma
needs (ptxas rejects wgmma for plain sm_90). So the wgmma path compiles with
the NVRTC library CuPy itself uses (`cupy_backends.cuda.libs.nvrtc`), with
exactly `build.nvrtc_options(arch)`, reads the lowered name of each kernel
instantiation, and the launcher loads each cubin through
`cupy.RawModule(path=...)`. A compile error raises (with NVRTC's log): there
is no fallback to the mma.sync kernels, which would hide the failure.

Each kernel instantiation (name expression) is its own NVRTC program of the
whole translation unit, so that:
- the kernels compile in parallel, one per thread (NVRTC releases the GIL;
  ptxas, most of the time, works on one kernel at a time): the time to compile
  a module is that of its slowest kernel, not the sum (107 kernels in one
  program took 74.9 s on the H100 host);
- the cache holds each kernel once: a library that asks for more kernels (the
  tuner's candidates beside the served ones) compiles only those it lacks.

The cubins and their lowered names are kept under $CUPY_CACHE_DIR (default
~/.cupy/kernel_cache), keyed by a hash of the source, options, name expression
and NVRTC version. Processes that start together (Triton's instances of a
model) share the work through a lock file per kernel: each compiles the
kernels no other holds, then waits for and reads the rest.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path

CACHE_PREFIX = "fusedresnet_"


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


def _cupy_nvrtc():
    from cupy_backends.cuda.libs import nvrtc
    return nvrtc


def default_workers() -> int:
    """Compile threads: one per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class KernelCache:
    """The compiled kernels of one translation unit and option list, on disk (see the module doc)."""

    def __init__(self, source: str, options: tuple[str, ...], nvrtc=None, directory: Path | None = None):
        self.nvrtc = nvrtc or _cupy_nvrtc()
        self.source, self.options = source, tuple(options)
        self.version = tuple(self.nvrtc.getVersion())
        self.directory = directory or cache_dir()
        self._prefix = hashlib.sha256(json.dumps([source, list(options), list(self.version)]).encode())

    def key(self, name: str) -> str:
        digest = self._prefix.copy()
        digest.update(name.encode())
        return digest.hexdigest()[:32]

    def _paths(self, name: str) -> tuple[Path, Path]:
        stem = self.directory / f"{CACHE_PREFIX}{self.key(name)}"
        return stem.with_suffix(".cubin"), stem.with_suffix(".name")

    def cached(self, name: str) -> tuple[Path, str] | None:
        cubin, lowered = self._paths(name)
        if cubin.is_file() and lowered.is_file():
            return cubin, lowered.read_text()
        return None

    def compile_one(self, name: str) -> tuple[Path, str]:
        """NVRTC's compile of the translation unit for the one kernel `name`, written to the cache."""
        nvrtc = self.nvrtc
        program = nvrtc.createProgram(self.source, "fusedresnet_kernels.cu", (), ())
        try:
            nvrtc.addNameExpression(program, name)
            try:
                nvrtc.compileProgram(program, list(self.options))
            except nvrtc.NVRTCError as e:
                raise RuntimeError(f"NVRTC {self.version} failed to compile {name} with {' '.join(self.options)}:\n"
                                   f"{nvrtc.getProgramLog(program)}") from e
            cubin = nvrtc.getCUBIN(program)
            lowered = nvrtc.getLoweredName(program, name)
        finally:
            nvrtc.destroyProgram(program)
        cubin_path, name_path = self._paths(name)
        _write_atomic(cubin_path, cubin)
        _write_atomic(name_path, lowered.encode())
        return cubin_path, lowered

    def _get(self, name: str, wait: bool) -> tuple[Path, str] | None:
        """The cached kernel, else compiled here under its lock; None if another process holds the lock and
        not `wait`."""
        found = self.cached(name)
        if found is not None:
            return found
        with open(self._paths(name)[0].with_suffix(".lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            try:
                return self.cached(name) or self.compile_one(name)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def get(self, names, workers: int | None = None) -> dict[str, tuple[Path, str]]:
        """{name: (cubin path, lowered name)} for every name, compiling those not cached, `workers` at a time."""
        names = list(dict.fromkeys(names))
        found = {name: hit for name in names if (hit := self.cached(name)) is not None}
        missing = [name for name in names if name not in found]
        if not missing:
            return found
        self.directory.mkdir(parents=True, exist_ok=True)
        workers = min(len(missing), workers or default_workers())
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="nvrtc") as pool:
            # first those no other process is compiling, then (waiting for their locks) the others
            first = dict(zip(missing, pool.map(lambda name: self._get(name, False), missing)))
            later = [name for name, hit in first.items() if hit is None]
            found.update((name, hit) for name, hit in first.items() if hit is not None)
            found.update(zip(later, pool.map(lambda name: self._get(name, True), later)))
        return found
