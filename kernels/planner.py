"""The planner: which tile and split-K each convolution runs with, and which kernels serving compiles.

A tuned plan comes from the measured table of the GPU model it runs on (`load_tuned_plans`,
kernels/tuned_plans/<model>.json, written by `python -m fusedresnet.harness.tune`); any other shape or GPU model is
planned by `untuned_plan`
(conv3x3_patch_wgmma where it wins, else the cost model of `plan_conv`). Pure Python.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .build import KERNEL_DIR, wgmma_arch
from .geometry import BK, HEAD_IMGS
from .launch_choices import CONV_PATHS, MIXED
from .tiles import (
    CONV_TILES,
    PATCH_WGMMA_TILES,
    STEM_POOL_KERNELS,
    STEM_POOL_WGMMA_KERNELS,
    WGMMA_TILES,
    PatchConfig,
    PatchEpilogue,
    PatchWgmmaConfig,
    TileConfig,
    WgmmaConfig,
    patch_wgmma_applies,
    patch_wgmma_tiles,
    reduces_in_cluster,
    runs_persistent,
    shortcut_applies,
    shortcut_name_expression,
    tile_by_label,
    tile_family,
    without_cuda_bindings,
)

TUNED_PLANS_DIR = KERNEL_DIR / "tuned_plans"   # one table per GPU model, by `python -m fusedresnet.harness.tune`


def tuned_plans_path(device: str) -> Path:
    """The tuning table of one GPU model (its CUDA device name): kernels/tuned_plans/<the name, each run of other
    characters than letters and digits as one _>.json, e.g. NVIDIA_H100_80GB_HBM3.json."""
    return TUNED_PLANS_DIR / (re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_") + ".json")


def committed_tuned_plans() -> list[Path]:
    """Every GPU model's committed tuning table."""
    return sorted(TUNED_PLANS_DIR.glob("*.json"))


@dataclass(frozen=True)
class ConvPlan:
    tile: TileConfig | PatchConfig | WgmmaConfig | PatchWgmmaConfig
    splits: int
    k_tiles_per_split: int
    grid: tuple[int, int, int]

    def __post_init__(self):
        # every plan, the tuned ones and those the check harness builds by hand, before any launch
        if runs_persistent(self.tile) and self.splits != 1:
            raise ValueError(f"{self.tile.label} runs whole tiles: no split-K, got {self.splits}")

    @property
    def cluster_splitk(self) -> bool:
        """Its split-K slices are reduced in a thread-block cluster (a "wc" tile), not through the workspace."""
        return reduces_in_cluster(self.tile)

    def workspace_floats(self, outputs: int) -> int:
        """The fp32 workspace it needs for `outputs` output elements: a slice each, if split-K goes through it."""
        return self.splits * outputs if self.splits > 1 and not self.cluster_splitk else 0


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


def plan_key(n: int, h: int, w: int, c: int, k: int, r: int, stride: int, shortcut_c: int = 0) -> str:
    """The tuned table's key of a convolution (with a fused shortcut of shortcut_c channels: `_sc` and those)."""
    return f"n{n}_h{h}_w{w}_c{c}_k{k}_r{r}_s{stride}" + (f"_sc{shortcut_c}" if shortcut_c else "")


def conv_tiles(path: str) -> tuple:
    """The generic implicit-GEMM tiles the untuned cost model chooses among on a path (wgmma: the measured ones)."""
    wgmma = tuple(t for t in WGMMA_TILES if t.measured)
    return {"wgmma": wgmma, MIXED: CONV_TILES + wgmma}.get(path, CONV_TILES)


# The mixed path's untuned rule: wgmma for a 3x3 conv with at least this many
# MACs per SM (~12k clocks of tensor-core work at 2048 MAC/clock).
WGMMA_MIN_MACS_PER_SM = 24e6


