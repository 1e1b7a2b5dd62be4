"""Kernel variants, compile options and the per-layer launch plan (pure Python).

Nothing here needs CuPy or a GPU: the CPU compile test and the launcher both
import it, so the kernels compiled in CI are exactly those the engine launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
DEV_DIR = KERNEL_DIR / "dev"   # experiments beside the served kernels, each runnable as a check and a benchmark
TUNED_PLANS = KERNEL_DIR / "tuned_plans.json"   # written by `python -m fusedresnet.harness.tune`
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

# The convolution paths (kernel families). "mma": mma.sync kernels only,
# compiled by CuPy's RawModule for whatever architecture CuPy picks (sm_80,
# sm_86, sm_89, sm_90, ...). "wgmma": compute capability 9.0 only, every
# generic convolution on conv_wgmma. "mixed": compute capability 9.0 only,
# each convolution plan names its own family (tuned table, else
# `plan_default`). On cc 9.0 "wgmma" and "mixed" load one sm_90a module
# compiled by nvrtc_build.py that holds both families (mma.sync assembles for
# sm_90a unchanged). FUSEDRESNET_CONV_PATH=mma|wgmma forces one family
# everywhere (for comparisons); auto (the default) is mixed on cc 9.0 and mma
# elsewhere.
CONV_PATH_ENV = "FUSEDRESNET_CONV_PATH"
CONV_PATHS = ("mma", "wgmma")        # the families a table records and FUSEDRESNET_CONV_PATH can force
MIXED = "mixed"
WGMMA_ARCH = "sm_90a"
WGMMA_CC = (9, 0)
# Every target the engine compiles for (the compile tests build each one):
# the mma path on the Ampere/Ada parts and on an H100 forced to it, sm_90a for wgmma.
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", WGMMA_ARCH)

# THE GEOMETRY, defined once. Every fixed tile size, thread count and
# shared-memory size of the kernels is here; `source_text` pastes each as a
# `constexpr int` at the top of the CUDA translation unit (geometry_preamble),
# and the launcher uses the same Python values. The .cu files restate none of
# them: they derive what they need (e.g. stem.cu's patch height 2*STEM_TH+5)
# and static_assert that their shared-memory carve-up fits the bytes below.
# The per-instantiation tile shapes (BM, BN, warps, STAGES) are template
# arguments, from the TileConfig / WgmmaConfig / PatchConfig tables further
# down (`name_expression`).
GEOMETRY = {
    "BK": 64,                  # reduction slice per pipeline stage: 64 fp16 = one 128-byte swizzled row
    "STEM_TH": 8,              # stem_conv7x7s2: output tile rows x cols per block (GEMM rows = 128)
    "STEM_TW": 16,
    "STEM_KG": 192,            # 7*7*3 = 147 reduction values as 8 filter rows x 24, whole k-tiles
    "STEM_K": 64,              # stem output channels
    "STEM_IN_ROW": 112,        # halfs per input-patch row: (2*STEM_TW+5)*3 = 111, padded to even
    "STEM_THREADS": 256,       # 8 warps, 4 x 2 of 32 x 32
    "SP_PH": 4,                # stem_pool_conv7x7s2: pooled tile rows x cols per block
    "SP_PW": 8,
    "SP_M": 160,               # its GEMM rows: 9 x 17 = 153 stem pixels padded to 5 warps x 32
    "SP_IN_ROW": 118,          # halfs per input-patch row: (2*(2*SP_PW+1)+5)*3 = 117, padded to even
    "SP_C_ROW": 72,            # halfs per staged stem pixel (64 + 8 pad)
    "STEM_POOL_THREADS": 320,  # 10 warps, 5 x 2 of 32 x 32
    "SW_PH": 7,                # stem_pool_wgmma (sm_90a): pooled tile rows x cols per block
    "SW_PW": 8,
    "SW_M": 256,               # its GEMM rows: 15 x 17 = 255 stem pixels in four m64 blocks
    "SW_IN_ROW": 148,          # halfs per input-patch row: >= 120 read, = 20 (mod 32) for conflict-free A loads
    "SW_RAW_ROW": 144,         # bytes per staged uint8 patch row: 9 16-byte chunks hold its 117 from any offset
    "SW_THREADS": 256,         # 2 warpgroups, 2 m64 blocks each
    "SW_BLOCKS_PER_SM": 2,     # its __launch_bounds__ minimum and the persistent grid's blocks per SM
    "EW_THREADS": 256,         # element-wise kernels: splitk_epilogue, maxpool_3x3s2
    "HEAD_THREADS": 256,       # avgpool_fc (8 warps, one class per warp at a time)
    "WGMMA_SMEM_ALIGN": 1024,  # conv_wgmma aligns its ring to the 128B-swizzle atom: allocated on top
    "PATCH_WGMMA_BN": 64,      # conv3x3_patch_wgmma: output channels per block = input channels (= BK)
    "CLUSTER_STAGE_PAD": 8,    # conv_wgmma, split-K in a cluster: staged fp32 rows of BN + 8 floats (no conflicts)
    "TMA_PRODUCER_THREADS": 32,   # conv_wgmma_tma: one warp beside the consumer warpgroups (one thread issues)
    "SM_SMEM_BYTES": 228 * 1024,        # shared memory per SM (H100, H200) ...
    "SM_BLOCK_RESERVED_SMEM": 1024,     # ... of which the driver reserves this much per resident block
}
_PATCH_WGMMA_ROWS = "(((BM + 2 * W + 13) >> 3) << 3)"
# Shared-memory bytes per launch, as expressions over GEOMETRY and the
# template arguments named in the key: evaluated here for the launcher, pasted
# as constexpr functions / ints for the kernels (the same text in both).
SMEM_BYTES = {
    "conv_smem_bytes(BM, BN, STAGES)": "STAGES * (BM + BN) * BK * 2",
    "wgmma_smem_bytes(BM, BN, STAGES)": "STAGES * (BM + BN) * BK * 2 + WGMMA_SMEM_ALIGN",
    # conv_wgmma_ws: the same ring, then a full and an empty mbarrier (8 bytes each) per stage
    "wgmma_ws_smem_bytes(BM, BN, STAGES)": "STAGES * (BM + BN) * BK * 2 + WGMMA_SMEM_ALIGN + STAGES * 16",
    "patch_smem_bytes(TH, TW, BN, STAGES)": "2 * (TH + 2) * (TW + 2) * BK * 2 + STAGES * BN * BK * 2",
    "STEM_SMEM_BYTES": "(STEM_TH * STEM_TW + STEM_K) * STEM_KG * 2 + (2 * STEM_TH + 5) * STEM_IN_ROW * 2",
    "STEM_POOL_SMEM_BYTES": "(SP_M + STEM_K) * STEM_KG * 2 + (2 * (2 * SP_PH + 1) + 5) * SP_IN_ROW * 2",
    # filter + input patch (rounded up to 16 bytes) + staged stem values, aligned for the descriptors,
    # then the raw uint8 patch and the fp32 bias
    "STEM_WGMMA_SMEM_BYTES": "WGMMA_SMEM_ALIGN + (STEM_K * STEM_KG + (((2 * (2 * SW_PH + 1) + 5) * SW_IN_ROW + 7) & ~7)"
                             " + SW_M * SP_C_ROW) * 2 + (2 * (2 * SW_PH + 1) + 5) * SW_RAW_ROW + STEM_K * 4",
    # conv3x3_patch_wgmma (sm_90a): its patch rows, BM positions + 2 padded rows + 2, in whole 8-row atoms
    # ((BM + 2 * (W + 2) + 2 + 7) / 8 * 8) ...
    "patch_wgmma_rows(BM, W)": _PATCH_WGMMA_ROWS,
    # ... and its shared memory: the 9-tap filter slice, then STAGES patches, aligned for the descriptors
    "patch_wgmma_smem_bytes(BM, STAGES, W)": f"WGMMA_SMEM_ALIGN + (9 * PATCH_WGMMA_BN + STAGES * {_PATCH_WGMMA_ROWS})"
                                             " * BK * 2",
    # conv_wgmma with its split-K reduced in a cluster: the block's fp32 tile staged over its drained ring
    "cluster_stage_bytes(BM, BN)": "BM * (BN + CLUSTER_STAGE_PAD) * 4",
    # Not bytes but what they allow: the blocks per SM conv_wgmma's and conv_wgmma_tma's launch bounds ask
    # registers for, two wherever two blocks of SMEM bytes fit in an SM's shared memory, else one (the
    # same text is C++ and Python: 1 + a comparison)
    "wgmma_launch_blocks(SMEM)": "1 + (2 * (SMEM + SM_BLOCK_RESERVED_SMEM) <= SM_SMEM_BYTES)",
}


def smem_bytes(name: str, **args: int) -> int:
    """The value of SMEM_BYTES[name...] for these template arguments (e.g. smem_bytes("conv", BM=128, ...))."""
    key = next(k for k in SMEM_BYTES if k.split("(")[0] in (name, f"{name}_smem_bytes"))
    params = key.split("(")[1].rstrip(")").split(", ") if "(" in key else []
    if sorted(params) != sorted(args):
        raise TypeError(f"{key}: got {sorted(args)}")
    return int(eval(SMEM_BYTES[key], {"__builtins__": {}}, {**GEOMETRY, **args}))


# The entries only the sm_90a sources (WGMMA_SOURCES) use: pasted for that target alone, since nvcc
# warns about a constexpr the translation unit never uses.
WGMMA_ONLY_GEOMETRY = ("SW_PH", "SW_PW", "SW_M", "SW_IN_ROW", "SW_RAW_ROW", "SW_THREADS", "SW_BLOCKS_PER_SM",
                       "STEM_WGMMA_SMEM_BYTES", "SM_SMEM_BYTES", "SM_BLOCK_RESERVED_SMEM", "PATCH_WGMMA_BN",
                       "patch_wgmma_rows(BM, W)", "patch_wgmma_smem_bytes(BM, STAGES, W)", "CLUSTER_STAGE_PAD",
                       "TMA_PRODUCER_THREADS",
                       "cluster_stage_bytes(BM, BN)", "wgmma_launch_blocks(SMEM)")


def geometry_preamble(arch: str | None = None) -> str:
    """GEOMETRY and SMEM_BYTES as C++ constexpr definitions: the first lines of the translation unit for `arch`."""
    lines = ["// Generated from kernels/configs.py (GEOMETRY, SMEM_BYTES): the one definition of the kernels'",
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


BK = GEOMETRY["BK"]
STEM_KG_PADDED = GEOMETRY["STEM_KG"]
HEAD_IMGS = 8           # images per avgpool_fc block: its template argument (name_expressions)
HEAD_BLOCKS_X = 4       # class slices per avgpool_fc grid row (a launch choice, not compiled in)


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
                                        # cp.async loads onto mbarriers; never chosen, not served


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
    vec: int = 0   # the epilogue's global accesses: 4-byte fragments (0), 16-byte stores (1), and loads (2)
    bn: int = GEOMETRY["PATCH_WGMMA_BN"]

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
        return f"pwg{self.bm}g{self.warpgroups}s{self.stages}" + (f"v{self.vec}" if self.vec else "")


# The most dynamic shared memory one block may have (227 KB on the H100 / H200).
MAX_BLOCK_SMEM_BYTES = GEOMETRY["SM_SMEM_BYTES"] - GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
# conv3x3_patch_wgmma tiles: one block per SM (the filter slice alone is 72 KB). Sizes at W = 56 (layer1):
PATCH_WGMMA_TILES = (
    PatchWgmmaConfig(128, 2, 3),    # 170 KB
    PatchWgmmaConfig(128, 2, 4),    # 201 KB
    PatchWgmmaConfig(256, 2, 3),    # 218 KB, two m64 blocks per warpgroup
    PatchWgmmaConfig(128, 1, 4),    # 201 KB, one warpgroup, two m64 blocks
    PatchWgmmaConfig(64, 1, 4),     # 168 KB, small batches
    PatchWgmmaConfig(128, 2, 4, vec=1),   # 201 KB, 16-byte stores
    PatchWgmmaConfig(128, 2, 4, vec=2),   # 201 KB, and 16-byte residual loads
    PatchWgmmaConfig(256, 2, 3, vec=2),   # 218 KB
)


def patch_wgmma_applies(tile: PatchWgmmaConfig, c: int, k: int, r: int, stride: int, pad: int, w: int) -> bool:
    return r == 3 and stride == 1 and pad == 1 and c == BK and k % tile.bn == 0 and tile.fits(w)


STEM_TILES = {stem.value: TileConfig(128, 64, 4, 2, 3, input=ConvInput[f"STEM_{stem.name}"]) for stem in StemInput}


def stem_kernels(kernel: str) -> dict[str, str]:
    """{input dtype: name expression} of a stem kernel's instantiations, one per StemInput."""
    return {stem.value: f"{kernel}<StemInput::{stem.name}>" for stem in StemInput}


