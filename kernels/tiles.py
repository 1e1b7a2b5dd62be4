"""The catalogue of kernel instantiations: every tile shape and named schedule the library compiles.

One dataclass per kernel (`TileConfig`: conv_implicit_gemm, `PatchConfig`: conv3x3_patch, `WgmmaConfig`:
conv_wgmma / conv_wgmma_tma, `PatchWgmmaConfig`: conv3x3_patch_wgmma), its instantiations in tables
(CONV_TILES, PATCH_TILES, WGMMA_CONV_TILES, PATCH_WGMMA_TILES). As in CUTLASS, a schedule and an epilogue are
named types (`Schedule`, `Epilogue`, `PatchEpilogue`), not flags: a tile's `label`, the name the tuned table
(tuned_plans/*.json) records, is derived from those names, and `tile_by_label` reads it back. Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from .geometry import BK, GEOMETRY, HEAD_IMGS, MAX_BLOCK_SMEM_BYTES, smem_bytes


class ConvInput(Enum):
    """What an implicit-GEMM convolution's A operand, the im2col rows, is gathered from: conv_implicit_gemm's
    template argument (all four), conv_wgmma's (the fp16 ones). The value says it in words."""

    FP16_NHWC = "fp16 NHWC activations"
    FP16_NHWC_FUSED_SHORTCUT = ("fp16 NHWC activations, then from main_k_tiles on the downsampling shortcut's "
                                "1x1 projection (loaders.cuh); its own instantiation, so that FP16_NHWC's k-loop "
                                "has no branch for it")
    STEM_UINT8_NHWC = "the stem's uint8 NHWC pixels, normalised on the way (stem.cu's reference path)"
    STEM_FP32_NCHW = "the stem's fp32 NCHW normalised values (stem.cu's reference path)"


class StemInput(Enum):
    """The network input the stem kernels read (stem.cu, stem_wgmma.cu, stem.cuh): their template argument. The
    value is the input's dtype, the key of STEM_TILES, STEM_KERNELS, STEM_POOL_KERNELS and
    STEM_POOL_WGMMA_KERNELS."""

    UINT8_NHWC = "uint8"      # raw pixels; the ImageNet normalisation fused (in_scale, in_shift)
    FP32_NCHW = "float32"     # normalised values


@dataclass(frozen=True)
class TileConfig:
    """One instantiation of conv_implicit_gemm."""

    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    input: ConvInput = ConvInput.FP16_NHWC   # (FP16_NHWC_FUSED_SHORTCUT: `shortcut_name_expression`)
    efficiency: float = 1.0   # relative tensor-core efficiency per SM (cost model)
    blocks_per_sm: int = 1    # resident blocks per SM (from smem/threads/registers)

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def smem_bytes(self) -> int:
        return smem_bytes("conv", BM=self.bm, BN=self.bn, STAGES=self.stages)

    @property
    def name_expression(self) -> str:
        return (f"conv_implicit_gemm<{self.bm},{self.bn},{self.warps_m},{self.warps_n},"
                f"{self.stages},ConvInput::{self.input.name}>")

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


class Schedule(Enum):
    """How a wgmma tile's blocks load their operands and walk their tiles (CUTLASS names its kernel schedules the
    same way: KernelTmaWarpSpecializedPingpong, ...). The value is the label's prefix."""

    MULTISTAGE = "wg"                   # conv_wgmma (v1): every thread loads a cp.async ring, one tile per block
    CLUSTER_SPLIT_K = "wc"              # conv_wgmma (v3): a tile's split-K slices one thread-block cluster, added
                                        # up through distributed shared memory; no workspace, no splitk_epilogue
    PERSISTENT = "wp"                   # conv_wgmma (v4): blocks_per_sm blocks per SM run tile after tile, the
                                        # cp.async ring going on across them; no split-K
    TMA_WARP_SPECIALIZED = "wt"         # conv_wgmma_tma (v6): persistent, every operand tile loaded by the TMA from
                                        # one producer thread onto an mbarrier ring; needs cuda.bindings
    TMA_PINGPONG = "wq"                 # conv_wgmma_tma (v6) PINGPONG: each consumer warpgroup whole tiles in turn,
                                        # one's epilogue under the other's wgmma (two warpgroups, one block per SM)
    CP_ASYNC_WARP_SPECIALIZED = "ws"    # conv_wgmma_ws (v2, kernels/dev): a producer warpgroup issues the


