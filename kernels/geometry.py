"""The kernels' fixed geometry and shared-memory formulas, defined once for the CUDA sources and the launcher.

`build.geometry_preamble` pastes GEOMETRY and SMEM_BYTES at the top of the translation unit as C++ constexpr
definitions; the launcher and the tile catalogue (`tiles`) evaluate the same SMEM_BYTES text here with
`smem_bytes` (a small integer-expression evaluator over the names of GEOMETRY and the template arguments, no
`eval`). Pure Python.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

# THE GEOMETRY, defined once. Every fixed tile size, thread count and
# shared-memory size of the kernels is here; `build.source_text` pastes each as a
# `constexpr int` at the top of the CUDA translation unit (`build.geometry_preamble`),
# and the launcher uses the same Python values. The .cu files restate none of
# them: they derive what they need (e.g. stem.cu's patch height 2*STEM_TH+5)
# and static_assert that their shared-memory carve-up fits the bytes below.
# The per-instantiation tile shapes (BM, BN, warps, STAGES) are template
# arguments, from the TileConfig / WgmmaConfig / PatchConfig tables of `tiles`
# (`name_expression`).
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
    return int(integer_expression(SMEM_BYTES[key], {**GEOMETRY, **args}))


# The operators the SMEM_BYTES texts use, with the meaning C++ gives them on non-negative ints (a comparison is
# 0 or 1). The texts parenthesise wherever C++ and Python order these operators differently (a comparison
# beside `&`).
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift,
              ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.LtE: operator.le,
              ast.Invert: operator.invert}


def integer_expression(text: str, names: dict[str, int]) -> int:
    """The value of `text`, an integer expression that is both C++ and Python (SMEM_BYTES), over `names`:
    integer literals, names, parentheses, + - * << >> & ~ and <=; anything else is a ValueError."""

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPERATORS:
            return int(_OPERATORS[type(node.ops[0])](value(node.left), value(node.comparators[0])))
        raise ValueError(f"{text!r}: {ast.unparse(node)!r} is not an integer expression over {sorted(names)}")

    return value(ast.parse(text, mode="eval").body)


# The entries only the sm_90a sources (WGMMA_SOURCES) use: pasted for that target alone, since nvcc
# warns about a constexpr the translation unit never uses.
WGMMA_ONLY_GEOMETRY = ("SW_PH", "SW_PW", "SW_M", "SW_IN_ROW", "SW_RAW_ROW", "SW_THREADS", "SW_BLOCKS_PER_SM",
                       "STEM_WGMMA_SMEM_BYTES", "SM_SMEM_BYTES", "SM_BLOCK_RESERVED_SMEM", "PATCH_WGMMA_BN",
                       "patch_wgmma_rows(BM, W)", "patch_wgmma_smem_bytes(BM, STAGES, W)", "CLUSTER_STAGE_PAD",
                       "TMA_PRODUCER_THREADS",
                       "cluster_stage_bytes(BM, BN)", "wgmma_launch_blocks(SMEM)")
BK = GEOMETRY["BK"]
STEM_KG_PADDED = GEOMETRY["STEM_KG"]
# The stem filter as the stem kernels read it, [K][STEM_FILTER_ROWS][STEM_ROW_VALUES]: filter row r holds its
# 7 taps x 3 channels = 21 values and 3 zeros, and an 8th row of zeros (stem.cu, stem_wgmma.cu).
STEM_FILTER_ROWS = 8
STEM_ROW_VALUES = STEM_KG_PADDED // STEM_FILTER_ROWS
HEAD_IMGS = 8           # images per avgpool_fc block: its template argument (name_expressions)
HEAD_BLOCKS_X = 4       # class slices per avgpool_fc grid row (a launch choice, not compiled in)
# The most dynamic shared memory one block may have (227 KB on the H100 / H200).
MAX_BLOCK_SMEM_BYTES = GEOMETRY["SM_SMEM_BYTES"] - GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
STEM_SMEM_BYTES = smem_bytes("STEM_SMEM_BYTES")     # A + B tiles + input patch (stem.cu)
STEM_TILE_H, STEM_TILE_W = GEOMETRY["STEM_TH"], GEOMETRY["STEM_TW"]
STEM_THREADS, STEM_POOL_THREADS = GEOMETRY["STEM_THREADS"], GEOMETRY["STEM_POOL_THREADS"]
EW_THREADS, HEAD_THREADS = GEOMETRY["EW_THREADS"], GEOMETRY["HEAD_THREADS"]
STEM_POOL_SMEM_BYTES = smem_bytes("STEM_POOL_SMEM_BYTES")   # A + B tiles + input patch
STEM_POOL_TILE_H, STEM_POOL_TILE_W = GEOMETRY["SP_PH"], GEOMETRY["SP_PW"]   # pooled pixels per block tile
STEM_WGMMA_SMEM_BYTES = smem_bytes("STEM_WGMMA_SMEM_BYTES")
STEM_WGMMA_TILE_H, STEM_WGMMA_TILE_W = GEOMETRY["SW_PH"], GEOMETRY["SW_PW"]
STEM_WGMMA_THREADS, STEM_WGMMA_BLOCKS_PER_SM = GEOMETRY["SW_THREADS"], GEOMETRY["SW_BLOCKS_PER_SM"]


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
