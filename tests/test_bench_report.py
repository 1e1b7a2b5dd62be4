"""The benchmark's tables carry both timings of every engine: back-to-back (throughput) and one call at a time
(latency). Fed with the H100 figures of 2026-11-25 (the lead's GPU-host run at 60dc795: the fused engine,
torch.compile max-autotune and cuDNN + CUDA graph, measured both ways in one process), the tables must give the
speed-ups targeted for them: 2.04x / 1.41x / 1.59x back-to-back at batch 1 / 32 / 128."""

from __future__ import annotations

import json

from fusedresnet.harness.bench_report import markdown, record, summary_table, write_result

# (batch, fused back-to-back, fused one at a time, compile b2b, compile one, graph b2b, graph one), ms
H100_2026_11_25 = ((1, 0.142, 0.143, 0.290, 0.374, 0.356, 0.360),
                   (32, 0.450, 0.458, 0.635, 0.839, 0.972, 0.979),
                   (128, 1.215, 1.229, 1.930, 2.018, 3.122, 3.126))


def result() -> dict:
    rows = []
    for batch, ours_b2b, ours_one, compile_b2b, compile_one, graph_b2b, graph_one in H100_2026_11_25:
        row = {"batch": batch}
        record(row, "custom", (ours_one, ours_b2b))
        record(row, "compile_max_autotune", (compile_one, compile_b2b))
        record(row, "graph_fp16", (graph_one, graph_b2b))
        row["custom_img_s"] = round(batch * 1000 / ours_b2b, 1)
        rows.append(row)
    return {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25", "command": "python -m fusedresnet.harness.bench",
            "peak_tflops": 660.0, "whole_network": rows, "features_64": [], "shortcut_fusion": []}


def test_whole_network_table_gives_both_timings_and_both_speedups_of_every_engine():
    text = markdown(result())
    row_128 = next(line for line in text.splitlines() if line.startswith("| 128 |"))
    cells = [cell.strip() for cell in row_128.strip("|").split("|")]
    assert "1.215 / 1.229" in cells and "1.930 / 2.018" in cells and "3.122 / 3.126" in cells
    assert "105,350" in cells                          # img/s from back-to-back: 128 / 1.215 ms
    assert cells[-1] == "1.59x / 1.64x"                # vs compile: back-to-back / one at a time
    assert cells[-2] == "2.57x / 2.54x"                # vs cuDNN fp16 + CUDA graph
    speedups = [next(line for line in text.splitlines() if line.startswith(f"| {b} |")).rstrip(" |").split("|")[-1]
                for b in (1, 32, 128)]
    assert [s.split("/")[0].strip() for s in speedups] == ["2.04x", "1.41x", "1.59x"]


def test_engines_not_timed_are_marked_and_the_plain_text_table_has_both_columns():
    table = summary_table(result()["whole_network"])
    lines = table.splitlines()
    assert lines[1].split(" | ") == ["batch", "custom", "fp16 CL + graph", "compile max-autotune", "custom img/s"]
    assert lines[2].split(" | ") == ["1", "0.142 / 0.143", "0.356 / 0.360", "0.290 / 0.374", "7042"]
    assert "| - |" in markdown(result())                # TorchScript fp32 and the forced paths were not timed


def test_result_files_keep_both_timings(tmp_path):
    write_result(result(), tmp_path)
    saved = json.loads((tmp_path / "kernels_bench.json").read_text())["whole_network"][0]
    assert (saved["custom_b2b_ms"], saved["custom_ms"]) == (0.142, 0.143)
    assert (tmp_path / "kernels_bench.png").stat().st_size > 10_000
    assert "0.290 / 0.374" in (tmp_path / "kernels_bench.md").read_text()


def test_the_roofline_section_sums_the_layers_against_the_peak_and_the_whole_network():
    """Two layers at batch 128 (0.5 ms for 330 GFLOP, 0.25 ms for 82.5) against a 660 TFLOP/s peak and the whole
    network's 1.215 ms back-to-back: the layers run 0.75 ms at 550 TFLOP/s (83%), the network 412.5 GFLOP in
    1.215 ms, 340 TFLOP/s (51%), 0.465 ms beside the layers; each layer's row keeps its tile, bound and roof."""
    bench = result()
    bench["conv_path"] = "mixed"
    bench["memory_bandwidth_gbs"] = 3350.0
    common = {"path": "mixed", "N": 128, "bound": "compute", "fits_l2": False}
    bench["layers"] = [
        {**common, "layer": "layer1.0.conv1", "tile": "pwg128g2s4v1", "ms": 0.5, "GFLOP": 330.0, "TFLOP/s": 660.0,
         "pct_peak": 100.0, "GB/s": 10.0, "pct_roof": 100.0, "time_share": 66.7},
        {**common, "layer": "layer4.1.conv2", "tile": "wg64x128g1s3", "ms": 0.25, "GFLOP": 82.5, "TFLOP/s": 330.0,
         "pct_peak": 50.0, "GB/s": 20.0, "pct_roof": 50.0, "time_share": 33.3, "fits_l2": True},
        {**common, "path": "mma", "layer": "layer1.0.conv1", "tile": "128x128w2x4s3", "ms": 9.0, "GFLOP": 330.0,
         "TFLOP/s": 36.7, "pct_peak": 5.6, "GB/s": 1.0, "pct_roof": 5.6, "time_share": 100.0}]
    text = markdown(bench)
    section = text[text.index("## Per-layer roofline"):]
    assert "(660 TFLOP/s)" in section and "(3,350 GB/s)" in section
    assert "Batch 128: the layers 0.750 ms, 550 TFLOP/s (83% of the peak); the whole network 1.215 ms" in section
    assert "340 TFLOP/s (51%): +0.465 ms between and around the layers" in section
    assert "| layer4.1.conv2 | wg64x128g1s3 | 0.2500 | 33.3% | 330.0 | 50.0 | 20.0 | compute | 50.0 | yes |" in section
    assert "128x128w2x4s3" not in section            # the forced mma.sync path is not the engine's
    assert "Batch 32" not in section                 # no layer rows there
