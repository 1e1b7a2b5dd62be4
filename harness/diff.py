"""Layer-by-layer diff: where do the engine's numbers start to differ from the float32 reference?

    python -m fusedresnet.harness.diff [--weights FILE] [--device cuda|cpu] [--tolerance T] [--json] [IMAGES...]

Runs the same images through an engine and through the unfolded float32
ResNet-18 (`backend/resnet/architecture.py`, on the CPU) and compares them at every
checkpoint, in execution order:

    stem+maxpool, layer1.0, layer1.1 (= layer1), layer2.0, layer2.1 (= layer2), ...,
    layer4.1 (= layer4), avgpool, logits

For each: the largest absolute difference, the relative L2 error over the batch
(||engine - reference|| / ||reference||), the largest per-image relative L2
error and the smallest per-image cosine similarity; then the first checkpoint
whose relative L2 error exceeds the tolerance (default: the served models'
set tolerance, 1e-2). The exit status is 0 when every checkpoint is within it,
1 when one is not (as diff(1)), 2 on a usage error.

- ``--device cpu``: the folded graph (`TorchFoldedEngine`: BatchNorm folded,
  fp16 weights, fp32 compute), walked checkpoint by checkpoint by its own
  `checkpoints` (the walk its `features` and logits come from).
- ``--device cuda``: the fused CUDA kernels (`FusedCudaEngine`, fp16 NHWC), fed
  the UINT8 pixels (so the normalisation folded into the stem is compared too);
  their activations come from `FusedCudaEngine.checkpoint_outputs`. A checkpoint
  the engine does not materialise (the fused kernels pool and apply the head in
  one kernel) is listed as not compared.

IMAGES are image files, preprocessed as the client does (resize 256, crop 224);
without any, the sample photos and four seeded smooth random images. --weights
takes a torchvision checkpoint (.pth) or ONNX file; default: the seeded weights.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from ..backend.engines.config import environment_engine_arguments
from ..backend.images import normalize_uint8, smooth_random_images
from ..backend.resnet.folding import (
    LOGITS_CHECKPOINT,
    POOL_CHECKPOINT,
    STEM_CHECKPOINT,
    checkpoint_names,
    fold_resnet18,
)
from ..backend.resnet.weights import build_resnet18
from ..client.agreement import SET_REL_L2_TOLERANCE, compare_logits
from ..client.preprocess import preprocess_files, sample_photo_paths

DEFAULT_SMOOTH_IMAGES, DEFAULT_IMAGES_SEED = 4, 31


def stage_of(name: str) -> str | None:
    """"layer2" for layer2.1, the last block of its stage (its output is the stage's); else None."""
    stage, _, index = name.partition(".")
    return stage if index == "1" else None


def reference_checkpoints(model, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The unfolded float32 network's activations at every checkpoint, taken by forward hooks on its modules."""
    modules = {STEM_CHECKPOINT: "maxpool", POOL_CHECKPOINT: "avgpool", LOGITS_CHECKPOINT: "fc"}
    modules.update({name: name for name in checkpoint_names() if name not in modules})
    outputs, handles = {}, []
    for checkpoint, module_name in modules.items():
        def keep(_module, _inputs, output, checkpoint=checkpoint):
            outputs[checkpoint] = output.detach().clone()
        handles.append(model.get_submodule(module_name).register_forward_hook(keep))
    try:
        with torch.inference_mode():
            model(normalize_uint8(pixels))
    finally:
        for handle in handles:
            handle.remove()
    outputs[POOL_CHECKPOINT] = outputs[POOL_CHECKPOINT].flatten(1)
    return outputs


def folded_engine_checkpoints(params: dict, pixels: torch.Tensor) -> tuple[str, dict[str, torch.Tensor]]:
    """(engine name, activations) of the folded graph on the CPU."""
    from ..backend.engines.serving import TorchFoldedEngine
    engine = TorchFoldedEngine(params, "cpu")
    with torch.inference_mode():
        return engine.name, dict(engine.checkpoints(normalize_uint8(pixels)))


def fused_engine_checkpoints(params: dict, pixels: torch.Tensor,
                             **engine_arguments) -> tuple[str, dict[str, torch.Tensor]]:
    """(engine name, activations) of the fused CUDA kernels (`engine_arguments`: conv_path, pdl), fed the UINT8
    pixels."""
    from ..backend.engines.fused_cuda import FusedCudaEngine
    engine = FusedCudaEngine(params, "cuda", **engine_arguments)
    return engine.name, engine.checkpoint_outputs(pixels.cuda())


def compare_checkpoints(engine: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                        tolerance: float) -> dict:
    """Per-checkpoint agreement, in execution order, and the first checkpoint beyond `tolerance` (rel L2)."""
    rows, not_compared, first = [], [], None
    for name in checkpoint_names():
        if name not in engine:
            not_compared.append(name)
            continue
        ours, ref = engine[name].detach().float().cpu(), reference[name]
        if ours.shape != ref.shape:
            raise ValueError(f"{name}: engine shape {list(ours.shape)}, reference {list(ref.shape)}")
        stats = compare_logits(ours.flatten(1).numpy(), ref.flatten(1).numpy())
        finite = bool(torch.isfinite(ours).all())
        within = finite and stats["rel_l2"] <= tolerance
        rows.append({"name": name, "stage": stage_of(name), "shape": list(ref.shape),
                     "max_abs": stats["max_abs"] if finite else float("inf"), "rel_l2": stats["rel_l2"],
                     "max_image_rel_l2": stats["max_row_rel_l2"], "min_cosine": stats["min_cosine"],
                     "within_tolerance": within})
        if not within and first is None:
            first = name
    return {"tolerance": tolerance, "checkpoints": rows, "not_compared": not_compared,
            "first_beyond_tolerance": first}


def default_images() -> np.ndarray:
    photos = preprocess_files(sample_photo_paths())
    smooth = smooth_random_images(DEFAULT_SMOOTH_IMAGES, DEFAULT_IMAGES_SEED).numpy()
    return np.concatenate([photos, smooth])


def run_diff(weights: str | None = None, device: str = "cpu", images: np.ndarray | None = None,
             tolerance: float = SET_REL_L2_TOLERANCE, params: dict | None = None,
             engine_arguments: dict | None = None) -> dict:
    """The diff report (see the module doc). `params` replaces the folded parameters of `weights`;
    `engine_arguments` (conv_path, pdl) go to the fused engine."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, not {device!r}")
    model = build_resnet18(weights)
    pixels = torch.from_numpy(np.ascontiguousarray(default_images() if images is None else images))
    params = params or fold_resnet18(model, weights or "seeded")
    if device == "cpu":
        engine_name, ours = folded_engine_checkpoints(params, pixels)
    else:
        engine_name, ours = fused_engine_checkpoints(params, pixels, **(engine_arguments or {}))
    report = compare_checkpoints(ours, reference_checkpoints(model, pixels), tolerance)
    return {"engine": engine_name, "reference": "unfolded ResNet-18, float32, CPU",
            "weights": weights or "seeded", "images": int(pixels.shape[0]), **report}


def format_report(report: dict) -> str:
    lines = [f"layer-by-layer diff: {report['engine']} vs {report['reference']} ({report['weights']} weights, "
             f"{report['images']} images), tolerance: rel L2 <= {report['tolerance']:.0e}",
             f"{'checkpoint':<18} {'shape':<18} {'max abs':>10} {'rel L2':>10} {'max img rel L2':>15} "
             f"{'min cosine':>11}"]
    for row in report["checkpoints"]:
        name = row["name"] + (f" ({row['stage']})" if row["stage"] else "")
        mark = "" if row["within_tolerance"] else "  <- beyond tolerance"
        lines.append(f"{name:<18} {'x'.join(map(str, row['shape'])):<18} {row['max_abs']:>10.3e} "
                     f"{row['rel_l2']:>10.3e} {row['max_image_rel_l2']:>15.3e} {row['min_cosine']:>11.6f}{mark}")
    for name in report["not_compared"]:
        lines.append(f"{name:<18} not materialised by this engine: not compared")
    first = report["first_beyond_tolerance"]
    lines.append(f"first checkpoint beyond tolerance: {first or 'none'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="*", help="image files (default: the sample photos + 4 seeded images)")
    parser.add_argument("--weights", help="torchvision checkpoint (.pth) or ONNX file; default: seeded weights")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda: the fused kernels; cpu: the folded graph (default: cuda if present)")
    parser.add_argument("--tolerance", type=float, default=SET_REL_L2_TOLERANCE,
                        help="relative L2 error beyond which a checkpoint counts as differing")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    images = preprocess_files(args.images) if args.images else None
    report = run_diff(args.weights, args.device, images, args.tolerance,
                      engine_arguments=environment_engine_arguments())
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0 if report["first_beyond_tolerance"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
