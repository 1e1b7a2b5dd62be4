"""Kernel variants, compile options and the per-layer launch plan (pure Python).

Nothing here needs CuPy or a GPU: the CPU compile test and the launcher both
import it, so the kernels compiled in CI are exactly those the engine launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
TUNED_PLANS = KERNEL_DIR / "tuned_plans.json"   # written by `python -m fusedresnet.kernels.tune`
MMA_SOURCES = ("conv_implicit_gemm.cu", "conv3x3_patch.cu", "stem.cu", "pool_head.cu")
WGMMA_SOURCES = ("conv_wgmma.cu",)     # sm_90a only
SOURCES = MMA_SOURCES + WGMMA_SOURCES

# Options passed to CuPy's RawModule (NVRTC). CuPy adds the architecture
# (-arch=sm_XY for the current device) itself, and -ftz=true; the compile
# tests add both.
COMPILE_OPTIONS = ("-std=c++17",)
CUPY_ADDED_OPTIONS = ("-ftz=true",)

# The two convolution paths. "mma": mma.sync kernels, compiled by CuPy's
# RawModule for whatever architecture CuPy picks (sm_80, sm_86, sm_89, sm_90,
# ...). "wgmma": compute capability 9.0 only; the module (every kernel plus
# conv_wgmma.cu) is compiled for sm_90a by nvrtc_build.py, and the convolutions
# run on conv_wgmma. FUSEDRESNET_CONV_PATH=mma|wgmma|auto overrides the choice
# (auto: wgmma on cc 9.0, mma elsewhere).
CONV_PATH_ENV = "FUSEDRESNET_CONV_PATH"
CONV_PATHS = ("mma", "wgmma")
WGMMA_ARCH = "sm_90a"
WGMMA_CC = (9, 0)
# Every target the engine compiles for (the compile tests build each one):
# the mma path on the Ampere/Ada parts and on an H100 forced to it, sm_90a for wgmma.
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", WGMMA_ARCH)

BK = 64                 # reduction slice per pipeline stage (see common.cuh, conv_implicit_gemm.cu)
STEM_KG_PADDED = 192    # 7*7*3 = 147 reduction values, padded to whole k-tiles
HEAD_IMGS = 8           # images per avgpool_fc block
HEAD_BLOCKS_X = 4       # class slices per avgpool_fc grid row


@dataclass(frozen=True)
class TileConfig:
    """One instantiation of conv_implicit_gemm."""

    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    mode: int = 0        # 0: fp16 NHWC input; 1: stem, uint8 NHWC; 2: stem, fp32 NCHW
    efficiency: float = 1.0   # relative tensor-core efficiency per SM (cost model)
    blocks_per_sm: int = 1    # resident blocks per SM (from smem/threads/registers)

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def smem_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * BK * 2

    @property
    def name_expression(self) -> str:
        return (f"conv_implicit_gemm<{self.bm},{self.bn},{self.warps_m},{self.warps_n},"
                f"{self.stages},{self.mode}>")

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}w{self.warps_m}x{self.warps_n}s{self.stages}"


CONV_TILES = (
    TileConfig(128, 128, 2, 4, 3, efficiency=1.00, blocks_per_sm=2),
    TileConfig(128, 64, 4, 2, 4, efficiency=0.90, blocks_per_sm=2),
    TileConfig(64, 128, 2, 4, 4, efficiency=0.90, blocks_per_sm=2),
    TileConfig(64, 64, 2, 2, 4, efficiency=0.75, blocks_per_sm=3),
    # 64x64 / 64x32 warp tiles: fewer shared-memory bytes per MAC (see NOTES.md).
    TileConfig(128, 128, 2, 2, 3, efficiency=1.05, blocks_per_sm=2),
    TileConfig(128, 64, 2, 2, 4, efficiency=0.95, blocks_per_sm=2),
    TileConfig(128, 128, 2, 4, 4, efficiency=1.0, blocks_per_sm=1),
)


@dataclass(frozen=True)
class WgmmaConfig:
    """One instantiation of conv_wgmma (sm_90a): BM x BN tile, `warpgroups` consumers of 128 threads."""

    bm: int
    bn: int
    warpgroups: int
    stages: int
    efficiency: float = 1.0   # cost model, relative to the mma.sync 128x128 tile (see plan_conv)
    blocks_per_sm: int = 1

    @property
    def threads(self) -> int:
        return self.warpgroups * 128

    @property
    def smem_bytes(self) -> int:
        # + 1024: the kernel aligns its ring to a 1024-byte boundary (the swizzle atom).
        return self.stages * (self.bm + self.bn) * BK * 2 + 1024

    @property
    def name_expression(self) -> str:
        return f"conv_wgmma<{self.bm},{self.bn},{self.warpgroups},{self.stages}>"

    @property
    def label(self) -> str:
        return f"wg{self.bm}x{self.bn}g{self.warpgroups}s{self.stages}"


# Default wgmma tiles (untuned: efficiency is the predicted SM throughput relative
# to the mma.sync 128x128 tile, from the shared-memory traffic per MAC; NOTES.md).
# 228 KB of shared memory per SM: blocks_per_sm from smem_bytes.
WGMMA_TILES = (
    WgmmaConfig(128, 128, 2, 4, efficiency=1.8, blocks_per_sm=1),   # 129 KB
    WgmmaConfig(128, 128, 2, 3, efficiency=1.7, blocks_per_sm=2),   # 97 KB
    WgmmaConfig(128, 256, 2, 4, efficiency=1.95, blocks_per_sm=1),  # 193 KB
    WgmmaConfig(128, 64, 2, 4, efficiency=1.4, blocks_per_sm=2),    # 97 KB
    WgmmaConfig(64, 128, 1, 4, efficiency=1.4, blocks_per_sm=2),    # 97 KB
    WgmmaConfig(128, 128, 1, 4, efficiency=1.6, blocks_per_sm=1),   # 129 KB, one warpgroup, two m64 blocks
    WgmmaConfig(64, 64, 1, 4, efficiency=1.0, blocks_per_sm=3),     # 65 KB
)


@dataclass(frozen=True)
class PatchConfig:
    """One instantiation of conv3x3_patch (3x3, stride 1, pad 1; input patch in shared memory)."""

    th: int
    tw: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    smem_epilogue: bool = False

    @property
    def bm(self) -> int:
        return self.th * self.tw

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def smem_bytes(self) -> int:
        return 2 * (self.th + 2) * (self.tw + 2) * 64 * 2 + self.stages * self.bn * 64 * 2

    @property
    def name_expression(self) -> str:
        return (f"conv3x3_patch<{self.th},{self.tw},{self.bn},{self.warps_m},{self.warps_n},{self.stages},"
                f"{'true' if self.smem_epilogue else 'false'}>")

    @property
    def label(self) -> str:
        return (f"patch{self.th}x{self.tw}n{self.bn}w{self.warps_m}x{self.warps_n}s{self.stages}"
                + ("e" if self.smem_epilogue else ""))


PATCH_TILES = (
    PatchConfig(8, 16, 64, 4, 2, 4),
    PatchConfig(8, 16, 64, 2, 2, 4),
    PatchConfig(4, 32, 64, 4, 2, 4),
    PatchConfig(4, 32, 128, 2, 4, 3),
    PatchConfig(8, 16, 128, 2, 4, 3),
    PatchConfig(8, 16, 64, 4, 2, 4, smem_epilogue=True),
    PatchConfig(4, 32, 128, 2, 4, 3, smem_epilogue=True),
    PatchConfig(4, 32, 64, 4, 2, 4, smem_epilogue=True),
)

STEM_TILES = {
    "uint8": TileConfig(128, 64, 4, 2, 3, mode=1),
    "float32": TileConfig(128, 64, 4, 2, 3, mode=2),
}
STEM_KERNELS = {"uint8": "stem_conv7x7s2<1>", "float32": "stem_conv7x7s2<2>"}
STEM_SMEM_BYTES = (128 + 64) * STEM_KG_PADDED * 2 + 21 * 112 * 2   # A + B tiles + input patch (stem.cu)
STEM_TILE_H, STEM_TILE_W = 8, 16
STEM_POOL_KERNELS = {"uint8": "stem_pool_conv7x7s2<1>", "float32": "stem_pool_conv7x7s2<2>"}
STEM_POOL_SMEM_BYTES = (160 + 64) * STEM_KG_PADDED * 2 + 23 * 118 * 2   # A + B tiles + input patch
STEM_POOL_TILE_H, STEM_POOL_TILE_W = 4, 8    # pooled pixels per block tile
OTHER_KERNELS = ("splitk_epilogue", "maxpool_3x3s2", f"avgpool_fc<{HEAD_IMGS}>", *STEM_KERNELS.values(),
                 *STEM_POOL_KERNELS.values())


def conv_path(cc: tuple[int, int], requested: str | None = None) -> str:
    """The convolution path for a device of compute capability `cc`: "wgmma" on 9.0, else "mma".

    `requested` (default: $FUSEDRESNET_CONV_PATH) may force "mma" anywhere, or
    "wgmma" (an error off cc 9.0: no silent fallback).
    """
    import os
    choice = (requested if requested is not None else os.environ.get(CONV_PATH_ENV, "")).strip().lower() or "auto"
    if choice == "auto":
        return "wgmma" if tuple(cc) == WGMMA_CC else "mma"
    if choice not in CONV_PATHS:
        raise ValueError(f"{CONV_PATH_ENV}={choice!r}: expected auto, mma or wgmma")
    if choice == "wgmma" and tuple(cc) != WGMMA_CC:
        raise RuntimeError(f"the wgmma path needs compute capability 9.0 (sm_90a), this device is {cc[0]}.{cc[1]}")
    return choice


def wgmma_arch(arch: str | None) -> bool:
    return arch == WGMMA_ARCH


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Everything NVRTC gets for `arch`: our options, those CuPy adds, the architecture."""
    return COMPILE_OPTIONS + CUPY_ADDED_OPTIONS + (f"-arch={arch}",)


