"""The package works from any directory, and its client side imports without the server side."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fusedresnet.backend.spec import MODEL_REPOSITORY, REPO_ROOT

# What only the server, the load tests or the GPU need (extras server, loadtest, gpu).
SERVER_SIDE_PACKAGES = ("torch", "pytriton", "triton_python_backend_utils", "psutil", "locust", "matplotlib",
                        "prometheus_client", "cupy")
CLIENT_MODULES = ("fusedresnet.backend.spec", "fusedresnet.backend.network",
                  "fusedresnet.backend.repository.prepared_stamp", "fusedresnet.client.preprocess",
                  "fusedresnet.client.agreement", "fusedresnet.client.resnet_client",
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


# --- The GPU install: one CUDA major across torch, CuPy, NVRTC and cuda-bindings -------------------------

GPU_PYTHON = "3.12"   # the GPU host's
GPU_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)] + ["manylinux2014_x86_64"]
# pip >= 23.3 resolves a --dry-run from the wheels' metadata alone (with fast-deps: HTTP range requests) instead
# of downloading gigabytes of CUDA wheels; the virtual environment's pip may be older, so the check runs this
# one from its wheel (`python pip.whl/pip ...`).
RESOLVER_PIP = "pip==26.3"
CUDA_PACKAGES = ("torch", "cupy", "nvidia-cuda-nvrtc", "cuda-bindings")


def cuda_major_of(name: str, version: str) -> int | None:
    """The CUDA major a resolved package is built for, where its name or version says so."""
    name = canonicalize_name(name)
    suffix = re.fullmatch(r"nvidia-.+-cu(\d+)|cupy-cuda(\d+)x", name)
    if suffix:
        return int(suffix.group(1) or suffix.group(2))
    # Packages versioned by the CUDA release (not cuFFT, cuRAND, ... which have their own versions).
    if name in ("cuda-toolkit", "cuda-bindings", "nvidia-nvjitlink", "nvidia-cublas", "nvidia-nvtx") \
            or name.startswith("nvidia-cuda-"):
        return int(version.split(".")[0])
    return None


def gpu_step_requirements() -> list[str]:
    """What `make setup` installs on a GPU machine, where CUDA is concerned: the gpu extra, the server
    extra's torch and the dev extra's CUDA packages (pyproject.toml)."""
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = [Requirement(r) for r in extras["server"] + extras["dev"]]
    return [".[gpu]"] + [str(r) for r in pinned
                         if r.name == "torch" or "cuda" in canonicalize_name(r.name)]


def test_cuda_major_is_read_from_names_and_versions():
    assert cuda_major_of("nvidia-cudnn-cu13", "9.20.0.48") == 13 and cuda_major_of("cupy-cuda12x", "14.2.0") == 12
    assert cuda_major_of("nvidia-cuda-nvrtc-cu12", "12.9.86") == 12
    assert cuda_major_of("nvidia_cuda_nvrtc", "13.0.88") == 13
    assert cuda_major_of("cuda-bindings", "13.0.3") == 13 and cuda_major_of("nvidia-cufft", "12.0.0.61") is None
    assert cuda_major_of("numpy", "2.4.6") is None


def test_gpu_install_resolves_to_one_cuda_major_matching_the_torch_wheel(tmp_path):
    """pip, for the GPU host's platform (Python 3.12, manylinux x86_64), resolves the GPU install from
    PyPI to one set in which torch's CUDA libraries, CuPy, NVRTC and cuda-bindings share one CUDA major."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "-d", str(tmp_path), RESOLVER_PIP], env=env, capture_output=True, text=True, timeout=300)
    if fetched.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot reach PyPI from CI: {fetched.stderr[-2000:]}")
        pytest.skip("PyPI unreachable here (the check runs in CI)")
    pip_wheel = next(tmp_path.glob("pip-*.whl"))
    platforms = [arg for platform in GPU_PLATFORMS for arg in ("--platform", platform)]
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, str(pip_wheel / "pip"), "install", "--dry-run", "--ignore-installed", "--quiet",
         "--use-feature=fast-deps", "--only-binary=:all:", "--python-version", GPU_PYTHON, "--implementation", "cp",
         *platforms, "--report", str(report), *gpu_step_requirements()],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert resolved.returncode == 0, resolved.stderr[-4000:]
    installed = {canonicalize_name(item["metadata"]["name"]): item["metadata"]
                 for item in json.loads(report.read_text())["install"]}
    for name in CUDA_PACKAGES:
        assert any(n == name or n.startswith(name + "-") for n in installed), f"{name} is not in the GPU install"
    torch_cuda = {int(m.group(1)) for r in installed["torch"].get("requires_dist", [])
                  if (m := re.match(r"cuda-toolkit\S*==(\d+)\.", r.replace(" ", "")))}
    assert len(torch_cuda) == 1, installed["torch"].get("requires_dist")
    majors = {name: major for name, meta in installed.items()
              if (major := cuda_major_of(name, meta["version"])) is not None}
    assert set(majors.values()) == torch_cuda, f"CUDA majors: {majors}, torch's: {torch_cuda}"


def test_make_setup_installs_the_gpu_extra_where_it_finds_an_nvidia_gpu(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    venv = tmp_path / "venv"

    def planned(env_path: str, *overrides: str) -> str:
        result = subprocess.run(["make", "-n", "-B", f"VENV={venv}", *overrides, "setup"], cwd=REPO_ROOT,
                                env={**os.environ, "PATH": env_path}, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    with_gpu = planned(f"{fake_bin}:{os.environ['PATH']}")
    assert "pip install -q -e '.[server,client,loadtest,dev]'" in with_gpu and "pip install -q -e '.[gpu]'" in with_gpu
    assert "'.[gpu]'" not in planned(os.environ["PATH"], "NVIDIA_GPU=")