TMA_SCHEDULES = (Schedule.TMA_WARP_SPECIALIZED, Schedule.TMA_PINGPONG)
PERSISTENT_SCHEDULES = (Schedule.PERSISTENT, *TMA_SCHEDULES)


class Epilogue(Enum):
    """How a wgmma tile's epilogue stores its outputs. The value is the label's suffix."""

    FRAGMENTS = ""    # each thread its accumulator fragments, 4 bytes at a time (epilogue.cuh)
    VEC16 = "v"       # a quad transpose, then 16-byte stores (epilogue.cuh epilogue_store16); conv_wgmma_tma's VEC


# The epilogues each schedule has (VEC16 not on the ping-pong tiles: 128 accumulators per thread, it spilled).
SCHEDULE_EPILOGUES = {schedule: (Epilogue.FRAGMENTS,) for schedule in Schedule} | {
    Schedule.TMA_WARP_SPECIALIZED: (Epilogue.FRAGMENTS, Epilogue.VEC16)}


@dataclass(frozen=True)
class WgmmaConfig:
    """One instantiation of conv_wgmma (sm_90a): BM x BN tile, `warpgroups` consumers of 128 threads, run on a
    named `schedule` (Schedule: MULTISTAGE, CLUSTER_SPLIT_K, PERSISTENT, TMA_WARP_SPECIALIZED, TMA_PINGPONG,
    CP_ASYNC_WARP_SPECIALIZED) with a named `epilogue` (Epilogue). Labels are derived from both names:
    Schedule's prefix, the shape, Epilogue's suffix ("wt128x128g2s4v": TMA_WARP_SPECIALIZED, VEC16)."""

    bm: int
    bn: int
    warpgroups: int
    stages: int
    efficiency: float = 1.0   # cost model, relative to the mma.sync 128x128 tile (see plan_conv)
    blocks_per_sm: int = 1
    measured: bool = False    # efficiency calibrated on a GPU run: only these are untuned (cost-model) choices
    schedule: Schedule = Schedule.MULTISTAGE
    epilogue: Epilogue = Epilogue.FRAGMENTS

    def __post_init__(self):
        if self.epilogue not in SCHEDULE_EPILOGUES[self.schedule]:
            raise ValueError(f"the {self.schedule.name} schedule has no {self.epilogue.name} epilogue (the 16-byte "
                             f"epilogue is TMA_WARP_SPECIALIZED's)")
        if self.tma and self.blocks_per_sm != self.launch_blocks:
            raise ValueError("a TMA tile's blocks per SM are those its launch bounds ask registers for")
        if self.schedule is Schedule.TMA_PINGPONG and not (self.warpgroups == 2 and self.blocks_per_sm == 1):
            raise ValueError("the TMA_PINGPONG schedule takes two warpgroups and one block per SM")

    # What the launcher and the cost model ask of a schedule.
    @property
    def warp_specialized(self) -> bool:   # conv_wgmma_ws: a producer warpgroup beside the consumers
        return self.schedule is Schedule.CP_ASYNC_WARP_SPECIALIZED

    @property
    def cluster_splitk(self) -> bool:
        return self.schedule is Schedule.CLUSTER_SPLIT_K

    @property
    def persistent(self) -> bool:
        return self.schedule in PERSISTENT_SCHEDULES

    @property
    def tma(self) -> bool:
        return self.schedule in TMA_SCHEDULES

    @property
    def pingpong(self) -> bool:
        return self.schedule is Schedule.TMA_PINGPONG

    @property
    def vec_epilogue(self) -> bool:
        return self.epilogue is Epilogue.VEC16

    @property
    def threads(self) -> int:
        if self.tma:
            return self.warpgroups * 128 + GEOMETRY["TMA_PRODUCER_THREADS"]
        return (self.warpgroups + self.warp_specialized) * 128

    @property
    def smem_bytes(self) -> int:   # conv_wgmma_tma: the ring and the mbarriers of conv_wgmma_ws
        return smem_bytes("wgmma_ws" if self.warp_specialized or self.tma else "wgmma", BM=self.bm, BN=self.bn,
                          STAGES=self.stages)

    @property
    def launch_blocks(self) -> int:
        """Blocks per SM the kernel's __launch_bounds__ ask ptxas for registers for (conv_wgmma_ws: one)."""
        return 1 if self.warp_specialized else smem_bytes("wgmma_launch_blocks", SMEM=self.smem_bytes)

    @property
    def name_expression(self) -> str:
        """conv_wgmma<BM, BN, WGS, STAGES, Schedule SCHEDULE[, ConvInput INPUT]>, conv_wgmma_tma<..., Schedule,
        Epilogue> (the C++ enum classes are generated from Schedule, Epilogue, ConvInput: geometry_preamble), or the
        dev kernel conv_wgmma_ws<BM, BN, WGS, STAGES>."""
        shape = f"{self.bm},{self.bn},{self.warpgroups},{self.stages}"
        if self.tma:
            return f"conv_wgmma_tma<{shape},Schedule::{self.schedule.name},Epilogue::{self.epilogue.name}>"
        if self.warp_specialized:
            return f"conv_wgmma_ws<{shape}>"
        return f"conv_wgmma<{shape},Schedule::{self.schedule.name}>"

    @property
    def label(self) -> str:
        return f"{self.schedule.value}{self.bm}x{self.bn}g{self.warpgroups}s{self.stages}{self.epilogue.value}"


