"""The offline bundle for a GPU host with no package index (scripts/make_offline_bundle.sh,
scripts/offline_bundle_setup.sh), checked on the CPU: the scripts pass shellcheck, the bundle
asks for exactly the versions pyproject.toml pins (and the script repeats none of them), a
cuda-bindings of another CUDA major is refused, and the setup installs a bundle without an index,
puts its tools on PATH and installs again only when the bundle's requirements change. Building
a real bundle downloads about 50 MB: docs/GPU_HOST.md."""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
MAKE = ROOT / "scripts" / "make_offline_bundle.sh"
SETUP = ROOT / "scripts" / "offline_bundle_setup.sh"
# What the bundle must bring, by the extra of pyproject.toml that pins each (docs/GPU_HOST.md).
BUNDLED = {"nvidia-pytriton": "server", "tritonclient": "client", "locust": "loadtest",
           "prometheus_client": "loadtest", "perf-analyzer": "perf", "cuda-bindings": "cuda",
           "cuda-pathfinder": "cuda"}


def pyproject_pins() -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {}
    for name, extra in BUNDLED.items():
        matching = [r for r in extras[extra] if r.split("==")[0].split("[")[0] == name]
        assert len(matching) == 1, f"pyproject.toml's extra {extra} pins {name} once: {extras[extra]}"
        pins[name] = matching[0]
    return pins


def run_make(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(MAKE), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


@pytest.mark.skipif(shutil.which("shellcheck") is None and os.environ.get("CI") != "true",
                    reason="shellcheck not installed (.ci/apt-packages/offline-bundle)")
def test_gpu_host_scripts_pass_shellcheck():
    """The bundle's scripts and every GPU-host task script (they run where nothing can be fixed in place)."""
    scripts = sorted({MAKE, SETUP, *(ROOT / "scripts").glob("*.sh"), ROOT / "kernels" / "gpu_check.sh"})
    result = subprocess.run(["shellcheck", "-x", *map(str, scripts)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bundle_asks_for_exactly_the_versions_pyproject_pins():
    result = run_make("--print-requirements")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == sorted(pyproject_pins().values())


def test_bundle_script_repeats_no_pinned_version():
    text = MAKE.read_text() + SETUP.read_text()
    for requirement in pyproject_pins().values():
        version = requirement.split("==")[1]
        assert version not in text, f"{requirement}: the version belongs to pyproject.toml alone"


def test_bundle_refuses_a_package_pyproject_does_not_pin(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(MAKE, tmp_path / "scripts" / MAKE.name)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(pyproject.replace(pyproject_pins()["perf-analyzer"], "perf-analyzer"))
    result = subprocess.run(["bash", str(tmp_path / "scripts" / MAKE.name), "--print-requirements"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "pins no version of perf-analyzer" in result.stderr
    assert result.stdout == ""


def test_bundle_refuses_cuda_bindings_of_another_cuda_major():
    pinned_major = pyproject_pins()["cuda-bindings"].split("==")[1].split(".")[0]
    other = str(int(pinned_major) - 1)
    refused = run_make("--print-requirements", CUDA_MAJOR=other)
    assert refused.returncode == 2
    assert f"the host's CUDA is {other}" in refused.stderr and "CUDA_BINDINGS_VERSION" in refused.stderr
    chosen = run_make("--print-requirements", CUDA_MAJOR=other, CUDA_BINDINGS_VERSION=f"{other}.9.4")
    assert chosen.returncode == 0, chosen.stderr
    assert f"cuda-bindings=={other}.9.4" in chosen.stdout.split()
    mismatched = run_make("--print-requirements", CUDA_BINDINGS_VERSION=f"{other}.9.4")
    assert mismatched.returncode == 2 and "does not match CUDA_MAJOR" in mismatched.stderr


def write_wheel(folder: Path, module: str, version: str) -> None:
    """A pure-Python wheel holding one module that records its version."""
    dist = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{module}.py", f"VERSION = {version!r}\n")
        wheel.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n")
        wheel.writestr(f"{dist}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}/RECORD", "")


def make_bundle(bundle: Path, version: str) -> None:
    """A bundle laid out as make_offline_bundle.sh lays it out, with a stand-in server tree."""
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / "wheels").mkdir(parents=True)
    tree = bundle.parent / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    for folder in ("pytriton/tritonserver/bin", "nvidia_pytriton.libs", "perf_analyzer/bin"):
        (tree / folder).mkdir(parents=True)
    for tool in ("pytriton/tritonserver/bin/tritonserver", "perf_analyzer/bin/perf_analyzer"):
        (tree / tool).write_text(f"#!/bin/sh\necho {Path(tool).name} {version}\n")
        (tree / tool).chmod(0o755)
    with tarfile.open(bundle / "triton.tar.xz", "w:xz") as archive:
        for path in sorted(tree.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(tree)), recursive=False)
    write_wheel(bundle / "wheels", "bundleprobe", version)
    (bundle / "requirements.txt").write_text(f"bundleprobe=={version}\n")
    shutil.copy(SETUP, bundle / "setup.sh")


def source_setup(bundle: Path, site: Path) -> list[str]:
    script = (f'source "{bundle}/setup.sh" && python3 -c "import bundleprobe; print(bundleprobe.VERSION)"'
              ' && tritonserver && perf_analyzer && echo "$TRITON_HOME" && echo "$LD_LIBRARY_PATH"')
    env = {**os.environ, "GPU_SITE": str(site), "PIP_NO_INDEX": "1"}
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("\n")


def test_bundle_setup_installs_without_an_index_and_again_only_when_the_bundle_changes(tmp_path):
    bundle, site = tmp_path / "bundle", tmp_path / "site"
    make_bundle(bundle, "1.0")
    version, server, perf, triton_home, libraries = source_setup(bundle, site)[:5]
    assert (version, server, perf) == ("1.0", "tritonserver 1.0", "perf_analyzer 1.0")
    assert triton_home == str(site / "pytriton" / "tritonserver")
    assert libraries.split(":")[0] == str(site / "nvidia_pytriton.libs")

    (site / "bundleprobe.py").write_text("VERSION = 'kept'\n")   # the same bundle: no new install
    assert source_setup(bundle, site)[0] == "kept"

    make_bundle(bundle, "2.0")                                  # a new bundle: installed afresh
    assert source_setup(bundle, site)[:3] == ["2.0", "tritonserver 2.0", "perf_analyzer 2.0"]
