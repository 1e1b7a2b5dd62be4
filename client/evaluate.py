"""Accuracy of both served models on labelled images: top-1, top-5, their agreement, the images where they differ.

    python -m fusedresnet.client.evaluate DIR                       # server on 127.0.0.1:8001 (gRPC)
    python -m fusedresnet.client.evaluate DIR --ground-truth LOC_val_solution.csv --url HOST:PORT --out build/eval

DIR is either
- a class-per-folder tree (torchvision's ImageFolder layout): DIR/<class>/<image>, where <class> is an
  ImageNet WordNet id (n01440764, as in ImageNet's train/ and a sorted val/) or a class name of
  backend/imagenet_classes.txt ("tench", "golden retriever"); or
- an ImageNet validation folder: the images directly in DIR and a ground-truth file, given with
  --ground-truth or found in DIR as LOC_val_solution.csv. Its lines are `ImageId,PredictionString` (Kaggle's
  LOC_val_solution.csv: the first word of PredictionString is the WordNet id) or `<file> <label>` (the
  val.txt of Caffe and many ImageNet tools), the label a class index 0-999 in torchvision's order, a WordNet
  id or a class name. (The devkit's ILSVRC2012_validation_ground_truth.txt numbers classes in another order,
  one label per line with no file name: it is refused, with the reason.)

Every image goes through the client's preprocessing (`client.preprocess`: Resize 256, CenterCrop 224) and
to both models, in batches. Prints a table and writes <out>/evaluation.json: per model top-1 and top-5
accuracy and the engine; top-1/top-5 agreement between the models (`client.agreement.compare_logits`);
each image where their top-1 classes differ, with its label. Bad input (no such folder, no images, a class
that is not an ImageNet class, an image that cannot be read, a ground-truth line that names no image) stops
with a message that names it, before any image is sent.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from fusedresnet.backend.spec import BUILD_DIR, LABELS_FILE, MODEL_CUDNN, MODEL_CUSTOM, MODELS, load_labels
from fusedresnet.client.agreement import compare_logits
from fusedresnet.client.preprocess import IMAGE_SUFFIXES, preprocess_files
from fusedresnet.client.resnet_client import DEFAULT_URLS, PROTOCOLS, ResNetClient

WNIDS_FILE = LABELS_FILE.with_name("imagenet_wnids.txt")   # line i: the WordNet id of class i
KAGGLE_GROUND_TRUTH = "LOC_val_solution.csv"
DEFAULT_BATCH = 32
DEFAULT_OUT = BUILD_DIR / "evaluate"
TOP_K = 5


class EvaluationError(ValueError):
    """The image set cannot be evaluated as given; the message names the folder, file or class."""


@dataclass(frozen=True)
class LabelledImage:
    path: Path
    label: int


def load_wnids() -> list[str]:
    return WNIDS_FILE.read_text().split()


def class_index(name: str, wnids: list[str], labels: list[str]) -> int:
    """The class index of a WordNet id, a class name (case-insensitive) or an index 0-999."""
    key = name.strip()
    if key in wnids:
        return wnids.index(key)
    if key.isdigit() and int(key) < len(labels):
        return int(key)
    matches = [i for i, label in enumerate(labels) if label.lower() == key.lower()]   # the names are unique
    if matches:
        return matches[0]
    raise EvaluationError(f"{key!r} is not an ImageNet class (neither a WordNet id such as {wnids[0]}, "
                          f"nor a class name of {LABELS_FILE.name}, nor an index 0-{len(labels) - 1})")


def is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES


def find_ground_truth(folder: Path, ground_truth: Path | None) -> Path | None:
    if ground_truth is not None:
        if not Path(ground_truth).is_file():
            raise EvaluationError(f"ground-truth file {ground_truth} does not exist")
        return Path(ground_truth)
    candidate = folder / KAGGLE_GROUND_TRUTH
    return candidate if candidate.is_file() else None


def read_ground_truth(path: Path, wnids: list[str], labels: list[str]) -> dict[str, int]:
    """{image file stem: class index} from a LOC_val_solution.csv or a `<file> <label>` list."""
    text = path.read_text().strip().splitlines()
    if not text:
        raise EvaluationError(f"ground-truth file {path} is empty")
    truth = {}
    if text[0].startswith("ImageId,"):
        for row in csv.DictReader(text):
            truth[row["ImageId"]] = class_index(row["PredictionString"].split()[0], wnids, labels)
        return truth
    for number, line in enumerate(text, 1):
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise EvaluationError(
                f"{path}:{number}: expected `<image file> <label>`, got {line!r} (the devkit's "
                "ILSVRC2012_validation_ground_truth.txt numbers the classes in the devkit's order, not "
                "torchvision's: use LOC_val_solution.csv or a `<file> <WordNet id>` list)")
        try:
            truth[Path(parts[0]).stem] = class_index(parts[1], wnids, labels)
        except EvaluationError as error:
            raise EvaluationError(f"{path}:{number}: {error}") from None
    return truth


def labelled_images(folder: Path, ground_truth: Path | None = None) -> list[LabelledImage]:
    """The images of `folder` with their class indices (class-per-folder, or flat with a ground truth)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise EvaluationError(f"{folder} is not a folder")
    wnids, labels = load_wnids(), load_labels()
    truth_file = find_ground_truth(folder, ground_truth)
    if truth_file is not None:
        truth = read_ground_truth(truth_file, wnids, labels)
        images = sorted(p for p in folder.iterdir() if is_image(p))
        unlabelled = [p.name for p in images if p.stem not in truth]
        if unlabelled:
            raise EvaluationError(f"{len(unlabelled)} image(s) in {folder} have no line in {truth_file}: "
                                  f"{', '.join(unlabelled[:5])}")
        found = [LabelledImage(p, truth[p.stem]) for p in images]
    else:
        classes = sorted(p for p in folder.iterdir() if p.is_dir())
        unknown = []
        found = []
        for class_folder in classes:
            try:
                label = class_index(class_folder.name, wnids, labels)
            except EvaluationError as error:
                unknown.append(f"{class_folder.name} ({error})")
                continue
            found += [LabelledImage(p, label) for p in sorted(class_folder.iterdir()) if is_image(p)]
        if unknown:
            raise EvaluationError(f"class folder(s) in {folder} that are not ImageNet classes: "
                                  + "; ".join(unknown))
    if not found and truth_file is None and any(is_image(p) for p in folder.iterdir()):
        raise EvaluationError(f"the images in {folder} are not in class folders and no ground-truth file is given "
                              f"(--ground-truth, or {KAGGLE_GROUND_TRUTH} in the folder)")
    if not found:
        layout = "ground truth" if truth_file is not None else "class-per-folder"
        raise EvaluationError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder} ({layout} layout)")
    for image in found:   # every file decodes before anything is sent
        try:
            with Image.open(image.path) as opened:
                opened.verify()
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            raise EvaluationError(f"cannot read image {image.path}: {error}") from None
    return found