# wgmma tiles. `efficiency` is relative to the mma.sync 128x128 tile (1.0, which
# measured 250-270 TFLOP/s on the H100's batch-128 3x3 convs). Three of them
# are calibrated on the v6 H100 run (NOTES.md, outcome 7): 128x128s4 267-292
# TFLOP/s on layer3 -> 1.05; 128x256s4 355-373 on layer4 -> 1.4; 128x64 on
# layer1 (K = 64) 194-230 -> 0.85. The others were never measured: their
# efficiency is a guess and the untuned cost model does not choose them
# (`measured`); the tuner measures them all.
# SM_SMEM_BYTES per SM: blocks_per_sm from smem_bytes; conv_wgmma's
# __launch_bounds__ asks ptxas for two blocks' registers wherever two fit in
# shared memory (the s3 128x128 tile: <= 128 registers for 2 x 256 threads;
# tests/test_kernels_compile.py checks every tile's registers against its
# blocks_per_sm).
WGMMA_TILES = (
    WgmmaConfig(128, 128, 2, 4, efficiency=1.05, blocks_per_sm=1, measured=True),  # 129 KB
    WgmmaConfig(128, 128, 2, 3, efficiency=1.0, blocks_per_sm=2),   # 97 KB
    WgmmaConfig(128, 256, 2, 4, efficiency=1.4, blocks_per_sm=1, measured=True),   # 193 KB
    WgmmaConfig(128, 64, 2, 4, efficiency=0.85, blocks_per_sm=2, measured=True),   # 97 KB
    WgmmaConfig(64, 128, 1, 4, efficiency=0.8, blocks_per_sm=2),    # 97 KB
    WgmmaConfig(128, 128, 1, 4, efficiency=0.9, blocks_per_sm=1),   # 129 KB, one warpgroup, two m64 blocks
    WgmmaConfig(64, 64, 1, 4, efficiency=0.6, blocks_per_sm=3),     # 65 KB
    # Deeper rings (prefetch distance STAGES-2 k-tiles, NOTES.md outcome 7): 2048 clocks of
    # loads in flight ahead of the tensor cores, as the 128x256s4 tile has.
    WgmmaConfig(128, 128, 2, 6, efficiency=1.4, blocks_per_sm=1),   # 193 KB
    WgmmaConfig(256, 128, 2, 4, efficiency=1.4, blocks_per_sm=1),   # 193 KB, each warpgroup 128x128
    WgmmaConfig(64, 128, 1, 6, efficiency=0.8, blocks_per_sm=1),    # 145 KB, small M
    WgmmaConfig(64, 64, 1, 6, efficiency=0.6, blocks_per_sm=2),     # 97 KB, small M
    # Three blocks per SM (<= 170 registers): batch-128 layer4 (M = 6272, K = 512) as 392 blocks in one
    # wave of 396, where 128x256 gives 98 blocks for 132 SMs (NOTES.md outcome 21).
    WgmmaConfig(64, 128, 1, 3, efficiency=0.8, blocks_per_sm=3),    # 73 KB
)
# (The warp-specialised conv_wgmma_ws tiles, "ws", never chosen by the tuner: kernels/dev/conv_wgmma_ws.py.)
# Each conv_wgmma tile again with its split-K reduced in a cluster of its slices (v3; NOTES.md outcome 24):
# at batch 1, 12 of the 20 convolutions split K 3-12 ways and each was followed by a splitk_epilogue kernel.
# Only the tuner chooses them (not `measured`), with 2 .. CLUSTER_SPLITK_MAX slices.
CLUSTER_SPLITK_MAX = 8   # slices per cluster: the portable cluster size (a launch limit, not compiled in)
WGMMA_CLUSTER_TILES = tuple(replace(t, schedule=Schedule.CLUSTER_SPLIT_K, measured=False) for t in WGMMA_TILES)
# conv_wgmma tiles again as persistent blocks (NOTES.md outcome 32): for the convolutions with few k-tiles
# per tile (layer2.0's stride-2 3x3 conv, K = 9 x 64), where each block's prologue and ring fill weighed
# on a short k-loop. Only the tuner chooses them (not `measured`), without split-K.
WGMMA_PERSISTENT_TILES = tuple(replace(t, schedule=Schedule.PERSISTENT, measured=False) for t in WGMMA_TILES
                               if (t.bm, t.bn, t.stages) in
                               ((128, 128, 3), (128, 128, 4), (64, 128, 3), (256, 128, 4)))
