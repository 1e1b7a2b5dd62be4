"""The Python-backend stub processes of a running tritonserver, found with psutil.

Triton starts one stub process (`triton_python_backend_stub`) per model instance. The
launcher starts Triton with `--disable-auto-complete-config`, so there are no short-lived
auto-complete stubs: every stub child of the server is a model instance. A stub is named by
the model instance it serves (e.g. `resnet18_custom_0_0`, Triton's `<model>_<group>_<index>`),
the one argument of its command line that has that form.
"""

from __future__ import annotations

import contextlib
import re

import psutil

STUB_BINARY = "triton_python_backend_stub"
SERVER_BINARY = "tritonserver"
INSTANCE_NAME = re.compile(r"^\w+_\d+_\d+$")


def instance_name(stub: psutil.Process) -> str:
    return next((arg for arg in stub.cmdline() if INSTANCE_NAME.match(arg)), f"stub pid {stub.pid}")


def live_children(pid: int, name: str) -> list[psutil.Process]:
    """The live (not zombie) child processes of `pid` called `name`; a child that ends meanwhile is left out."""
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if child.name() == name and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def tritonserver_of(launcher_pid: int) -> psutil.Process | None:
    """The tritonserver the launcher (`python -m fusedresnet.backend.serve`) runs now, if any (the first, with
    several processes per GPU: tritonservers_of)."""
    return next(iter(live_children(launcher_pid, SERVER_BINARY)), None)


def tritonservers_of(launcher_pid: int) -> list[psutil.Process]:
    """Every tritonserver the launcher runs now."""
    return live_children(launcher_pid, SERVER_BINARY)


def python_stubs(server_pid: int) -> dict[str, psutil.Process]:
    """Model instance name -> live (not zombie) Python-backend stub process of tritonserver `server_pid`."""
    stubs = {}
    for stub in live_children(server_pid, STUB_BINARY):
        try:
            stubs[instance_name(stub)] = stub
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return stubs


def tree_cpu_seconds(root: psutil.Process) -> tuple[float, float]:
    """CPU seconds (user + system) of `root` and all its descendants, and of the tritonserver among them;
    processes that ended meanwhile count as nothing, and a root that ended as (0, 0)."""
    total = triton = 0.0
    with contextlib.suppress(psutil.Error):
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                seconds = times.user + times.system
                total += seconds
                if process.name() == SERVER_BINARY:
                    triton += seconds
    return total, triton
