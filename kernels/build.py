"""The build recipe: which sources make the translation unit, with which options, for which architectures.

`source_text(arch)` is the one translation unit the engine compiles (NVRTC through `nvrtc_build` or CuPy), the
compile tests build with nvcc and `sass_diff` dumps: the generated geometry preamble, the headers once, the
.cu files. `name_expressions(arch)` lists every kernel instantiation of it, `kernel_smem(arch)` their dynamic
shared memory. Pure Python: nothing here needs CuPy or a GPU, so the kernels compiled in CI are exactly those
the engine launches.
"""

from __future__ import annotations

from pathlib import Path

from .geometry import (
    GEOMETRY,
    HEAD_IMGS,
    SMEM_BYTES,
    STEM_POOL_SMEM_BYTES,
    STEM_SMEM_BYTES,
    STEM_WGMMA_SMEM_BYTES,
    WGMMA_ONLY_GEOMETRY,
)
from .tiles import (
    CONV_TILES,
    OTHER_KERNELS,
    PATCH_TILES,
    PATCH_WGMMA_TILES,
    STEM_KERNELS,
    STEM_POOL_KERNELS,
    STEM_POOL_WGMMA_KERNELS,
    STEM_TILES,
    WGMMA_CONV_TILES,
    ConvInput,
    Epilogue,
    Schedule,
    StemInput,
    shortcut_applies,
    shortcut_name_expression,
)

KERNEL_DIR = Path(__file__).resolve().parent
DEV_DIR = KERNEL_DIR / "dev"   # experiments beside the served kernels, each runnable as a check and a benchmark
MMA_SOURCES = ("conv_implicit_gemm.cu", "conv3x3_patch.cu", "stem.cu", "pool_head.cu")
WGMMA_SOURCES = ("conv_wgmma.cu", "conv3x3_patch_wgmma.cu", "stem_wgmma.cu")     # sm_90a only
SOURCES = MMA_SOURCES + WGMMA_SOURCES
# The shared headers, pasted at the top of the translation unit in this order
# (each .cu includes those it uses, for readers and editors; source_text drops
# the #include lines).
HEADERS = ("common.cuh", "epilogue.cuh", "loaders.cuh", "warp_mma.cuh", "stem.cuh")
WGMMA_HEADERS = ("wgmma.cuh",)      # sm_90a only, pasted before WGMMA_SOURCES
# Options passed to CuPy's RawModule (NVRTC). CuPy adds the architecture
# (-arch=sm_XY for the current device) itself, and -ftz=true; the compile
# tests add both.
COMPILE_OPTIONS = ("-std=c++17",)
CUPY_ADDED_OPTIONS = ("-ftz=true",)
WGMMA_ARCH = "sm_90a"
# Every target the engine compiles for (the compile tests build each one):
# the mma path on the Ampere/Ada parts and on an H100 forced to it, sm_90a for wgmma.
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", WGMMA_ARCH)