# conv_wgmma_tma (v6, NOTES.md outcome 36): the persistent tiles with TMA loads. The 128x128 s3 and 64x128
# s4 rings fit two blocks per SM (each block's epilogue under the other's main loop); 128x128 s4 and s6 and
# 256x128 s4 (48 KB per k-tile) one, deeper. Only the tuner chooses them (not `measured`).
WGMMA_TMA_TILES = (
    WgmmaConfig(128, 128, 2, 3, blocks_per_sm=2, schedule=Schedule.TMA_WARP_SPECIALIZED),   # 97 KB
    WgmmaConfig(128, 128, 2, 4, blocks_per_sm=1, schedule=Schedule.TMA_WARP_SPECIALIZED),   # 129 KB
    WgmmaConfig(128, 128, 2, 6, blocks_per_sm=1, schedule=Schedule.TMA_WARP_SPECIALIZED),   # 193 KB
    WgmmaConfig(64, 128, 1, 4, blocks_per_sm=2, schedule=Schedule.TMA_WARP_SPECIALIZED),    # 97 KB
    WgmmaConfig(256, 128, 2, 4, blocks_per_sm=1, schedule=Schedule.TMA_WARP_SPECIALIZED),   # 193 KB
    # ping-pong: each warpgroup a whole 128x128 tile (128 accumulators per thread), one block per SM
    WgmmaConfig(128, 128, 2, 4, blocks_per_sm=1, schedule=Schedule.TMA_PINGPONG),   # 129 KB
    WgmmaConfig(128, 128, 2, 6, blocks_per_sm=1, schedule=Schedule.TMA_PINGPONG),   # 193 KB
    # 16-byte epilogue stores (not on the ping-pong tiles: 128 accumulators per thread, it spilled 468 bytes)
    WgmmaConfig(128, 128, 2, 4, blocks_per_sm=1, schedule=Schedule.TMA_WARP_SPECIALIZED,
                epilogue=Epilogue.VEC16),   # 129 KB
    WgmmaConfig(128, 128, 2, 6, blocks_per_sm=1, schedule=Schedule.TMA_WARP_SPECIALIZED,
                epilogue=Epilogue.VEC16),   # 193 KB
)
# Every conv_wgmma / conv_wgmma_tma instantiation's tile: what the sm_90a module compiles and
# the tuner times.
WGMMA_CONV_TILES = WGMMA_TILES + WGMMA_CLUSTER_TILES + WGMMA_PERSISTENT_TILES + WGMMA_TMA_TILES


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
        return smem_bytes("patch", TH=self.th, TW=self.tw, BN=self.bn, STAGES=self.stages)

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


class PatchEpilogue(Enum):
    """How conv3x3_patch_wgmma's epilogue reaches global memory: its VEC template argument is the member's
    position (0, 1, 2; conv3x3_patch_wgmma.cu). The value is the label's suffix."""

    FRAGMENTS = ""                  # each thread its accumulator fragments, 4 bytes at a time
    VEC16_STORES = "v1"             # a quad transpose, then 16-byte stores (NOTES.md outcome 43)
    VEC16_STORES_AND_LOADS = "v2"   # and the residual read with 16-byte loads, turned back the same way