def wgmma_by_default(m: int, k: int, k_tiles: int, r: int, sms: int) -> bool:
    """The untuned rule of the mixed path: a conv runs on wgmma tiles iff it is a 3x3 conv with at
    least WGMMA_MIN_MACS_PER_SM multiply-adds per SM.

    From the v6 H100 rows (NOTES.md, outcome 7): at >= 28 M MAC per SM (every
    3x3 conv at N=128, the stride-1 ones at N=32) wgmma was faster or within
    5%, except layer2.0.conv1 at N=128 (56 M, +0.007 ms); at 14 M (the
    stride-2 3x3 convs at N=32) it was even or much slower (layer4.0.conv1
    0.035 vs 0.023 ms); at N=1 (<= 0.3 M) 1.2-1.6x slower (the big tiles leave
    SMs idle and the ring's fill and the epilogue are not amortised over a
    short k-loop); it lost every 1x1 downsample (1-4 k-tiles). The whole
    network at N=8 was 10% slower on wgmma: there every conv is <= 7 M.
    """
    return r == 3 and m * k * k_tiles * BK / sms >= WGMMA_MIN_MACS_PER_SM


def plan_default(m: int, k: int, k_tiles: int, r: int, sms: int, path: str) -> ConvPlan:
    """The untuned plan of a path: its family's cost model; on "mixed" the family by `wgmma_by_default`."""
    if path == MIXED:
        path = "wgmma" if wgmma_by_default(m, k, k_tiles, r, sms) else "mma"
    return plan_conv(m, k, k_tiles, sms, conv_tiles(path))


# The conv3x3_patch_wgmma tiles `untuned_plan` picks from: one tile of BM 128 from batch 8 up, the fastest
# at 128 and 256 and within 5% of pwg128g2s4v2 at 8 and 32 (8.5 and 23.9 us), on the H100 (a dev run,
# kernels/NOTES.md outcome 43: layer1.0.conv2 with its residual, pwg128g2s4v1 against pwg128g2s4 / pwg256g2s3:
# N=8 8.9 / 9.3 / 10.4 us, N=32 25.1 / 27.0 / 30.0, N=128 77.1 / 83.1 / 93.6, N=256 149.6 / 161.4 / 187.8;
# N=1 (27 tiles of 128 for 132 SMs): pwg64g1s4 5.3 us, every other tile >= 6.4).
UNTUNED_PATCH_WGMMA = (PatchWgmmaConfig(128, 2, 4, PatchEpilogue.VEC16_STORES), PatchWgmmaConfig(64, 1, 4))


def untuned_plan(n: int, h: int, w: int, c: int, k: int, r: int, stride: int, pad: int, sms: int,
                 path: str, shortcut_c: int = 0) -> ConvPlan:
    """The plan of a convolution without a tuned-table entry (another input size, another GPU model).

    On the sm_90a paths (mixed, wgmma) a 3x3/1 conv with 64 input channels runs on conv3x3_patch_wgmma:
    on the H100 it beat every other tile and split-K at layer1's shape at every batch, 1 to 256
    (NOTES.md, outcome 15). Its tile there: pwg128g2s4v1 (16-byte epilogue stores) from one tile per SM,
    else pwg64g1s4 (NOTES.md, outcome 43).
    Everything else, and a convolution with a fused shortcut of `shortcut_c` channels (the patch kernels
    have none): `plan_default`.
    """
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - r) // stride + 1
    k_tiles = (r * r * c + shortcut_c) // BK
    if path in (MIXED, "wgmma") and not shortcut_c:
        by_bm = {t.bm: t for t in PATCH_WGMMA_TILES
                 if t in UNTUNED_PATCH_WGMMA and patch_wgmma_applies(t, c, k, r, stride, pad, w)}
        for bm, min_tiles_per_sm in ((128, 1), (64, 0)):
            tile = by_bm.get(bm)
            if tile is not None and patch_wgmma_tiles(tile, n, p, q) >= min_tiles_per_sm * sms:
                return make_plan(tile, 1, n * p * q, k, k_tiles, n, p, q)
    return plan_default(n * p * q, k, k_tiles, r, sms, path)


def untuned_tiles(path: str) -> tuple:
    """Every tile `untuned_plan` and `plan_default` can choose on a path (any input size, any GPU)."""
    patch = tuple(t for t in PATCH_WGMMA_TILES if t in UNTUNED_PATCH_WGMMA) if path in (MIXED, "wgmma") else ()
    return conv_tiles(path) + patch