def wgmma_arch(arch: str | None) -> bool:
    return arch == WGMMA_ARCH


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Everything NVRTC gets for `arch`: our options, those CuPy adds, the architecture."""
    return COMPILE_OPTIONS + CUPY_ADDED_OPTIONS + (f"-arch={arch}",)


def geometry_preamble(arch: str | None = None) -> str:
    """GEOMETRY and SMEM_BYTES as C++ constexpr definitions: the first lines of the translation unit for `arch`."""
    lines = ["// Generated from kernels/geometry.py (GEOMETRY, SMEM_BYTES): the one definition of the kernels'",
             "// fixed geometry, shared with the launcher. Do not restate these in the .cu files."]
    skip = () if wgmma_arch(arch) else WGMMA_ONLY_GEOMETRY
    lines += [f"constexpr int {name} = {value};" for name, value in GEOMETRY.items() if name not in skip]
    for key, expr in SMEM_BYTES.items():
        if key in skip:
            continue
        if "(" in key:
            name, params = key.split("(")
            args = ", ".join(f"int {p}" for p in params.rstrip(")").split(", "))
            lines.append(f"__host__ __device__ constexpr int {name}({args}) {{ return {expr}; }}")
        else:
            lines.append(f"constexpr int {key} = {expr};")
    # The kernels' named template arguments: ConvInput and StemInput on every target, the wgmma tiles'
    # schedules and epilogues (conv_wgmma*) on sm_90a.
    for enum in (ConvInput, StemInput) + ((Schedule, Epilogue) if wgmma_arch(arch) else ()):
        lines.append(f"enum class {enum.__name__} : int {{ " + ", ".join(
            f"{member.name} = {index}" for index, member in enumerate(enum)) + " };")
    return "\n".join(lines) + "\n"


def source_text(arch: str | None = None, dev_sources: tuple[Path, ...] = ()) -> str:
    """The kernel sources for `arch` as one translation unit: the geometry, the HEADERS once, the .cu files.

    WGMMA_HEADERS and WGMMA_SOURCES are part of it only for sm_90a, after the others (wgmma does not
    assemble for any other target); `dev_sources` (experiments of kernels/dev/, never served) last.
    """
    parts = [geometry_preamble(arch)] + [_drop_includes((KERNEL_DIR / name).read_text()) for name in HEADERS]
    for name in MMA_SOURCES:
        parts.append(f"// ---- {name} ----\n" + _drop_includes((KERNEL_DIR / name).read_text()))
    if wgmma_arch(arch):
        parts += [_drop_includes((KERNEL_DIR / name).read_text()) for name in WGMMA_HEADERS]
        for name in WGMMA_SOURCES:
            parts.append(f"// ---- {name} ----\n" + _drop_includes((KERNEL_DIR / name).read_text()))
    for path in dev_sources:
        parts.append(f"// ---- dev/{path.name} ----\n" + _drop_includes(path.read_text()))
    return "\n".join(parts)


def _drop_includes(text: str) -> str:
    """The text without its `#include "<header>"` lines (every header is pasted once, first)."""
    for name in HEADERS + WGMMA_HEADERS:
        text = text.replace(f'#include "{name}"', "").replace(f'#include "../{name}"', "")
    return text


def name_expressions(arch: str | None = None) -> list[str]:
    """Every kernel instantiation the launcher uses on `arch` (the wgmma ones only on sm_90a)."""
    wgmma_tiles = WGMMA_CONV_TILES
    wgmma = ([t.name_expression for t in wgmma_tiles + PATCH_WGMMA_TILES] + list(STEM_POOL_WGMMA_KERNELS.values())
             + [shortcut_name_expression(t) for t in wgmma_tiles if shortcut_applies(t)]
             if wgmma_arch(arch) else [])
    return ([t.name_expression for t in CONV_TILES + tuple(STEM_TILES.values()) + PATCH_TILES]
            + [shortcut_name_expression(t) for t in CONV_TILES if shortcut_applies(t)] + list(OTHER_KERNELS) + wgmma)


def kernel_smem(arch: str | None = None) -> dict[str, int]:
    """{name expression: the dynamic shared memory its launches may ask for} of every kernel instantiation the
    launcher can use on `arch` (`name_expressions`: the tuner's candidates and what the checks run)."""
    tiles = CONV_TILES + tuple(STEM_TILES.values()) + PATCH_TILES
    if wgmma_arch(arch):
        tiles += WGMMA_CONV_TILES + PATCH_WGMMA_TILES
    smem = {}
    for tile in tiles:
        smem[tile.name_expression] = tile.smem_bytes
        if shortcut_applies(tile):
            smem[shortcut_name_expression(tile)] = tile.smem_bytes
    smem.update(dict.fromkeys(STEM_KERNELS.values(), STEM_SMEM_BYTES))
    smem.update(dict.fromkeys(STEM_POOL_KERNELS.values(), STEM_POOL_SMEM_BYTES))
    smem.update(dict.fromkeys(("splitk_epilogue", "maxpool_3x3s2", f"avgpool_fc<{HEAD_IMGS}>"), 0))
    if wgmma_arch(arch):
        smem.update(dict.fromkeys(STEM_POOL_WGMMA_KERNELS.values(), STEM_WGMMA_SMEM_BYTES))
    return smem
