"""Every CUDA source in kernels/ compiles for every architecture the engine supports (CPU only, no GPU).

`configs.ARCHS`: sm_80, sm_86, sm_89 and sm_90 (the mma.sync path, compiled
by CuPy's RawModule) and sm_90a (the wgmma path, compiled by
`kernels/nvrtc_build.py`). For each, the translation unit is exactly what the
engine compiles (`configs.source_text(arch)`, the same options) with every
kernel instantiation the launcher uses on that path:
- with nvcc (warnings as errors, no register spills in the matrix kernels, no
  serialised wgmma), plus a line that takes the address of each instantiation;
- with NVRTC, the library the engine compiles with (the CUDA toolkit's or the
  nvidia-cuda-nvrtc wheel's: this runs on a CPU-only machine), every name
  expression lowered.
A syntax error in a .cu file, or PTX that does not assemble for one target, cannot land.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from fusedresnet.kernels.configs import (
    ARCHS,
    COMPILE_OPTIONS,
    KERNEL_DIR,
    SOURCES,
    WGMMA_ARCH,
    WGMMA_SOURCES,
    WGMMA_TILES,
    name_expressions,
    nvrtc_options,
    source_text,
)

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA kernels here")


def test_every_cu_file_is_part_of_the_compiled_source():
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(SOURCES), "a .cu file in kernels/ is not listed in configs.SOURCES (never compiled)"
    for name in SOURCES:
        assert f"// ---- {name} ----" in source_text(WGMMA_ARCH)
    for name in WGMMA_SOURCES:   # wgmma does not assemble for the other targets
        assert f"// ---- {name} ----" not in source_text("sm_90")
    wgmma_names = {t.name_expression for t in WGMMA_TILES}
    assert wgmma_names <= set(name_expressions(WGMMA_ARCH))
    assert not wgmma_names & set(name_expressions("sm_80"))


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_for_arch_without_warnings_or_spills(arch, tmp_path):
    names = name_expressions(arch)
    source = source_text(arch) + "\nvoid *fusedresnet_instances[] = {" + ", ".join(
        f"(void *)&{name}" for name in names) + "};\n"
    path = tmp_path / "fusedresnet_kernels.cu"
    path.write_text(source)
    cmd = [NVCC, f"-arch={arch}", *COMPILE_OPTIONS, "-cubin", "-Werror", "all-warnings", "--resource-usage",
           "-o", str(tmp_path / "kernels.cubin"), str(path)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    report = result.stdout + result.stderr
    compiled = re.findall(r"Function properties for (\S+)", report)
    assert len(compiled) == len(names), report
    # The matrix kernels must keep their accumulators in registers.
    checked = 0
    for block in report.split("Function properties for ")[1:]:
        if block.startswith(("_Z18conv_implicit_gemm", "_Z10conv_wgmma")):
            assert " 0 bytes spill stores" in block, block
            checked += 1
    assert checked >= len([n for n in names if n.startswith(("conv_implicit_gemm", "conv_wgmma"))])
    # ptxas serialises wgmma (and says so, C7515/C7520) when the accumulators are touched while in flight.
    assert "Potential Performance Loss" not in report, report


def _find_nvrtc():
    """libnvrtc ($FUSEDRESNET_NVRTC, the CUDA toolkit or the nvidia-cuda-nvrtc wheel), if any is here."""
    import ctypes
    import ctypes.util
    import glob
    import os
    import site
    candidates = [os.environ.get("FUSEDRESNET_NVRTC"), ctypes.util.find_library("nvrtc")]
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        candidates += sorted(glob.glob(f"{root}/nvidia/*/lib/libnvrtc.so*"))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for path in filter(None, candidates):
        if "builtins" in path or ".alt." in path:
            continue
        try:
            # libnvrtc dlopens its builtins library by name: load the one beside it first.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_under_nvrtc_like_the_engine(arch):
    """The exact compile of the engine for `arch`: NVRTC, the launcher's options, every name expression lowered.

    mma path: what CuPy's RawModule hands NVRTC (our options, -ftz=true, the architecture);
    sm_90a: what nvrtc_build.compile_cubin hands it (the same list).
    """
    import ctypes
    nvrtc = _find_nvrtc()
    if nvrtc is None:
        pytest.skip("libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)")
    program = ctypes.c_void_p()
    created = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source_text(arch).encode(), b"fusedresnet.cu", 0,
                                       None, None)
    assert created == 0
    names = name_expressions(arch)
    for name in names:
        assert nvrtc.nvrtcAddNameExpression(program, name.encode()) == 0
    options = [o.encode() for o in nvrtc_options(arch)]
    result = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    assert result == 0, log.value.decode()
    assert "warning" not in log.value.decode(), log.value.decode()
    for name in names:
        lowered = ctypes.c_char_p()
        assert nvrtc.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(lowered)) == 0, name
    cubin_size = ctypes.c_size_t()
    assert nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(cubin_size)) == 0 and cubin_size.value > 0


def test_conv_path_is_wgmma_on_cc_9_0_only_and_can_be_forced(monkeypatch):
    from fusedresnet.kernels.configs import CONV_PATH_ENV, conv_path
    monkeypatch.delenv(CONV_PATH_ENV, raising=False)
    assert conv_path((9, 0)) == "wgmma"
    assert [conv_path(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))] == ["mma"] * 5
    monkeypatch.setenv(CONV_PATH_ENV, "mma")
    assert conv_path((9, 0)) == "mma"
    assert conv_path((9, 0), "wgmma") == "wgmma"          # an explicit argument beats the environment
    monkeypatch.setenv(CONV_PATH_ENV, "wgmma")
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        conv_path((8, 9))                                  # never a silent fallback
    monkeypatch.setenv(CONV_PATH_ENV, "tensor")
    with pytest.raises(ValueError, match="auto, mma or wgmma"):
        conv_path((9, 0))


def test_tuned_plans_apply_only_to_the_gpu_and_conv_path_they_were_measured_on():
    import json

    from fusedresnet.kernels.configs import TUNED_PLANS, load_tuned_plans
    table = json.loads(TUNED_PLANS.read_text())
    device, path = table["device"], table.get("conv_path", "mma")
    assert len(load_tuned_plans(device, path)) == len(table["plans"]) > 0
    assert load_tuned_plans(device, "wgmma" if path == "mma" else "mma") == {}
    assert load_tuned_plans("NVIDIA A100-SXM4-80GB", path) == {}