STEM_KERNELS = stem_kernels("stem_conv7x7s2")
STEM_SMEM_BYTES = smem_bytes("STEM_SMEM_BYTES")     # A + B tiles + input patch (stem.cu)
STEM_TILE_H, STEM_TILE_W = GEOMETRY["STEM_TH"], GEOMETRY["STEM_TW"]
STEM_THREADS, STEM_POOL_THREADS = GEOMETRY["STEM_THREADS"], GEOMETRY["STEM_POOL_THREADS"]
EW_THREADS, HEAD_THREADS = GEOMETRY["EW_THREADS"], GEOMETRY["HEAD_THREADS"]
STEM_POOL_KERNELS = stem_kernels("stem_pool_conv7x7s2")
STEM_POOL_SMEM_BYTES = smem_bytes("STEM_POOL_SMEM_BYTES")   # A + B tiles + input patch
STEM_POOL_TILE_H, STEM_POOL_TILE_W = GEOMETRY["SP_PH"], GEOMETRY["SP_PW"]   # pooled pixels per block tile
# The fused stem + max-pool on wgmma (stem_wgmma.cu, sm_90a): what stem_pool runs on the wgmma and mixed paths.
STEM_POOL_WGMMA_KERNELS = stem_kernels("stem_pool_wgmma")
STEM_WGMMA_SMEM_BYTES = smem_bytes("STEM_WGMMA_SMEM_BYTES")
STEM_WGMMA_TILE_H, STEM_WGMMA_TILE_W = GEOMETRY["SW_PH"], GEOMETRY["SW_PW"]
STEM_WGMMA_THREADS, STEM_WGMMA_BLOCKS_PER_SM = GEOMETRY["SW_THREADS"], GEOMETRY["SW_BLOCKS_PER_SM"]
OTHER_KERNELS = ("splitk_epilogue", "maxpool_3x3s2", f"avgpool_fc<{HEAD_IMGS}>", *STEM_KERNELS.values(),
                 *STEM_POOL_KERNELS.values())


