"""The package works from any directory, and its client side imports without the server side."""

from __future__ import annotations

import subprocess
import sys

from fusedresnet.backend.spec import MODEL_REPOSITORY

# What only the server, the load tests or the GPU need (extras server, loadtest, gpu).
SERVER_SIDE_PACKAGES = ("torch", "pytriton", "triton_python_backend_utils", "psutil", "locust", "matplotlib",
                        "prometheus_client", "cupy")
CLIENT_MODULES = ("fusedresnet.backend.spec", "fusedresnet.backend.network", "fusedresnet.backend.prepared_stamp",
                  "fusedresnet.client.preprocess", "fusedresnet.client.agreement", "fusedresnet.client.resnet_client",
                  "fusedresnet.client.classify")


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_client_and_wire_contract_import_without_server_side_packages(tmp_path):
    blocker = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {SERVER_SIDE_PACKAGES!r}:\n"
        "            raise ImportError(f'{name} is server-side')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for module in {CLIENT_MODULES!r}:\n"
        "    __import__(module)\n"
        "print('imported')\n")
    result = run_python(blocker, tmp_path)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr


def test_package_is_found_from_any_directory_and_points_at_this_checkout(tmp_path):
    result = run_python("import fusedresnet.backend.spec as spec; print(spec.MODEL_REPOSITORY)", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(MODEL_REPOSITORY)
    assert (MODEL_REPOSITORY / "resnet18_custom" / "config.pbtxt").is_file()