def name_expressions(arch: str | None = None) -> list[str]:
    """Every kernel instantiation the launcher uses on `arch` (the wgmma ones only on sm_90a)."""
    wgmma = [t.name_expression for t in WGMMA_TILES] if wgmma_arch(arch) else []
    return ([t.name_expression for t in CONV_TILES + tuple(STEM_TILES.values()) + PATCH_TILES]
            + list(OTHER_KERNELS) + wgmma)


def source_text(arch: str | None = None) -> str:
    """The kernel sources for `arch` as one translation unit, `#include "common.cuh"` pasted in once.

    conv_wgmma.cu is part of it only for sm_90a (wgmma does not assemble for any other target).
    """
    common = (KERNEL_DIR / "common.cuh").read_text()
    parts = [common]
    for name in SOURCES if wgmma_arch(arch) else MMA_SOURCES:
        text = (KERNEL_DIR / name).read_text()
        parts.append(f"// ---- {name} ----\n" + text.replace('#include "common.cuh"', ""))
    return "\n".join(parts)


@dataclass(frozen=True)
class ConvPlan:
    tile: TileConfig | PatchConfig | WgmmaConfig
    splits: int
    k_tiles_per_split: int
    grid: tuple[int, int, int]


def plan_conv(m: int, k: int, k_tiles: int, sms: int, tiles=CONV_TILES, max_splits: int = 16) -> ConvPlan:
    """Tile shape and split-K factor for a GEMM of M x K with k_tiles reduction tiles.

    Cost model: blocks run in waves of sms*blocks_per_sm; a wave costs the
    tile's MACs over its efficiency; split-K adds one fp32 write and read of
    the output per slice (at ~2.5 TB/s) and a launch (~2 us).
    """
    best = None
    for tile in tiles:
        tiles_mn = math.ceil(m / tile.bm) * math.ceil(k / tile.bn)
        for splits in range(1, max_splits + 1):
            per = math.ceil(k_tiles / splits)
            if splits > 1 and per < 3:
                break
            real_splits = math.ceil(k_tiles / per)
            blocks = tiles_mn * real_splits
            waves = math.ceil(blocks / (sms * tile.blocks_per_sm))
            # time units: one 128x128x64 k-tile at efficiency 1 on one SM alone = 1
            per_block = tile.bm * tile.bn * per / (128 * 128) / tile.efficiency
            t = waves * tile.blocks_per_sm * per_block * 0.55  # ~0.55 us per unit
            if real_splits > 1:
                t += 2.0 + 2 * real_splits * m * k * 4 / 2.5e6
            if best is None or t < best[0] - 1e-9:
                grid = (math.ceil(m / tile.bm), math.ceil(k / tile.bn), real_splits)
                best = (t, ConvPlan(tile, real_splits, per, grid))
    return best[1]


