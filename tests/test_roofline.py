"""harness/roofline.py: a convolution's compulsory bytes and its place under the roofline (issue 48)."""

import pytest

from fusedresnet.harness import roofline


def test_a_3x3_convolutions_bytes_are_its_input_weights_bias_and_output():
    # layer3.1.conv1 at batch 128: 14x14x256 in and out, 3x3x256x256 weights
    moved = roofline.conv_bytes(128, 14, 14, 14, 14, 256, 256, 3)
    assert moved == 128 * 14 * 14 * 256 * 2 + 256 * 9 * 256 * 2 + 256 * 4 + 128 * 14 * 14 * 256 * 2 == 26_870_784
    # its conv2 adds the residual, read once more
    assert roofline.conv_bytes(128, 14, 14, 14, 14, 256, 256, 3, adds_residual=True) == moved + 12_845_056


def test_a_fused_shortcut_reads_the_pixels_its_stride_lands_on_and_its_weights():
    # layer2.0.conv2 with the stride-2 1x1 projection of the block's 56x56x64 input fused in: 28x28 of its pixels
    plain = roofline.conv_bytes(32, 28, 28, 28, 28, 128, 128, 3)
    fused = roofline.conv_bytes(32, 28, 28, 28, 28, 128, 128, 3, shortcut_channels=64, shortcut_hw=(56, 56),
                                shortcut_stride=2)
    assert fused - plain == 32 * 28 * 28 * 64 * 2 + 128 * 64 * 2


def test_a_strided_1x1_convolution_reads_a_quarter_of_its_input_and_a_3x3_one_all_of_it():
    # layer2.0.downsample alone (56x56x64 -> 28x28x128, stride 2) and layer2.0.conv1 (3x3, stride 2)
    assert roofline.conv_bytes(8, 56, 56, 28, 28, 64, 128, 1) == \
        8 * 28 * 28 * 64 * 2 + 128 * 64 * 2 + 128 * 4 + 8 * 28 * 28 * 128 * 2
    assert roofline.conv_bytes(8, 56, 56, 28, 28, 64, 128, 3) == \
        8 * 56 * 56 * 64 * 2 + 128 * 9 * 64 * 2 + 128 * 4 + 8 * 28 * 28 * 128 * 2


def test_the_stem_reads_pixels_and_writes_only_the_pooled_map():
    assert roofline.stem_bytes(1, 224, 224, 56, 56) == 224 * 224 * 3 + 64 * 49 * 3 * 2 + 64 * 4 + 56 * 56 * 64 * 2


def test_the_roof_is_the_slower_of_compute_and_memory_at_their_peaks():
    flops = 2 * 128 * 14 * 14 * 256 * 9 * 256            # 29.6 GFLOP
    row = roofline.roofline(flops, 26_870_784, ms=0.0505, peak_tflops=1000.0, bandwidth_gbs=4000.0)
    assert row["compute_ms"] == pytest.approx(0.0296, abs=1e-4)      # 29.6e9 / 1e15 s
    assert row["memory_ms"] == pytest.approx(0.00672, abs=1e-5)      # 26.9e6 / 4e12 s
    assert row["bound"] == "compute"
    assert row["pct_roof"] == pytest.approx(58.6, abs=0.1)           # 0.0296 / 0.0505
    assert row["flop_per_byte"] == pytest.approx(1101.4, abs=0.1)
    assert row["GB/s"] == pytest.approx(532.1, abs=0.1)              # 26.87 MB in 0.0505 ms
    # a layer that moves much and computes little is bound by memory
    assert roofline.roofline(1e6, 100_000_000, ms=0.05, peak_tflops=1000.0, bandwidth_gbs=4000.0)["bound"] == "memory"
    # 26.9 MB fits in a 50 MB L2, not in a 25 MB one
    assert row["fits_l2"] is False
    assert roofline.roofline(flops, 26_870_784, 0.0505, 1000.0, 4000.0, l2_bytes=50_000_000)["fits_l2"] is True
    assert roofline.roofline(flops, 26_870_784, 0.0505, 1000.0, 4000.0, l2_bytes=25_000_000)["fits_l2"] is False


def test_time_shares_are_per_batch_and_path():
    rows = [{"path": "mixed", "N": 32, "ms": 1.0}, {"path": "mixed", "N": 32, "ms": 3.0},
            {"path": "mixed", "N": 128, "ms": 2.0}]
    assert [row["time_share"] for row in roofline.time_shares(rows)] == [25.0, 75.0, 100.0]