def crops(images: list[LabelledImage]) -> np.ndarray:
    try:
        return preprocess_files([image.path for image in images])
    except (UnidentifiedImageError, OSError) as error:
        raise EvaluationError(f"cannot read image: {error}") from None


def served_logits(images: list[LabelledImage], protocol: str, url: str, batch: int) -> tuple[dict, dict]:
    """({model: logits [N, 1000]}, {model: engine}), every batch through both models."""
    logits = {model: [] for model in MODELS}
    engines = {}
    with contextlib.ExitStack() as opened:   # a client that fails to open closes those opened before it
        clients = {model: opened.enter_context(ResNetClient(model, protocol, url)) for model in MODELS}
        for start in range(0, len(images), batch):
            batch_crops = crops(images[start:start + batch])
            for model, client in clients.items():
                result = client.infer(batch_crops)
                logits[model].append(result.logits)
                engines[model] = result.engine
    return {model: np.concatenate(rows) for model, rows in logits.items()}, engines


def evaluate(images: list[LabelledImage], logits: dict, engines: dict) -> dict:
    """Accuracy of each model, agreement of the custom model with the cuDNN baseline, the differing images."""
    truth = np.array([image.label for image in images])
    labels, wnids = load_labels(), load_wnids()
    models = {}
    top = {}
    for model in MODELS:
        top[model] = np.argsort(-logits[model], axis=1)[:, :TOP_K]
        models[model] = {
            "engine": engines.get(model),
            "top1_correct": int((top[model][:, 0] == truth).sum()),
            "top5_correct": int((top[model] == truth[:, None]).any(axis=1).sum()),
        }
        models[model]["top1_accuracy"] = models[model]["top1_correct"] / len(images)
        models[model]["top5_accuracy"] = models[model]["top5_correct"] / len(images)
    agreement = compare_logits(logits[MODEL_CUSTOM], logits[MODEL_CUDNN])
    differ = [{"image": str(image.path), "label": labels[image.label], "wnid": wnids[image.label],
               **{model: labels[int(top[model][i, 0])] for model in MODELS}}
              for i, image in enumerate(images) if top[MODEL_CUSTOM][i, 0] != top[MODEL_CUDNN][i, 0]]
    return {"images": len(images), "classes": len(set(truth.tolist())), "models": models,
            "agreement": {key: agreement[key] for key in ("top1_agree", "top5_agree", "near_tie_disagreements",
                                                          "clear_disagreements", "max_abs", "rel_l2")},
            "top1_differs": differ}


def table(report: dict) -> str:
    n = report["images"]
    rows = [f"{n} images, {report['classes']} classes",
            f"{'model':16s} {'engine':50s} {'top-1':>16s} {'top-5':>16s}"]
    for model, m in report["models"].items():
        rows.append(f"{model:16s} {m['engine'] or '-':50s} "
                    f"{m['top1_correct']:>5d}/{n} {100 * m['top1_accuracy']:6.2f}% "
                    f"{m['top5_correct']:>5d}/{n} {100 * m['top5_accuracy']:6.2f}%")
    a = report["agreement"]
    rows.append(f"agreement {MODEL_CUSTOM} vs {MODEL_CUDNN}: top-1 {a['top1_agree']}/{n}, "
                f"top-5 sets {a['top5_agree']}/{n}, max |diff| {a['max_abs']:.3g}, relative L2 {a['rel_l2']:.2e}")
    for d in report["top1_differs"]:
        rows.append(f"  differ: {d['image']} (label {d['label']}): {MODEL_CUSTOM} {d[MODEL_CUSTOM]}, "
                    f"{MODEL_CUDNN} {d[MODEL_CUDNN]}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="class-per-folder tree, or a validation folder")
    parser.add_argument("--ground-truth", type=Path,
                        help=f"labels of a flat folder (default: DIR/{KAGGLE_GROUND_TRUTH})")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--url", help="server address (default: 127.0.0.1, the protocol's port)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for evaluation.json")
    args = parser.parse_args(argv)
    try:
        images = labelled_images(args.folder, args.ground_truth)
        logits, engines = served_logits(images, args.protocol, args.url or DEFAULT_URLS[args.protocol],
                                        args.batch_size)
    except EvaluationError as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return 2
    report = evaluate(images, logits, engines)
    print(table(report))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "evaluation.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out / 'evaluation.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