def conv_path(cc: tuple[int, int], requested: str | None = None) -> str:
    """The convolution path for a device of compute capability `cc`: "mixed" on 9.0, else "mma".

    `requested` (default: $FUSEDRESNET_CONV_PATH) may be "auto", force "mma"
    anywhere, or force "wgmma" (an error off cc 9.0: no silent fallback).
    """
    import os
    choice = (requested if requested is not None else os.environ.get(CONV_PATH_ENV, "")).strip().lower() or "auto"
    if choice == "auto":
        return MIXED if tuple(cc) == WGMMA_CC else "mma"
    if choice == MIXED and tuple(cc) == WGMMA_CC:
        return MIXED
    if choice not in CONV_PATHS:
        raise ValueError(f"{CONV_PATH_ENV}={choice!r}: expected auto, mma or wgmma")
    if choice == "wgmma" and tuple(cc) != WGMMA_CC:
        raise RuntimeError(f"the wgmma path needs compute capability 9.0 (sm_90a), this device is {cc[0]}.{cc[1]}")
    return choice


PDL_ENV = "FUSEDRESNET_PDL"
PDL_MIN_CC = (9, 0)   # griddepcontrol (sm_90) and the launch attribute
# The engine's batch buckets up to this one are captured with programmatic dependent launch, larger ones
# plainly: measured on the H100 (kernels/NOTES.md, outcomes 12 and 16), PDL gains 3-10% at batch 1, 2, 8
# and 16, is even at 4, and since layer1 runs on the persistent conv3x3_patch_wgmma costs 5-10% at 32
# (it gained 3-5% there before) and 1-2% from 64 up. With the trigger after the main loop (outcome 23) it
# measured -2% at 64, -1% at 128, but +1-6% at 32 and +4% at 256 (outcome 26): left at 16.
PDL_MAX_BATCH = 16
# The engine fuses each downsampling block's 1x1 projection into its conv2 (kernels/loaders.cuh) for the
# batch buckets from this one up, and runs it as its own kernel beside conv1 (a second captured stream)
# below: measured on the H100 (kernels/NOTES.md, outcomes 22 and 27), fused is 4-5% faster at batch 32 and
# 128, 2% at 256 and 2-2.5% at 8 and 16 (since the trigger comes after the main loop), and 1.4-7.5% slower
# at batch 1, 2 and 4, where the projection beside conv1 costs nothing.
SHORTCUT_FUSION_MIN_BATCH = 8