@dataclass(frozen=True)
class PatchWgmmaConfig:
    """One instantiation of conv3x3_patch_wgmma (sm_90a): 3x3 / stride 1 / pad 1 with C = 64, K % 64 == 0.

    Persistent blocks of `warpgroups` x 128 threads, each owning 64 output channels and walking tiles of
    `bm` consecutive positions of the flat padded grid with `stages` patch buffers (conv3x3_patch_wgmma.cu).
    Its shared memory depends on the image width (`smem_for`); `smem_bytes` is the most a block may ask for.
    """

    bm: int
    warpgroups: int
    stages: int
    epilogue: PatchEpilogue = PatchEpilogue.FRAGMENTS
    bn: int = GEOMETRY["PATCH_WGMMA_BN"]

    @property
    def vec(self) -> int:
        """The kernel's VEC template argument: the epilogue's position in PatchEpilogue."""
        return list(PatchEpilogue).index(self.epilogue)

    @property
    def threads(self) -> int:
        return self.warpgroups * 128

    @property
    def smem_bytes(self) -> int:
        return MAX_BLOCK_SMEM_BYTES

    def smem_for(self, w: int) -> int:
        return smem_bytes("patch_wgmma", BM=self.bm, STAGES=self.stages, W=w)

    def fits(self, w: int) -> bool:
        return self.smem_for(w) <= MAX_BLOCK_SMEM_BYTES

    @property
    def name_expression(self) -> str:
        return f"conv3x3_patch_wgmma<{self.bm},{self.warpgroups},{self.stages},{self.vec}>"

    @property
    def label(self) -> str:
        return f"pwg{self.bm}g{self.warpgroups}s{self.stages}{self.epilogue.value}"


# conv3x3_patch_wgmma tiles: one block per SM (the filter slice alone is 72 KB). Sizes at W = 56 (layer1):
PATCH_WGMMA_TILES = (
    PatchWgmmaConfig(128, 2, 3),    # 170 KB
    PatchWgmmaConfig(128, 2, 4),    # 201 KB
    PatchWgmmaConfig(256, 2, 3),    # 218 KB, two m64 blocks per warpgroup
    PatchWgmmaConfig(128, 1, 4),    # 201 KB, one warpgroup, two m64 blocks
    PatchWgmmaConfig(64, 1, 4),     # 168 KB, small batches
    PatchWgmmaConfig(128, 2, 4, PatchEpilogue.VEC16_STORES),             # 201 KB
    PatchWgmmaConfig(128, 2, 4, PatchEpilogue.VEC16_STORES_AND_LOADS),   # 201 KB
    PatchWgmmaConfig(256, 2, 3, PatchEpilogue.VEC16_STORES_AND_LOADS),   # 218 KB
)


def patch_wgmma_applies(tile: PatchWgmmaConfig, c: int, k: int, r: int, stride: int, pad: int, w: int) -> bool:
    return r == 3 and stride == 1 and pad == 1 and c == BK and k % tile.bn == 0 and tile.fits(w)


STEM_TILES = {stem.value: TileConfig(128, 64, 4, 2, 3, input=ConvInput[f"STEM_{stem.name}"]) for stem in StemInput}


def stem_kernels(kernel: str) -> dict[str, str]:
    """{input dtype: name expression} of a stem kernel's instantiations, one per StemInput."""
    return {stem.value: f"{kernel}<StemInput::{stem.name}>" for stem in StemInput}


STEM_KERNELS = stem_kernels("stem_conv7x7s2")
STEM_POOL_KERNELS = stem_kernels("stem_pool_conv7x7s2")
# The fused stem + max-pool on wgmma (stem_wgmma.cu, sm_90a): what stem_pool runs on the wgmma and mixed paths.
STEM_POOL_WGMMA_KERNELS = stem_kernels("stem_pool_wgmma")
OTHER_KERNELS = ("splitk_epilogue", "maxpool_3x3s2", f"avgpool_fc<{HEAD_IMGS}>", *STEM_KERNELS.values(),
                 *STEM_POOL_KERNELS.values())


# Every tile of the catalogue by its label (a label names one tile: tests/test_kernel_planner.py).
TILES_BY_LABEL = {t.label: t for t in CONV_TILES + PATCH_TILES + WGMMA_CONV_TILES + PATCH_WGMMA_TILES}


