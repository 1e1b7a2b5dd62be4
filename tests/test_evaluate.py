"""`python -m fusedresnet.client.evaluate DIR` against the real server, on a labelled set whose true labels
come from an independent float64 reference: the network with the served weights, evaluated in float64 on
the exact 224x224 crop the client sends (256x256 images: Resize(256) leaves them as they are, CenterCrop(224)
is a slice)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from fusedresnet.backend.images import smooth_random_images
from fusedresnet.backend.spec import IMAGE_SIZE, IMAGENET_MEAN, IMAGENET_STD, MODELS, RESIZE_SHORTER_SIDE, load_labels
from fusedresnet.client.evaluate import load_wnids, main

CANDIDATES = 64
SET_SIZE = 12
# These images' logits are about 4 (seeded weights); a served model's stay within a few hundredths of the
# reference's (fp32 on a CPU, fp16 on a GPU: client/agreement.py): a margin of 0.15 between the ranks that
# decide each answer leaves no near tie.
CLEAR_MARGIN = 0.15
RANK_OF_LABEL = (1, 2, 1, 8)   # image i is labelled with its reference's class of rank RANK_OF_LABEL[i % 4]


@pytest.fixture(scope="module")
def labelled_set(reference_model, tmp_path_factory):
    """(folder tree, flat folder + val.txt, expected top-1 and top-5 correct counts, N)."""
    images = smooth_random_images(CANDIDATES, seed=2029, size=RESIZE_SHORTER_SIDE).numpy()
    offset = (RESIZE_SHORTER_SIDE - IMAGE_SIZE) // 2
    crop = torch.from_numpy(images[:, offset:offset + IMAGE_SIZE, offset:offset + IMAGE_SIZE]).double() / 255
    x = ((crop - torch.tensor(IMAGENET_MEAN, dtype=torch.float64)) / torch.tensor(IMAGENET_STD, dtype=torch.float64))
    with torch.no_grad():
        logits = copy.deepcopy(reference_model).double()(x.permute(0, 3, 1, 2).contiguous()).numpy()
    ranked = np.argsort(-logits, axis=1)
    ordered = np.take_along_axis(logits, ranked, axis=1)
    # rank 1 is top-1; rank 2 is not top-1 but within the top 5; rank 8 is outside the top 5
    clear = (ordered[:, 0] - ordered[:, 1] > CLEAR_MARGIN) & (ordered[:, 1] - ordered[:, 5] > CLEAR_MARGIN) \
        & (ordered[:, 4] - ordered[:, 7] > CLEAR_MARGIN)
    chosen = np.flatnonzero(clear)[:SET_SIZE]
    assert len(chosen) == SET_SIZE, f"only {clear.sum()} of {CANDIDATES} images have clear margins"
    wnids, labels = load_wnids(), load_labels()
    root = tmp_path_factory.mktemp("labelled")
    tree, flat = root / "tree", root / "flat"
    flat.mkdir()
    truth_lines = []
    for n, i in enumerate(chosen):
        label = int(ranked[i, RANK_OF_LABEL[n % 4] - 1])
        folder = tree / (labels[label] if n % 2 else wnids[label])   # both ways of naming a class
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(folder / f"img{n:03d}.png")
        Image.fromarray(images[i]).save(flat / f"ILSVRC2012_val_{n:08d}.png")
        truth_lines.append(f"ILSVRC2012_val_{n:08d}.JPEG {wnids[label]}")
    (root / "val.txt").write_text("\n".join(truth_lines) + "\n")
    ranks = [RANK_OF_LABEL[n % 4] for n in range(SET_SIZE)]
    return tree, flat, root / "val.txt", sum(r == 1 for r in ranks), sum(r <= 5 for r in ranks)


def run(args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_accuracy_agreement_and_json_of_both_models_match_the_float64_labels(triton_server, labelled_set,
                                                                            tmp_path, capsys):
    tree, flat, val_txt, top1, top5 = labelled_set
    for layout in (["--ground-truth", val_txt, flat], [tree]):
        out_dir = tmp_path / layout[-1].name
        code, out, err = run([*layout, "--url", triton_server.grpc_url, "--batch-size", 5, "--out", out_dir], capsys)
        assert code == 0, err
        report = json.loads((out_dir / "evaluation.json").read_text())
        assert report["images"] == SET_SIZE
        for model in MODELS:
            stats = report["models"][model]
            assert (stats["top1_correct"], stats["top5_correct"]) == (top1, top5), (model, stats)
            assert stats["top1_accuracy"] == pytest.approx(top1 / SET_SIZE)
            assert f"{top1:>5d}/{SET_SIZE}" in out and stats["engine"] in out
        assert report["agreement"]["top1_agree"] == SET_SIZE and report["top1_differs"] == []
        assert f"top-1 {SET_SIZE}/{SET_SIZE}" in out


def write_png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a folder"),
    ("empty", "no images"),
    ("unknown_class", "'not_a_class' is not an ImageNet class"),
    ("unreadable_image", "cannot read image"),
    ("flat_without_labels", "no ground-truth file"),
    ("devkit_ground_truth", "numbers the classes in the devkit's order"),
    ("unlabelled_image", "have no line in"),
])
def test_bad_input_gets_a_clear_error_before_anything_is_sent(tmp_path, capsys, case, message):
    folder = tmp_path / "images"
    args = [folder]
    if case != "missing":
        folder.mkdir()
    if case == "unknown_class":
        write_png(folder / "n01440764" / "a.png")
        write_png(folder / "not_a_class" / "b.png")
    elif case == "unreadable_image":
        write_png(folder / "tench" / "a.png")
        (folder / "tench" / "b.jpg").write_bytes(b"not an image at all")
    elif case == "flat_without_labels":
        write_png(folder / "ILSVRC2012_val_00000001.png")
    elif case == "devkit_ground_truth":
        write_png(folder / "ILSVRC2012_val_00000001.png")
        (tmp_path / "gt.txt").write_text("490\n361\n")
        args = ["--ground-truth", tmp_path / "gt.txt", folder]
    elif case == "unlabelled_image":
        write_png(folder / "ILSVRC2012_val_00000001.png")
        write_png(folder / "ILSVRC2012_val_00000002.png")
        (folder / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n"
                                                     "ILSVRC2012_val_00000001,n01751748 1 2 3 4\n")
    # No server: a port nothing listens on; the error must come before any request.
    code, out, err = run([*args, "--url", "127.0.0.1:1", "--out", tmp_path / "out"], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()