def pdl_choice(cc: tuple[int, int], requested: bool | None = None) -> tuple[bool, str]:
    """(use programmatic dependent launch, why) for a device of compute capability `cc`.

    `requested` (default: $FUSEDRESNET_PDL, "0" or "1"; unset = where possible) True makes a device or a
    host that cannot do it an error, not a silent plain launch.
    """
    import os
    explicit = requested is not None
    if requested is None:
        env = os.environ.get(PDL_ENV, "").strip()
        if env not in ("", "0", "1"):
            raise ValueError(f"{PDL_ENV}={env!r}: expected 0 or 1")
        requested = None if env == "" else env == "1"
    if requested is False:
        return False, "turned off by the caller" if explicit else f"{PDL_ENV}=0"
    if tuple(cc) < PDL_MIN_CC:
        if requested:
            raise RuntimeError(f"programmatic dependent launch needs compute capability "
                               f"{PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}, this is {cc[0]}.{cc[1]}")
        return False, f"compute capability {cc[0]}.{cc[1]} < {PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}"
    if not has_cuda_bindings():
        if requested:
            raise ImportError(f"{PDL_ENV}=1 needs cuda.bindings (pip install 'fusedresnet[gpu]')")
        return False, "cuda.bindings is not installed"
    return True, f"compute capability >= {PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}"


