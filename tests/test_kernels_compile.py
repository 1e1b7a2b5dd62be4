"""Every CUDA source in kernels/ compiles for sm_80 and sm_90 (CPU only: needs nvcc, no GPU).

The translation unit is exactly what the engine hands CuPy's RawModule
(`configs.source_text()`, the same options), plus a line that takes the
address of every kernel instantiation the launcher uses, so each template is
compiled, with warnings treated as errors. A syntax error in a .cu file
cannot land.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from fusedresnet.kernels.configs import COMPILE_OPTIONS, KERNEL_DIR, SOURCES, name_expressions, source_text

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA kernels here")


def test_every_cu_file_is_part_of_the_compiled_source():
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(SOURCES), "a .cu file in kernels/ is not listed in configs.SOURCES (never compiled)"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_for_arch_without_warnings_or_spills(arch, tmp_path):
    source = source_text() + "\nvoid *fusedresnet_instances[] = {" + ", ".join(
        f"(void *)&{name}" for name in name_expressions()) + "};\n"
    path = tmp_path / "fusedresnet_kernels.cu"
    path.write_text(source)
    cmd = [NVCC, f"-arch={arch}", *COMPILE_OPTIONS, "-cubin", "-Werror", "all-warnings", "--resource-usage",
           "-o", str(tmp_path / "kernels.cubin"), str(path)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    report = result.stdout + result.stderr
    compiled = re.findall(r"Function properties for (\S+)", report)
    assert len(compiled) == len(name_expressions()), report
    # The matrix kernels must keep their accumulators in registers.
    for block in report.split("Function properties for ")[1:]:
        if block.startswith("_Z18conv_implicit_gemm"):
            assert " 0 bytes spill stores" in block, block


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


def test_kernels_compile_under_nvrtc_like_cupy():
    """The exact RawModule compile: NVRTC, the launcher's options, every name expression lowered."""
    import ctypes
    nvrtc = _find_nvrtc()
    if nvrtc is None:
        pytest.skip("libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)")
    program = ctypes.c_void_p()
    created = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source_text().encode(), b"fusedresnet.cu", 0, None, None)
    assert created == 0
    names = name_expressions()
    for name in names:
        assert nvrtc.nvrtcAddNameExpression(program, name.encode()) == 0
    options = [o.encode() for o in COMPILE_OPTIONS] + [b"-arch=sm_90"]
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
