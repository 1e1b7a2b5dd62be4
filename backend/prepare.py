"""Write the generated files of the model repository (they are gitignored).

    python -m fusedresnet.backend.prepare [--weights resnet18-f37072fd.pth] [--repository DIR]

- resnet18_cudnn/1/resnet18_traced.pt : the baseline as traced TorchScript
  (frozen at load time, after the cast to the precision the config asks for)
- resnet18_custom/1/resnet18_folded.pt: BatchNorm folded into the convolutions,
  KRSC fp16 weights and fp32 biases for the NHWC kernels
- <model>/labels.txt                   : the ImageNet class names (`label_filename`)

Without --weights the seeded default weights of `fusedresnet.backend.resnet` are
used. A stamp file records the weights source, so `make` can skip the step.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from .folding import fold_resnet18
from .resnet import DEFAULT_SEED, build_resnet18
from .spec import (FOLDED_PARAMS_FILE, IMAGE_SIZE, LABELS_FILE, LABELS_FILENAME, MODEL_CUDNN, MODEL_CUSTOM,
                   MODEL_REPOSITORY, MODELS, TORCHSCRIPT_FILE)

STAMP_FILE = ".prepared.json"


def prepare(repository: Path = MODEL_REPOSITORY, weights: str | None = None, seed: int = DEFAULT_SEED) -> dict:
    repository = Path(repository)
    source = str(Path(weights).resolve()) if weights else f"seeded:{seed}"
    model = build_resnet18(weights, seed)

    example = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
    torch.jit.save(traced, str(repository / MODEL_CUDNN / "1" / TORCHSCRIPT_FILE))
    torch.save(fold_resnet18(model, source), repository / MODEL_CUSTOM / "1" / FOLDED_PARAMS_FILE)
    for name in MODELS:
        shutil.copyfile(LABELS_FILE, repository / name / LABELS_FILENAME)

    stamp = {"weights": source, "torch": torch.__version__}
    (repository / STAMP_FILE).write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help="torchvision ResNet-18 checkpoint (.pth); default: seeded weights")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the default weights")
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    args = parser.parse_args(argv)
    stamp = prepare(args.repository, args.weights, args.seed)
    print(f"prepared {args.repository} with weights {stamp['weights']}")


if __name__ == "__main__":
    main()