def has_cuda_bindings() -> bool:
    """Whether cuda.bindings (cuLaunchKernelEx: programmatic and cluster launches) can be imported here."""
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


def bindings_launch_choice(wgmma_module: bool) -> tuple[bool, str]:
    """(the "wc", "wt" and "wq" tiles can launch, why): thread-block clusters and tensor maps need the sm_90a
    module and cuda.bindings (cuLaunchKernelEx, cuTensorMapEncode*). Without, a tuned "wc", "wt" or "wq" plan
    runs on its twin (`without_cuda_bindings`)."""
    if not wgmma_module:
        return False, "no sm_90a module (compute capability 9.0 only)"
    if not has_cuda_bindings():
        return False, "cuda.bindings is not installed"
    return True, "sm_90a module and cuda.bindings"


def reduces_in_cluster(tile) -> bool:
    """Whether the tile reduces its split-K slices in a thread-block cluster (a "wc" tile)."""
    return isinstance(tile, WgmmaConfig) and tile.cluster_splitk


def runs_persistent(tile) -> bool:
    """Whether the tile's blocks are persistent (a "wp" tile): its plan's grid.x is the blocks wanted, at
    most its tiles; the launch caps it at blocks_per_sm per SM."""
    return isinstance(tile, WgmmaConfig) and tile.persistent


