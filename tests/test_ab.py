"""The A/B agreement command against the real server: the same images through both models."""

from __future__ import annotations

import json

import pytest

from fusedresnet.backend.spec import INPUT_FP32, MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.client import ab
from fusedresnet.client.agreement import SET_REL_L2_TOLERANCE
from fusedresnet.client.preprocess import sample_photo_paths

CI_GENERATED = 12


@pytest.fixture(scope="module")
def agreement_run(triton_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("ab")
    exit_code = ab.main(["--url", triton_server.grpc_url, "--generated", str(CI_GENERATED), "--out", str(out)])
    return exit_code, json.loads((out / f"{ab.REPORT_NAME}.json").read_text()), out


def test_agreement_command_sends_photos_and_generated_images_to_both_models(agreement_run):
    exit_code, agreement, _ = agreement_run
    assert exit_code == 0
    assert agreement["sets"][ab.PHOTOS]["inputs"] == len(sample_photo_paths())
    assert agreement["sets"][ab.GENERATED]["inputs"] == CI_GENERATED
    requests = len(sample_photo_paths()) + CI_GENERATED
    for model in (MODEL_CUSTOM, MODEL_CUDNN):
        assert agreement["latency"][model]["requests"] == requests == len(agreement["latencies_ms"][model])
        latency = agreement["latency"][model]
        assert 0 < latency["min_ms"] <= latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
        assert agreement["engines"][model]


def test_both_models_agree_on_the_same_images(agreement_run):
    _, agreement, _ = agreement_run
    for stats in agreement["sets"].values():
        assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE, stats
        assert stats["clear_disagreements"] == 0, stats
        assert stats["top1_agree"] >= stats["inputs"] - stats["near_tie_disagreements"]
        assert stats["min_cosine"] > 0.999
    assert [row["photo"] for row in agreement["photo_top1"]] == [p.name for p in sample_photo_paths()]


def test_agreement_report_files_hold_the_json_figures(agreement_run):
    _, agreement, out = agreement_run
    text = (out / f"{ab.REPORT_NAME}.md").read_text()
    photos = agreement["sets"][ab.PHOTOS]
    assert f"| {ab.PHOTOS} | {photos['inputs']} | {photos['top1_agree']}/{photos['inputs']} |" in text
    assert (out / f"{ab.REPORT_NAME}_latency.png").read_bytes()[:4] == b"\x89PNG"


def test_agreement_over_http_with_client_normalised_input_matches_too(triton_server, tmp_path):
    agreement = ab.run_agreement(ab.agreement_image_sets(generated=4), "http", triton_server.http_url,
                                 batch_size=3, input_format=INPUT_FP32)
    for stats in agreement["sets"].values():
        assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE and stats["clear_disagreements"] == 0
    assert agreement["latency"][MODEL_CUSTOM]["requests"] == 2 + 2   # 5 photos and 4 images, 3 per request