def plan_key(n: int, h: int, w: int, c: int, k: int, r: int, stride: int) -> str:
    return f"n{n}_h{h}_w{w}_c{c}_k{k}_r{r}_s{stride}"


def tile_by_label(label: str):
    return next((t for t in CONV_TILES + PATCH_TILES + WGMMA_TILES if t.label == label), None)


def conv_tiles(path: str) -> tuple:
    """The generic implicit-GEMM tiles of a convolution path (the cost model chooses among them)."""
    return WGMMA_TILES if path == "wgmma" else CONV_TILES


def patch_applies(tile: PatchConfig, c: int, k: int, r: int, stride: int, pad: int) -> bool:
    return r == 3 and stride == 1 and pad == 1 and c % 64 == 0 and k % tile.bn == 0


def load_tuned_plans(device: str, path: str, table_path: Path = TUNED_PLANS) -> dict:
    """{plan_key: (tile, splits)} from the tuning table, {} if there is none for this GPU and conv path.

    A table holds what one GPU model measured on one convolution path (its
    "device" and "conv_path"; tables from before the wgmma path are "mma"):
    on any other GPU or path the cost model plans instead.
    """
    import json
    if not table_path.is_file():
        return {}
    data = json.loads(table_path.read_text())
    if data.get("device") != device or data.get("conv_path", "mma") != path:
        return {}
    table = {}
    for key, entry in data["plans"].items():
        tile = tile_by_label(entry["tile"])
        if tile is not None:
            table[key] = (tile, int(entry["splits"]))
    return table


def make_plan(tile, splits: int, m: int, k: int, k_tiles: int, n: int = 0, p: int = 0, q: int = 0) -> ConvPlan:
    if isinstance(tile, PatchConfig):
        tiles = n * math.ceil(p / tile.th) * math.ceil(q / tile.tw)
        return ConvPlan(tile, 1, k_tiles, (tiles, k // tile.bn, 1))
    per = math.ceil(k_tiles / splits)
    real = math.ceil(k_tiles / per)
    return ConvPlan(tile, real, per, (math.ceil(m / tile.bm), math.ceil(k / tile.bn), real))