@dataclass(frozen=True)
class TmaIm2colMap:
    """The arguments of cuTensorMapEncodeIm2col for conv_wgmma_tma's input (fp16 NHWC, rank 4), innermost
    dimension first: `rows` output positions (pixelsPerColumn) of BK channels (channelsPerPixel: one
    128-byte swizzled row each) per load; the walk steps by the convolution's stride (element strides)
    through the bounding box of the filter window's start, `lower` (-pad) and `upper` (pad - (r - 1))
    being offsets from the tensor's first and last pixel. A row of the walk then has
    (w + upper - lower - 1) // stride + 1 positions (`walk_positions`), the convolution's Q (CUTLASS's
    make_im2col_tma_copy_desc derives its corners the same way); the load at output position (p, q)
    starts at input (q * stride - pad, p * stride - pad) (conv_wgmma_tma's producer) and the filter tap
    (s, r) is its im2col offset."""

    dims: tuple[int, int, int, int]          # C, W, H, N
    strides: tuple[int, int, int]            # bytes between consecutive W, H, N
    lower: tuple[int, int]                   # W, H (equal: square filters, one padding)
    upper: tuple[int, int]
    channels: int
    rows: int
    element_strides: tuple[int, int, int, int]

    @staticmethod
    def of(n: int, h: int, w: int, c: int, r: int, stride: int, pad: int, rows: int) -> TmaIm2colMap:
        return TmaIm2colMap((c, w, h, n), (c * 2, w * c * 2, h * w * c * 2), (-pad, -pad),
                            (pad - (r - 1), pad - (r - 1)), BK, rows, (1, stride, stride, 1))

    def walk_positions(self, axis: int) -> int:
        """Positions per walk row along W (axis 0) or H (axis 1)."""
        return (self.dims[1 + axis] + self.upper[axis] - self.lower[axis] - 1) // self.element_strides[1 + axis] + 1


def tma_filter_box(ldw: int, k: int, bn: int) -> tuple[tuple[int, int], tuple[int], tuple[int, int]]:
    """cuTensorMapEncodeTiled's dims, byte strides and box for conv_wgmma_tma's [k][ldw] fp16 filter: one
    k-tile (BK reduction values, one 128-byte swizzled row) of bn output channels per load."""
    return (ldw, k), (ldw * 2,), (BK, bn)


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
        return tile_by_label("wg" + tile.label.removeprefix("wc"))
    if loads_by_tma(tile):
        shape = tile.label[2:].removesuffix("v")   # "v": the 16-byte epilogue, the same sums
        twin = tile_by_label("wp" + shape) or tile_by_label("wg" + shape)
        if twin is None:
            raise ValueError(f"{tile.label} has no cp.async twin (a wp{shape} or wg{shape} tile) to run without "
                             f"cuda.bindings")
        return twin
    return tile


def path_arch(path: str) -> str | None:
    """The architecture a path's module is compiled for: sm_90a for wgmma and mixed, CuPy's choice for mma."""
    return WGMMA_ARCH if path in ("wgmma", MIXED) else None


