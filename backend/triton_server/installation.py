"""Where the Triton server comes from, and what it needs to run here.

Finds `tritonserver` ($TRITON_HOME, PATH, or the server bundled in the nvidia-pytriton
wheel), and prepares a private copy of its backend tree with the Python-backend stub that
matches this interpreter (the wheel ships one stub per Python version) and the project's own
C++ backends that the caller names (the launcher names the A/B router's, built by
backend/ab_router/build.py, when its model repository serves the router).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..server_error import ServerError  # raised here, and imported from here by the launcher, tests and tools
from ..spec import BUILD_DIR


@dataclass
class TritonInstallation:
    home: Path            # holds bin/tritonserver, backends/, caches/, python_backend_stubs/
    library_dirs: list[Path]

    @property
    def binary(self) -> Path:
        return self.home / "bin" / "tritonserver"


def find_triton() -> TritonInstallation:
    candidates = []
    if os.environ.get("TRITON_HOME"):
        candidates.append(Path(os.environ["TRITON_HOME"]))
    on_path = shutil.which("tritonserver")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    try:
        import pytriton  # the nvidia-pytriton wheel bundles a complete server
        candidates.append(Path(pytriton.__file__).parent / "tritonserver")
    except ImportError:
        pass
    for home in candidates:
        if (home / "bin" / "tritonserver").is_file():
            wheel_libs = home.parent.parent / "nvidia_pytriton.libs"
            return TritonInstallation(home, [wheel_libs] if wheel_libs.is_dir() else [])
    raise ServerError("tritonserver not found: install nvidia-pytriton (make setup), put tritonserver on PATH, "
                      "or set TRITON_HOME to the folder holding bin/tritonserver")


def core_library_dir(triton: TritonInstallation) -> Path:
    """A folder holding `libtritonserver.so`, a link to this installation's core library: the name the tritonfrontend
    wheel's library asks for (the nvidia-pytriton wheel names its copy libtritonserver-<hash>.so)."""
    folders = [*triton.library_dirs, triton.home / "lib"]
    core = next((found for folder in folders for found in sorted(folder.glob("libtritonserver*.so*"))), None)
    if core is None:
        raise ServerError(f"no libtritonserver*.so beside {triton.home} (looked in {', '.join(map(str, folders))})")
    link_dir = BUILD_DIR / "triton-core"
    link = link_dir / "libtritonserver.so"
    if not (link.is_symlink() and link.resolve() == core.resolve()):
        link_dir.mkdir(parents=True, exist_ok=True)
        scratch = link_dir / f".libtritonserver.so.{os.getpid()}"
        scratch.unlink(missing_ok=True)
        scratch.symlink_to(core.resolve())
        scratch.replace(link)    # atomic: processes starting together see one link or the other
    return link_dir


def python_stub_for_interpreter(triton: TritonInstallation) -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = triton.home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if stub.is_file():
        return stub
    if (triton.home / "backends" / "python" / "triton_python_backend_stub").is_file():
        return triton.home / "backends" / "python" / "triton_python_backend_stub"
    raise ServerError(f"no Python-backend stub for Python {version} in {triton.home}")


_BACKEND_TREE_LOCK = threading.Lock()


def private_backend_tree(triton: TritonInstallation, backends: Mapping[str, Path] | None = None) -> Path:
    """A copy of the backends folder with the stub for this interpreter placed in backends/python, and each of
    `backends` (name: its library, e.g. {"fusedresnet_ab": the A/B router's}) in backends/<name>/. A tree with
    such backends is a folder of its own (triton-backends-py3.11+fusedresnet_ab), so launchers with and without
    them do not remake each other's.

    The launcher's server processes start together: the copy is made once under a lock, into a folder of its
    own that is then renamed into place, so no process sees a half-made tree (another launcher that made it
    first wins the rename)."""
    backends = dict(sorted((backends or {}).items()))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    tree = BUILD_DIR / "".join([f"triton-backends-py{version}", *(f"+{name}" for name in backends)])
    stub = python_stub_for_interpreter(triton)
    # a library's folder is its build digest (build/<name>/<digest>/<library>)
    source = ":".join([str(triton.home.resolve()), str(stub.stat().st_mtime_ns),
                       *(library.parent.name for library in backends.values())])

    def made(folder: Path) -> bool:
        marker = folder / ".source"
        return (folder / "python" / "triton_python_backend_stub").is_file() and marker.is_file() \
            and marker.read_text() == source

    with _BACKEND_TREE_LOCK:
        if made(tree):
            return tree
        tree.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{tree.name}.", dir=tree.parent)) / "tree"
        shutil.copytree(triton.home / "backends", scratch)
        shutil.copy2(stub, scratch / "python" / "triton_python_backend_stub")
        (scratch / "python" / "triton_python_backend_stub").chmod(0o755)
        for name, library in backends.items():
            (scratch / name).mkdir()
            shutil.copy2(library, scratch / name / library.name)
        (scratch / ".source").write_text(source)
        shutil.rmtree(tree, ignore_errors=True)
        try:
            scratch.rename(tree)
        except OSError:
            if not made(tree):
                raise
        shutil.rmtree(scratch.parent, ignore_errors=True)
    return tree


def host_gpus() -> list[str]:
    """The host's GPUs as `nvidia-smi -L` lists them ("GPU 0: <name> (UUID: GPU-...)"); empty without
    a driver, and when CUDA_VISIBLE_DEVICES hides every GPU."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return []
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def gpu_present() -> bool:
    return bool(host_gpus())