def served_name_expressions(arch: str | None, path: str, tuned: dict, bindings_launch: bool) -> list[str]:
    """The kernels a library on `path` compiled for `arch` can launch when it serves the network: what it
    compiles at load (the rest of `name_expressions`, the tuner's candidates, only when asked for).

    - the stem + max-pool of its module (stem_pool_wgmma on sm_90a, else stem_pool_conv7x7s2), the head and
      splitk_epilogue;
    - the tile of every tuned plan (`tuned`, from `load_tuned_plans`: the fused-shortcut instantiation for a
      "_sc" key), or its twin where cuda.bindings cannot launch it (`without_cuda_bindings`);
    - every tile the untuned plans can choose (`untuned_tiles`), plain and with the fused shortcut.
    """
    stem_pool = STEM_POOL_WGMMA_KERNELS if wgmma_arch(arch) else STEM_POOL_KERNELS
    names = dict.fromkeys([*stem_pool.values(), "splitk_epilogue", f"avgpool_fc<{HEAD_IMGS}>"])
    for key, (tile, _) in sorted(tuned.items()):
        tile = tile if bindings_launch else without_cuda_bindings(tile)
        names[shortcut_name_expression(tile) if "_sc" in key else tile.name_expression] = None
    for tile in untuned_tiles(path):
        names[tile.name_expression] = None
        if shortcut_applies(tile):
            names[shortcut_name_expression(tile)] = None
    return list(names)


def load_tuned_plans(device: str, path: str, table_path: Path | None = None) -> dict:
    """{plan_key: (tile, splits)} from the tuning table (`table_path`, default this GPU model's,
    `tuned_plans_path(device)`), {} if it has nothing for this GPU model and path.

    A table holds what one GPU model measured (its "device"). Per plan key it
    records the fastest candidate of each family it measured ("by_family") and
    the fastest overall (the top-level "tile"/"splits", the mixed path's plan).
    A forced path ("mma", "wgmma") takes its family's best; "mixed" takes the
    overall best only from a table that measured both families. Tables from
    before the mixed path ("conv_path": "mma" or "wgmma", no "by_family") hold
    one family's plans. Any other GPU model plans with the cost model.
    """
    import json
    table_path = tuned_plans_path(device) if table_path is None else table_path
    if not table_path.is_file():
        return {}
    data = json.loads(table_path.read_text())
    if data.get("device") != device:
        return {}
    families = data.get("families", [data.get("conv_path", "mma")])
    if path == MIXED and set(families) != set(CONV_PATHS):
        return {}
    if path != MIXED and path not in families:
        return {}
    table = {}
    for key, entry in data["plans"].items():
        if path != MIXED and "by_family" in entry:
            entry = entry["by_family"].get(path)
            if entry is None:
                continue
        tile = tile_by_label(entry["tile"])
        if tile is None:
            raise ValueError(f"{table_path}: {key} names tile {entry['tile']!r}, which is not compiled")
        if path != MIXED and tile_family(tile) != path:
            continue
        table[key] = (tile, int(entry["splits"]))
    return table


def make_plan(tile, splits: int, m: int, k: int, k_tiles: int, n: int = 0, p: int = 0, q: int = 0) -> ConvPlan:
    if isinstance(tile, PatchConfig):
        tiles = n * math.ceil(p / tile.th) * math.ceil(q / tile.tw)
        return ConvPlan(tile, 1, k_tiles, (tiles, k // tile.bn, 1))
    if isinstance(tile, PatchWgmmaConfig):   # grid.x: the tiles; the launch caps it at one block per SM
        return ConvPlan(tile, 1, k_tiles, (patch_wgmma_tiles(tile, n, p, q), k // tile.bn, 1))
    if runs_persistent(tile):   # grid.x: every tile (the launch caps the blocks at blocks_per_sm per SM)
        return ConvPlan(tile, splits, k_tiles, (math.ceil(m / tile.bm) * math.ceil(k / tile.bn), 1, 1))
    per = math.ceil(k_tiles / splits)
    real = math.ceil(k_tiles / per)
    return ConvPlan(tile, real, per, (math.ceil(m / tile.bm), math.ceil(k / tile.bn), real))