def tile_family(tile) -> str:
    """"wgmma" for the sm_90a tiles (conv_wgmma, conv3x3_patch_wgmma), "mma" for the mma.sync ones."""
    return "wgmma" if isinstance(tile, (WgmmaConfig, PatchWgmmaConfig)) else "mma"


def wgmma_arch(arch: str | None) -> bool:
    return arch == WGMMA_ARCH


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Everything NVRTC gets for `arch`: our options, those CuPy adds, the architecture."""
    return COMPILE_OPTIONS + CUPY_ADDED_OPTIONS + (f"-arch={arch}",)


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


def untuned_tiles(path: str) -> tuple:
    """Every tile `untuned_plan` and `plan_default` can choose on a path (any input size, any GPU)."""
    patch = tuple(t for t in PATCH_WGMMA_TILES if t.label in UNTUNED_PATCH_WGMMA) if path in (MIXED, "wgmma") else ()
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


def tile_by_label(label: str):
    return next((t for t in CONV_TILES + PATCH_TILES + WGMMA_CONV_TILES + PATCH_WGMMA_TILES
                 if t.label == label), None)


def conv_tiles(path: str) -> tuple:
    """The generic implicit-GEMM tiles the untuned cost model chooses among on a path (wgmma: the measured ones)."""
    wgmma = tuple(t for t in WGMMA_TILES if t.measured)
    return {"wgmma": wgmma, MIXED: CONV_TILES + wgmma}.get(path, CONV_TILES)


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
                 if t.label in UNTUNED_PATCH_WGMMA and patch_wgmma_applies(t, c, k, r, stride, pad, w)}
        for bm, min_tiles_per_sm in ((128, 1), (64, 0)):
            tile = by_bm.get(bm)
            if tile is not None and patch_wgmma_tiles(tile, n, p, q) >= min_tiles_per_sm * sms:
                return make_plan(tile, 1, n * p * q, k, k_tiles, n, p, q)
    return plan_default(n * p * q, k, k_tiles, r, sms, path)


# The conv3x3_patch_wgmma tiles `untuned_plan` picks from: one tile of BM 128 from batch 8 up, the fastest
# at 128 and 256 and within 5% of pwg128g2s4v2 at 8 and 32 (8.5 and 23.9 us), on the H100 (the dev run
# of 2026-11-24 01:27 UTC, layer1.0.conv2 with its residual, pwg128g2s4v1 against pwg128g2s4 / pwg256g2s3:
# N=8 8.9 / 9.3 / 10.4 us, N=32 25.1 / 27.0 / 30.0, N=128 77.1 / 83.1 / 93.6, N=256 149.6 / 161.4 / 187.8;
# N=1 (27 tiles of 128 for 132 SMs): pwg64g1s4 5.3 us, every other tile >= 6.4 in the run of 01:12 UTC).
UNTUNED_PATCH_WGMMA = ("pwg128g2s4v1", "pwg64g1s4")


def load_tuned_plans(device: str, path: str, table_path: Path = TUNED_PLANS) -> dict:
    """{plan_key: (tile, splits)} from the tuning table, {} if it has nothing for this GPU model and path.

    A table holds what one GPU model measured (its "device"). Per plan key it
    records the fastest candidate of each family it measured ("by_family") and
    the fastest overall (the top-level "tile"/"splits", the mixed path's plan).
    A forced path ("mma", "wgmma") takes its family's best; "mixed" takes the
    overall best only from a table that measured both families. Tables from
    before the mixed path ("conv_path": "mma" or "wgmma", no "by_family") hold
    one family's plans. Any other GPU model plans with the cost model.
    """
    import json
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


def patch_wgmma_tiles(tile: PatchWgmmaConfig, n: int, h: int, w: int) -> int:
    """conv3x3_patch_wgmma's tiles for an N x H x W output: BM positions each of the flat padded grid."""
    return math.ceil(n * (h + 2) * (w + 2) / tile.bm)
