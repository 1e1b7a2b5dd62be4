"""conv_wgmma_tma's tensor maps (kernels/geometry.py TmaIm2colMap, tma_filter_box): CPU only.

The GPU checks (harness.check, every "wt" tile forced on every layer shape) show the maps right for
ResNet-18's shapes. These tests hold the geometry to the convolution arithmetic for any shape, and every
shape the engine runs to the limits that cuTensorMapEncodeIm2col / Tiled document (CUDA driver API,
"Tensor Map Object Management"), so that an input size the GPU runs were never given fails here with a
reason rather than there with CUDA_ERROR_INVALID_VALUE.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fusedresnet.kernels.geometry import BK, TmaIm2colMap, tma_filter_box
from fusedresnet.kernels.tiles import WGMMA_TMA_TILES


def conv_out(size: int, r: int, stride: int, pad: int) -> int:
    """Output positions of a convolution along one axis (the usual formula, restated for the test)."""
    return (size + 2 * pad - r) // stride + 1


@given(h=st.integers(1, 300), w=st.integers(1, 300), r=st.sampled_from((1, 3, 5, 7)), stride=st.integers(1, 4),
       pad=st.integers(0, 3), rows=st.sampled_from((64, 128, 256)))
def test_the_im2col_walk_visits_the_convolutions_output_positions_in_order(h, w, r, stride, pad, rows):
    if h + 2 * pad < r or w + 2 * pad < r:
        return   # no output position
    m = TmaIm2colMap.of(2, h, w, 64, r, stride, pad, rows)
    # a walk row has as many positions as the output has columns (W) and rows (H)
    assert m.walk_positions(0) == conv_out(w, r, stride, pad)
    assert m.walk_positions(1) == conv_out(h, r, stride, pad)
    # output position q's window starts at the lower corner + q * stride (the kernel's coordinate) and
    # the last window's last tap stays inside the padded input
    for axis, size in ((0, w), (1, h)):
        last = m.walk_positions(axis) - 1
        assert m.lower[axis] == -pad
        assert m.lower[axis] + last * stride + (r - 1) <= size - 1 + pad
        assert m.lower[axis] + (last + 1) * stride + (r - 1) > size - 1 + pad   # one more would not fit


RESNET18_CONVS = [  # (h, w, c, r, stride, pad) of every convolution after the stem at 224 x 224
    (56, 56, 64, 3, 1, 1), (56, 56, 64, 3, 2, 1), (56, 56, 64, 1, 2, 0), (28, 28, 128, 3, 1, 1),
    (28, 28, 128, 3, 2, 1), (28, 28, 128, 1, 2, 0), (14, 14, 256, 3, 1, 1), (14, 14, 256, 3, 2, 1),
    (14, 14, 256, 1, 2, 0), (7, 7, 512, 3, 1, 1),
]


def test_every_engine_shape_and_tile_is_inside_the_encoders_documented_limits():
    for h, w, c, r, stride, pad in RESNET18_CONVS:
        for n in (1, 256):
            for tile in WGMMA_TMA_TILES:
                m = TmaIm2colMap.of(n, h, w, c, r, stride, pad, tile.bm)
                assert m.dims == (c, w, h, n) and all(0 < d <= 2 ** 32 for d in m.dims)
                # byte strides of W, H, N: multiples of 16, below 2^40
                assert m.strides == (2 * c, 2 * c * w, 2 * c * w * h)
                assert all(s % 16 == 0 and s < 2 ** 40 for s in m.strides)
                # rank 4: two corner offsets each in [-128, 127]; a box of non-zero area
                assert all(-128 <= v <= 127 for v in m.lower + m.upper)
                assert m.walk_positions(0) >= 1 and m.walk_positions(1) >= 1
                # channelsPerPixel <= 256 and, with the 128-byte swizzle, at most 128 bytes; pixelsPerColumn
                # <= 1024; element strides in 1 .. 8
                assert m.channels == BK and m.channels * 2 <= 128 and m.rows == tile.bm <= 1024
                assert m.element_strides == (1, stride, stride, 1) and all(1 <= e <= 8 for e in m.element_strides)
                k = 2 * c if stride == 2 else c
                ldw = r * r * c
                dims, strides, box = tma_filter_box(ldw, k, tile.bn)
                assert dims == (ldw, k) and strides == (2 * ldw,) and strides[0] % 16 == 0
                # the box: one k-tile of 128 bytes (the swizzle span) by at most 256 rows
                assert box == (BK, tile.bn) and box[0] * 2 <= 128 and box[1] <= 256
