"""The Python-backend stub processes of a running tritonserver, found with psutil.

Triton starts one stub process (`triton_python_backend_stub`) per model instance. The
launcher starts Triton with `--disable-auto-complete-config`, so there are no short-lived
auto-complete stubs: every stub child of the server is a model instance. A stub is named by
the model instance it serves (e.g. `resnet18_custom_0_0`, Triton's `<model>_<group>_<index>`),
the one argument of its command line that has that form.
"""

from __future__ import annotations

import re

import psutil

STUB_BINARY = "triton_python_backend_stub"
INSTANCE_NAME = re.compile(r"^\w+_\d+_\d+$")


def instance_name(stub: psutil.Process) -> str:
    return next((arg for arg in stub.cmdline() if INSTANCE_NAME.match(arg)), f"stub pid {stub.pid}")


def python_stubs(server_pid: int) -> dict[str, psutil.Process]:
    """Model instance name -> live (not zombie) Python-backend stub process of tritonserver `server_pid`."""
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return {}
    stubs = {}
    for child in children:
        try:
            if child.name() == STUB_BINARY and child.status() != psutil.STATUS_ZOMBIE:
                stubs[instance_name(child)] = child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return stubs