def tile_by_label(label: str):
    """The catalogue's tile of this label (what the tuned table records), or None."""
    return TILES_BY_LABEL.get(label)


def tile_family(tile) -> str:
    """"wgmma" for the sm_90a tiles (conv_wgmma, conv3x3_patch_wgmma), "mma" for the mma.sync ones."""
    return "wgmma" if isinstance(tile, (WgmmaConfig, PatchWgmmaConfig)) else "mma"


def reduces_in_cluster(tile) -> bool:
    """Whether the tile reduces its split-K slices in a thread-block cluster (a "wc" tile)."""
    return isinstance(tile, WgmmaConfig) and tile.cluster_splitk


def runs_persistent(tile) -> bool:
    """Whether the tile's blocks are persistent (a "wp" tile): its plan's grid.x is the blocks wanted, at
    most its tiles; the launch caps it at blocks_per_sm per SM."""
    return isinstance(tile, WgmmaConfig) and tile.persistent


def loads_by_tma(tile) -> bool:
    """Whether the tile loads its operands with the TMA (a "wt" tile: tensor maps, launched through
    cuda.bindings)."""
    return isinstance(tile, WgmmaConfig) and tile.tma


def without_cuda_bindings(tile):
    """The tile itself, or the twin that runs without cuda.bindings: for a "wc" tile (split-K reduced in a
    cluster) its "wg" twin, whose slices go through the fp32 workspace and splitk_epilogue (the same sums in
    the same order); for a "wt" or "wq" tile (TMA loads) its "wp" twin where there is one, else its "wg"
    twin."""
    if reduces_in_cluster(tile):
        return tile_by_label(replace(tile, schedule=Schedule.MULTISTAGE).label)
    if loads_by_tma(tile):   # the fragment epilogue: the same sums as the 16-byte one
        twins = [replace(tile, schedule=schedule, epilogue=Epilogue.FRAGMENTS).label
                 for schedule in (Schedule.PERSISTENT, Schedule.MULTISTAGE)]
        twin = next((tile_by_label(label) for label in twins if tile_by_label(label) is not None), None)
        if twin is None:
            raise ValueError(f"{tile.label} has no cp.async twin (a {' or '.join(twins)} tile) to run without "
                             f"cuda.bindings")
        return twin
    return tile


def shortcut_applies(tile) -> bool:
    """Whether the tile's kernel has the fused shortcut (kernels/loaders.cuh): the implicit-GEMM kernels
    conv_implicit_gemm (fp16 NHWC) and conv_wgmma; not the patch kernels, conv_wgmma_ws nor the persistent
    "wp" tiles (ptxas 13.0: the 128x128 s3 one spilled 24 bytes at its 128-register cap with the second
    loader; the fused-shortcut convs have 19-41 k-tiles per tile, where persistence matters least)."""
    return ((isinstance(tile, TileConfig) and tile.input is ConvInput.FP16_NHWC)
            or (isinstance(tile, WgmmaConfig) and not tile.warp_specialized and not tile.persistent))


def shortcut_name_expression(tile) -> str:
    """The tile's instantiation with the fused shortcut (a tile of `shortcut_applies`): its ConvInput
    FP16_NHWC_FUSED_SHORTCUT (conv_implicit_gemm, conv_wgmma). Its own instantiation, so that the plain one's
    k-loop has no branch for it."""
    fused = ConvInput.FP16_NHWC_FUSED_SHORTCUT
    if isinstance(tile, TileConfig):
        return replace(tile, input=fused).name_expression
    return (f"conv_wgmma<{tile.bm},{tile.bn},{tile.warpgroups},{tile.stages},Schedule::{tile.schedule.name},"
            f"ConvInput::{fused.name}>")


def patch_applies(tile: PatchConfig, c: int, k: int, r: int, stride: int, pad: int) -> bool:
    return r == 3 and stride == 1 and pad == 1 and c % 64 == 0 and k % tile.bn == 0


def patch_wgmma_tiles(tile: PatchWgmmaConfig, n: int, h: int, w: int) -> int:
    """conv3x3_patch_wgmma's tiles for an N x H x W output: BM positions each of the flat padded grid."""
    return math.ceil(n * (h + 2) * (w + 2) / tile.bm)
