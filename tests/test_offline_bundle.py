"""The offline bundle for a GPU host with no package index (scripts/make_offline_bundle.sh,
scripts/offline_bundle_setup.sh), checked on the CPU: the scripts pass shellcheck, the bundle
asks for exactly the versions pyproject.toml pins (and the script repeats none of them), a
cuda-bindings of another CUDA major is refused, and the setup installs a bundle without an index,
puts its tools on PATH and installs again only when the bundle's requirements change. Building
a real bundle downloads about 50 MB: docs/GPU_HOST.md.

The A/B router's backend, which the bundle brings built: it builds with the C++ compiler alone, from the
RapidJSON and BLAKE2 vendored in backend/ab_router/ab_router_backend/third_party (a system copy of either is never read;
the digest covers them), its sticky hash is hashlib's blake2b, and the bundle script builds it in a checkout
where nothing is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
MAKE = ROOT / "scripts" / "make_offline_bundle.sh"
SETUP = ROOT / "scripts" / "offline_bundle_setup.sh"
# What the bundle must bring, by the extra of pyproject.toml that pins each (docs/GPU_HOST.md).
BUNDLED = {"nvidia-pytriton": "server", "tritonfrontend": "frontend", "tritonclient": "client", "locust": "loadtest",
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


# ---------------------------------------------------------------- the A/B router's backend, which the bundle brings

def router_build():
    from fusedresnet.backend.ab_router import build
    return build


def test_router_builds_from_its_vendored_code_alone_with_the_compiler(tmp_path, monkeypatch):
    """RapidJSON and BLAKE2 come from ab_router_backend/third_party: the command names no system library and only
    the project's include folders, and a system rapidjson/ or blake2.h on the compiler's own search path (poisoned
    here: CPATH, CPLUS_INCLUDE_PATH) is never read. The library needs the C library alone and exports only Triton's
    entry points."""
    build = router_build()
    assert build.BUILD_PACKAGES == ("g++",)
    command = build.compile_command("c++", tmp_path, tmp_path / build.LIBRARY_NAME)
    assert [flag for flag in command if flag.startswith("-l")] == ["-ldl"]
    assert [flag for flag in command if flag.startswith("-L")] == []
    includes = [Path(flag[2:]) for flag in command if flag.startswith("-I")]
    assert includes == [tmp_path, *build.INCLUDE_DIRS]
    assert all(folder.is_relative_to(build.SOURCE_DIR) for folder in build.INCLUDE_DIRS)
    assert str(build.BLAKE2_DIR / "blake2b-ref.c") in command

    poison = tmp_path / "system-include"
    for header in ("blake2.h", "rapidjson/document.h", "rapidjson/stringbuffer.h", "rapidjson/writer.h",
                   "rapidjson/rapidjson.h"):
        (poison / header).parent.mkdir(parents=True, exist_ok=True)
        (poison / header).write_text('#error "a system header was read instead of the vendored one"\n')
    monkeypatch.setenv("CPATH", str(poison))
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", str(poison))
    monkeypatch.delenv(build.PREBUILT_ENV, raising=False)
    library = build.build(tmp_path / "out")
    assert library == build.library_path(tmp_path / "out")
    assert b"libb2.so" not in library.read_bytes()
    if shutil.which("nm"):   # binutils, which g++ brings
        def dynamic_symbols(which: str) -> list[str]:
            listed = subprocess.run(["nm", "-D", which, str(library)], capture_output=True, text=True, check=True)
            return [line.split()[-1] for line in listed.stdout.splitlines() if line.strip()]
        exported = dynamic_symbols("--defined-only")
        assert exported and all(name.startswith("TRITONBACKEND_") for name in exported), exported
        # BLAKE2b is in the library, not left for a system libb2 to resolve at load.
        assert not [name for name in dynamic_symbols("--undefined-only") if "blake2" in name]


def test_router_build_digest_covers_the_vendored_code(tmp_path, monkeypatch):
    """Every vendored header and C file is a source of the digest: a change to one builds a new library."""
    build = router_build()
    vendored = {path for path in build.THIRD_PARTY_DIR.rglob("*") if path.suffix in (".h", ".c")}
    assert {build.BLAKE2_DIR / "blake2b-ref.c", build.BLAKE2_DIR / "blake2.h",
            build.THIRD_PARTY_DIR / "rapidjson" / "include" / "rapidjson" / "document.h"} <= vendored
    assert vendored <= set(build.SOURCES)
    digest = build.build_digest()
    copy = tmp_path / "ab_router_backend"
    shutil.copytree(build.SOURCE_DIR, copy)
    monkeypatch.setattr(build, "SOURCES", tuple(copy / p.relative_to(build.SOURCE_DIR) for p in build.SOURCES))
    monkeypatch.setattr(build, "SOURCE_DIR", copy)
    assert build.build_digest() == digest   # the paths are not in it
    with open(copy / "third_party" / "blake2" / "blake2b-ref.c", "a") as source:
        source.write("\n")
    assert build.build_digest() != digest


def test_routers_sticky_share_is_pythons_with_the_vendored_blake2b(tmp_path):
    """The router's StickyShare (its text in ab_router.cc) compiled with the vendored BLAKE2b, as the build compiles
    it, puts every key where ab_config.sticky_share (hashlib.blake2b) does: empty, ASCII, UTF-8, one and more than
    one 128-byte block."""
    from fusedresnet.backend.ab_router.config import sticky_share
    build = router_build()
    source = build.COMPILED[0].read_text()
    start = source.index("double StickyShare(const std::string& key) {")
    function = source[start:source.index("\n}\n", start) + 3]
    (tmp_path / "ab_router_spec.h").write_text(build.generated_header())
    (tmp_path / "sticky.cc").write_text(
        '#include <cstdint>\n#include <cstdio>\n#include <string>\n#include "ab_router_spec.h"\n'
        f'#include "blake2.h"\n{function}\n'
        'int main(int argc, char** argv) {\n'
        '  for (int i = 1; i < argc; ++i) std::printf("%.17g\\n", StickyShare(argv[i]));\n}\n')
    program = tmp_path / "sticky"
    compiled = subprocess.run([build.compiler(), "-std=c++17", "-O2", "-Wall", f"-I{tmp_path}",
                               *(f"-I{folder}" for folder in build.INCLUDE_DIRS), str(tmp_path / "sticky.cc"),
                               "-x", "c++", str(build.COMPILED[1]), "-o", str(program)],
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    keys = ["", "a", "key-1", "0d1f8a4c-request-id", "clé-ключ-鍵", "x" * 127, "y" * 128, "z" * 129,
            *(f"key-{i}" for i in range(200))]
    shares = subprocess.run([str(program), *keys], capture_output=True, text=True, check=True).stdout.split()
    assert [float(share) for share in shares] == [sticky_share(key) for key in keys]


def test_bundle_builds_the_router_in_a_checkout_with_nothing_installed(tmp_path):
    """make_offline_bundle.sh in a fresh clone (no .venv, no make setup): its python3 sees no installed package
    (a python3 -S stand-in here, which also stands in for pip's downloads: an empty wheel for each requirement),
    yet it builds the router's backend into the bundle."""
    build = router_build()
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for script in (MAKE, SETUP):
        shutil.copy(script, checkout / "scripts" / script.name)
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    (checkout / "backend").symlink_to(ROOT / "backend")   # so the library is make setup's, in the repository's build/
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "python3").write_text(f"""#!/usr/bin/env bash
if [[ $1 == -m && $2 == pip && $3 == download ]]; then
  shift 3; wheels=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      -d) folder=$2; shift 2 ;;
      --platform|--python-version|--implementation) shift 2 ;;
      -*) shift ;;
      *) name=${{1%%==*}}; name=${{name%%\\[*}}; wheels+=("${{name//-/_}}-${{1##*==}}-py3-none-any.whl"); shift ;;
    esac
  done
  mkdir -p "$folder" && cd "$folder" || exit 1
  exec "{sys.executable}" -S -c 'import sys, zipfile; [zipfile.ZipFile(w, "w").close() for w in sys.argv[1:]]' \
       "${{wheels[@]}}"
fi
exec "{sys.executable}" -S "$@"
""")
    (stand_ins / "python3").chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    pytriton = run_make("--print-requirements").stdout.split()[0]
    (bundle / "triton.version").write_text(pytriton + "\n")   # the Triton tree is there already: not downloaded
    (bundle / "triton.tar.xz").write_text("stand-in\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "FUSEDRESNET_HOME")}
    env["PATH"] = f"{stand_ins}:{env['PATH']}"
    unimportable = subprocess.run(["python3", "-c", "import fusedresnet.backend"], env=env, capture_output=True,
                                  text=True, cwd=tmp_path)
    assert "No module named 'fusedresnet'" in unimportable.stderr
    result = subprocess.run(["bash", str(checkout / "scripts" / MAKE.name), str(bundle)], env=env,
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (bundle / "ab_router_backend" / build.build_digest() / build.LIBRARY_NAME).is_file()
    pins = dict(line.split("==", 1) for line in run_make("--print-requirements").stdout.split())
    assert (bundle / "wheels" / f"locust-{pins['locust']}-py3-none-any.whl").is_file()
