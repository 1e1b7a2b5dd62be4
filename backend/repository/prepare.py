"""Write the generated files of the model repository (they are gitignored).

    python -m fusedresnet.backend.repository.prepare [--weights torchvision | resnet18-f37072fd.pth | model.onnx]
                                          [--repository DIR]

- resnet18_cudnn/1/resnet18_traced.pt : the baseline as traced TorchScript
  (frozen at load time, after the cast to the precision the config asks for)
- resnet18_custom/1/resnet18_folded.pt: BatchNorm folded into the convolutions,
  KRSC fp16 weights and fp32 biases for the NHWC kernels
- <entry>/labels.txt                   : the ImageNet class names (`label_filename`), in every
  model entry (the *_normalized entries read their network's weights from its folder)

--weights torchvision downloads torchvision's ImageNet-trained checkpoint (SHA-256 checked,
cached; `fusedresnet.backend.resnet.pretrained`), so the labels are real ones. --weights also
takes a torchvision checkpoint file (.pth) or a ResNet-18 ONNX file (.onnx,
torchvision's export, opset 13 and later, BatchNorm folded or not; see
`fusedresnet.backend.resnet.onnx_import`). Without it the seeded default weights of
`fusedresnet.backend.resnet.architecture` are used. A stamp file records the weights source,
so `make` can skip the step.

Weights that cannot be read (a missing file, a wrong key or shape, an ONNX graph
that is not ResNet-18) fail before anything is written; the files are written
under temporary names and renamed into place only once all of them are complete,
so a failed run leaves the repository as it was. A --repository without the model entries
(each entry's folder with its config.pbtxt, and the networks' version folders) is refused
before anything is built, naming what is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch

from ..resnet.architecture import DEFAULT_SEED
from ..resnet.folding import fold_resnet18
from ..resnet.onnx_import import OnnxImportError
from ..resnet.pretrained import WEIGHTS_TORCHVISION, CheckpointError, fetch
from ..resnet.weights import build_resnet18
from ..spec import (
    FOLDED_PARAMS_FILE,
    IMAGE_SIZE,
    LABELS_FILE,
    LABELS_FILENAME,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    MODEL_ENTRIES,
    MODEL_REPOSITORY,
    TORCHSCRIPT_FILE,
)
from .prepared_stamp import STAMP_FILE, make_stamp, seeded_source, write_stamp


class RepositoryError(ValueError):
    """The folder given as the model repository lacks the entries prepare writes into; the message names them."""


def missing_entries(repository: Path) -> list[str]:
    """What `prepare` needs in `repository` and does not find there: every entry's config.pbtxt and the
    version folders of the networks' weights (relative paths)."""
    needed = [f"{name}/config.pbtxt" for name in MODEL_ENTRIES] + [f"{MODEL_CUDNN}/1/", f"{MODEL_CUSTOM}/1/"]
    return [path for path in needed if not (repository / path).exists()]


def prepare(repository: Path = MODEL_REPOSITORY, weights: str | None = None, seed: int = DEFAULT_SEED) -> dict:
    repository = Path(repository)
    missing = missing_entries(repository)
    if missing:
        raise RepositoryError(f"{repository} is not a model repository: it has no {', '.join(missing)} "
                              f"(copy the model entries of {MODEL_REPOSITORY} there first)")
    if weights == WEIGHTS_TORCHVISION:
        weights = str(fetch())
    source = str(Path(weights).resolve()) if weights else seeded_source(seed)
    model = build_resnet18(weights, seed)

    example = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
    folded = fold_resnet18(model, source)
    stamp = make_stamp(source, torch.__version__)
    writers = {
        repository / MODEL_CUDNN / "1" / TORCHSCRIPT_FILE: lambda path: torch.jit.save(traced, str(path)),
        repository / MODEL_CUSTOM / "1" / FOLDED_PARAMS_FILE: lambda path: torch.save(folded, path),
    }
    # Every entry its labels (Triton's classification extension reads them from the entry's folder); the
    # *_normalized entries read their network's weights from the network's own entry (triton_adapter/python_model.py).
    for name in MODEL_ENTRIES:
        writers[repository / name / LABELS_FILENAME] = lambda path: shutil.copyfile(LABELS_FILE, path)
    # The stamp last: `make` and the tests take its presence to mean the other files are complete.
    writers[repository / STAMP_FILE] = lambda path: write_stamp(path, stamp)
    write_all_or_nothing(writers)
    return stamp


def write_all_or_nothing(writers: dict) -> None:
    """Call writer(temporary path) for each target, then rename all into place; on failure remove them all."""
    temporary = {target: target.with_name(f".{target.name}.{os.getpid()}.tmp") for target in writers}
    started = []
    try:
        for target, write in writers.items():
            started.append(temporary[target])
            write(temporary[target])
    except BaseException:
        for path in started:
            if path.is_file():
                path.unlink()
        raise
    for target, path in temporary.items():
        os.replace(path, target)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help=f"'{WEIGHTS_TORCHVISION}' (download torchvision's ImageNet-trained "
                                          "checkpoint), a torchvision ResNet-18 checkpoint (.pth) or ONNX file "
                                          "(.onnx); default: seeded weights")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the default weights")
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    args = parser.parse_args(argv)
    try:
        stamp = prepare(args.repository, args.weights, args.seed)
    except (OnnxImportError, CheckpointError, RepositoryError) as error:
        sys.exit(f"prepare: {error}")
    print(f"prepared {args.repository} with weights {stamp['weights']}")


if __name__ == "__main__":
    main()
